"""BP: standard back-propagation through the whole network on one device."""
from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxdecouple.common import use_split_backward, vjp_call
from jaxdecouple.data import Batch, train_inputs
from jaxdecouple.errors import fail
from jaxdecouple.methods.base import Method


class BPState(NamedTuple):
  params: Any
  batch_stats: Any
  opt_state: Any


class BP(Method):
  name = 'bp'

  @classmethod
  def validate(cls, config) -> None:
    super().validate(config)
    if config.distributed.coordinator:
      fail('distributed.coordinator', f'several processes run the pipeline and replica methods; {cls.name} '
           'runs in one process')

  def init(self, rng, example: Batch) -> BPState:
    x = jnp.zeros((1, *example.images.shape[1:]), jnp.float32)
    variables = self.setup.model.init(rng, x)
    params = variables['params']
    state = BPState(params, variables['batch_stats'], self.setup.optimizer.init(params))
    return jax.device_put(state, self.setup.devices[0])

  def _loss_fn(self, batch_stats, images, labels, step):
    """``params -> (loss, (new batch statistics, accuracy))`` on the step's augmented batch."""
    s = self.setup
    x = train_inputs(images, step, s.config.seed, s.preprocess)

    def loss_fn(params):
      logits, stats = s.model.apply({'params': params, 'batch_stats': batch_stats}, x, train=True)
      loss, accuracy = s.model.loss(logits, labels)
      return loss, (stats, accuracy)
    return loss_fn

  @functools.cached_property
  def _step(self):
    def make(state: BPState, images, labels, step):
      loss, vjp_fn, (stats, accuracy) = jax.vjp(self._loss_fn(state.batch_stats, images, labels, step),
                                                state.params, has_aux=True)
      return vjp_fn, (loss, stats, accuracy)

    def use(vjp_fn, aux, state: BPState, images, labels, step):
      loss, stats, accuracy = aux
      (grads,) = vjp_fn(jnp.ones_like(loss))
      lr = self.setup.schedule(step)
      params, opt_state = self.setup.optimizer.update(grads, state.opt_state, state.params, lr)
      return BPState(params, stats, opt_state), {'train_loss': loss, 'train_accuracy': accuracy,
                                                 'learning_rate': lr}
    return vjp_call(make, use, use_split_backward(self.setup.config), donate=(0,))

  def _put_batch(self, batch: Batch):
    return jax.device_put((batch.images, batch.labels), self.setup.devices[0])

  def step(self, state: BPState, batch: Batch, step: int):
    return self._step(state, *self._put_batch(batch), np.int32(step))

  def eval_variables(self, state: BPState):
    return {'params': state.params, 'batch_stats': state.batch_stats}
