"""The studies, one short definition file each (as configs are): ``study()`` returns its Study."""
from __future__ import annotations

from typing import Callable

from jaxdecouple.study.core import Study
from jaxdecouple.study.definitions import (cpu_cifar10, cpu_cifar10_converged, cpu_cifar10_converged_why,
                                           cpu_cifar10_correctors, cpu_cifar10_fdg_beta, cpu_cifar10_resist,
                                           cpu_cifar10_resist_ablations, cpu_cifar10_resist_compressed,
                                           cpu_cifar10_resist_depth, cpu_cifar10_resist_outer, cpu_cifar10_resist_release,
                                           cpu_cifar10_resist_why, cpu_cifar10_why, cpu_fmnist, cpu_fmnist_why,
                                           cpu_gpt_async, cpu_shapes_detection, gpu_cifar10, tiny)

STUDIES: dict[str, Callable[[], Study]] = {
    m.__name__.rsplit('.', 1)[1]: m.study
    for m in (cpu_fmnist, cpu_fmnist_why, cpu_cifar10, cpu_cifar10_why, cpu_cifar10_converged,
              cpu_cifar10_converged_why, cpu_cifar10_correctors, cpu_cifar10_fdg_beta, cpu_cifar10_resist,
              cpu_cifar10_resist_ablations, cpu_cifar10_resist_compressed, cpu_cifar10_resist_depth,
              cpu_cifar10_resist_outer, cpu_cifar10_resist_release, cpu_cifar10_resist_why, cpu_gpt_async,
              cpu_shapes_detection, gpu_cifar10, tiny)}
