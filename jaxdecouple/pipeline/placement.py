"""Where a stage's arrays live, in one process or several: the placement rules the driver, evaluation and
the diagnosis share. Kept apart from the engine because they are about processes and devices, not about
what a stage computes: every process holds the whole pipeline's structure, and only the process that owns
a device holds real arrays on it."""
from __future__ import annotations

from typing import Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P


def is_local(device: jax.Device) -> bool:
  """Whether this process drives ``device`` (always, in a one-process run)."""
  return device.process_index == jax.process_index()


def place(tree, device: jax.Device):
  """``tree`` on ``device``. Across processes every process keeps the whole pipeline's structure: a
  stage's arrays are real on the process that owns its device and, on the others, arrays of the same
  shape and placement that hold nothing here, so one driver runs everywhere. A jitted call on them
  runs only where its device is, and ``jax.device_put`` between devices of different processes is
  JAX's cross-process transfer: the sender sends, the receiver receives, the others skip it."""
  if is_local(device):
    return jax.device_put(tree, device)
  sharding = jax.sharding.SingleDeviceSharding(device)
  return jax.tree.map(lambda x: jax.make_array_from_single_device_arrays(np.shape(x), sharding, [],
                                                                         dtype=x.dtype), tree)


def move(tree, device: jax.Device):
  """Device arrays to ``device`` (across processes, a transfer where they live elsewhere); arrays already
  there stay (a put of another process's array onto its own device is not a no-op in JAX)."""
  return jax.tree.map(lambda x: x if x.devices() == {device} else jax.device_put(x, device), tree)


def on_one_device(tree, device: jax.Device):
  """A tree replicated over a stage's devices as the copy on ``device``, so that it can travel as a single-device
  array (across processes too: the other processes get its shape on that device). An array replicated over
  another stage's devices (DGL: every stage logs metrics of its own) gives the copy on the first of its own
  devices; every process makes the same choice."""
  def one(x):
    if len(x.devices()) == 1:
      return x
    here = device if device in x.devices() else min(x.devices(), key=lambda d: d.id)
    if is_local(here):
      return next(s.data for s in x.addressable_shards if s.device == here)
    return jax.make_array_from_single_device_arrays(x.shape, jax.sharding.SingleDeviceSharding(here), [],
                                                    dtype=x.dtype)
  return jax.tree.map(one, tree)


class StagePlace:
  """Where a stage lives: one device, or D devices that split each of its micro-batches (data parallelism
  inside the stage). With D devices the stage's parameters, statistics and optimizer are replicated on all
  of them and every activation, gradient and label it receives is sharded along the batch; its compiled
  passes are the same functions, which XLA partitions from those shardings: each device computes its part
  of the micro-batch, BatchNorm's batch statistics and the weight gradients are summed over the D devices
  (all-reduces XLA inserts), so the numbers are D = 1's on the same micro-batch."""

  def __init__(self, devices: Sequence[jax.Device]):
    self.devices, self.device = tuple(devices), devices[0]
    if len(devices) > 1:
      mesh = Mesh(np.array(devices), ('data',))
      self.whole, self.split = NamedSharding(mesh, P()), NamedSharding(mesh, P('data'))

  def state(self, tree):
    """Parameters and the like: on the device, or replicated on the stage's devices."""
    return place(tree, self.device) if len(self.devices) == 1 else jax.device_put(tree, self.whole)

  def batch(self, tree):
    """What a micro-batch brings (images, activations, gradients, labels): to the device, or split."""
    return move(tree, self.device) if len(self.devices) == 1 else jax.device_put(tree, self.split)

  def __str__(self) -> str:
    return ', '.join(str(d) for d in self.devices)


def device_bytes(x) -> int:
  """Bytes of ``x`` on one of its devices (all of it on one device; a shard of a split array)."""
  shards = x.addressable_shards
  return shards[0].data.nbytes if shards else x.nbytes
