"""What several studies share: their recipes' builders and what their data is."""
from __future__ import annotations

from jaxdecouple.config import get_default_config, set_fields

CIFAR10_DATA = ('CIFAR-10 from a JPEG-compressed copy (each image a quality-75 JPEG, read as it is: docs/DATA.md): '
                "not the original PNGs, so absolute errors are not the paper's data")
CIFAR10_FILE = '--data_path to the CIFAR-10 .npz (the JPEG copy is read as it is)'
FMNIST_DATA = ('Fashion-MNIST (the Debian package dataset-fashion-mnist; 60k train / 10k test), no augmentation')


def fmnist(method: str, model: str, epochs: int = 3, **fields):
  """SGD lr 0.1 on Fashion-MNIST for ``epochs``, lr / 10 for the last, then ``fields``."""
  def build():
    c = get_default_config()
    c.method, c.model, c.dataset = method, model, 'fashion_mnist'
    c.data.source, c.data.augment = 'idx', False
    c.num_epochs, c.optim.milestones, c.optim.learning_rate = epochs, (epochs - 1,), 0.1
    c.log_every_steps, c.checkpoint_every_steps, c.profile_every_steps = 50, 200, 0
    return set_fields(c, fields)
  return build


def cifar10(method: str, epochs: int = 30, k: int = 2, beta: float = 1.0, warmup: bool = False,
            model: str = 'resnet56', milestones: tuple[int, ...] | None = None):
  """The FDG paper's CIFAR-10 recipe shortened to ``epochs`` (milestones scaled unless given)."""
  def build():
    from jaxdecouple.recipes import fdg_paper
    c = fdg_paper(method, model, 'cifar10', num_stages=k, beta=beta, warmup=warmup)
    c.num_epochs = epochs
    c.optim.milestones = milestones or tuple(int(round(m * epochs / 300)) for m in (150, 225, 275))
    c.data.source = 'npz'
    return c
  return build
# cpu_cifar10_resist's workdir keeps benchmarks/resist_round.py's one-round records of each wire setting on its
# network at S = 4, one worker per CPU device (the runs train on one device, where no byte crosses one): written by
#   for s in "" --quantize_bits=8 --quantize_bits=6 --quantize_bits=5 --quantize_bits=4 --sparsify=0.25 \
#            "--compress=updates --quantize_bits=8" "--compress=updates --quantize_bits=4" \
#            "--compress=updates --sparsify=0.25" "--compress=updates --update_exchange=two_stage --quantize_bits=8" \
#            "--compress=updates --update_exchange=two_stage --quantize_bits=4" \
#            "--compress=updates --update_exchange=two_stage --sparsify=0.25" "--outer_lr=0.7 --outer_momentum=0.9" \
#            "--outer_lr=1.0 --outer_momentum=0.5" "--outer_lr=0.4 --outer_momentum=0.9" \
#            "--outer_lr=1.5 --outer_momentum=0.0"; do python benchmarks/resist_round.py --model=preact_tiny_s3_9 \
#     --batch=32 --local_steps=2 --workers=4 --rounds=1 --cpu_devices=4 $s \
#     --json_out=studies/cpu_cifar10_resist/budget.jsonl; done
BUDGET = 'budget.jsonl'
