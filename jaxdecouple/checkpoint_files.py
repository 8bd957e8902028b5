"""One process's own checkpoint files in a multi-process pipeline (``checkpoint.Checkpointer`` with
``per_process``): plain ``.npz`` files, since orbax writes only global arrays across processes."""
from __future__ import annotations

import os

import numpy as np


class ProcessFiles:
  """One process's own checkpoints in a multi-process pipeline: a step's arrays in ``STEP.npz``, written
  to a temporary name and renamed when complete (a crash leaves no half file under a step's name), the
  newest ``keep`` kept, and never fewer than 2: each process writes its own files, so a process killed after
  another had written a step and deleted the one before, but before it wrote that step itself, must still
  share the step before with the others (with one kept, no step would restore). Saves are synchronous."""

  def __init__(self, directory: str, keep: int):
    self.directory, self.keep = directory, keep
    os.makedirs(directory, exist_ok=True)

  def _path(self, step: int) -> str:
    return os.path.join(self.directory, f'{step}.npz')

  def all_steps(self) -> list[int]:
    return sorted(int(f[:-4]) for f in os.listdir(self.directory) if f.endswith('.npz') and f[:-4].isdigit())

  def save(self, step: int, leaves: list) -> None:
    tmp = self._path(step) + '.tmp'
    with open(tmp, 'wb') as f:
      np.savez(f, *leaves)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, self._path(step))
    for old in self.all_steps()[:-max(self.keep, 2)] if self.keep else []:
      os.remove(self._path(old))

  def restore(self, step: int) -> list:
    with np.load(self._path(step)) as z:
      return [z[f'arr_{i}'] for i in range(len(z.files))]

  def shapes(self, step: int) -> list:
    with np.load(self._path(step)) as z:
      return [z[f'arr_{i}'] for i in range(len(z.files))]

  def reload(self) -> None:
    pass

  def wait_until_finished(self) -> None:
    pass

  def close(self) -> None:
    pass
