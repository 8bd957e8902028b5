"""The replica engine: S workers train copies or layer-wise sub-networks, then average.

Every per-worker array is stacked on a leading worker axis and sharded over a 'worker' mesh axis;
a local iteration runs under ``jax.shard_map``, each device running the workers it holds one after
another, so S workers run on S devices, or on fewer devices with the same code and numbers. Where the
blocks live is ``layout.py``; how a worker runs its slots, ``models/slots.py``; the end of a round and
the bytes it moves, ``averaging.py`` (and ``exchange.py``, ``wire.py``). This file holds the spec, the
state, the local step, the round driver, evaluation and accounting. The engine is built from a
``ReplicaSpec`` and the training pieces (model, optimizer, schedule, preprocessing): never a config.
"""
from __future__ import annotations

import dataclasses
import functools
import time
from typing import Callable, Sequence

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxdecouple.data import Batch, Preprocess, TrainOrder, train_inputs
from jaxdecouple.models import Chain, Model
from jaxdecouple.models.slots import slot_apply
from jaxdecouple.optim import Optimizer
from jaxdecouple.replica.averaging import AXIS, Averaging
from jaxdecouple.replica.layout import Layout, ReplicaState, slot_key
from jaxdecouple.replica.outer import OuterOptimizer
from jaxdecouple.replica.stragglers import round_model
from jaxdecouple.replica.traffic import Traffic
from jaxdecouple.replica.partition import test_time_scale


@dataclasses.dataclass(frozen=True)
class ReplicaSpec:
  """Everything that makes one replica run differ from another (the method's knobs and the run's seed and
  batch): what the engine needs, and nothing of the config."""
  num_workers: int
  local_steps: int
  partition: bool               # ResIST: random sub-networks; False: every block on every worker
  seed: int = 0                 # partitions and each worker's data order derive from it
  batch_size: int = 128         # per worker
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
  outer_lr: float = 1.0         # the outer optimizer (outer.py); lr 1 and momentum 0: plain averaging
  outer_momentum: float = 0.0
  outer_nesterov: bool = True
  compress: str = 'weights'     # what quantize_bits / sparsify apply to: weights | updates (outer.py)
  error_feedback: bool = True   # compressed updates: carry what was not sent into the next round
  update_exchange: str = 'all_gather'  # compressed updates: all_gather | two_stage (bytes constant in S)

  @property
  def compresses(self) -> bool:
    return bool(self.quantize_bits or self.sparsify)

  @property
  def outer(self) -> OuterOptimizer:
    return OuterOptimizer(self.outer_lr, self.outer_momentum, self.outer_nesterov)


def worker_devices(devices: Sequence[jax.Device], num_workers: int) -> list[jax.Device]:
  """The devices the S workers spread over: the most that divide S (each device then runs as many workers),
  taken as many from every process, so that no process is left without a worker (its shards would be empty)
  nor one doing another's work. One process: the first of ``devices``, as many as divide S."""
  by_process: dict[int, list[jax.Device]] = {}
  for d in devices:
    by_process.setdefault(d.process_index, []).append(d)
  processes, fewest = len(by_process), min(len(v) for v in by_process.values())
  for n in range(min(len(devices), num_workers), 0, -1):
    if num_workers % n == 0 and n % processes == 0 and n // processes <= fewest:
      return [d for p in sorted(by_process) for d in by_process[p][:n // processes]]
  raise ValueError(f'{num_workers} workers cannot be spread evenly over {processes} processes (every process '
                   f'holds as many workers); use a multiple of {processes} workers')


class Replica:
  """Builds the workers' state and runs local iterations and averaging rounds."""

  def __init__(self, model: Model, spec: ReplicaSpec, devices: Sequence[jax.Device], optimizer: Optimizer,
               schedule: Callable[[jax.Array], jax.Array], preprocess: Preprocess):
    self.model, self.chain, self.spec = model, model.chain, spec
    self.optimizer, self.schedule, self.preprocess = optimizer, schedule, preprocess
    self.layout = Layout(model, spec.num_workers, spec.seed, spec.partition, spec.scope, spec.min_depth, spec.redraw)
    self.groups, self.partitioned = self.layout.groups, self.layout.partitioned
    chosen = worker_devices(devices, spec.num_workers)
    d = len(chosen)
    self.mesh = Mesh(np.array(chosen), (AXIS,))
    self.devices = list(self.mesh.devices.flat)
    self.per_device = spec.num_workers // d
    self.sharded = NamedSharding(self.mesh, P(AXIS))
    self.averaging = Averaging(self.layout, self.mesh, self.per_device, optimizer.init if optimizer else None,
                               spec.momentum, spec.quantize_bits, spec.sparsify, spec.stats_every, spec.outer,
                               spec.compress == 'updates', spec.error_feedback, spec.update_exchange == 'two_stage')
    self.orders: list[TrainOrder] = []
    self.last_traffic: Traffic | None = None
    self.announce = True  # log the first round's measured bytes (off for a warm-up's engine)
    self.speeds: tuple[float, ...] = ()  # per-worker speeds: each round timed for real, beside stragglers.py's model
    self._round_start: float | None = None
    self._rounds_timed = 0
    self.steps_done = 0  # steps trained (or restored): where in a round evaluation falls

  # --- state ----------------------------------------------------------------------------------------
  def put_workers(self, tree):
    """Global host arrays -> arrays laid out over the worker mesh (each process supplies only its shards)."""
    def put(x):
      x = np.asarray(x)
      return jax.make_array_from_callback(x.shape, self.sharded, lambda idx: x[idx])
    return jax.tree.map(put, tree)

  def state_from(self, params, batch_stats, opt_state, round_index: int = 0, outer_momentum=None) -> ReplicaState:
    """The workers' state holding one network (host arrays, block name -> subtree) as of ``round_index``'s
    partition; ``opt_state``: the optimizer state of that network, or None for a fresh one; likewise
    ``outer_momentum`` (the round's anchor is the network itself, its unsent error zero)."""
    member = self.layout.membership(round_index)
    p = self.layout.to_workers(params, member)
    # one optimizer state per worker (a step count too, for the optimizers that keep one), as the optimizer
    # initialises it: not always zeros (Muon keeps its Newton-Schulz coefficients in its state)
    fresh = jax.device_get(jax.vmap(self.optimizer.init)(p))
    o = fresh if opt_state is None else self.layout.per_parameter_to_workers(
        opt_state, jax.tree.structure(params), member)
    outer = self.averaging.outer_state(p)
    if outer_momentum is not None and 'momentum' in outer:
      outer['momentum'] = self.layout.to_workers(outer_momentum, member)
    return ReplicaState(self.put_workers(p), self.put_workers(self.layout.to_workers(batch_stats, member)),
                        self.put_workers(o), self.put_workers(member), self.put_workers(outer))

  def init(self, rng: jax.Array, example: Batch) -> ReplicaState:
    variables = jax.device_get(self.model.init(rng, jnp.zeros((1, *example.images.shape[2:]), jnp.float32)))
    return self.state_from(variables['params'], variables.get('batch_stats', {}), None)

  def resident_bytes(self, state: ReplicaState) -> dict:
    """Bytes of the state's arrays (parameters, statistics, optimizer and outer state) resident on each of this
    process's devices, summed from the arrays' addressable shards."""
    total = {}
    for leaf in jax.tree.leaves((state.params, state.batch_stats, state.opt_state, state.outer)):
      for shard in leaf.addressable_shards:
        total[shard.device] = total.get(shard.device, 0) + shard.data.nbytes
    return total

  def train_batch(self, x, y: np.ndarray | None, step: int) -> Batch:
    """Worker w's batch of this step from its own shuffle of the whole training set (stream w)."""
    if not self.orders or self.orders[0].num_examples != len(x):
      self.orders = [TrainOrder(len(x), self.spec.batch_size, self.spec.seed, stream=w)
                     for w in range(self.spec.num_workers)]
    idx = np.stack([o.indices(step) for o in self.orders])
    if y is not None:
      return Batch(x[idx], y[idx])
    # streamed images: decode only the workers whose device is this process's (the others' rows are
    # never read: each process supplies only its own shards), each worker's crops from its own stream
    images = np.zeros((*idx.shape, *x.shape[1:]), x.dtype)
    labels = np.zeros(idx.shape, np.int32)
    here = jax.process_index()
    for w, order in enumerate(self.orders):
      if self.devices[w // self.per_device].process_index == here:
        images[w], labels[w] = x.take(idx[w], (order.seed, order.stream, step))
    return Batch(images, labels)

  # --- one local iteration ------------------------------------------------------------------------
  def worker_step(self, params, stats, opt_state, member, images, labels, worker, step):
    """One worker's training step on its own arrays (no worker axis): a pure function, jit-able alone."""
    x = train_inputs(images, step, self.spec.seed, self.preprocess, stream=worker)
    valid = self.layout.valid(member)

    def loss_fn(shared, slots):
      p = {**shared, **slots}
      logits, new_stats = slot_apply(self.chain, self.groups, {'params': p, 'batch_stats': stats}, x,
                                     valid, train=True, skip=self.spec.skip)
      loss, accuracy = self.model.loss(logits, labels)
      return loss, (new_stats, accuracy)

    # The slots enter the gradient one by one (a list): differentiating slices of the stacked array would
    # pad every slot's gradient to the whole stack and add them up (1.46x a full step at 22 slots).
    shared = {n: v for n, v in params.items() if n not in self.layout.keys}
    slots = {g.key: [jax.tree.map(lambda s: s[j], params[g.key]) for j in range(g.slots)] for g in self.groups}
    (loss, (new_stats, accuracy)), (g_shared, g_slots) = jax.value_and_grad(loss_fn, argnums=(0, 1),
                                                                           has_aux=True)(shared, slots)
    grads = {**g_shared, **{k: jax.tree.map(lambda *g: jnp.stack(g), *v) for k, v in g_slots.items()}}
    new_params, new_opt = self.optimizer.update(grads, opt_state, params, self.schedule(step))
    if self.layout.index:  # an empty slot stays exactly as it was (zero; weight decay and momentum included)
      def keep(path, new, old):
        key = slot_key(path)
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
      outs.append(self.worker_step(take(params), take(stats), take(opt_state), take(member), images[i],
                                   labels[i], base + i, step))
    p, st, o, loss, acc = jax.tree.map(lambda *xs: jnp.stack(xs), *outs)
    loss, acc = jax.lax.pmean((jnp.mean(loss), jnp.mean(acc)), AXIS)
    return p, st, o, loss, acc

  @functools.cached_property
  def local_step(self):
    """``(state, images, labels, step) -> (state, metrics)``: every worker's step, compiled once."""
    w = P(AXIS)
    f = jax.shard_map(self._local, mesh=self.mesh, in_specs=(w, w, w, w, w, w, P()),
                      out_specs=(w, w, w, P(), P()), check_vma=False)

    def step_fn(state: ReplicaState, images, labels, step):
      p, st, o, loss, acc = f(state.params, state.batch_stats, state.opt_state, state.membership,
                              images, labels, step)
      metrics = {'train_loss': loss, 'train_accuracy': acc, 'learning_rate': self.schedule(step)}
      return state._replace(params=p, batch_stats=st, opt_state=o), metrics
    return jax.jit(step_fn, donate_argnums=0)

  # --- the driver ---------------------------------------------------------------------------------
  def aggregate(self, state: ReplicaState, round_index: int) -> ReplicaState:
    """The end of round ``round_index`` (averaging.py); its bytes in ``last_traffic``."""
    state, self.last_traffic = self.averaging.aggregate(state, round_index, self.put_workers)
    return state

  def step(self, state: ReplicaState, batch: Batch, t: int):
    timed = bool(self.speeds) and self.spec.average
    if timed and (self._round_start is None or t % self.spec.local_steps == 0):
      self._round_start = time.perf_counter()  # the last round ended waited for: nothing of it is still running
    images, labels = self.put_workers((batch.images, batch.labels))
    state, metrics = self.local_step(state, images, labels, np.int32(t))
    self.steps_done = t + 1
    if self.spec.average and (t + 1) % self.spec.local_steps == 0:
      first = self.last_traffic is None and self.announce
      if timed:
        jax.block_until_ready(state)
        local_end = time.perf_counter()
      state = self.aggregate(state, t // self.spec.local_steps)
      if timed:
        jax.block_until_ready(state)
        metrics = {**metrics, **self._round_times(self._round_start, local_end, time.perf_counter())}
      traffic = self.last_traffic
      metrics = {**metrics, 'sent_mb': float(np.mean(traffic.sent)) / 1e6,
                 'received_mb': float(np.mean(traffic.received)) / 1e6,
                 'all_reduce_mb': traffic.all_reduce / 1e6,
                 'collective_received_mb': traffic.collective_received / 1e6}
      if first:
        logging.info('first round (per device): %.2f MB of blocks sent and %.2f MB received across devices '
                     '(measured), %.2f MB put into the shared layers\' collectives and %.2f MB arriving from them '
                     '(all-gather: exact; all-reduce: a ring\'s count); logged each round as sent_mb, received_mb, '
                     'all_reduce_mb, collective_received_mb', metrics['sent_mb'], metrics['received_mb'],
                     metrics['all_reduce_mb'], metrics['collective_received_mb'])
    return state, metrics

  def _round_times(self, start: float, local_end: float, end: float) -> dict[str, float]:
    """A round's measured seconds (its local steps, then its exchange, each waited for) and the stragglers
    model's round and idle fraction at ``self.speeds`` (replica/stragglers.py). The local steps of every worker
    ran together in one program, so the model takes their time as each worker's at full speed (exact with one
    worker per device). The first round includes compiling."""
    local_s, exchange_s = local_end - start, end - local_end
    model = round_model([local_s] * self.spec.num_workers, self.speeds, exchange_s)
    times = {'round_s': end - start, 'round_local_s': local_s, 'round_exchange_s': exchange_s,
             'round_s_stragglers': model['round_s'], 'stragglers_idle_fraction': model['idle_fraction']}
    if self._rounds_timed == 1 and jax.process_index() == 0 and set(self.speeds) != {1.0}:  # past compiling
      logging.info('stragglers (simulated, worker speeds %s): a round measured %.3f s (local steps %.3f s, exchange '
                   '%.3f s); waiting for its slowest worker it would take %.3f s, the workers idle %.0f%% of their '
                   'time (a model: replica/stragglers.py); logged each round as round_s, round_s_stragglers',
                   ','.join(f'{v:g}' for v in self.speeds), times['round_s'], local_s, exchange_s,
                   model['round_s'], 100 * model['idle_fraction'])
    self._rounds_timed += 1
    return times

  # --- evaluation -------------------------------------------------------------------------------
  def averaged(self, state: ReplicaState):
    """(params, batch_stats) of the averaged network, replicated over the mesh (averaging.py): in the middle
    of a round whose end sends compressed weights, the network that end would make (``Averaging.closing``)."""
    a, L = self.averaging, self.spec.local_steps
    if self.spec.average and a.compresses and not a.tracks and self.steps_done % L:
      following = np.asarray(self.layout.membership(self.steps_done // L + 1), bool)
      following = following if following.size else np.zeros((self.spec.num_workers, 0), bool)
      # every process supplies the whole (replicated) array: the same partition, drawn from (seed, round)
      following = jax.make_array_from_callback(following.shape, NamedSharding(self.mesh, P()),
                                               lambda index: following[index])
      return a.closing(state, following)
    return a.averaged(state)

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

  def ensemble_predict(self, train: bool):
    """``(variables, x) -> log of the workers' mean predicted probabilities``, ``variables`` holding every
    worker's (params, batch_stats, membership) on one device: the ensemble baseline's evaluation."""
    def predict(variables, x):
      probs = []
      for w in range(self.spec.num_workers):  # unrolled: XLA:CPU runs convolutions in loops slowly
        p, s, m = jax.tree.map(lambda v: v[w], (variables['params'], variables['batch_stats'],
                                                variables['membership']))
        logits, _ = slot_apply(self.chain, self.groups, {'params': p, 'batch_stats': s}, x, self.layout.valid(m),
                               train=train, skip=self.spec.skip)
        probs.append(jax.nn.softmax(logits.astype(jnp.float32)))
      return jnp.log(jnp.mean(jnp.stack(probs), axis=0))
    return predict
