"""Where each worker's blocks live: shared blocks by name, partitioned ones in slots, and the partitions.

A worker holds the shared layers (every block outside the partitioned section) and, for ResIST, only the
partitioned blocks it owns this round, in fixed slots (``params[SLOTS]``, leaves (S, slots, ...); likewise
BatchNorm statistics and momentum): slot j holds the worker's j-th block in chain order, the slots a
smaller sub-network leaves over are zero. With the naive partition (``scope='every_section'``) the
partitioned blocks come in several groups (one per section, blocks of different shapes), each in its own
slots (``params['slots_s1']`` and so on; the third section's stay under SLOTS) and dealt out on its own.
Host-side conversions between one network and the workers' layout live here; nothing here runs a step.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxdecouple.models import Model, count_params
from jaxdecouple.models.slots import SLOTS, SlotGroup, check_partitioned_run
from jaxdecouple.replica.partition import draw_partition, partitioned_groups


class ReplicaState(NamedTuple):
  params: Any          # shared blocks by name, leaves (S, ...); ResIST: SLOTS, leaves (S, slots, ...)
  batch_stats: Any
  opt_state: Any
  membership: Any      # (S, P) bool: worker w runs partitioned block b this round (groups side by side); ()
                       # for local SGD
  outer: Any = {}      # the outer optimizer's state in the same layout (replica/outer.py): anchor, momentum,
                       # unsent error; {} for plain averaging


def slot_count(num_blocks: int, num_workers: int, min_depth: int = 0) -> int:
  """The most partitioned blocks one sub-network can own: ceil(P / S), or the minimum depth."""
  return min(num_blocks, max(-(-num_blocks // num_workers), min_depth))


def slot_key(path) -> str | None:
  """The slot group a leaf belongs to (its key: SLOTS or SLOTS_s1...), or None for a shared leaf."""
  for k in path:
    if isinstance(k, jax.tree_util.DictKey) and isinstance(k.key, str) and \
        (k.key == SLOTS or k.key.startswith(SLOTS + '_')):
      return k.key
  return None


def in_slots(path, key: str | None = None) -> bool:
  """Whether a leaf sits in slots (of group ``key`` when given)."""
  found = slot_key(path)
  return found is not None and (key is None or found == key)


def shared_sizes(tree) -> list[int]:
  """Values per worker of each shared (not slot) leaf of a workers' layout tree."""
  return [int(np.prod(x.shape[1:])) for path, x in jax.tree_util.tree_flatten_with_path(tree)[0] if not in_slots(path)]


class Layout:
  """The slot groups of a model under a partition scheme, and the conversions to and from them."""

  def __init__(self, model: Model, num_workers: int, seed: int, partition: bool, scope: str = 'third_section',
               min_depth: int = 0, redraw: bool = True):
    self.model, self.chain = model, model.chain
    self.num_workers, self.seed, self.scope, self.min_depth, self.redraw = num_workers, seed, scope, min_depth, redraw
    groups, start = [], 0
    for names in (partitioned_groups(model, scope) if partition else ()):
      check_partitioned_run(self.chain, names)
      section = model.sections[names[0]][0]
      key = SLOTS if scope == 'third_section' or section == 2 else f'{SLOTS}_s{section + 1}'
      key = key if key not in {g.key for g in groups} else f'{key}_{len(groups)}'  # two runs in one section
      groups.append(SlotGroup(key, names, start, slot_count(len(names), num_workers, min_depth)))
      start += len(names)
    self.groups: tuple[SlotGroup, ...] = tuple(groups)
    self.keys = frozenset(g.key for g in self.groups)
    self.partitioned = tuple(n for g in self.groups for n in g.names)
    self.index = {n: i for i, n in enumerate(self.partitioned)}
    self.slots = sum(g.slots for g in self.groups)  # slots per worker, all groups

  def membership(self, round_index: int):
    """Round ``round_index``'s (S, P) membership; () when nothing is partitioned (local SGD)."""
    if not self.groups:
      return ()
    r = round_index if self.redraw else 0
    if self.scope == 'third_section':
      return draw_partition(len(self.partitioned), self.num_workers, self.seed, r, self.min_depth)
    return np.concatenate([draw_partition(len(g.names), self.num_workers, self.seed, r, self.min_depth,
                                          group=i + 1, allow_idle=True) for i, g in enumerate(self.groups)], axis=1)

  def valid(self, member) -> dict:
    """Which of a worker's slots hold a block, per group: the first as many as it owns."""
    return {g.key: jnp.arange(g.slots) < jnp.sum(member[g.columns]) for g in self.groups}

  def to_workers(self, network, member) -> dict:
    """One network (block name -> subtree, host arrays) -> the workers' layout (host arrays): each
    shared block stacked S times; with partitioned blocks, each group's key: worker w's blocks of
    ``member`` in chain order, its leftover slots zero."""
    S = self.num_workers
    out = {n: jax.tree.map(lambda x: np.broadcast_to(x, (S, *np.shape(x))), v)
           for n, v in network.items() if n not in self.index}
    for g in self.groups:
      if g.names[0] not in network:  # a collection without this block (no statistics)
        continue
      empty = jax.tree.map(np.zeros_like, network[g.names[0]])
      workers = []
      for w in range(S):
        blocks = [network[g.names[b]] for b in np.flatnonzero(np.asarray(member)[w, g.columns])]
        blocks += [empty] * (g.slots - len(blocks))
        workers.append(jax.tree.map(lambda *xs: np.stack(xs), *blocks))
      out[g.key] = jax.tree.map(lambda *xs: np.stack(xs), *workers)
    return out

  def worker_network(self, tree, member, w: int) -> dict:
    """Worker ``w``'s blocks by name (shared ones and the partitioned ones it holds) from a workers'
    layout tree (host arrays): what the worker stores, under the blocks' own names."""
    out = {n: jax.tree.map(lambda x: np.asarray(x)[w], v) for n, v in tree.items() if n not in self.keys}
    for g in self.groups:
      if g.key in tree:
        for j, b in enumerate(np.flatnonzero(np.asarray(member)[w, g.columns])):
          out[g.names[b]] = jax.tree.map(lambda x: np.asarray(x)[w, j], tree[g.key])
    return out

  def network_shapes(self, params) -> dict:
    """One whole network's parameters as shapes (block name -> subtree), from the workers' layout."""
    shape = lambda lead: lambda x: jax.ShapeDtypeStruct(x.shape[lead:], x.dtype)
    out = {n: jax.tree.map(shape(1), v) for n, v in params.items() if n not in self.keys}
    for g in self.groups:
      for n in g.names if g.key in params else ():
        out[n] = jax.tree.map(shape(2), params[g.key])
    return out

  def parameter_counts(self, params) -> tuple[int, dict[str, int]]:
    """(shared parameters, parameters of each partitioned block) of one network."""
    sizes = {n: count_params(params[n]) for n in params}
    shared = sum(v for n, v in sizes.items() if n not in self.index)
    return shared, {n: sizes[n] for n in self.partitioned}

  def per_parameter_to_workers(self, tree, params_structure, member):
    """An optimizer state of one network -> the workers' layout: every subtree shaped like the parameters
    (momentum, Adam's moments) converted with ``to_workers``, every other leaf (a step count) stacked S
    times. Reads no optimizer's internals: only the parameters' tree structure."""
    S = self.num_workers
    is_params = lambda node: jax.tree.structure(node) == params_structure
    convert = lambda node: (self.to_workers(node, member) if is_params(node)
                            else np.broadcast_to(node, (S, *np.shape(node))))
    return jax.tree.map(convert, tree, is_leaf=is_params)
