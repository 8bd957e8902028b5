"""The shared layers' end of a round: the all-reduce, the compressed all-gather, and their outer step.

Every worker holds the shared layers (every block outside the partitioned section; everything for local
SGD). At a round's end they are averaged over all workers: a float32 all-reduce, or, with compression on,
an all-gather of each worker's encoded buffer (its weights, or its change plus unsent error with
``compress='updates'``) decoded one worker after another. With an outer optimizer (outer.py) the average
becomes a pseudo-gradient and the shared layers take its step; their outer momentum is the same on every
worker and never travels.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxdecouple.replica import wire
from jaxdecouple.replica.layout import in_slots
from jaxdecouple.replica.outer import OuterOptimizer

AXIS = 'worker'


def shared_part(keys, tree) -> dict:
  """The shared blocks of a workers' layout tree (its slot groups, ``keys``, left out)."""
  return {n: v for n, v in tree.items() if n not in keys}


class SharedLayers:
  """The collectives over the shared layers of one engine (inside its shard_map over the 'worker' axis)."""

  def __init__(self, keys, num_workers: int, per_device: int, quantize_bits: int = 0, sparsify: float = 0.0,
               outer: OuterOptimizer = OuterOptimizer(), updates: bool = False, error_feedback: bool = True):
    self.keys, self.num_workers, self.per_device = keys, num_workers, per_device
    self.quantize_bits, self.sparsify, self.outer = quantize_bits, sparsify, outer
    self.updates = updates and bool(quantize_bits or sparsify)
    self.error_feedback = self.updates and error_feedback

  def mean(self, x):
    """A (workers here, ...) leaf averaged over all workers: summed here, then all-reduced."""
    return (jax.lax.psum(jnp.sum(x.astype(jnp.float32), axis=0), AXIS) / self.num_workers).astype(x.dtype)

  def gathered_mean(self, values):
    """Each worker's rows of ``values`` (a list of (workers here, n) float32 arrays) sent encoded: every
    worker's buffer gathered by every device, decoded one worker after another (one dense copy at a time,
    not S) and summed in worker order, so placement never changes the numbers. Returns (the means over all
    workers, (n,) each; what arrived of this device's own workers' rows, for error feedback)."""
    bits, keep = self.quantize_bits, self.sparsify
    sizes = [v.shape[1] for v in values]
    buffers = jnp.concatenate([jax.vmap(lambda v: wire.encode(v, bits, keep))(v) for v in values], axis=1)
    everyone = jax.lax.all_gather(buffers, AXIS, tiled=True)  # (S, bytes)
    offsets = np.cumsum([0] + [wire.encoded_size(n, bits, keep) for n in sizes])

    def decoded(buffer):
      return [wire.decode(jax.lax.dynamic_slice_in_dim(buffer, int(offsets[i]), int(offsets[i + 1] - offsets[i])),
                          n, bits, keep) for i, n in enumerate(sizes)]
    add = lambda w, total: [t + d for t, d in zip(total, decoded(everyone[w]))]
    total = jax.lax.fori_loop(0, self.num_workers, add, [jnp.zeros((n,), jnp.float32) for n in sizes])
    own = [jnp.stack(xs) for xs in zip(*[decoded(buffers[i]) for i in range(self.per_device)])]
    return [t / self.num_workers for t in total], own

  def compressed(self, params):
    """Shared parameters sent compressed: each worker's encoded, gathered and averaged; every worker ends
    with the same average."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
    shared = [x for path, x in flat if not in_slots(path)]
    means, _ = self.gathered_mean([x.reshape(x.shape[0], -1).astype(jnp.float32) for x in shared])
    out = iter(jnp.broadcast_to(m.reshape(x.shape[1:]).astype(x.dtype), x.shape) for m, x in zip(means, shared))
    return jax.tree_util.tree_unflatten(treedef, [x if in_slots(path) else next(out) for path, x in flat])

  def outer_step(self, params, outer):
    """The shared layers' outer step (outer.py): the pseudo-gradient is the anchor less the workers' average,
    or, with compressed updates, the average of what arrived of each worker's change plus its unsent error.
    Returns (parameters, outer momentum, unsent error): shared leaves new, slot leaves as they were."""
    anchor, theta = shared_part(self.keys, outer['anchor']), shared_part(self.keys, params)
    leaves, treedef = jax.tree.flatten(theta)
    changes = [a.astype(jnp.float32) - x.astype(jnp.float32) for a, x in zip(jax.tree.leaves(anchor), leaves)]
    error = {}
    if self.updates:
      if self.error_feedback:
        changes = [c + e for c, e in zip(changes, jax.tree.leaves(outer['error']))]
      means, own = self.gathered_mean([c.reshape(c.shape[0], -1) for c in changes])
      delta = [jnp.broadcast_to(m.reshape(c.shape[1:]), c.shape) for m, c in zip(means, changes)]
      if self.error_feedback:
        error = treedef.unflatten([c - o.reshape(c.shape) for c, o in zip(changes, own)])
    else:
      delta = [jnp.broadcast_to(self.mean(c), c.shape) for c in changes]
    momentum = shared_part(self.keys, outer['momentum']) if self.outer.momentum else ()
    new, m = self.outer.apply(anchor, treedef.unflatten(delta), momentum)
    return {**params, **new}, ({**outer['momentum'], **m} if self.outer.momentum else ()), error
