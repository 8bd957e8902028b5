"""The width-wise methods, each a configuration of the replica engine (jaxdecouple.replica).

resist    ResIST (Dun et al.): every round a random partition of the third section's non-strided
          blocks into S disjoint sub-ResNets, one per worker; L local iterations; shared layers
          averaged over all workers, each partitioned block over its owners; at test time every block
          runs with its residual branch scaled by 1/S.
localsgd  local SGD: every block on every worker, everything averaged every L iterations.
ensemble  the paper's A.2 baseline: S sub-ResNets from one partition, trained without ever
          averaging; evaluation averages their predicted probabilities.
"""
from __future__ import annotations

import dataclasses

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from jaxdecouple.config import fail
from jaxdecouple.data import Batch
from jaxdecouple.methods.base import Method, Setup
from jaxdecouple.models import build_model
from jaxdecouple.replica import Replica, ReplicaSpec, ReplicaState, slot_apply
from jaxdecouple.replica.partition import SCOPES, partitioned_groups


class ReplicaMethod(Method):
  """Shared plumbing: config checks, the engine, evaluation and the start-up description."""
  scans_blocks = False  # workers gather and skip blocks one by one
  partition = True
  average = True
  redraw = True

  @classmethod
  def validate(cls, config) -> None:
    r = config.replica
    if r.num_workers < 1:
      fail('replica.num_workers', f'must be at least 1, got {r.num_workers}')
    if r.local_steps < 1:
      fail('replica.local_steps', f'must be at least 1, got {r.local_steps}')
    if r.momentum not in ('restart', 'average'):
      fail('replica.momentum', f"{r.momentum!r} is not allowed; choose restart or average")
    if r.batch_norm not in ('batch', 'running'):
      fail('replica.batch_norm', f"{r.batch_norm!r} is not allowed; choose batch or running")
    if r.quantize_bits and not 4 <= r.quantize_bits <= 8:
      fail('replica.quantize_bits', f'must be 0 (off) or 4..8, got {r.quantize_bits}')
    if not 0 <= r.sparsify < 1:
      fail('replica.sparsify', f'must be in [0, 1) (fraction kept; 0 = off), got {r.sparsify}')
    if r.skip not in ('gather', 'cond'):
      fail('replica.skip', f"{r.skip!r} is not allowed; choose gather (default, fast everywhere) or cond")
    if r.warmup_steps and (not cls.partition or not cls.average):
      fail('replica.warmup_steps', f'is a local SGD warm-up before ResIST; {config.method} has none (leave it at 0)')
    if r.warmup_steps < 0 or (r.local_steps >= 1 and r.warmup_steps % r.local_steps):
      fail('replica.warmup_steps', f'must be 0 (none) or a multiple of replica.local_steps ({r.local_steps}), '
           f'got {r.warmup_steps}')
    if r.warmup_steps and config.max_steps and r.warmup_steps >= config.max_steps:
      fail('replica.warmup_steps', f'{r.warmup_steps} is not shorter than the run (max_steps {config.max_steps}): '
           'ResIST would never start')
    if r.stats_every_steps < 0 or (r.local_steps >= 1 and r.stats_every_steps % r.local_steps):
      fail('replica.stats_every_steps', f'must be 0 (every round) or a multiple of replica.local_steps '
           f'({r.local_steps}), got {r.stats_every_steps}')
    if r.min_depth < 0:
      fail('replica.min_depth', f'must be non-negative, got {r.min_depth}')
    if r.num_devices < 0:
      fail('replica.num_devices', f'must be non-negative (0: as many as useful), got {r.num_devices}')
    if r.num_devices and r.num_workers % r.num_devices:
      fail('replica.num_devices', f'{r.num_devices} does not divide the {r.num_workers} workers (each device runs '
           f'as many); use one of {", ".join(str(n) for n in range(1, r.num_workers + 1) if r.num_workers % n == 0)}'
           ', or 0 for as many as divide them')
    if r.partition not in SCOPES:
      fail('replica.partition', f"{r.partition!r} is not allowed; choose {' or '.join(SCOPES)}")
    if r.partition != 'third_section' and not cls.partition:
      fail('replica.partition', f'{config.method} partitions nothing (leave it at third_section)')
    if r.partition == 'every_section' and r.min_depth:
      fail('replica.min_depth', "the naive partition (replica.partition='every_section') deals every section out "
           'on its own, as the paper\'s A.1 does, without a minimum depth; leave replica.min_depth at 0')
    if cls.partition:
      try:
        blocks = len(partitioned_groups(build_model(config.model, 10))[0])
      except ValueError as e:
        fail('model', str(e))
      # (the naive partition: a section with fewer blocks than workers leaves some workers without one)
      if r.partition == 'third_section' and r.num_workers > blocks and r.min_depth == 0:
        fail('replica.num_workers', f'{config.model} has {blocks} partitioned blocks, fewer than the '
             f'{r.num_workers} workers; use at most {blocks} workers or set replica.min_depth')
      if r.min_depth > blocks:
        fail('replica.min_depth', f'{config.model} has only {blocks} partitioned blocks, got {r.min_depth}')

  def __init__(self, setup: Setup):
    super().__init__(setup)
    r = setup.config.replica
    spec = ReplicaSpec(r.num_workers, r.local_steps, partition=self.partition, average=self.average,
                       redraw=self.redraw, min_depth=r.min_depth, momentum=r.momentum,
                       batch_norm=r.batch_norm, quantize_bits=r.quantize_bits, sparsify=r.sparsify,
                       skip=r.skip, test_time_scale=r.test_time_scale,
                       stats_every=max(1, r.stats_every_steps // r.local_steps),
                       scope=r.partition if self.partition else 'third_section')
    n = r.num_devices or len(setup.devices)
    if n > len(setup.devices):
      fail('replica.num_devices', f'{n} devices asked for but only {len(setup.devices)} present')
    self.engine = Replica(setup, spec, setup.devices[:n])
    self.eval_uses_batch_statistics = r.batch_norm == 'batch'
    self.warmup = r.warmup_steps if self.partition and self.average else 0
    if self.warmup:  # local SGD on the network ResIST evaluates: partitioned branches scaled, as the paper does
      warm = dataclasses.replace(setup, model=self.engine.eval_model())
      self.warm = Replica(warm, dataclasses.replace(spec, partition=False), setup.devices[:n])

  def train_batch(self, x, y, order, step: int) -> Batch:
    return self.engine.train_batch(x, y, step)

  def init(self, rng: jax.Array, example: Batch) -> ReplicaState:
    self._example = (rng, example)
    return (self.warm if self.warmup else self.engine).init(rng, example)

  def state_at(self, initial: ReplicaState, step: int) -> ReplicaState:
    if self.warmup and step >= self.warmup:  # past the warm-up: ResIST's layout
      return self.engine.init(*self._example)
    return initial

  def _after_warmup(self, state: ReplicaState) -> ReplicaState:
    """The warm-up's last step averaged every worker's network: each device hands its copy to ResIST's
    layout, every worker keeping only its blocks of the next round; momentum restarts (or carries over,
    averaged, with ``momentum='average'``)."""
    e = self.engine
    first = lambda x: np.asarray(x.addressable_shards[0].data[0])  # every worker holds the same now
    network = lambda tree: jax.tree.map(first, tree)
    member = e.membership(self.warmup // e.spec.local_steps)
    params, stats = e.to_workers(network(state.params), member), e.to_workers(network(state.batch_stats), member)
    opt = jax.tree.map(np.zeros_like, jax.device_get(self.setup.optimizer.init(params)))
    if e.spec.momentum == 'average':
      opt = (opt[0], opt[1]._replace(trace=e.to_workers(network(state.opt_state[1].trace), member)))
    return ReplicaState(e.put_workers(params), e.put_workers(stats), e.put_workers(opt), e.put_workers(member))

  def step(self, state: ReplicaState, batch: Batch, step: int):
    if step < self.warmup:
      state, metrics = self.warm.step(state, batch, step)
      if step + 1 == self.warmup:
        state = self._after_warmup(state)
        logging.info('local SGD warm-up done at step %d: ResIST from here on', step + 1)
      return state, metrics
    state, metrics = self.engine.step(state, batch, step)
    if 'sent_mb' in metrics and not getattr(self, '_told', False):
      self._told = True
      logging.info('first round (measured, per device): %.2f MB of blocks sent and %.2f MB received across devices, '
                   '%.2f MB into the shared layers\' collective; logged each round as sent_mb, received_mb, '
                   'all_reduce_mb', metrics['sent_mb'], metrics['received_mb'], metrics['all_reduce_mb'])
    return state, metrics

  def eval_variables(self, state: ReplicaState) -> dict:
    engine = self.engine if not self.warmup or any(g.key in state.params for g in self.engine.groups) else self.warm
    params, stats = engine.averaged(state)  # replicated over the mesh: this process's copy
    return jax.tree.map(lambda x: x.addressable_data(0), {'params': params, 'batch_stats': stats})

  def predict_fn(self):
    model, train = self.engine.eval_model(), self.eval_uses_batch_statistics
    return lambda variables, x: model.apply(variables, x, train=train)[0]

  def describe(self, state: ReplicaState) -> list[str]:
    e, s = self.engine, self.engine.spec
    network = e.network_shapes(state.params)
    shared, blocks = e.parameter_counts(network)
    lines = [f'{s.num_workers} workers on {e.mesh.devices.size} device{"s" if e.mesh.devices.size > 1 else ""} ({e.per_device} per device), '
             f'{s.local_steps} local iterations per round, batch {self.setup.config.batch_size} per worker, '
             f'momentum {s.momentum}, BatchNorm {s.batch_norm} statistics']
    if self.warmup:
      lines.append(f'  local SGD warm-up for the first {self.warmup} steps (partitioned branches scaled as at test '
                   'time), then ResIST')
    if e.partitioned:
      groups = ', '.join(f'{g.names[0]}..{g.names[-1]}' if len(g.names) > 1 else g.names[0] for g in e.groups)
      slots = ' + '.join(str(g.slots) for g in e.groups)
      line = (f'  partitioned: {len(e.partitioned)} blocks ({groups}, {sum(blocks.values()) / 1e6:.2f}M params); '
              f'shared: {shared / 1e6:.2f}M params; each worker holds the shared layers and {slots} block slots')
      if isinstance(state.membership, jax.Array) and state.membership.is_fully_addressable:
        sizes = np.asarray(jax.device_get(state.membership)).sum(axis=1)
        line += f'; blocks per worker this round: {", ".join(map(str, sizes))}'
      lines.append(line)
    held = e.resident_bytes(state)
    lines.append(f'  stored on each of this process\'s devices (parameters, statistics, momentum; measured): '
                 + ', '.join(f'{d}: {b / 1e6:.1f} MB' for d, b in held.items()))
    if s.average:
      model = e.traffic_model(network, 0)
      full = 2 * (shared + sum(blocks.values())) * 4 * s.num_workers
      lines.append(f'  communication per round, model (Table 1\'s count): {model["total"] / 1e9:.3f} GB for all '
                   f'workers ({model["sent_per_worker"] / 1e6:.1f} MB sent, {model["received_per_worker"] / 1e6:.1f} '
                   f'MB received per worker; local SGD: {full / 1e9:.3f} GB); measured figures are logged each '
                   'round as sent_mb, received_mb, all_reduce_mb')
    return lines


class ResIST(ReplicaMethod):
  name = 'resist'
  transfers = True  # blocks travel to their next owners


class LocalSGD(ReplicaMethod):
  name = 'localsgd'
  partition = False


class Ensemble(ReplicaMethod):
  name = 'ensemble'
  average = False
  redraw = False

  def eval_variables(self, state: ReplicaState) -> dict:
    if jax.process_count() > 1:
      fail('method', 'the ensemble evaluates every worker on one device, so it runs in one process')
    device = jax.local_devices()[0]
    return jax.device_put({'params': state.params, 'batch_stats': state.batch_stats,
                           'membership': state.membership}, device)

  def predict_fn(self):
    e, train = self.engine, self.eval_uses_batch_statistics

    def predict(variables, x):
      probs = []
      for w in range(e.spec.num_workers):  # unrolled: XLA:CPU runs convolutions in loops slowly
        p, s, m = jax.tree.map(lambda v: v[w], (variables['params'], variables['batch_stats'],
                                                variables['membership']))
        logits, _ = slot_apply(e.chain, e.groups, {'params': p, 'batch_stats': s}, x, e._valid(m),
                               train=train, skip=e.spec.skip)
        probs.append(jax.nn.softmax(logits.astype(jnp.float32)))
      return jnp.log(jnp.mean(jnp.stack(probs), axis=0))
    return predict
