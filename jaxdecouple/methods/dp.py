"""DP: data parallel. The batch is sharded over the devices, gradients are averaged every step.

BatchNorm uses the statistics of the whole batch (averaged over the devices), so DP on any number of
devices computes the same step as BP on the same global batch; only the reductions' order differs.
Augmentation runs on the whole batch before it is sharded, with BP's random draws.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxdecouple.common import VjpStash
from jaxdecouple.config import fail
from jaxdecouple.data import Batch, train_inputs
from jaxdecouple.methods.base import Setup, classification_loss
from jaxdecouple.methods.bp import BP, BPState

AXIS = 'data'


class DP(BP):
  name = 'dp'

  @classmethod
  def validate(cls, config) -> None:
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

  def _shard_loss_fn(self, batch_stats, x, labels):
    def loss_fn(p):
      logits, stats = self.sharded_model.apply({'params': p, 'batch_stats': batch_stats}, x, train=True)
      loss, accuracy = classification_loss(logits, labels)
      return loss, (stats, accuracy)
    return loss_fn

  @functools.cached_property
  def _split_step(self):
    """The step as two compiled calls (see ``use_split_backward``): each device's forward keeping its
    vjp residuals (given a leading device axis, so they stay where they were made), then the backward,
    the gradient average and the update."""
    s, stash = self.setup, VjpStash()
    shard = lambda f, in_specs, out_specs: jax.shard_map(f, mesh=self.mesh, in_specs=in_specs,
                                                          out_specs=out_specs, check_vma=False)

    def forward_shard(params, batch_stats, x, labels):
      loss, vjp_fn, (stats, accuracy) = jax.vjp(self._shard_loss_fn(batch_stats, x, labels), params,
                                                has_aux=True)
      loss, accuracy = jax.lax.pmean((loss, accuracy), AXIS)
      return loss, accuracy, stats, tuple(r[None] for r in stash.flatten(vjp_fn))

    def backward_shard(params, opt_state, residuals, step):
      (grads,) = stash.unflatten([r[0] for r in residuals])(jnp.ones((), jnp.float32))
      grads = jax.lax.pmean(grads, AXIS)
      return self._update(grads, opt_state, params, step)

    def forward(params, batch_stats, images, labels, step):
      x = train_inputs(images, step, s.config.seed, s.preprocess)
      return shard(forward_shard, (P(), P(), P(AXIS), P(AXIS)), (P(), P(), P(), P(AXIS)))(
          params, batch_stats, x, labels)

    backward = shard(backward_shard, (P(), P(), P(AXIS), P()), P())
    return jax.jit(forward, donate_argnums=1), jax.jit(backward, donate_argnums=(0, 1))

  @functools.cached_property
  def _fused_step(self):
    s = self.setup

    def shard_step(params, batch_stats, opt_state, x, labels, step):
      loss_fn = self._shard_loss_fn(batch_stats, x, labels)
      (loss, (stats, accuracy)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
      grads, loss, accuracy = jax.lax.pmean((grads, loss, accuracy), AXIS)
      params, opt_state, lr = self._update(grads, opt_state, params, step)
      return params, stats, opt_state, loss, accuracy, lr

    # check_vma=False: per-device gradients are averaged explicitly by the pmean above. (With it on,
    # differentiating the replicated parameters through sharded data already sums the gradients
    # over devices, and the pmean would leave them n times too large.)
    sharded = jax.shard_map(shard_step, mesh=self.mesh, out_specs=P(),
                            in_specs=(P(), P(), P(), P(AXIS), P(AXIS), P()), check_vma=False)

    def train_step(state: BPState, images, labels, step):
      x = train_inputs(images, step, s.config.seed, s.preprocess)
      params, stats, opt_state, loss, accuracy, lr = sharded(
          state.params, state.batch_stats, state.opt_state, x, labels, step)
      return BPState(params, stats, opt_state), {'train_loss': loss, 'train_accuracy': accuracy,
                                                 'learning_rate': lr}

    return jax.jit(train_step, donate_argnums=0)

  def _put_batch(self, batch: Batch):  # BP.step then runs the fused or split step below
    return jax.device_put((batch.images, batch.labels), self.sharded)

  def describe(self, state) -> list[str]:
    n = self.mesh.devices.size
    return [f'data parallel over {n} devices ({", ".join(str(d) for d in self.mesh.devices)}): '
            f'{self.setup.config.batch_size // n} examples per device, gradients and BatchNorm '
            'statistics averaged over all of them']
