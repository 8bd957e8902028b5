"""Running a chain whose run of alike blocks is stored in slots: a replica worker's sub-network.

A ResIST worker stores, in place of each group of contiguous, identical partitioned blocks, a fixed
number of *slots* (``variables[c][group.key]``, leaves stacked on a slot axis): slot j holds the j-th
block the worker owns, in chain order, and the slots a smaller sub-network leaves over are zero.
Running the sub-network is running the chain with each group replaced by its valid slots, one after
another, with the model's own block application (``core.apply_block``).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import jax
import jax.numpy as jnp

from jaxdecouple.models.core import Chain, apply_block

SLOTS = 'slots'  # the key under which a group of partitioned blocks sits, stacked on a slot axis
SKIPS = ('gather', 'cond')


@dataclasses.dataclass(frozen=True)
class SlotGroup:
  """Partitioned blocks of one definition, contiguous in the chain, stored in ``slots`` slots under ``key``;
  their columns of a membership matrix start at ``start``."""
  key: str
  names: tuple[str, ...]
  start: int
  slots: int

  @property
  def columns(self) -> slice:
    return slice(self.start, self.start + len(self.names))


def check_partitioned_run(chain: Chain, partitioned: Sequence[str]) -> None:
  """Slots replace the partitioned blocks in place: they must be contiguous and of one definition."""
  if not partitioned:
    return
  names = list(chain.names)
  first = names.index(partitioned[0])
  if tuple(names[first:first + len(partitioned)]) != tuple(partitioned):
    raise ValueError('the partitioned blocks must be contiguous in the chain')
  modules = dict(zip(chain.names, chain.modules))
  if any(modules[n] != modules[partitioned[0]] for n in partitioned):
    raise ValueError('the partitioned blocks differ in definition')


def slot_apply(chain: Chain, partitioned, variables, x, valid, train: bool, skip: str = 'gather'):
  """Runs one worker's sub-network: the shared blocks by name and, in place of each group of (contiguous,
  alike) partitioned blocks, the worker's slots ``variables[c][group.key]`` in order, slot j only where
  ``valid[group.key][j]``. ``partitioned``: the groups (``SlotGroup``), or one group's block names (stored
  under SLOTS, ``valid`` then that group's array). Returns the output and the new batch statistics (a
  skipped slot's unchanged).

  ``skip='gather'``: every slot is computed and an empty slot's output dropped with ``jnp.where`` (its
  zero parameters keep it finite; its gradient is exactly zero); no control flow, full speed on every
  backend. ``skip='cond'``: ``lax.cond`` per slot (XLA:CPU runs convolutions inside it ~20x slower)."""
  if partitioned and isinstance(partitioned[0], str):
    partitioned, valid = (SlotGroup(SLOTS, tuple(partitioned), 0, int(valid.shape[0])),), {SLOTS: valid}
  group_of = {n: g for g in partitioned for n in g.names}
  new_stats = {}
  for name, module in zip(chain.names, chain.modules):
    if name in group_of:
      g = group_of[name]
      if name == g.names[0]:
        stacked = {c: v[g.key] for c, v in variables.items() if g.key in v}
        x, stats = _run_slots(module, stacked, x, valid[g.key], train, skip)
        if stats is not None:
          new_stats[g.key] = stats
      continue
    block = {c: v[name] for c, v in variables.items() if name in v}
    x, stats = apply_block(module, block, x, train)
    if stats is not None:
      new_stats[name] = stats
  return x, new_stats


def _run_slots(module, stacked, x, valid, train: bool, skip: str):
  new = []
  for j in range(valid.shape[0]):  # a collection is stacked, or (parameters under grad) a list of slots
    block = {c: v[j] if isinstance(v, list) else jax.tree.map(lambda s: s[j], v) for c, v in stacked.items()}
    if skip == 'cond':
      x, stats = jax.lax.cond(valid[j], functools.partial(apply_block, module, train=train),
                              lambda block, x: (x, block.get('batch_stats')), block, x)
    else:
      y, stats = apply_block(module, block, x, train)
      x = jnp.where(valid[j], y, x)
      if stats is not None:
        stats = jax.tree.map(lambda n, o: jnp.where(valid[j], n, o), stats, block['batch_stats'])
    if stats is not None:
      new.append(stats)
  return x, (jax.tree.map(lambda *s: jnp.stack(s), *new) if new else None)
