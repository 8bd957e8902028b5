"""Training order and on-device preprocessing.

The order of epoch e is a permutation drawn from (seed, e) and batch i of an epoch is a contiguous
slice of it (the last incomplete batch is dropped), so the batch of any global step can be rebuilt
without replaying the run. Augmentation (random crop with zero padding, horizontal flip) and
normalisation run inside the jitted step, keyed by (seed, step).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class Batch(NamedTuple):
  images: np.ndarray | jax.Array  # uint8 [B, H, W, C] (text: uint8 bytes [B, T])
  labels: np.ndarray | jax.Array  # int32 [B] (text: the next bytes, [B, T]; detection: float32 boxes [B, M, 6])


class Preprocess(NamedTuple):
  """Static description of the on-device preprocessing (hashable, so it can key a jit)."""
  mean: tuple[float, ...]
  std: tuple[float, ...]
  crop_padding: int = 4
  flip: bool = True
  augment: bool = True
  tokens: bool = False  # text: the inputs are byte values, passed to the model as int32 (no augmentation)


def preprocess_for(dataset, data_config) -> Preprocess:
  """The preprocessing a data set's training inputs get: text none, streamed images their normalisation only
  (crops and flips were made on the host as the JPEGs were decoded), in-memory images as configured."""
  if dataset.tokens:
    return Preprocess((), (), 0, False, False, tokens=True)
  if dataset.streamed:
    return Preprocess(tuple(dataset.mean), tuple(dataset.std), 0, False, False)
  return Preprocess(tuple(dataset.mean), tuple(dataset.std), data_config.crop_padding, data_config.flip,
                    data_config.augment)


class TrainOrder:
  """Maps a global step to the indices of its training examples."""

  def __init__(self, num_examples: int, batch_size: int, seed: int, stream: int = 0):
    if batch_size > num_examples:
      raise ValueError(f'batch size {batch_size} exceeds the {num_examples} training examples')
    self.num_examples = num_examples
    self.batch_size = batch_size
    self.seed = seed
    self.stream = stream  # e.g. a worker index: its own shuffle of the same data
    self.steps_per_epoch = num_examples // batch_size
    self._cached: tuple[int, np.ndarray] | None = None

  def permutation(self, epoch: int) -> np.ndarray:
    cached = self._cached  # read once: prefetching threads may ask for other epochs at the same time
    if cached is None or cached[0] != epoch:
      rng = np.random.default_rng([self.seed, self.stream, epoch])
      cached = self._cached = (epoch, rng.permutation(self.num_examples))
    return cached[1]

  def indices(self, step: int) -> np.ndarray:
    epoch, i = divmod(step, self.steps_per_epoch)
    return self.permutation(epoch)[i * self.batch_size:(i + 1) * self.batch_size]

  def batch(self, x, y: np.ndarray | None, step: int) -> Batch:
    """Step's batch from images in memory (``x[idx]``), or read from a stream (x: StreamImages, y: None),
    whose random crops and flips are drawn from (seed, stream, step)."""
    idx = self.indices(step)
    if y is None:
      return Batch(*x.take(idx, (self.seed, self.stream, step)))
    return Batch(x[idx], y[idx])


def normalize(images: jax.Array, pre: Preprocess) -> jax.Array:
  if pre.tokens:
    return images.astype(jnp.int32)
  x = images.astype(jnp.float32) / 255.0
  return (x - jnp.asarray(pre.mean, jnp.float32)) / jnp.asarray(pre.std, jnp.float32)


def augment(rng: jax.Array, images: jax.Array, pre: Preprocess) -> jax.Array:
  """Random crop from the zero-padded image and random horizontal flip, on uint8 pixels."""
  if not pre.augment or pre.tokens:
    return images
  n, h, w, _ = images.shape
  if pre.crop_padding:
    p = pre.crop_padding
    padded = jnp.pad(images, ((0, 0), (p, p), (p, p), (0, 0)))
    crop_rng, rng = jax.random.split(rng)
    offsets = jax.random.randint(crop_rng, (n, 2), 0, 2 * p + 1)
    crop = lambda img, o: jax.lax.dynamic_slice(img, (o[0], o[1], 0), (h, w, img.shape[-1]))
    images = jax.vmap(crop)(padded, offsets)
  if pre.flip:
    flips = jax.random.bernoulli(rng, 0.5, (n, 1, 1, 1))
    images = jnp.where(flips, images[:, :, ::-1, :], images)
  return images


def train_inputs(images: jax.Array, step: jax.Array, seed: int, pre: Preprocess,
                 stream: jax.Array | None = None) -> jax.Array:
  """Augmented, normalised float32 inputs of one training step (call inside jit).

  ``stream`` (e.g. a worker index, may be traced) draws its own augmentation; stream 0 draws
  exactly what no stream draws, so worker 0 of a replica method sees BP's inputs.
  """
  rng = jax.random.fold_in(jax.random.key(seed), step)
  if stream is not None:
    data = jnp.where(stream == 0, jax.random.key_data(rng),
                     jax.random.key_data(jax.random.fold_in(rng, stream)))
    rng = jax.random.wrap_key_data(data)
  return normalize(augment(rng, images, pre), pre)

