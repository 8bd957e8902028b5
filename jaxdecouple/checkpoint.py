"""Checkpoints of any method's state with orbax-checkpoint.

A state is saved as the flat list of its leaves; it is restored into the structure and the device
placement of a freshly initialised state (the template), so pipeline stages come back on their own
devices. The latest checkpoint that restores wins: a damaged or half-written one is skipped with a
warning in favour of the one before. A checkpoint whose arrays do not match the config (another
model, K or method) stops the run with a message rather than being silently ignored.
"""
from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp
from absl import logging

from jaxdecouple.errors import CheckpointError


class Checkpointer:

  def __init__(self, directory: str, keep: int):
    self.directory = os.path.abspath(directory)
    self._manager = ocp.CheckpointManager(
        self.directory, item_handlers=ocp.StandardCheckpointHandler(),
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True))

  def all_steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def save(self, step: int, state: Any) -> None:
    """Starts an asynchronous save; training continues while it is written."""
    self._manager.save(step, args=ocp.args.StandardSave({'leaves': jax.tree.leaves(state)}), force=True)

  def restore_latest(self, template: Any) -> tuple[int, Any] | None:
    """(step, state) from the newest checkpoint that restores, or None when there is none."""
    leaves, treedef = jax.tree.flatten(template)
    abstract = {'leaves': [jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding) for x in leaves]}
    steps = self.all_steps()
    for step in reversed(steps):
      self._check_matches(step, leaves)
      try:
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
    source = os.path.join(self.directory, str(step))
    target, n = f'{source}.damaged', 1
    while os.path.exists(target):
      n += 1
      target = f'{source}.damaged{n}'
    os.rename(source, target)
    self._manager.reload()
    return target

  def _check_matches(self, step: int, leaves) -> None:
    try:
      saved = self._manager.item_metadata(step).tree['leaves']
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
