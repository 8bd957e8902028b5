"""What a network is trained to minimise, given its outputs and a batch's labels: every method and engine calls
``Model.loss`` rather than a fixed loss, so a detection network (models/detection.py) trains through BP, DP, the
pipelines and the replicas exactly as a classifier does."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def classification_loss(logits: jax.Array, labels: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Mean softmax cross-entropy and accuracy of a batch (byte-level text: of every position)."""
  loss = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels).mean()
  accuracy = jnp.mean(jnp.argmax(logits, -1) == labels)
  return loss, accuracy
