"""DP: data parallel. The batch is sharded over the devices, gradients are averaged every step.

BatchNorm uses the statistics of the whole batch (averaged over the devices), so DP on any number of
devices computes the same step as BP on the same global batch; only the reductions' order differs.
Augmentation runs on the whole batch before it is sharded, with BP's random draws. The step is BP's:
only the loss differs, each device computing its shard's under ``jax.shard_map`` and the mean over the
devices taken there, so differentiating it averages the gradients over the devices.
"""
from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxdecouple.errors import fail
from jaxdecouple.data import Batch, train_inputs
from jaxdecouple.methods.base import Setup
from jaxdecouple.methods.bp import BP, BPState

AXIS = 'data'


class DP(BP):
  name = 'dp'

  @classmethod
  def validate(cls, config) -> None:
    super().validate(config)
    if config.dp.num_devices < 0:
      fail('dp.num_devices', f'must be non-negative (0: every device), got {config.dp.num_devices}')

  def __init__(self, setup: Setup):
    super().__init__(setup)
    c = setup.config
    n = c.dp.num_devices or len(setup.devices)
    if n > len(setup.devices):
      fail('dp.num_devices', f'{n} devices asked for but only {len(setup.devices)} present')
    if c.batch_size % n:
      fail('batch_size', f'{c.batch_size} is not divisible by the {n} devices data parallel spreads it '
           f'over; use a multiple of {n} or set dp.num_devices')
    self.mesh = Mesh(np.array(setup.devices[:n]), (AXIS,))
    self.replicated = NamedSharding(self.mesh, P())
    self.sharded = NamedSharding(self.mesh, P(AXIS))
    self.sharded_model = setup.model.with_batch_norm_axis(AXIS)

  def init(self, rng, example: Batch) -> BPState:
    return jax.device_put(super().init(rng, example), self.replicated)

  def _loss_fn(self, batch_stats, images, labels, step):
    s = self.setup
    x = train_inputs(images, step, s.config.seed, s.preprocess)

    def shard_loss(params, batch_stats, x, labels):
      logits, stats = self.sharded_model.apply({'params': params, 'batch_stats': batch_stats}, x, train=True)
      loss, accuracy = jax.lax.pmean(self.sharded_model.loss(logits, labels), AXIS)
      return loss, (stats, accuracy)
    loss = jax.shard_map(shard_loss, mesh=self.mesh, in_specs=(P(), P(), P(AXIS), P(AXIS)),
                         out_specs=(P(), (P(), P())))
    return lambda params: loss(params, batch_stats, x, labels)

  def _put_batch(self, batch: Batch):
    return jax.device_put((batch.images, batch.labels), self.sharded)

  def describe(self, state) -> list[str]:
    n = self.mesh.devices.size
    return [f'data parallel over {n} devices ({", ".join(str(d) for d in self.mesh.devices)}): '
            f'{self.setup.config.batch_size // n} examples per device, gradients and BatchNorm '
            'statistics averaged over all of them']
