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
import numpy as np

from jaxdecouple.data import Batch
from jaxdecouple.errors import fail
from jaxdecouple.methods import replica_config
from jaxdecouple.methods.base import Method, Setup
from jaxdecouple.replica import Replica, ReplicaState, describe


class ReplicaMethod(Method):
  """Shared plumbing: the engine (and a local SGD warm-up's), evaluation and the start-up description."""
  scans_blocks = False  # workers gather and skip blocks one by one
  replicated = True
  partition, average, redraw = True, True, True

  @classmethod
  def validate(cls, config) -> None:
    super().validate(config)
    replica_config.validate(config, cls.name, cls.partition, cls.average)

  def __init__(self, setup: Setup):
    super().__init__(setup)
    r = setup.config.replica
    spec = replica_config.spec(setup.config, self.partition, self.average, self.redraw)
    devices = replica_config.devices(r, setup.devices)
    engine = lambda model, spec: Replica(model, spec, devices, setup.optimizer, setup.schedule, setup.preprocess)
    self.engine = engine(setup.model, spec)
    self.engine.speeds = tuple(float(v) for v in r.worker_speeds)  # stragglers, simulated (replica/stragglers.py)
    self.eval_uses_batch_statistics = r.batch_norm == 'batch'
    self.warmup = r.warmup_steps if self.partition and self.average else 0
    total = setup.config.max_steps or setup.config.num_epochs * setup.steps_per_epoch  # as the training loop counts
    if self.warmup and self.warmup >= total:  # (validate checks max_steps; an epoch count needs the data's size)
      fail('replica.warmup_steps', f'{self.warmup} is not shorter than the run ({total} steps: num_epochs '
           f'{setup.config.num_epochs} x {setup.steps_per_epoch} per epoch): ResIST would never start; shorten '
           'the warm-up or train longer')
    # the warm-up: local SGD on the network ResIST evaluates (partitioned branches scaled, as the paper does)
    self.warm = engine(self.engine.eval_model(), dataclasses.replace(spec, partition=False)) if self.warmup else None
    if self.warm is not None:
      self.warm.announce = False  # the bytes the log announces are ResIST's
      self.warm.speeds = self.engine.speeds  # the warm-up's rounds are timed too
    self._example = None

  def train_batch(self, x, y, order, step: int) -> Batch:
    return self.engine.train_batch(x, y, step)

  def init(self, rng: jax.Array, example: Batch) -> ReplicaState:
    self._example = (rng, example)
    return (self.warm or self.engine).init(rng, example)

  def state_at(self, initial: ReplicaState, step: int) -> ReplicaState:
    for engine in (self.engine, self.warm):  # a restored state's place in its round (evaluation needs it)
      if engine is not None:
        engine.steps_done = step
    if self.warmup and step >= self.warmup:  # past the warm-up: ResIST's layout
      return self.engine.init(*self._example)
    return initial

  def _after_warmup(self, state: ReplicaState) -> ReplicaState:
    """The warm-up's last step averaged every worker's network: ResIST's layout from it, every worker
    keeping only its blocks of the next round; momentum restarts (or carries over with 'average'); the
    outer momentum carries over, the unsent error (compressed updates) restarts at zero. The BatchNorm
    statistics are averaged over the workers here whatever ``replica.stats_every_steps`` says: the last
    round averaged them only if it was a statistics round (the ImageNet configs: every 1300 rounds, the
    warm-up 500), and ResIST starts from one network, not from worker 0's statistics."""
    first = lambda tree: jax.tree.map(lambda x: np.asarray(x.addressable_shards[0].data[0]), tree)
    opt_state = first(state.opt_state) if self.engine.spec.momentum == 'average' else None
    outer_momentum = first(state.outer['momentum']) if 'momentum' in state.outer else None
    stats = jax.tree.map(lambda x: np.asarray(x.addressable_data(0)), self.warm.averaged(state)[1])
    return self.engine.state_from(first(state.params), stats, opt_state,
                                  self.warmup // self.engine.spec.local_steps, outer_momentum)

  def step(self, state: ReplicaState, batch: Batch, step: int):
    if step < self.warmup:
      state, metrics = self.warm.step(state, batch, step)
      if step + 1 == self.warmup:
        state = self._after_warmup(state)
        logging.info('local SGD warm-up done at step %d: ResIST from here on', step + 1)
      return state, metrics
    return self.engine.step(state, batch, step)

  def eval_variables(self, state: ReplicaState) -> dict:
    in_warmup = self.warmup and not any(g.key in state.params for g in self.engine.groups)
    params, stats = (self.warm if in_warmup else self.engine).averaged(state)  # replicated: this process's copy
    return jax.tree.map(lambda x: x.addressable_data(0), {'params': params, 'batch_stats': stats})

  def predict_fn(self):
    return self.engine.eval_model().predict(train=self.eval_uses_batch_statistics)

  def describe(self, state: ReplicaState) -> list[str]:
    lines = describe(self.engine, state)
    if self.warmup:
      lines.insert(1, f'  local SGD warm-up for the first {self.warmup} steps (partitioned branches scaled as at '
                   'test time), then ResIST')
    return lines


class ResIST(ReplicaMethod):
  name = 'resist'
  transfers = True  # blocks travel to their next owners


class LocalSGD(ReplicaMethod):
  name = 'localsgd'
  partition = False


class Ensemble(ReplicaMethod):
  name = 'ensemble'
  average, redraw = False, False

  @classmethod
  def validate(cls, config) -> None:
    super().validate(config)
    if config.model.startswith('yolo_'):
      fail('method', f'the ensemble averages its members\' class probabilities, which {config.model}\'s box outputs are '
           'not; train a detector with resist or localsgd')

  def eval_variables(self, state: ReplicaState) -> dict:
    if jax.process_count() > 1:
      fail('method', 'the ensemble evaluates every worker on one device, so it runs in one process')
    return jax.device_put({'params': state.params, 'batch_stats': state.batch_stats,
                           'membership': state.membership}, jax.local_devices()[0])

  def predict_fn(self):
    return self.engine.ensemble_predict(train=self.eval_uses_batch_statistics)
