"""Where a stage's arrays live, in one process or several: the placement rules the driver, evaluation and
the diagnosis share. Kept apart from the engine because they are about processes and devices, not about
what a stage computes: every process holds the whole pipeline's structure, and only the process that owns
a device holds real arrays on it."""
from __future__ import annotations

import jax
import numpy as np


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
