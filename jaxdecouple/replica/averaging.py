"""The end of a round: shared layers averaged, partitioned blocks sent to their next owners, and what it moved.

Every ``local_steps`` iterations the shared layers are averaged over all workers (``shared_layers.py``:
one all-reduce, or, compressed, an all-gather of each worker's encoded buffer); each partitioned block
travels as one flat float32 *row* (parameters, statistics and, when averaged, momentum; its outer
momentum with an outer optimizer) from the worker(s) that trained it to its owner(s) of the next round
(``exchange.py``), averaged over its previous owners where a minimum depth lets several hold one. With an
outer optimizer (``outer.py``) each holder takes the outer step of its blocks before they travel, and the
shared layers take theirs after the all-reduce. The bytes that crossed a device boundary are counted from
the arrays handed to the transfers and to the collectives. ``averaged`` gathers the whole network
(evaluation, unlike training, needs it in one place).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

from jaxdecouple.models.slots import SlotGroup
from jaxdecouple.replica import exchange, wire
from jaxdecouple.replica.layout import Layout, ReplicaState, in_slots, shared_sizes
from jaxdecouple.replica.outer import OuterOptimizer
from jaxdecouple.replica.shared_layers import AXIS, SharedLayers, shared_part
from jaxdecouple.replica.traffic import Traffic



class Averaging:
  """The compiled end-of-round programs of one engine, over its 'worker' mesh."""

  def __init__(self, layout: Layout, mesh: Mesh, per_device: int, optimizer_init=None, momentum: str = 'restart',
               quantize_bits: int = 0, sparsify: float = 0.0, stats_every: int = 1,
               outer: OuterOptimizer = OuterOptimizer(), updates: bool = False, error_feedback: bool = True,
               two_stage: bool = False):
    self.layout, self.mesh, self.per_device, self.optimizer_init = layout, mesh, per_device, optimizer_init
    self.devices = list(mesh.devices.flat)
    self.num_workers = layout.num_workers
    self.momentum, self.quantize_bits, self.sparsify, self.stats_every = momentum, quantize_bits, sparsify, stats_every
    self.shared = SharedLayers(layout.keys, self.num_workers, per_device, quantize_bits, sparsify, outer, updates,
                               error_feedback, two_stage)
    self.outer, self.updates, self.error_feedback = outer, self.shared.updates, self.shared.error_feedback
    self._codecs: list[wire.Codec | None] | None = None  # by group, made at the first round (row widths)

  @property
  def compresses(self) -> bool:
    return bool(self.quantize_bits or self.sparsify)

  @property
  def tracks(self) -> bool:
    """Whether the workers keep outer state (the round's anchor, outer momentum, the unsent error): with
    an outer optimizer other than plain averaging, or with compressed updates."""
    return not self.outer.plain or self.updates

  def outer_state(self, params) -> dict:
    """The outer state of workers whose round starts at ``params`` (the workers' layout, any arrays):
    the anchor (a copy), zero outer momentum, zero unsent error of the shared layers."""
    if not self.tracks:
      return {}
    zeros = lambda tree: jax.tree.map(lambda x: x * 0, tree)
    state = {'anchor': jax.tree.map(lambda x: x + 0, params)}
    if self.outer.momentum:
      state['momentum'] = zeros(params)
    if self.error_feedback:
      state['error'] = zeros(shared_part(self.layout.keys, params))
      if self.shared.two_stage:  # each worker's unsent error of the chunk it averages
        state['chunk_error'] = np.zeros((self.num_workers, self.shared.chunk(sum(shared_sizes(params)))), np.float32)
    return state

  # --- rows: a slot's block as one flat float32 row -------------------------------------------------
  def moving(self, params, stats, opt_state, outer_momentum=()):
    """What travels with a block: its parameters and statistics, its momentum when averaged, and its
    outer momentum when there is one."""
    return (params, stats, opt_state if self.momentum == 'average' else (), outer_momentum)

  def outer_slots(self, params, outer):
    """Each holder's outer step of its partitioned blocks, taken before they travel (see outer.py):
    (parameters, outer momentum), shared leaves as they were (momentum () without one)."""
    if self.outer.plain or not self.layout.keys:
      return params, outer.get('momentum', ())
    slots = lambda tree: {k: tree[k] for k in self.layout.keys}
    anchor = slots(outer['anchor'])
    delta = jax.tree.map(lambda a, p: a.astype(jnp.float32) - p.astype(jnp.float32), anchor, slots(params))
    new, m = self.outer.apply(anchor, delta, slots(outer['momentum']) if self.outer.momentum else ())
    return {**params, **new}, ({**outer['momentum'], **m} if self.outer.momentum else ())

  def pack(self, tree, g: SlotGroup):
    """Group g's slot leaves (..., slots, *shape) of this device -> rows (workers here * slots, R), float32."""
    leaves = [x for path, x in jax.tree_util.tree_flatten_with_path(tree)[0] if in_slots(path, g.key)]
    return jnp.concatenate([x.reshape(self.per_device * g.slots, -1).astype(jnp.float32) for x in leaves],
                           axis=1)

  def row_width(self, state: ReplicaState, g: SlotGroup | None = None) -> int:
    g = g or self.layout.groups[0]
    leaves = [x for path, x in jax.tree_util.tree_flatten_with_path(self.moving(
        state.params, state.batch_stats, state.opt_state, state.outer.get('momentum', ())))[0]
              if in_slots(path, g.key)]
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

    def rows(p, s, o, outer):
      p, m = self.outer_slots(p, outer)
      return tuple(self.pack(self.moving(p, s, o, m), g) for g in self.layout.groups)
    f = jax.shard_map(rows, mesh=self.mesh, in_specs=(w, w, w, w), out_specs=w, check_vma=False)
    return jax.jit(lambda st: f(st.params, st.batch_stats, st.opt_state, st.outer))

  def _finish(self, params, stats, opt_state, outer, rows, sync_stats: bool):
    """Shared layers averaged over all workers (or their outer step taken), their BatchNorm statistics only
    where ``sync_stats`` (in between, each worker keeps its own); slots from the assembled rows; momentum
    restarted unless averaged; the next round's anchor is where this one ends."""
    shared = lambda tree: jax.tree_util.tree_map_with_path(
        lambda path, x: x if in_slots(path) else jnp.broadcast_to(self.shared.mean(x), x.shape), tree)
    outer_momentum, errors = (), {}
    if self.tracks:
      params, outer_momentum, errors = self.shared.outer_step(params, outer)
    else:
      params = self.shared.compressed(params) if self.compresses else shared(params)
    stats = shared(stats) if sync_stats else stats
    opt_state = shared(opt_state) if self.momentum == 'average' else opt_state
    if self.layout.index:
      moved = self.moving(params, stats, opt_state, outer_momentum)
      for g, group_rows in zip(self.layout.groups, rows):
        moved = self.unpack_into(group_rows, moved, g)
      params, stats, _, outer_momentum = moved
      if self.momentum == 'average':
        opt_state = moved[2]
    if self.momentum != 'average':  # restarted: as the optimizer initialises it (zeros for SGD's momentum)
      opt_state = jax.vmap(self.optimizer_init)(params)
    if self.tracks:
      outer = {'anchor': params, **({'momentum': outer_momentum} if self.outer.momentum else {}), **errors}
    return params, stats, opt_state, outer

  @functools.cached_property
  def finish(self):
    """``{sync_stats: (state, rows, next membership) -> state}``: the round's last program, compiled once
    with the shared layers' statistics averaged and once without (their all-reduce really left out)."""
    w = P(AXIS)

    def program(sync_stats):
      f = jax.shard_map(functools.partial(self._finish, sync_stats=sync_stats), mesh=self.mesh,
                        in_specs=(w, w, w, w, w), out_specs=(w, w, w, w), check_vma=False)

      def fin(state: ReplicaState, rows, next_membership):
        p, st, o, outer = f(state.params, state.batch_stats, state.opt_state, state.outer, rows)
        return ReplicaState(p, st, o, next_membership, outer)
      return jax.jit(fin, donate_argnums=0)
    return {True: program(True), False: program(False)}

  # --- bytes ------------------------------------------------------------------------------------------
  def shared_bytes(self, state: ReplicaState) -> int:
    """Bytes one device puts into the collectives over the shared layers: float32 statistics (and
    momentum when averaged) summed over its workers into the all-reduce, and the parameters likewise,
    or, compressed, each of its workers' encoded parameters into the all-gather."""
    rest = sum(shared_sizes((state.batch_stats, state.opt_state if self.momentum == 'average' else ())))
    params = shared_sizes(state.params)
    if self.compresses:
      return 4 * rest + self.gathered_bytes(state) + self.all_to_all_bytes(state)
    return 4 * (rest + sum(params))

  def gathered_bytes(self, state: ReplicaState) -> int:
    """Bytes one device puts into the all-gather of encoded shared parameters (or updates): each of its
    workers' buffers (two-stage: each of its workers' encoded chunk); 0 without compression."""
    if not self.compresses:
      return 0
    bits, keep = self.quantize_bits, self.sparsify
    if self.shared.two_stage:
      return self.per_device * wire.encoded_size(self.shared.chunk(sum(shared_sizes(state.params))), bits, keep)
    return self.per_device * sum(wire.encoded_size(n, bits, keep) for n in shared_sizes(state.params))

  def all_to_all_bytes(self, state: ReplicaState) -> int:
    """Bytes one device sends to the others in the two-stage exchange's all-to-all (as many arrive): each of
    its workers' encoded chunks of the workers on other devices; 0 otherwise."""
    if not self.shared.two_stage:
      return 0
    devices = len(self.devices)
    return self.per_device * (devices - 1) * self.gathered_bytes(state)

  def stats_bytes(self, state: ReplicaState) -> int:
    """Bytes of one worker's shared BatchNorm statistics (float32)."""
    return 4 * sum(shared_sizes(state.batch_stats))

  def codec(self, state: ReplicaState, g: SlotGroup | None = None) -> wire.Codec | None:
    """How a block's row (of group g, default the first) is encoded on the wire (parameters compressed), or
    None."""
    if not self.compresses or self.updates:  # compressed updates: a moving block travels whole (outer.py)
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
    if not sync:  # the statistics stay out of this round's all-reduce (a program without them)
      reduce -= self.stats_bytes(state) if devices > 1 else 0
    new = self.finish[sync](state, tuple(moved), put_workers(nxt))
    many = devices > 1
    return new, Traffic(sent, received, reduce, self.gathered_bytes(state) if many else 0,
                        self.all_to_all_bytes(state) if many else 0, devices)

  # --- the whole network ----------------------------------------------------------------------------
  @functools.cached_property
  def averaged(self):
    """The network a round's end would make of the current state, without changing the state (evaluation
    mid-round scores it): shared layers averaged over all workers, each partitioned block over the workers
    holding it (gathered from their slots). With outer state the round's end is the outer step (``closed``):
    scoring the anchor instead would score every mid-round evaluation, the run's last included, on a
    network up to L - 1 steps older than plain averaging's, which is scored on its workers' mean."""
    w = P(AXIS)
    f = jax.shard_map(self._whole, mesh=self.mesh, in_specs=(w, w, w, w), out_specs=(P(), P()), check_vma=False)
    return jax.jit(lambda st: f(st.params, st.batch_stats, st.membership, st.outer))

  @functools.cached_property
  def closing(self):
    """``(state, next membership (S, P)) -> (params, batch_stats)``: ``averaged`` in the middle of a round whose
    end sends compressed weights (``quantize_bits`` / ``sparsify`` on the weights): the network that end would
    make and a boundary's evaluation would then score. The shared layers as the round's end averages them, each
    worker's encoded; each block as its next owners would receive it, a holder's own row where it keeps the
    block and the row through the codec where the block goes to another worker, averaged over the holders and
    then over the next owners (several of either with a minimum depth):
        block = sum over holders h of (c_h row_h + (|O| - c_h) codec(row_h)) / (|O| |H|),
    c_h = 1 where h is among the next owners O. Plain ``averaged`` scored the exact float32 mean there, a
    network no round's end makes."""
    w = P(AXIS)
    f = jax.shard_map(self._whole, mesh=self.mesh, in_specs=(w, w, w, w, P()), out_specs=(P(), P()),
                      check_vma=False)
    return jax.jit(lambda st, following: f(st.params, st.batch_stats, st.membership, st.outer, following))

  def closed(self, params, outer):
    """Every worker's parameters as the end of the round under way would leave them (inside the mesh):
    the shared layers' outer step (their compressed updates and unsent errors included) and each holder's
    outer step of its blocks, both on the change so far. At a round's boundary (no worker has moved from its
    anchor) the round is already closed: the anchor itself, not a second outer step of momentum alone."""
    ended = self.outer_slots(self.shared.outer_step(params, outer)[0], outer)[0]
    anchor = outer['anchor']
    moved = sum(jnp.sum(p != a) for p, a in zip(jax.tree.leaves(params), jax.tree.leaves(anchor)))
    moved = jax.lax.psum(moved.astype(jnp.int32), AXIS) > 0
    return jax.tree.map(lambda e, a: jnp.where(moved, e, a), ended, anchor)

  def _whole(self, params, stats, member, outer, following=None):
    layout = self.layout
    if self.tracks:
      params = self.closed(params, outer)
    elif following is not None:  # compressed weights mid-round: the shared layers as the round's end averages them
      params = self.shared.compressed(params)
    mean = lambda tree: {n: jax.tree.map(self.shared.mean, v) for n, v in tree.items() if n not in layout.keys}
    out_params, out_stats = mean(params), mean(stats)
    if layout.index:
      everyone = jax.lax.all_gather(member, AXIS, tiled=True)  # (S, P)
    for g in layout.groups:
      rows = jax.lax.all_gather(self.pack((params, stats), g), AXIS, tiled=True)  # (S * slots, R)
      member = everyone[:, g.columns]
      position = jnp.cumsum(member, axis=1) - 1  # a block's slot on each worker holding it
      if following is None:
        total = 0.0
        for w in range(self.num_workers):  # selected, not weighted: one holder passes through exactly
          total = total + jnp.where(member[w][:, None], rows[w * g.slots + jnp.maximum(position[w], 0)], 0.0)
        blocks = total / jnp.maximum(jnp.sum(member, axis=0), 1)[:, None].astype(jnp.float32)
      else:
        blocks = self._closing_blocks(rows, member, position, jnp.asarray(following)[:, g.columns], params, g)
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

  def _closing_blocks(self, rows, member, position, following, params, g: SlotGroup):
    """Group g's blocks (P, R) as ``closing`` says: each holder's row as it would arrive at each next owner
    (itself: as it is; another worker: through the codec, its parameter segments compressed), averaged."""
    sizes = [int(np.prod(x.shape[2:])) for path, x in jax.tree_util.tree_flatten_with_path(params)[0]
             if in_slots(path, g.key)]
    coded = wire.Codec(sizes, rows.shape[1], self.quantize_bits, self.sparsify)
    arrived = coded.decode(coded.encode(rows))
    owners = jnp.sum(following, axis=0).astype(jnp.float32)  # |O| per block
    share = owners * jnp.maximum(jnp.sum(member, axis=0), 1).astype(jnp.float32)  # |O| |H|
    total = 0.0
    for w in range(self.num_workers):
      row = w * g.slots + jnp.maximum(position[w], 0)
      keeps = (member[w] & following[w]).astype(jnp.float32)  # c_h: this holder keeps the block
      held = member[w].astype(jnp.float32)
      total = total + (keeps[:, None] * rows[row] + (held * owners - keeps)[:, None] * arrived[row])
    return total / jnp.maximum(share, 1.0)[:, None]
