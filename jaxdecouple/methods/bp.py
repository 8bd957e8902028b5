"""BP: standard back-propagation through the whole network on one device."""
from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxdecouple.common import VjpStash, use_split_backward
from jaxdecouple.data import Batch, train_inputs
from jaxdecouple.methods.base import Method, classification_loss


class BPState(NamedTuple):
  params: Any
  batch_stats: Any
  opt_state: Any


class BP(Method):
  name = 'bp'

  def init(self, rng, example: Batch) -> BPState:
    x = jnp.zeros((1, *example.images.shape[1:]), jnp.float32)
    variables = self.setup.model.init(rng, x)
    params = variables['params']
    state = BPState(params, variables['batch_stats'], self.setup.optimizer.init(params))
    return jax.device_put(state, self.setup.devices[0])

  def _loss_fn(self, batch_stats, images, labels, step):
    s = self.setup
    x = train_inputs(images, step, s.config.seed, s.preprocess)

    def loss_fn(params):
      logits, stats = s.model.apply({'params': params, 'batch_stats': batch_stats}, x, train=True)
      loss, accuracy = classification_loss(logits, labels)
      return loss, (stats, accuracy)
    return loss_fn

  def _update(self, grads, opt_state, params, step):
    lr = self.setup.schedule(step)
    params, opt_state = self.setup.optimizer.update(grads, opt_state, params, lr)
    return params, opt_state, lr

  @functools.cached_property
  def _fused_step(self):
    def train_step(state: BPState, images, labels, step):
      loss_fn = self._loss_fn(state.batch_stats, images, labels, step)
      (loss, (stats, accuracy)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
      params, opt_state, lr = self._update(grads, state.opt_state, state.params, step)
      return BPState(params, stats, opt_state), {'train_loss': loss, 'train_accuracy': accuracy,
                                                 'learning_rate': lr}
    return jax.jit(train_step, donate_argnums=0)

  @functools.cached_property
  def _split_step(self):
    """The same step as two compiled calls: forward keeping the vjp residuals, then backward+update."""
    stash = VjpStash()

    def forward(params, batch_stats, images, labels, step):
      loss_fn = self._loss_fn(batch_stats, images, labels, step)
      loss, vjp_fn, (stats, accuracy) = jax.vjp(loss_fn, params, has_aux=True)
      return loss, accuracy, stats, stash.flatten(vjp_fn)

    def backward(params, opt_state, residuals, step):
      (grads,) = stash.unflatten(residuals)(jnp.ones((), jnp.float32))
      return self._update(grads, opt_state, params, step)

    return jax.jit(forward, donate_argnums=1), jax.jit(backward, donate_argnums=(0, 1))

  def _put_batch(self, batch: Batch):
    return jax.device_put((batch.images, batch.labels), self.setup.devices[0])

  def step(self, state: BPState, batch: Batch, step: int):
    images, labels = self._put_batch(batch)
    step = np.int32(step)
    if not use_split_backward(self.setup.config):
      return self._fused_step(state, images, labels, step)
    forward, backward = self._split_step
    loss, accuracy, stats, residuals = forward(state.params, state.batch_stats, images, labels, step)
    params, opt_state, lr = backward(state.params, state.opt_state, residuals, step)
    return BPState(params, stats, opt_state), {'train_loss': loss, 'train_accuracy': accuracy,
                                               'learning_rate': lr}

  def eval_variables(self, state: BPState):
    return {'params': state.params, 'batch_stats': state.batch_stats}
