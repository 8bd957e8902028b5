"""The width-wise (replica) engine: S workers train copies or sub-networks, then average.

Every per-worker array is stacked on a leading worker axis and sharded over a 'worker' mesh axis;
a local iteration runs under ``jax.shard_map``, each device running the workers it holds one after
another, so S workers run on S devices, or on fewer devices with the same code and numbers.
Inside, a worker runs only the partitioned blocks it owns (identity elsewhere, no compute, no
gradient): by default its blocks are gathered by index from the stacked partitioned blocks into a
fixed number of slots (no control flow); ``skip='cond'`` uses ``lax.cond`` per block instead, which
XLA:CPU runs about 20x slower (convolutions inside a conditional; see docs/PERFORMANCE.md). The
update is masked too, so a block a worker does not own is left exactly as it was (weight decay and
momentum included).

Every ``local_steps`` iterations the workers average: a leaf of block b is averaged over the
workers whose weight for b is 1 (shared blocks: all workers; partitioned ones: their owners this
round), ``psum(w * p) / psum(w)``. Then the next round's partition is drawn from (seed, round).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxdecouple.common import Setup, classification_loss
from jaxdecouple.data import Batch, TrainOrder, train_inputs
from jaxdecouple.models import Chain, Model, count_params
from jaxdecouple.replica.partition import draw_partition, partitioned_blocks, test_time_scale

AXIS = 'worker'


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
  skip: str = 'gather'          # how a worker skips blocks it does not own: gather | cond

  @property
  def compresses(self) -> bool:
    return bool(self.quantize_bits or self.sparsify)


class ReplicaState(NamedTuple):
  params: Any          # every leaf with a leading worker axis
  batch_stats: Any
  opt_state: Any
  membership: Any      # (S, P) bool: worker w runs partitioned block b this round; () for local SGD
  anchor: Any          # the round's starting parameters when compressing (what deltas refer to), else ()


def _run_block(module, block, x, train: bool):
  """One block's output and its batch statistics (updated when training with BN, else as given)."""
  if train and 'batch_stats' in block:
    y, updated = module.apply(block, x, train=True, mutable=['batch_stats'])
    return y, updated['batch_stats']
  return module.apply(block, x, train=train), block.get('batch_stats')


def masked_apply(chain: Chain, index: dict[str, int], variables, x, member, train: bool,
                 skip: str = 'gather', slots: int | None = None):
  """Runs the chain with only the partitioned blocks ``b`` where ``member[index[b]]`` (the others are
  identity: not computed, no gradient). Returns the output and the batch statistics (unchanged where
  skipped).

  ``skip='gather'`` (default): the partitioned blocks (contiguous and of one definition) are
  stacked, the worker's own ones gathered by index in chain order into ``slots`` fixed slots (as many
  as the largest sub-network can own; default: every partitioned block); a slot left over by a
  smaller sub-network repeats one of its blocks and its output is discarded (the one computation
  that is wasted). No control flow, so it runs at full speed on every backend.
  ``skip='cond'``: ``lax.cond`` per partitioned block (nothing wasted, but XLA:CPU runs convolutions
  inside a conditional ~20x slower; see docs/PERFORMANCE.md).
  """
  names, modules = list(chain.names), list(chain.modules)
  new_stats = {}
  i = 0
  while i < len(names):
    name, module = names[i], modules[i]
    block = {c: v[name] for c, v in variables.items() if name in v}
    if name in index and skip == 'gather':
      end = i
      while end < len(names) and names[end] in index:
        end += 1
      run = names[i:end]
      if len(run) != len(index):
        raise ValueError('the partitioned blocks must be contiguous in the chain; use skip="cond"')
      if any(m != module for m in modules[i:end]):
        raise ValueError('the partitioned blocks differ in definition; use skip="cond"')
      x = _gathered(module, run, index, variables, x, member, train, slots or len(index), new_stats)
      i += len(run)
      continue
    if name in index:
      x, stats = jax.lax.cond(member[index[name]], functools.partial(_run_block, module, train=train),
                              lambda block, x: (x, block.get('batch_stats')), block, x)
    else:
      x, stats = _run_block(module, block, x, train)
    if stats is not None:
      new_stats[name] = stats
    i += 1
  return x, new_stats


def slot_count(num_blocks: int, num_workers: int, min_depth: int = 0) -> int:
  """The most partitioned blocks one sub-network can own: ceil(P / S), or the minimum depth."""
  return min(num_blocks, max(-(-num_blocks // num_workers), min_depth))


def _gathered(module, run: list[str], index, variables, x, member, train: bool, slots: int,
              new_stats: dict):
  """The contiguous partitioned blocks ``run`` (one module definition, stacked) through ``slots``
  slots: the worker's own blocks in chain order, then repeats of its first one whose outputs are
  dropped (``jnp.where`` on the output, so their gradient is exactly zero)."""
  stacked = {c: jax.tree.map(lambda *xs: jnp.stack(xs), *[v[n] for n in run])
             for c, v in variables.items() if run[0] in v}
  count = jnp.sum(member)
  order = jnp.argsort(jnp.logical_not(member), stable=True)  # owned blocks first, in chain order
  for j in range(slots):
    valid = j < count
    b = jnp.where(valid, order[j], order[0])
    y, stats = _run_block(module, jax.tree.map(lambda s: s[b], stacked), x, train)
    x = jnp.where(valid, y, x)
    if stats is not None:
      stacked['batch_stats'] = jax.tree.map(
          lambda s, new: s.at[b].set(jnp.where(valid, new, s[b])), stacked['batch_stats'], stats)
  if 'batch_stats' in stacked:
    for k, n in enumerate(run):
      new_stats[n] = jax.tree.map(lambda s: s[k], stacked['batch_stats'])
  return x


def _block_of(path, names: frozenset) -> str | None:
  for key in path:
    if isinstance(key, jax.tree_util.DictKey) and key.key in names:
      return key.key
  return None


def compress(delta: jax.Array, bits: int, keep: float) -> jax.Array:
  """What a worker sends of a change: the largest ``keep`` fraction of its entries by magnitude
  (the rest zero), then uniform quantisation to 2**bits levels over the tensor's [min, max]."""
  if keep:
    k = max(1, int(math.ceil(keep * delta.size)))
    threshold = jax.lax.top_k(jnp.abs(delta).ravel(), k)[0][-1]
    delta = jnp.where(jnp.abs(delta) >= threshold, delta, 0.0)
  if bits:
    lo, hi = jnp.min(delta), jnp.max(delta)
    step = jnp.maximum(hi - lo, 1e-12) / (2 ** bits - 1)
    delta = lo + jnp.round((delta - lo) / step) * step
  return delta


class Replica:
  """Builds the workers' state and runs local iterations and averaging rounds."""

  def __init__(self, setup: Setup, spec: ReplicaSpec, devices: Sequence[jax.Device]):
    self.setup, self.spec = setup, spec
    self.model: Model = setup.model
    self.chain = self.model.chain
    self.partitioned = partitioned_blocks(self.model) if spec.partition else ()
    self.index = {n: i for i, n in enumerate(self.partitioned)}
    self.slots = slot_count(len(self.partitioned), spec.num_workers, spec.min_depth)
    self.block_names = frozenset(self.chain.names)
    d = max(n for n in range(1, min(len(devices), spec.num_workers) + 1) if spec.num_workers % n == 0)
    self.mesh = Mesh(np.array(devices[:d]), (AXIS,))
    self.per_device = spec.num_workers // d
    self.sharded = NamedSharding(self.mesh, P(AXIS))
    self.replicated = NamedSharding(self.mesh, P())
    self._orders: list[TrainOrder] | None = None

  # --- partitions -------------------------------------------------------------------------------
  def membership(self, round_index: int):
    """Round ``round_index``'s (S, P) membership; () when nothing is partitioned (local SGD)."""
    s = self.spec
    if not s.partition:
      return ()
    r = round_index if s.redraw else 0
    return draw_partition(len(self.partitioned), s.num_workers, self.setup.config.seed, r, s.min_depth)

  # --- placement --------------------------------------------------------------------------------
  def _put(self, tree, sharding):
    """Global host arrays -> arrays laid out over the mesh (each process supplies only its shards)."""
    def put(x):
      x = np.asarray(x)
      return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])
    return jax.tree.map(put, tree)

  def put_workers(self, tree):
    return self._put(tree, self.sharded)

  # --- state --------------------------------------------------------------------------------------
  def init(self, rng: jax.Array, example: Batch) -> ReplicaState:
    s = self.spec
    variables = jax.device_get(self.model.init(rng, jnp.zeros((1, *example.images.shape[-3:]), jnp.float32)))
    stack = lambda tree: jax.tree.map(lambda x: np.broadcast_to(x, (s.num_workers, *np.shape(x))), tree)
    params, stats = variables['params'], variables.get('batch_stats', {})
    opt_state = jax.device_get(self.setup.optimizer.init(params))
    anchor = self._put(params, self.replicated) if s.compresses else ()
    return ReplicaState(self.put_workers(stack(params)), self.put_workers(stack(stats)),
                        self.put_workers(stack(opt_state)), self.put_workers(self.membership(0)), anchor)

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
      if self.mesh.devices.flat[w // self.per_device].process_index == here:
        images[w], labels[w] = x.take(idx[w], (order.seed, order.stream, step))
    return Batch(images, labels)

  # --- one local iteration ------------------------------------------------------------------------
  def _worker_step(self, params, stats, opt_state, member, images, labels, worker, step):
    s = self.setup
    x = train_inputs(images, step, s.config.seed, s.preprocess, stream=worker)

    def loss_fn(p):
      logits, new_stats = masked_apply(self.chain, self.index, {'params': p, 'batch_stats': stats}, x,
                                       member, train=True, skip=self.spec.skip, slots=self.slots)
      loss, accuracy = classification_loss(logits, labels)
      return loss, (new_stats, accuracy)

    (loss, (new_stats, accuracy)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    new_params, new_opt = s.optimizer.update(grads, opt_state, params, s.schedule(step))
    if self.index:  # blocks this worker does not run stay exactly as they were
      def keep(path, new, old):
        name = _block_of(path, self.block_names)
        return jnp.where(member[self.index[name]], new, old) if name in self.index else new
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

  # --- averaging ----------------------------------------------------------------------------------
  def _weights(self, member):
    """Per-block weights of this device's workers: (local workers,) arrays by block name."""
    ones = jnp.ones((self.per_device,), jnp.float32)
    return {n: member[:, self.index[n]].astype(jnp.float32) if n in self.index else ones
            for n in self.chain.names}

  def _average(self, tree, member, anchor=None):
    """Each leaf averaged over the workers that hold its block; the result has no worker axis."""
    weights = self._weights(member)

    def avg(path, x):
      w = weights[_block_of(path, self.block_names)]
      if anchor is not None:  # compressed: what arrives is the anchor plus the compressed change
        a = _leaf(anchor, path)
        x = a[None] + jax.vmap(lambda d: compress(d, self.spec.quantize_bits, self.spec.sparsify))(x - a[None])
      wx = jnp.tensordot(w, x.astype(jnp.float32), axes=1)
      total = jax.lax.psum(jnp.sum(w), AXIS)
      return (jax.lax.psum(wx, AXIS) / jnp.maximum(total, 1.0)).astype(x.dtype)

    return jax.tree_util.tree_map_with_path(avg, tree)

  def _aggregate(self, params, stats, opt_state, member, anchor):
    n = self.per_device
    spread = lambda tree: jax.tree.map(lambda x: jnp.broadcast_to(x, (n, *x.shape)), tree)
    avg_params = self._average(params, member, anchor if self.spec.compresses else None)
    avg_stats = self._average(stats, member)
    if self.spec.momentum == 'average':
      new_opt = spread(self._average(opt_state, member))
    else:
      new_opt = jax.tree.map(jnp.zeros_like, opt_state)
    return spread(avg_params), spread(avg_stats), new_opt, avg_params

  @property
  def aggregate(self):
    if not hasattr(self, '_aggregate_fn'):
      w = P(AXIS)
      f = jax.shard_map(self._aggregate, mesh=self.mesh, in_specs=(w, w, w, w, P()),
                        out_specs=(w, w, w, P()), check_vma=False)

      def agg(state: ReplicaState, next_membership):
        p, st, o, avg = f(state.params, state.batch_stats, state.opt_state, state.membership,
                          state.anchor if self.spec.compresses else {})
        return ReplicaState(p, st, o, next_membership, avg if self.spec.compresses else ())

      self._aggregate_fn = jax.jit(agg, donate_argnums=0)
    return self._aggregate_fn

  @property
  def averaged(self):
    """The averaged network of the current state (mid-round too), without changing the state."""
    if not hasattr(self, '_averaged'):
      w = P(AXIS)
      f = jax.shard_map(lambda p, s, m: (self._average(p, m), self._average(s, m)), mesh=self.mesh,
                        in_specs=(w, w, w), out_specs=(P(), P()), check_vma=False)
      self._averaged = jax.jit(lambda st: f(st.params, st.batch_stats, st.membership))
    return self._averaged

  # --- the driver ---------------------------------------------------------------------------------
  def step(self, state: ReplicaState, batch: Batch, t: int):
    images, labels = self.put_workers((batch.images, batch.labels))
    state, metrics = self.local_step(state, images, labels, np.int32(t))
    if self.spec.average and (t + 1) % self.spec.local_steps == 0:
      state = self.aggregate(state, self.put_workers(self.membership((t + 1) // self.spec.local_steps)))
    return state, metrics

  # --- evaluation -------------------------------------------------------------------------------
  def eval_model(self) -> Model:
    """The whole network with every partitioned block's residual branch scaled for test time."""
    if not self.partitioned:
      return self.model
    scale = test_time_scale(len(self.partitioned), self.spec.num_workers, self.spec.min_depth)
    modules = tuple(m.clone(residual_scale=scale) if n in self.index else m
                    for n, m in zip(self.chain.names, self.chain.modules))
    return dataclasses.replace(self.model, chain=Chain(self.chain.names, modules))

  # --- accounting ---------------------------------------------------------------------------------
  def parameter_counts(self, params) -> tuple[int, dict[str, int]]:
    """(shared parameters, parameters of each partitioned block) of one network."""
    sizes = {n: count_params(params[n]) for n in params}
    shared = sum(v for n, v in sizes.items() if n not in self.index)
    return shared, {n: sizes[n] for n in self.partitioned}

  def round_traffic(self, params, round_index: int, bytes_per_param: float = 4.0) -> dict[str, float]:
    """Bytes moved by one averaging round: each worker sends what it trained (shared layers and its
    blocks of this round) and receives its network for the next round; everything for local SGD."""
    shared, blocks = self.parameter_counts(params)
    sizes = np.array([blocks[n] for n in self.partitioned], np.float64)
    now, nxt = self.membership(round_index), self.membership(round_index + 1)
    if not self.partitioned:
      now = nxt = np.zeros((self.spec.num_workers, 0), bool)
    per_param = bytes_per_param * (self.spec.quantize_bits / 32 if self.spec.quantize_bits else 1.0)
    if self.spec.sparsify:
      per_param *= self.spec.sparsify
    sent = [(shared + float(sizes @ now[w])) * per_param for w in range(self.spec.num_workers)]
    received = [(shared + float(sizes @ nxt[w])) * bytes_per_param for w in range(self.spec.num_workers)]
    return {'sent_per_worker': float(np.mean(sent)), 'received_per_worker': float(np.mean(received)),
            'total': float(np.sum(sent) + np.sum(received))}


def _leaf(tree, path):
  for key in path:
    tree = tree[key.key] if isinstance(key, jax.tree_util.DictKey) else tree[key.idx]
  return tree
