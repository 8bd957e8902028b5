"""Checkpoints of any method's state with orbax-checkpoint.

A state is saved as the flat list of its leaves; it is restored into the structure and the device
placement of a freshly initialised state (the template), so pipeline stages come back on their own
devices. The latest checkpoint that restores wins: a damaged or half-written one is skipped with a
warning in favour of the one before. A checkpoint whose arrays do not match the config (another
model, K or method) stops the run with a message rather than being silently ignored.
"""
from __future__ import annotations

import json
import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

from jaxdecouple.errors import CheckpointError


class Checkpointer:
  """``per_process``: a multi-process pipeline, whose stages live each on one process's device: every
  process writes the arrays it holds (its stages, their rings and inboxes) to a folder of its own,
  ``process_P``, and on resume the processes agree on the newest step all of them have."""

  def __init__(self, directory: str, keep: int, per_process: bool = False):
    self.per_process = per_process and jax.process_count() > 1
    self.root = os.path.abspath(directory)  # the same in every process
    if self.per_process:
      directory = os.path.join(directory, f'process_{jax.process_index()}')
    self.directory = os.path.abspath(directory)
    if self.per_process:  # orbax writes only global arrays across processes: this process's own files
      self._manager = _ProcessFiles(self.directory, keep)
    else:
      self._manager = ocp.CheckpointManager(
          self.directory, item_handlers=ocp.StandardCheckpointHandler(),
          options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True))

  def all_steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def _mine(self, leaves: list) -> list:
    """The leaves this process writes: all of them, or, per process, those on its devices."""
    return [x for x in leaves if not self.per_process or x.is_fully_addressable]

  def save(self, step: int, state: Any) -> None:
    """Starts an asynchronous save; training continues while it is written."""
    if self.per_process:
      self._manager.save(step, [np.asarray(x) for x in self._mine(jax.tree.leaves(state))])
      return
    self._manager.save(step, args=ocp.args.StandardSave({'leaves': jax.tree.leaves(state)}), force=True)

  def _common_steps(self, steps: list[int]) -> list[int]:
    """Per process: the steps every process has a checkpoint of (the processes resume together)."""
    if not self.per_process:
      return steps
    from jax._src import distributed
    client, me = distributed.global_state.client, jax.process_index()
    key = f'jaxdecouple/checkpoints/{self.root}/{Checkpointer._round}'
    Checkpointer._round += 1
    client.key_value_set(f'{key}/{me}', json.dumps(steps))
    common = set(steps)
    for p in range(jax.process_count()):
      common &= set(json.loads(client.blocking_key_value_get(f'{key}/{p}', 600_000)))
    return sorted(common)

  _round = 0

  def restore_latest(self, template: Any) -> tuple[int, Any] | None:
    """(step, state) from the newest checkpoint that restores, or None when there is none."""
    leaves, treedef = jax.tree.flatten(template)
    mine = self._mine(leaves)
    abstract = {'leaves': [jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=None if self.per_process else x.sharding)
                           for x in mine]}
    steps = self._common_steps(self.all_steps())
    for step in reversed(steps):
      self._check_matches(step, mine)
      try:
        if self.per_process:  # back onto the devices of the template's arrays; the others stay placeholders
          arrays = iter(jax.device_put(x, t.sharding) for x, t in zip(self._manager.restore(step), mine))
          restored = {'leaves': [next(arrays) if t.is_fully_addressable else t for t in leaves]}
        else:
          restored = self._manager.restore(step, args=ocp.args.StandardRestore(abstract))
      except Exception as e:  # damaged files: missing, truncated, unreadable metadata
        aside = self._move_aside(step)
        logging.warning('checkpoint at step %d is damaged or incomplete (%s: %s); moved it to %s and '
                        'trying an earlier one', step, type(e).__name__,
                        str(e).splitlines()[0][:160], aside)
        continue
      return step, jax.tree.unflatten(treedef, restored['leaves'])
    if steps:
      raise CheckpointError(f'none of the checkpoints in {self.directory} (steps {steps}) could be '
                            'restored; remove that folder to start afresh or use another --workdir')
    return None

  def _move_aside(self, step: int) -> str:
    """Renames a damaged checkpoint so that the step can be written again, keeping the files."""
    source = os.path.join(self.directory, str(step) + ('.npz' if self.per_process else ''))
    target, n = f'{source}.damaged', 1
    while os.path.exists(target):
      n += 1
      target = f'{source}.damaged{n}'
    os.rename(source, target)
    self._manager.reload()
    return target

  def _check_matches(self, step: int, leaves) -> None:
    try:
      saved = self._manager.item_metadata(step).tree['leaves'] if not self.per_process else \
          self._manager.shapes(step)
    except Exception:  # unreadable metadata: restore will fail and fall back to an earlier one
      return
    if len(saved) != len(leaves) or any(
        tuple(s.shape) != tuple(x.shape) for s, x in zip(saved, leaves)):
      raise CheckpointError(
          f'the checkpoint at step {step} in {self.directory} was written by a different config '
          f'(its state has {len(saved)} arrays, this config makes {len(leaves)}, or shapes differ); '
          'resume with the config it was made with, or use another --workdir')

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()


class _ProcessFiles:
  """One process's own checkpoints in a multi-process pipeline: a step's arrays in ``STEP.npz``, written
  to a temporary name and renamed when complete (a crash leaves no half file under a step's name), the
  newest ``keep`` kept. Saves are synchronous."""

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
    for old in self.all_steps()[:-self.keep] if self.keep else []:
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
