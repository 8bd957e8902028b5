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
               outer: OuterOptimizer = OuterOptimizer(), updates: bool = False, error_feedback: bool = True,
               two_stage: bool = False):
    self.keys, self.num_workers, self.per_device = keys, num_workers, per_device
    self.quantize_bits, self.sparsify, self.outer = quantize_bits, sparsify, outer
    self.updates = updates and bool(quantize_bits or sparsify)
    self.error_feedback = self.updates and error_feedback
    self.two_stage = self.updates and two_stage

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

  def chunk(self, total: int) -> int:
    """Values per chunk of the two-stage exchange: a worker's N shared values cut into S chunks."""
    return -(-total // self.num_workers)

  def two_stage_mean(self, values, chunk_error):
    """The compressed mean whose bytes do not grow with S (``update_exchange='two_stage'``; the compressed
    all-reduce of 1-bit Adam, Tang et al. 2021, with error feedback at both stages): each worker's values,
    joined and cut into S chunks, are encoded chunk by chunk; chunk j of every worker goes to worker j (an
    all-to-all), which decodes and averages them in worker order, adds its own unsent error of the chunk,
    encodes the result and keeps what it failed to send; an all-gather brings every worker's encoded chunk
    to everyone. With one worker per device each device receives about 2 (D - 1) / D encoded copies (the
    all-to-all's chunks and the all-gather's), whatever S, against D - 1 whole copies by the all-gather; with
    p workers per device the all-to-all carries p chunks for each of the p workers, p^2 (D - 1) / S copies. Returns (the means, (n,) each; what arrived of this device's own
    workers' values; the chunks' new unsent error, (workers here, c))."""
    bits, keep, S, p = self.quantize_bits, self.sparsify, self.num_workers, self.per_device
    sizes = [v.shape[1] for v in values]
    c = self.chunk(sum(sizes))
    joined = jnp.pad(jnp.concatenate(values, axis=1), ((0, 0), (0, S * c - sum(sizes)))).reshape(p, S, c)
    codes = jax.vmap(jax.vmap(lambda v: wire.encode(v, bits, keep)))(joined)  # (p, S, B)
    own = jax.vmap(jax.vmap(lambda b: wire.decode(b, c, bits, keep)))(codes).reshape(p, S * c)[:, :sum(sizes)]
    devices = S // p  # to device d go its workers' chunks: (destination device, source worker here, its worker, B)
    routed = jax.lax.all_to_all(codes.reshape(p, devices, p, -1).transpose(1, 0, 2, 3), AXIS, 0, 0, tiled=True)
    routed = routed.reshape(S, p, -1)  # (source worker, chunk owner here, B), sources in worker order
    add = lambda w, total: total + jax.vmap(lambda b: wire.decode(b, c, bits, keep))(routed[w])
    means = jax.lax.fori_loop(0, S, add, jnp.zeros((p, c), jnp.float32)) / S
    if chunk_error is not None:
      means = means + chunk_error
    second = jax.vmap(lambda v: wire.encode(v, bits, keep))(means)  # (p, B)
    new_error = means - jax.vmap(lambda b: wire.decode(b, c, bits, keep))(second) if chunk_error is not None else None
    everyone = jax.lax.all_gather(second, AXIS, tiled=True)  # (S, B)
    total = jax.lax.map(lambda b: wire.decode(b, c, bits, keep), everyone).reshape(-1)[:sum(sizes)]
    bounds = np.cumsum([0] + sizes)
    split = lambda x: [x[..., bounds[i]:bounds[i + 1]] for i in range(len(sizes))]
    return split(total), split(own), new_error

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
    Returns (parameters, outer momentum, the unsent errors by name): shared leaves new, slot leaves as they
    were."""
    anchor, theta = shared_part(self.keys, outer['anchor']), shared_part(self.keys, params)
    leaves, treedef = jax.tree.flatten(theta)
    changes = [a.astype(jnp.float32) - x.astype(jnp.float32) for a, x in zip(jax.tree.leaves(anchor), leaves)]
    errors = {}
    if self.updates:
      if self.error_feedback:
        changes = [c + e for c, e in zip(changes, jax.tree.leaves(outer['error']))]
      rows = [c.reshape(c.shape[0], -1) for c in changes]
      if self.two_stage:
        means, own, chunk_error = self.two_stage_mean(rows, outer.get('chunk_error'))
        errors = {'chunk_error': chunk_error} if self.error_feedback else {}
      else:
        means, own = self.gathered_mean(rows)
      delta = [jnp.broadcast_to(m.reshape(c.shape[1:]), c.shape) for m, c in zip(means, changes)]
      if self.error_feedback:
        errors['error'] = treedef.unflatten([c - o.reshape(c.shape) for c, o in zip(changes, own)])
    else:
      delta = [jnp.broadcast_to(self.mean(c), c.shape) for c in changes]
    momentum = shared_part(self.keys, outer['momentum']) if self.outer.momentum else ()
    new, m = self.outer.apply(anchor, treedef.unflatten(delta), momentum)
    return {**params, **new}, ({**outer['momentum'], **m} if self.outer.momentum else ()), errors
