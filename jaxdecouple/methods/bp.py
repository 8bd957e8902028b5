"""BP: standard back-propagation through the whole network on one device."""
from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

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

  @functools.cached_property
  def _train_step(self):
    s = self.setup

    def train_step(state: BPState, images, labels, step):
      x = train_inputs(images, step, s.config.seed, s.preprocess)

      def loss_fn(params):
        logits, stats = s.model.apply({'params': params, 'batch_stats': state.batch_stats}, x, train=True)
        loss, accuracy = classification_loss(logits, labels)
        return loss, (stats, accuracy)

      (loss, (stats, accuracy)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
      lr = s.schedule(step)
      params, opt_state = s.optimizer.update(grads, state.opt_state, state.params, lr)
      return BPState(params, stats, opt_state), {'train_loss': loss, 'train_accuracy': accuracy,
                                                 'learning_rate': lr}

    return jax.jit(train_step, donate_argnums=0)

  def step(self, state: BPState, batch: Batch, step: int):
    device = self.setup.devices[0]
    images, labels = jax.device_put((batch.images, batch.labels), device)
    return self._train_step(state, images, labels, np.int32(step))

  def eval_variables(self, state: BPState):
    return {'params': state.params, 'batch_stats': state.batch_stats}
