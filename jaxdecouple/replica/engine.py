"""The replica engine: S workers train copies or layer-wise sub-networks, then average.

Every per-worker array is stacked on a leading worker axis and sharded over a 'worker' mesh axis;
a local iteration runs under ``jax.shard_map``, each device running the workers it holds one after
another, so S workers run on S devices, or on fewer devices with the same code and numbers.

**Storage.** A worker holds the shared layers (every block outside the partitioned section) and, for
ResIST, only the partitioned blocks it owns this round, in ``slots`` fixed slots (``params[SLOTS]``,
leaves (S, slots, ...); likewise BatchNorm statistics and momentum): slot j holds the worker's j-th
block in chain order, and the slots a smaller sub-network leaves over are zero and run as identity
(their output dropped with ``jnp.where``, exact zero gradient, update masked), or skipped with
``lax.cond`` (``skip='cond'``, which XLA:CPU runs about 20x slower). Nothing else of the partitioned
section is on the worker's device. With the naive partition (``scope='every_section'``) the partitioned
blocks come in several groups (one per section, blocks of different shapes), each in its own slots
(``params['slots_s1']`` and so on; the third section's stay under SLOTS) and dealt out on its own.

**Rounds.** Every ``local_steps`` iterations: the shared layers are averaged over all workers (one
all-reduce of the shared layers only); each partitioned block travels from the worker(s) that trained
it to its owner(s) of the next round (``exchange.py``: ``jax.device_put`` of exactly those rows,
averaged over the previous owners where a minimum depth lets several hold a block). Local SGD has no
slots: everything is shared and all-reduced. The bytes that crossed a device boundary are counted from
the arrays handed to the transfers and to the all-reduce.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxdecouple.common import Setup, classification_loss
from jaxdecouple.data import Batch, TrainOrder, train_inputs
from jaxdecouple.models import Chain, Model, count_params
from jaxdecouple.replica import exchange, wire
from jaxdecouple.replica.partition import draw_partition, partitioned_groups, test_time_scale

AXIS = 'worker'
SLOTS = 'slots'  # the key under which a worker's partitioned blocks sit, stacked on a slot axis


@dataclasses.dataclass(frozen=True)
class Group:
  """Partitioned blocks of one definition, contiguous in the chain, stored in ``slots`` slots under ``key``;
  their columns of the membership start at ``start``."""
  key: str
  names: tuple[str, ...]
  start: int
  slots: int

  @property
  def columns(self) -> slice:
    return slice(self.start, self.start + len(self.names))


@dataclasses.dataclass(frozen=True)
class ReplicaSpec:
  """The knobs that make one replica method differ from another."""
  num_workers: int
  local_steps: int
  partition: bool               # ResIST: random sub-networks; False: every block on every worker
  average: bool = True          # False: workers never average (the ensemble baseline)
  redraw: bool = True           # a new partition every round (False: the round-0 one forever)
  min_depth: int = 0
  momentum: str = 'restart'     # restart | average
  batch_norm: str = 'batch'     # batch (batch statistics at test time too) | running
  quantize_bits: int = 0
  sparsify: float = 0.0
  skip: str = 'gather'          # how a worker's empty slots are skipped: gather (select) | cond
  test_time_scale: bool = True  # scale the partitioned blocks' residual branches at test time
  stats_every: int = 1          # rounds between averagings of the shared layers' BatchNorm statistics
  scope: str = 'third_section'  # which blocks are partitioned: third_section | every_section (A.1's naive)

  @property
  def compresses(self) -> bool:
    return bool(self.quantize_bits or self.sparsify)


class ReplicaState(NamedTuple):
  params: Any          # shared blocks by name, leaves (S, ...); ResIST: SLOTS, leaves (S, slots, ...)
  batch_stats: Any
  opt_state: Any
  membership: Any      # (S, P) bool: worker w runs partitioned block b this round (groups side by side); ()
                       # for local SGD


class Traffic(NamedTuple):
  """Bytes one round moved across device boundaries, per device (counted from the arrays sent)."""
  sent: np.ndarray
  received: np.ndarray
  all_reduce: int      # bytes of the shared layers each device contributed to the all-reduce


def _run_block(module, block, x, train: bool):
  """One block's output and its batch statistics (updated when training with BN, else as given)."""
  if train and 'batch_stats' in block:
    y, updated = module.apply(block, x, train=True, mutable=['batch_stats'])
    return y, updated['batch_stats']
  return module.apply(block, x, train=train), block.get('batch_stats')


def slot_apply(chain: Chain, partitioned, variables, x, valid, train: bool, skip: str = 'gather'):
  """Runs one worker's sub-network: the shared blocks by name and, in place of each group of (contiguous,
  alike) partitioned blocks, the worker's slots ``variables[c][group.key]`` in order, slot j only where
  ``valid[group.key][j]``. ``partitioned``: the groups (``Group``), or one group's block names (stored under
  SLOTS, ``valid`` then that group's array). Returns the output and the new batch statistics (a skipped
  slot's unchanged).

  ``skip='gather'``: every slot is computed and an empty slot's output dropped with ``jnp.where`` (its
  zero parameters keep it finite; its gradient is exactly zero); no control flow, full speed on every
  backend. ``skip='cond'``: ``lax.cond`` per slot (XLA:CPU runs convolutions inside it ~20x slower)."""
  if partitioned and isinstance(partitioned[0], str):
    partitioned, valid = (Group(SLOTS, tuple(partitioned), 0, int(valid.shape[0])),), {SLOTS: valid}
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
    x, stats = _run_block(module, block, x, train)
    if stats is not None:
      new_stats[name] = stats
  return x, new_stats


def _run_slots(module, stacked, x, valid, train: bool, skip: str):
  new = []
  for j in range(valid.shape[0]):  # a collection is stacked, or (parameters under grad) a list of slots
    block = {c: v[j] if isinstance(v, list) else jax.tree.map(lambda s: s[j], v) for c, v in stacked.items()}
    if skip == 'cond':
      x, stats = jax.lax.cond(valid[j], functools.partial(_run_block, module, train=train),
                              lambda block, x: (x, block.get('batch_stats')), block, x)
    else:
      y, stats = _run_block(module, block, x, train)
      x = jnp.where(valid[j], y, x)
      if stats is not None:
        stats = jax.tree.map(lambda n, o: jnp.where(valid[j], n, o), stats, block['batch_stats'])
    if stats is not None:
      new.append(stats)
  return x, (jax.tree.map(lambda *s: jnp.stack(s), *new) if new else None)


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


def slot_count(num_blocks: int, num_workers: int, min_depth: int = 0) -> int:
  """The most partitioned blocks one sub-network can own: ceil(P / S), or the minimum depth."""
  return min(num_blocks, max(-(-num_blocks // num_workers), min_depth))


def _slot_key(path) -> str | None:
  """The slot group a leaf belongs to (its key: SLOTS or SLOTS_s1...), or None for a shared leaf."""
  for k in path:
    if isinstance(k, jax.tree_util.DictKey) and isinstance(k.key, str) and \
        (k.key == SLOTS or k.key.startswith(SLOTS + '_')):
      return k.key
  return None


def _in_slots(path, key: str | None = None) -> bool:
  """Whether a leaf sits in slots (of group ``key`` when given)."""
  found = _slot_key(path)
  return found is not None and (key is None or found == key)


def _shared_sizes(tree) -> list[int]:
  """Values per worker of each shared (not slot) leaf of a workers' layout tree."""
  return [int(np.prod(x.shape[1:])) for path, x in jax.tree_util.tree_flatten_with_path(tree)[0] if not _in_slots(path)]


class Replica:
  """Builds the workers' state and runs local iterations and averaging rounds."""

  def __init__(self, setup: Setup, spec: ReplicaSpec, devices: Sequence[jax.Device]):
    self.setup, self.spec = setup, spec
    self.model: Model = setup.model
    self.chain = self.model.chain
    groups, start = [], 0
    for names in (partitioned_groups(self.model, spec.scope) if spec.partition else ()):
      check_partitioned_run(self.chain, names)
      section = self.model.sections[names[0]][0]
      key = SLOTS if spec.scope == 'third_section' or section == 2 else f'{SLOTS}_s{section + 1}'
      key = key if key not in {g.key for g in groups} else f'{key}_{len(groups)}'  # two runs in one section
      groups.append(Group(key, names, start, slot_count(len(names), spec.num_workers, spec.min_depth)))
      start += len(names)
    self.groups: tuple[Group, ...] = tuple(groups)
    self.partitioned = tuple(n for g in self.groups for n in g.names)
    self.index = {n: i for i, n in enumerate(self.partitioned)}
    self.slots = sum(g.slots for g in self.groups)  # slots per worker, all groups
    d = max(n for n in range(1, min(len(devices), spec.num_workers) + 1) if spec.num_workers % n == 0)
    self.mesh = Mesh(np.array(devices[:d]), (AXIS,))
    self.devices = list(self.mesh.devices.flat)
    self.per_device = spec.num_workers // d
    self.sharded = NamedSharding(self.mesh, P(AXIS))
    self.replicated = NamedSharding(self.mesh, P())
    self._orders: list[TrainOrder] | None = None
    self.last_traffic: Traffic | None = None

  # --- partitions -------------------------------------------------------------------------------
  def membership(self, round_index: int):
    """Round ``round_index``'s (S, P) membership; () when nothing is partitioned (local SGD)."""
    s = self.spec
    if not s.partition:
      return ()
    r = round_index if s.redraw else 0
    if s.scope == 'third_section':
      return draw_partition(len(self.partitioned), s.num_workers, self.setup.config.seed, r, s.min_depth)
    return np.concatenate([draw_partition(len(g.names), s.num_workers, self.setup.config.seed, r, s.min_depth,
                                          group=i + 1, allow_idle=True) for i, g in enumerate(self.groups)], axis=1)

  # --- placement --------------------------------------------------------------------------------
  def _put(self, tree, sharding):
    """Global host arrays -> arrays laid out over the mesh (each process supplies only its shards)."""
    def put(x):
      x = np.asarray(x)
      return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])
    return jax.tree.map(put, tree)

  def put_workers(self, tree):
    return self._put(tree, self.sharded)

  # --- layouts ------------------------------------------------------------------------------------
  def to_workers(self, network, member) -> dict:
    """One network (block name -> subtree, host arrays) -> the workers' layout (host arrays): each
    shared block stacked S times; with partitioned blocks, SLOTS: worker w's blocks of ``member`` in
    chain order, its leftover slots zero."""
    S = self.spec.num_workers
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
    keys = {g.key for g in self.groups}
    out = {n: jax.tree.map(lambda x: np.asarray(x)[w], v) for n, v in tree.items() if n not in keys}
    for g in self.groups:
      if g.key in tree:
        for j, b in enumerate(np.flatnonzero(np.asarray(member)[w, g.columns])):
          out[g.names[b]] = jax.tree.map(lambda x: np.asarray(x)[w, j], tree[g.key])
    return out

  # --- state --------------------------------------------------------------------------------------
  def network_shapes(self, params) -> dict:
    """One whole network's parameters as shapes (block name -> subtree), from the workers' layout."""
    shape = lambda lead: lambda x: jax.ShapeDtypeStruct(x.shape[lead:], x.dtype)
    keys = {g.key for g in self.groups}
    out = {n: jax.tree.map(shape(1), v) for n, v in params.items() if n not in keys}
    for g in self.groups:
      for n in g.names if g.key in params else ():
        out[n] = jax.tree.map(shape(2), params[g.key])
    return out

  def init(self, rng: jax.Array, example: Batch) -> ReplicaState:
    variables = jax.device_get(self.model.init(rng, jnp.zeros((1, *example.images.shape[-3:]), jnp.float32)))
    member = self.membership(0)
    params = self.to_workers(variables['params'], member)
    stats = self.to_workers(variables.get('batch_stats', {}), member)
    opt_state = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), jax.eval_shape(self.setup.optimizer.init, params))
    return ReplicaState(self.put_workers(params), self.put_workers(stats), self.put_workers(opt_state),
                        self.put_workers(member))

  def resident_bytes(self, state: ReplicaState) -> dict:
    """Bytes of the state's arrays (parameters, statistics, optimizer state) resident on each of this
    process's devices, summed from the arrays' addressable shards."""
    total = {}
    for leaf in jax.tree.leaves((state.params, state.batch_stats, state.opt_state)):
      for shard in leaf.addressable_shards:
        total[shard.device] = total.get(shard.device, 0) + shard.data.nbytes
    return total

  def train_batch(self, x, y: np.ndarray | None, step: int) -> Batch:
    """Worker w's batch of this step from its own shuffle of the whole training set (stream w)."""
    if self._orders is None or self._orders[0].num_examples != len(x):
      b, seed = self.setup.config.batch_size, self.setup.config.seed
      self._orders = [TrainOrder(len(x), b, seed, stream=w) for w in range(self.spec.num_workers)]
    idx = np.stack([o.indices(step) for o in self._orders])
    if y is not None:
      return Batch(x[idx], y[idx])
    # streamed images: decode only the workers whose device is this process's (the others' rows are
    # never read: each process supplies only its own shards), each worker's crops from its own stream
    images = np.zeros((*idx.shape, *x.shape[1:]), x.dtype)
    labels = np.zeros(idx.shape, np.int32)
    here = jax.process_index()
    for w, order in enumerate(self._orders):
      if self.devices[w // self.per_device].process_index == here:
        images[w], labels[w] = x.take(idx[w], (order.seed, order.stream, step))
    return Batch(images, labels)

  # --- one local iteration ------------------------------------------------------------------------
  def _valid(self, member) -> dict:
    """Which of a worker's slots hold a block, per group: the first as many as it owns."""
    return {g.key: jnp.arange(g.slots) < jnp.sum(member[g.columns]) for g in self.groups}

  def _worker_step(self, params, stats, opt_state, member, images, labels, worker, step):
    s = self.setup
    x = train_inputs(images, step, s.config.seed, s.preprocess, stream=worker)
    valid = self._valid(member)

    def loss_fn(shared, slots):
      p = {**shared, **slots}
      logits, new_stats = slot_apply(self.chain, self.groups, {'params': p, 'batch_stats': stats}, x,
                                     valid, train=True, skip=self.spec.skip)
      loss, accuracy = classification_loss(logits, labels)
      return loss, (new_stats, accuracy)

    # The slots enter the gradient one by one (a list): differentiating slices of the stacked array would
    # pad every slot's gradient to the whole stack and add them up (1.46x a full step at 22 slots).
    keys = {g.key for g in self.groups}
    shared = {n: v for n, v in params.items() if n not in keys}
    slots = {g.key: [jax.tree.map(lambda s: s[j], params[g.key]) for j in range(g.slots)] for g in self.groups}
    (loss, (new_stats, accuracy)), (g_shared, g_slots) = jax.value_and_grad(loss_fn, argnums=(0, 1),
                                                                           has_aux=True)(shared, slots)
    grads = {**g_shared, **{k: jax.tree.map(lambda *g: jnp.stack(g), *v) for k, v in g_slots.items()}}
    new_params, new_opt = s.optimizer.update(grads, opt_state, params, s.schedule(step))
    if self.index:  # an empty slot stays exactly as it was (zero; weight decay and momentum included)
      def keep(path, new, old):
        key = _slot_key(path)
        return new if key is None else jnp.where(valid[key].reshape(-1, *[1] * (new.ndim - 1)), new, old)
      new_params = jax.tree_util.tree_map_with_path(keep, new_params, params)
      new_opt = jax.tree_util.tree_map_with_path(keep, new_opt, opt_state)
    return new_params, new_stats, new_opt, loss, accuracy

  def _local(self, params, stats, opt_state, member, images, labels, step):
    """This device's workers, one after another. A Python loop, unrolled at trace time, rather than
    ``lax.map``: XLA:CPU runs convolutions inside loop bodies an order of magnitude slower."""
    base = jax.lax.axis_index(AXIS) * self.per_device
    outs = []
    for i in range(self.per_device):
      take = lambda tree: jax.tree.map(lambda x: x[i], tree)
      outs.append(self._worker_step(take(params), take(stats), take(opt_state), take(member), images[i],
                                    labels[i], base + i, step))
    p, st, o, loss, acc = jax.tree.map(lambda *xs: jnp.stack(xs), *outs)
    loss, acc = jax.lax.pmean((jnp.mean(loss), jnp.mean(acc)), AXIS)
    return p, st, o, loss, acc

  @property
  def local_step(self):
    if not hasattr(self, '_local_step'):
      w = P(AXIS)
      f = jax.shard_map(self._local, mesh=self.mesh, in_specs=(w, w, w, w, w, w, P()),
                        out_specs=(w, w, w, P(), P()), check_vma=False)

      def step_fn(state: ReplicaState, images, labels, step):
        p, st, o, loss, acc = f(state.params, state.batch_stats, state.opt_state, state.membership,
                                images, labels, step)
        metrics = {'train_loss': loss, 'train_accuracy': acc, 'learning_rate': self.setup.schedule(step)}
        return state._replace(params=p, batch_stats=st, opt_state=o), metrics

      self._local_step = jax.jit(step_fn, donate_argnums=0)
    return self._local_step

  # --- rows: a slot's block as one flat float32 row -------------------------------------------------
  def _moving(self, params, stats, opt_state):
    """What travels with a block: its parameters and statistics, and its momentum when averaged."""
    return (params, stats, opt_state if self.spec.momentum == 'average' else ())

  def _pack(self, tree, g: Group):
    """Group g's slot leaves (..., slots, *shape) of this device -> rows (workers here * slots, R), float32."""
    leaves = [x for path, x in jax.tree_util.tree_flatten_with_path(tree)[0] if _in_slots(path, g.key)]
    return jnp.concatenate([x.reshape(self.per_device * g.slots, -1).astype(jnp.float32) for x in leaves],
                           axis=1)

  def row_width(self, state: ReplicaState, g: Group | None = None) -> int:
    g = g or self.groups[0]
    leaves = [x for path, x in jax.tree_util.tree_flatten_with_path(self._moving(
        state.params, state.batch_stats, state.opt_state))[0] if _in_slots(path, g.key)]
    return sum(int(np.prod(x.shape[2:])) for x in leaves)

  # --- averaging ----------------------------------------------------------------------------------
  @property
  def pack_rows(self):
    """The state's slots as rows, one per (worker, slot), sharded over the workers' devices: a tuple, one
    array per group."""
    if not hasattr(self, '_pack_rows'):
      w = P(AXIS)
      f = jax.shard_map(lambda p, s, o: tuple(self._pack(self._moving(p, s, o), g) for g in self.groups),
                        mesh=self.mesh, in_specs=(w, w, w), out_specs=w, check_vma=False)
      self._pack_rows = jax.jit(lambda st: f(st.params, st.batch_stats, st.opt_state))
    return self._pack_rows

  def _mean(self, x):
    """A (workers here, ...) leaf averaged over all workers: summed here, then all-reduced."""
    return (jax.lax.psum(jnp.sum(x.astype(jnp.float32), axis=0), AXIS) / self.spec.num_workers).astype(x.dtype)

  def _split_rows(self, rows, leaves):
    """The columns of ``rows`` that hold each slot leaf of ``leaves`` (the order ``_pack`` wrote them)."""
    start = 0
    for x in leaves:
      size = int(np.prod(x.shape[2:]))
      yield x, rows[:, start:start + size]
      start += size

  def _finish(self, params, stats, opt_state, rows, sync_stats):
    """Shared layers averaged over all workers (their BatchNorm statistics only where ``sync_stats``:
    in between, each worker keeps its own); slots from the assembled rows; momentum restarted unless
    averaged."""
    shared = lambda tree: jax.tree_util.tree_map_with_path(
        lambda path, x: x if _in_slots(path) else jnp.broadcast_to(self._mean(x), x.shape), tree)
    params = self._shared_compressed(params) if self.spec.compresses else shared(params)
    stats = jax.tree.map(lambda avg, x: jnp.where(sync_stats, avg, x), shared(stats), stats)
    opt_state = shared(opt_state) if self.spec.momentum == 'average' else jax.tree.map(jnp.zeros_like, opt_state)
    if self.index:
      moved = self._moving(params, stats, opt_state)
      for g, group_rows in zip(self.groups, rows):
        moved = self._unpack_into(group_rows, moved, g)
      params, stats = moved[0], moved[1]
      if self.spec.momentum == 'average':
        opt_state = moved[2]
    return params, stats, opt_state

  def _shared_compressed(self, params):
    """Shared parameters sent compressed: each worker's encoded (one uint8 buffer per worker), gathered
    by every device, decoded and averaged in worker order; every worker ends with the same average."""
    s = self.spec
    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
    shared = [x for path, x in flat if not _in_slots(path)]
    sizes = [int(np.prod(x.shape[1:])) for x in shared]
    buffers = jnp.concatenate([jax.vmap(lambda v: wire.encode(v.reshape(-1).astype(jnp.float32), s.quantize_bits,
                                                               s.sparsify))(x) for x in shared], axis=1)
    everyone = jax.lax.all_gather(buffers, AXIS, tiled=True)  # (S, bytes)
    means, start = [], 0
    for x, n in zip(shared, sizes):
      size = wire.encoded_size(n, s.quantize_bits, s.sparsify)
      decoded = jax.vmap(lambda b: wire.decode(b, n, s.quantize_bits, s.sparsify))(everyone[:, start:start + size])
      means.append(jnp.broadcast_to((jnp.sum(decoded, axis=0) / s.num_workers).reshape(x.shape[1:]).astype(x.dtype),
                                    x.shape))
      start += size
    out = iter(means)
    return jax.tree_util.tree_unflatten(treedef, [x if _in_slots(path) else next(out) for path, x in flat])

  def _unpack_into(self, rows, tree, g: Group):
    """Group g's rows (workers here * slots, R) -> ``tree`` with g's slot leaves (workers here, slots, ...)
    replaced."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
    moved = iter(cols.reshape(x.shape).astype(x.dtype)
                 for x, cols in self._split_rows(rows, [x for path, x in flat if _in_slots(path, g.key)]))
    return jax.tree_util.tree_unflatten(treedef, [next(moved) if _in_slots(path, g.key) else x for path, x in flat])

  @property
  def finish(self):
    if not hasattr(self, '_finish_fn'):
      w = P(AXIS)
      f = jax.shard_map(self._finish, mesh=self.mesh, in_specs=(w, w, w, w, P()), out_specs=(w, w, w),
                        check_vma=False)

      def fin(state: ReplicaState, rows, next_membership, sync_stats):
        p, st, o = f(state.params, state.batch_stats, state.opt_state, rows, sync_stats)
        return ReplicaState(p, st, o, next_membership)

      self._finish_fn = jax.jit(fin, donate_argnums=0)
    return self._finish_fn

  def shared_bytes(self, state: ReplicaState) -> int:
    """Bytes one device puts into the collectives over the shared layers: float32 statistics (and
    momentum when averaged) summed over its workers into the all-reduce, and the parameters likewise,
    or, compressed, each of its workers' encoded parameters into the all-gather."""
    s = self.spec
    rest = sum(_shared_sizes((state.batch_stats, state.opt_state if s.momentum == 'average' else ())))
    params = _shared_sizes(state.params)
    if s.compresses:
      return 4 * rest + self.per_device * sum(wire.encoded_size(n, s.quantize_bits, s.sparsify) for n in params)
    return 4 * (rest + sum(params))

  def codec(self, state: ReplicaState, g: Group | None = None) -> wire.Codec | None:
    """How a block's row (of group g, default the first) is encoded on the wire (parameters compressed), or
    None."""
    if not self.spec.compresses:
      return None
    g = g or self.groups[0]
    sizes = [int(np.prod(x.shape[2:])) for path, x in jax.tree_util.tree_flatten_with_path(state.params)[0]
             if _in_slots(path, g.key)]
    return wire.Codec(sizes, self.row_width(state, g), self.spec.quantize_bits, self.spec.sparsify)

  def aggregate(self, state: ReplicaState, round_index: int) -> ReplicaState:
    """The end of round ``round_index``: shared layers all-reduced, blocks sent to their next owners."""
    nxt = self.membership(round_index + 1)
    devices = len(self.devices)
    sent, received, moved = np.zeros(devices, np.int64), np.zeros(devices, np.int64), []
    if self.index:
      now = self.membership(round_index)
      if not hasattr(self, '_codecs'):
        self._codecs = [self.codec(state, g) for g in self.groups]
      for g, rows, codec in zip(self.groups, self.pack_rows(state), self._codecs):
        route = exchange.plan(now[:, g.columns], nxt[:, g.columns], g.slots, self.per_device,
                              coded=codec is not None)
        rows, out, into = exchange.run(rows, route, self.devices, codec)
        moved.append(rows)
        sent, received = sent + out, received + into
    reduce = self.shared_bytes(state) if devices > 1 else 0
    sync = (round_index + 1) % self.spec.stats_every == 0
    if not sync:  # the statistics stay out of this round's all-reduce
      reduce -= self.stats_bytes(state) if devices > 1 else 0
    self.last_traffic = Traffic(sent, received, reduce)
    return self.finish(state, tuple(moved), self.put_workers(nxt), np.bool_(sync))

  def stats_bytes(self, state: ReplicaState) -> int:
    """Bytes of one worker's shared BatchNorm statistics (float32)."""
    return 4 * sum(_shared_sizes(state.batch_stats))

  @property
  def averaged(self):
    """The averaged network of the current state (mid-round too), without changing the state: shared
    layers averaged over all workers, each partitioned block over the workers holding it (gathered from
    their slots: evaluation, unlike training, needs the whole network in one place)."""
    if not hasattr(self, '_averaged'):
      w = P(AXIS)
      f = jax.shard_map(self._whole, mesh=self.mesh, in_specs=(w, w, w), out_specs=(P(), P()), check_vma=False)
      self._averaged = jax.jit(lambda st: f(st.params, st.batch_stats, st.membership))
    return self._averaged

  def _whole(self, params, stats, member):
    keys = {g.key for g in self.groups}
    mean = lambda tree: {n: jax.tree.map(self._mean, v) for n, v in tree.items() if n not in keys}
    out_params, out_stats = mean(params), mean(stats)
    if self.index:
      everyone = jax.lax.all_gather(member, AXIS, tiled=True)  # (S, P)
    for g in self.groups:
      rows = jax.lax.all_gather(self._pack((params, stats), g), AXIS, tiled=True)  # (S * slots, R)
      member = everyone[:, g.columns]
      position = jnp.cumsum(member, axis=1) - 1  # a block's slot on each worker holding it
      total = 0.0
      for w in range(self.spec.num_workers):  # selected, not weighted: one holder passes through exactly
        total = total + jnp.where(member[w][:, None], rows[w * g.slots + jnp.maximum(position[w], 0)], 0.0)
      blocks = total / jnp.maximum(jnp.sum(member, axis=0), 1)[:, None].astype(jnp.float32)
      template = (params[g.key], stats.get(g.key, {}))
      flat, treedef = jax.tree_util.tree_flatten(template)
      p, s = jax.tree_util.tree_unflatten(treedef, [cols.reshape(-1, *x.shape[2:]).astype(x.dtype)
                                                    for x, cols in self._split_rows(blocks, flat)])
      for b, name in enumerate(g.names):
        out_params[name] = jax.tree.map(lambda x: x[b], p)
        if s:
          out_stats[name] = jax.tree.map(lambda x: x[b], s)
    order = {n: i for i, n in enumerate(self.chain.names)}
    ordered = lambda tree: {n: tree[n] for n in sorted(tree, key=order.__getitem__)}
    return ordered(out_params), ordered(out_stats)

  # --- the driver ---------------------------------------------------------------------------------
  def step(self, state: ReplicaState, batch: Batch, t: int):
    images, labels = self.put_workers((batch.images, batch.labels))
    state, metrics = self.local_step(state, images, labels, np.int32(t))
    if self.spec.average and (t + 1) % self.spec.local_steps == 0:
      state = self.aggregate(state, t // self.spec.local_steps)
      traffic = self.last_traffic
      metrics = {**metrics, 'sent_mb': float(np.mean(traffic.sent)) / 1e6,
                 'received_mb': float(np.mean(traffic.received)) / 1e6,
                 'all_reduce_mb': traffic.all_reduce / 1e6}
    return state, metrics

  # --- evaluation -------------------------------------------------------------------------------
  def eval_model(self) -> Model:
    """The whole network with every partitioned block's residual branch scaled for test time (unless
    ``test_time_scale`` is off: the paper's A.1 ablation)."""
    if not self.partitioned or not self.spec.test_time_scale:
      return self.model
    scale = {n: test_time_scale(len(g.names), self.spec.num_workers, self.spec.min_depth)
             for g in self.groups for n in g.names}
    modules = tuple(m.clone(residual_scale=scale[n]) if n in scale else m
                    for n, m in zip(self.chain.names, self.chain.modules))
    return dataclasses.replace(self.model, chain=Chain(self.chain.names, modules))

  # --- accounting ---------------------------------------------------------------------------------
  def parameter_counts(self, params) -> tuple[int, dict[str, int]]:
    """(shared parameters, parameters of each partitioned block) of one network."""
    sizes = {n: count_params(params[n]) for n in params}
    shared = sum(v for n, v in sizes.items() if n not in self.index)
    return shared, {n: sizes[n] for n in self.partitioned}

  def traffic_model(self, params, round_index: int, bytes_per_param: float = 4.0) -> dict[str, float]:
    """A model (a formula, not a measurement) of the bytes of one round as the paper's Table 1 counts
    them: each worker sends what it trained (shared layers and its blocks of this round) and receives
    its network for the next round; everything for local SGD. The measured figures: ``last_traffic``."""
    shared, blocks = self.parameter_counts(params)
    sizes = np.array([blocks[n] for n in self.partitioned], np.float64)
    now, nxt = self.membership(round_index), self.membership(round_index + 1)
    if not self.partitioned:
      now = nxt = np.zeros((self.spec.num_workers, 0), bool)
    per_param = bytes_per_param * (self.spec.quantize_bits / 32 if self.spec.quantize_bits else 1.0)
    if self.spec.sparsify:  # the kept values and their int32 indices
      per_param = self.spec.sparsify * (per_param + 4)
    sent = [(shared + float(sizes @ now[w])) * per_param for w in range(self.spec.num_workers)]
    received = [(shared + float(sizes @ nxt[w])) * bytes_per_param for w in range(self.spec.num_workers)]
    return {'sent_per_worker': float(np.mean(sent)), 'received_per_worker': float(np.mean(received)),
            'total': float(np.sum(sent) + np.sum(received))}

