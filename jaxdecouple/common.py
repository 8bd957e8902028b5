"""What methods and engines share: the run's setup and the classification loss."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import optax

from jaxdecouple.data import Preprocess
from jaxdecouple.models import Model
from jaxdecouple.optim import Optimizer


@dataclasses.dataclass(frozen=True)
class Setup:
  """Everything a method needs to build its state and steps."""
  config: Any
  model: Model
  preprocess: Preprocess
  optimizer: Optimizer
  schedule: Callable[[jax.Array], jax.Array]
  steps_per_epoch: int
  devices: Sequence[jax.Device]


def classification_loss(logits: jax.Array, labels: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Mean softmax cross-entropy and accuracy of a batch."""
  loss = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels).mean()
  accuracy = jnp.mean(jnp.argmax(logits, -1) == labels)
  return loss, accuracy
