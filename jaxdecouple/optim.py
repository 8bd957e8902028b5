"""SGD with momentum and weight decay (PyTorch's semantics), milestone decays and warm-up.

The learning rate is a pure function of the global iteration, passed into each update, rather than
of an optimizer's own step count: pipeline stages start updating at different iterations but must
all use the learning rate of the current iteration.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

WARMUPS = ('none', 'constant', 'linear')


class Optimizer(NamedTuple):
  """``update(grads, opt_state, params, lr) -> (params, opt_state)``: one SGD step.

  grad <- grad + weight_decay * param; buf <- momentum * buf + grad; param <- param - lr * buf
  (Nesterov: param <- param - lr * (grad + momentum * buf)), exactly torch.optim.SGD with dampening 0.
  """
  init: Callable[[Any], Any]
  update: Callable[..., tuple[Any, Any]]


def make_optimizer(optim_config) -> Optimizer:
  tx = optax.chain(optax.add_decayed_weights(optim_config.weight_decay),
                   optax.trace(decay=optim_config.momentum, nesterov=optim_config.nesterov))

  def update(grads, opt_state, params, lr):
    direction, opt_state = tx.update(grads, opt_state, params)
    params = jax.tree.map(lambda p, d: p - lr * d.astype(p.dtype), params, direction)
    return params, opt_state

  return Optimizer(tx.init, update)


def make_schedule(optim_config, steps_per_epoch: int) -> Callable[[jax.Array], jax.Array]:
  """Learning rate of global iteration ``step`` (a traced int is fine).

  Milestones are epochs at which the rate is multiplied by ``decay_factor``. Warm-up: 'constant'
  uses ``warmup_lr`` for the first ``warmup_epochs`` epochs (the FDG paper: 0.01 for 3 epochs);
  'linear' rises per iteration from ``warmup_factor * lr`` to ``lr`` over them (the ADL code).
  """
  base = optim_config.learning_rate
  boundaries = jnp.asarray([int(round(m * steps_per_epoch)) for m in optim_config.milestones] or [-1],
                           jnp.int32)
  has_milestones = bool(optim_config.milestones)
  warmup_steps = int(round(optim_config.warmup_epochs * steps_per_epoch))
  kind = optim_config.warmup

  def schedule(step):
    step = jnp.asarray(step, jnp.int32)
    passed = jnp.sum(step >= boundaries) if has_milestones else 0
    lr = base * jnp.asarray(optim_config.decay_factor, jnp.float32) ** passed
    if kind == 'constant' and warmup_steps > 0:
      lr = jnp.where(step < warmup_steps, jnp.float32(optim_config.warmup_lr), lr)
    elif kind == 'linear' and warmup_steps > 0:
      start = optim_config.warmup_factor * base
      ramp = start + (base - start) * step.astype(jnp.float32) / warmup_steps
      lr = jnp.where(step < warmup_steps, ramp, lr)
    return jnp.asarray(lr, jnp.float32)

  return schedule
