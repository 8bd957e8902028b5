"""The end of a round: shared layers averaged, partitioned blocks sent to their next owners, and what it moved.

Every ``local_steps`` iterations the shared layers are averaged over all workers (one all-reduce of the
shared layers only, or, compressed, an all-gather of each worker's encoded buffer); each partitioned
block travels as one flat float32 *row* (parameters, statistics and, when averaged, momentum) from the
worker(s) that trained it to its owner(s) of the next round (``exchange.py``), averaged over its previous
owners where a minimum depth lets several hold one. The bytes that crossed a device boundary are counted
from the arrays handed to the transfers and to the collectives. ``averaged`` gathers the whole network
(evaluation, unlike training, needs it in one place).
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

from jaxdecouple.models.slots import SlotGroup
from jaxdecouple.replica import exchange, wire
from jaxdecouple.replica.layout import Layout, ReplicaState, in_slots, shared_sizes

AXIS = 'worker'


class Traffic(NamedTuple):
  """Bytes one round moved across device boundaries, per device (counted from the arrays sent)."""
  sent: np.ndarray
  received: np.ndarray
  all_reduce: int      # bytes of the shared layers each device contributed to the all-reduce


class Averaging:
  """The compiled end-of-round programs of one engine, over its 'worker' mesh."""

  def __init__(self, layout: Layout, mesh: Mesh, per_device: int, optimizer_init=None, momentum: str = 'restart',
               quantize_bits: int = 0, sparsify: float = 0.0, stats_every: int = 1):
    self.layout, self.mesh, self.per_device, self.optimizer_init = layout, mesh, per_device, optimizer_init
    self.devices = list(mesh.devices.flat)
    self.num_workers = layout.num_workers
    self.momentum, self.quantize_bits, self.sparsify, self.stats_every = momentum, quantize_bits, sparsify, stats_every
    self._codecs: list[wire.Codec | None] | None = None  # by group, made at the first round (row widths)

  @property
  def compresses(self) -> bool:
    return bool(self.quantize_bits or self.sparsify)

  # --- rows: a slot's block as one flat float32 row -------------------------------------------------
  def moving(self, params, stats, opt_state):
    """What travels with a block: its parameters and statistics, and its momentum when averaged."""
    return (params, stats, opt_state if self.momentum == 'average' else ())

  def pack(self, tree, g: SlotGroup):
    """Group g's slot leaves (..., slots, *shape) of this device -> rows (workers here * slots, R), float32."""
    leaves = [x for path, x in jax.tree_util.tree_flatten_with_path(tree)[0] if in_slots(path, g.key)]
    return jnp.concatenate([x.reshape(self.per_device * g.slots, -1).astype(jnp.float32) for x in leaves],
                           axis=1)

  def row_width(self, state: ReplicaState, g: SlotGroup | None = None) -> int:
    g = g or self.layout.groups[0]
    leaves = [x for path, x in jax.tree_util.tree_flatten_with_path(self.moving(
        state.params, state.batch_stats, state.opt_state))[0] if in_slots(path, g.key)]
    return sum(int(np.prod(x.shape[2:])) for x in leaves)

  @staticmethod
  def split_rows(rows, leaves):
    """The columns of ``rows`` that hold each slot leaf of ``leaves`` (the order ``pack`` wrote them)."""
    start = 0
    for x in leaves:
      size = int(np.prod(x.shape[2:]))
      yield x, rows[:, start:start + size]
      start += size

  def unpack_into(self, rows, tree, g: SlotGroup):
    """Group g's rows (workers here * slots, R) -> ``tree`` with g's slot leaves (workers here, slots, ...)
    replaced."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
    moved = iter(cols.reshape(x.shape).astype(x.dtype)
                 for x, cols in self.split_rows(rows, [x for path, x in flat if in_slots(path, g.key)]))
    return jax.tree_util.tree_unflatten(treedef, [next(moved) if in_slots(path, g.key) else x for path, x in flat])

  @functools.cached_property
  def pack_rows(self):
    """The state's slots as rows, one per (worker, slot), sharded over the workers' devices: a tuple, one
    array per group."""
    w = P(AXIS)
    f = jax.shard_map(lambda p, s, o: tuple(self.pack(self.moving(p, s, o), g) for g in self.layout.groups),
                      mesh=self.mesh, in_specs=(w, w, w), out_specs=w, check_vma=False)
    return jax.jit(lambda st: f(st.params, st.batch_stats, st.opt_state))

  # --- the shared layers ----------------------------------------------------------------------------
  def mean(self, x):
    """A (workers here, ...) leaf averaged over all workers: summed here, then all-reduced."""
    return (jax.lax.psum(jnp.sum(x.astype(jnp.float32), axis=0), AXIS) / self.num_workers).astype(x.dtype)

  def _shared_compressed(self, params):
    """Shared parameters sent compressed: each worker's encoded (one uint8 buffer per worker), gathered
    by every device, decoded and averaged in worker order; every worker ends with the same average."""
    bits, keep = self.quantize_bits, self.sparsify
    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
    shared = [x for path, x in flat if not in_slots(path)]
    sizes = [int(np.prod(x.shape[1:])) for x in shared]
    buffers = jnp.concatenate([jax.vmap(lambda v: wire.encode(v.reshape(-1).astype(jnp.float32), bits, keep))(x)
                               for x in shared], axis=1)
    everyone = jax.lax.all_gather(buffers, AXIS, tiled=True)  # (S, bytes)
    means, start = [], 0
    for x, n in zip(shared, sizes):
      size = wire.encoded_size(n, bits, keep)
      decoded = jax.vmap(lambda b: wire.decode(b, n, bits, keep))(everyone[:, start:start + size])
      means.append(jnp.broadcast_to((jnp.sum(decoded, axis=0) / self.num_workers).reshape(x.shape[1:]).astype(x.dtype),
                                    x.shape))
      start += size
    out = iter(means)
    return jax.tree_util.tree_unflatten(treedef, [x if in_slots(path) else next(out) for path, x in flat])

  def _finish(self, params, stats, opt_state, rows, sync_stats):
    """Shared layers averaged over all workers (their BatchNorm statistics only where ``sync_stats``:
    in between, each worker keeps its own); slots from the assembled rows; momentum restarted unless
    averaged."""
    shared = lambda tree: jax.tree_util.tree_map_with_path(
        lambda path, x: x if in_slots(path) else jnp.broadcast_to(self.mean(x), x.shape), tree)
    params = self._shared_compressed(params) if self.compresses else shared(params)
    stats = jax.tree.map(lambda avg, x: jnp.where(sync_stats, avg, x), shared(stats), stats)
    opt_state = shared(opt_state) if self.momentum == 'average' else opt_state
    if self.layout.index:
      moved = self.moving(params, stats, opt_state)
      for g, group_rows in zip(self.layout.groups, rows):
        moved = self.unpack_into(group_rows, moved, g)
      params, stats = moved[0], moved[1]
      if self.momentum == 'average':
        opt_state = moved[2]
    if self.momentum != 'average':  # restarted: as the optimizer initialises it (zeros for SGD's momentum)
      opt_state = jax.vmap(self.optimizer_init)(params)
    return params, stats, opt_state

  @functools.cached_property
  def finish(self):
    """``(state, rows, next membership, sync_stats) -> state``: the round's last program, compiled once."""
    w = P(AXIS)
    f = jax.shard_map(self._finish, mesh=self.mesh, in_specs=(w, w, w, w, P()), out_specs=(w, w, w),
                      check_vma=False)

    def fin(state: ReplicaState, rows, next_membership, sync_stats):
      p, st, o = f(state.params, state.batch_stats, state.opt_state, rows, sync_stats)
      return ReplicaState(p, st, o, next_membership)
    return jax.jit(fin, donate_argnums=0)

  # --- bytes ------------------------------------------------------------------------------------------
  def shared_bytes(self, state: ReplicaState) -> int:
    """Bytes one device puts into the collectives over the shared layers: float32 statistics (and
    momentum when averaged) summed over its workers into the all-reduce, and the parameters likewise,
    or, compressed, each of its workers' encoded parameters into the all-gather."""
    rest = sum(shared_sizes((state.batch_stats, state.opt_state if self.momentum == 'average' else ())))
    params = shared_sizes(state.params)
    if self.compresses:
      return 4 * rest + self.per_device * sum(wire.encoded_size(n, self.quantize_bits, self.sparsify) for n in params)
    return 4 * (rest + sum(params))

  def stats_bytes(self, state: ReplicaState) -> int:
    """Bytes of one worker's shared BatchNorm statistics (float32)."""
    return 4 * sum(shared_sizes(state.batch_stats))

  def codec(self, state: ReplicaState, g: SlotGroup | None = None) -> wire.Codec | None:
    """How a block's row (of group g, default the first) is encoded on the wire (parameters compressed), or
    None."""
    if not self.compresses:
      return None
    g = g or self.layout.groups[0]
    sizes = [int(np.prod(x.shape[2:])) for path, x in jax.tree_util.tree_flatten_with_path(state.params)[0]
             if in_slots(path, g.key)]
    return wire.Codec(sizes, self.row_width(state, g), self.quantize_bits, self.sparsify)

  # --- the round ----------------------------------------------------------------------------------
  def aggregate(self, state: ReplicaState, round_index: int, put_workers) -> tuple[ReplicaState, Traffic]:
    """The end of round ``round_index``: shared layers all-reduced, blocks sent to their next owners.
    Returns the new state and the bytes the round moved."""
    layout = self.layout
    nxt = layout.membership(round_index + 1)
    devices = len(self.devices)
    sent, received, moved = np.zeros(devices, np.int64), np.zeros(devices, np.int64), []
    if layout.index:
      now = layout.membership(round_index)
      if self._codecs is None:
        self._codecs = [self.codec(state, g) for g in layout.groups]
      for g, rows, codec in zip(layout.groups, self.pack_rows(state), self._codecs):
        route = exchange.plan(now[:, g.columns], nxt[:, g.columns], g.slots, self.per_device,
                              coded=codec is not None)
        rows, out, into = exchange.run(rows, route, self.devices, codec)
        moved.append(rows)
        sent, received = sent + out, received + into
    reduce = self.shared_bytes(state) if devices > 1 else 0
    sync = (round_index + 1) % self.stats_every == 0
    if not sync:  # the statistics stay out of this round's all-reduce
      reduce -= self.stats_bytes(state) if devices > 1 else 0
    new = self.finish(state, tuple(moved), put_workers(nxt), np.bool_(sync))
    return new, Traffic(sent, received, reduce)

  # --- the whole network ----------------------------------------------------------------------------
  @functools.cached_property
  def averaged(self):
    """The averaged network of the current state (mid-round too), without changing the state: shared
    layers averaged over all workers, each partitioned block over the workers holding it (gathered from
    their slots)."""
    w = P(AXIS)
    f = jax.shard_map(self._whole, mesh=self.mesh, in_specs=(w, w, w), out_specs=(P(), P()), check_vma=False)
    return jax.jit(lambda st: f(st.params, st.batch_stats, st.membership))

  def _whole(self, params, stats, member):
    layout = self.layout
    mean = lambda tree: {n: jax.tree.map(self.mean, v) for n, v in tree.items() if n not in layout.keys}
    out_params, out_stats = mean(params), mean(stats)
    if layout.index:
      everyone = jax.lax.all_gather(member, AXIS, tiled=True)  # (S, P)
    for g in layout.groups:
      rows = jax.lax.all_gather(self.pack((params, stats), g), AXIS, tiled=True)  # (S * slots, R)
      member = everyone[:, g.columns]
      position = jnp.cumsum(member, axis=1) - 1  # a block's slot on each worker holding it
      total = 0.0
      for w in range(self.num_workers):  # selected, not weighted: one holder passes through exactly
        total = total + jnp.where(member[w][:, None], rows[w * g.slots + jnp.maximum(position[w], 0)], 0.0)
      blocks = total / jnp.maximum(jnp.sum(member, axis=0), 1)[:, None].astype(jnp.float32)
      template = (params[g.key], stats.get(g.key, {}))
      flat, treedef = jax.tree_util.tree_flatten(template)
      p, s = jax.tree_util.tree_unflatten(treedef, [cols.reshape(-1, *x.shape[2:]).astype(x.dtype)
                                                    for x, cols in self.split_rows(blocks, flat)])
      for b, name in enumerate(g.names):
        out_params[name] = jax.tree.map(lambda x: x[b], p)
        if s:
          out_stats[name] = jax.tree.map(lambda x: x[b], s)
    order = {n: i for i, n in enumerate(layout.chain.names)}
    ordered = lambda tree: {n: tree[n] for n in sorted(tree, key=order.__getitem__)}
    return ordered(out_params), ordered(out_stats)
