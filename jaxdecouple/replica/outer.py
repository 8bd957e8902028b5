"""The outer optimizer and compressed updates: a round's change treated as a pseudo-gradient.

DiLoCo (Douillard et al., 2023, arXiv:2311.08105, Algorithm 1) ends a round of H local steps not by
setting the parameters to the workers' average but by treating the average change as a gradient:

    delta   = anchor - mean_w theta_w            (the pseudo-gradient; anchor: the round's start)
    m      <- mu * m + delta                     (outer momentum, PyTorch SGD's buffer)
    theta  <- anchor - eta * (delta + mu * m)    (Nesterov; without Nesterov: anchor - eta * m)

with an outer learning rate eta (DiLoCo: 0.7) and momentum mu (0.9). Plain averaging is eta = 1, mu = 0
(theta = mean_w theta_w); the engine then keeps no outer state at all and runs its averaging as before,
so those numbers are unchanged bit for bit. Here the mean runs over a parameter's holders: a shared
layer's over all workers, a ResIST block's over the workers that trained it this round.

Where the state lives: each worker holds the anchor of what it holds (a copy of its parameters at the
round's start) and the outer momentum beside it. A shared layer's momentum is the same on every worker
(computed from the same average), so it never travels. A partitioned block's momentum travels with the
block to its next owners: the step is affine in each holder's parameters with (anchor, m) common to all
holders, so every holder applies it to its own copy before sending and the receiver's average of the
results is the step of the average (up to rounding); the receiver's anchor is the block it receives.

Compressed updates (``compress='updates'``): what a worker sends of the shared layers is its change
``anchor - theta_w`` plus the error it failed to send last round (error feedback, Seide et al. 2014;
Karimireddy et al. 2019, "Error feedback fixes SignSGD"):

    v_w = (anchor - theta_w) + e_w,   sent C(v_w),   e_w <- v_w - C(v_w),   delta = mean_w C(v_w)

C being the paper's A.5 codec (``wire.py``: the top fraction kept, a few bits per value). A block that
changes owner cannot travel as a change (its next owner holds no copy of it), so partitioned blocks move
whole and uncompressed in this mode.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class OuterOptimizer:
  """Outer SGD with (Nesterov) momentum on the pseudo-gradient; lr 1, momentum 0 is plain averaging."""
  lr: float = 1.0
  momentum: float = 0.0
  nesterov: bool = True

  @property
  def plain(self) -> bool:
    return self.lr == 1.0 and self.momentum == 0.0

  def step(self, anchor: jax.Array, delta: jax.Array, momentum) -> tuple[jax.Array, jax.Array | None]:
    """(new parameters, new momentum or None) from the anchor and the pseudo-gradient, leaf by leaf,
    in float32, cast back to the parameters' dtype."""
    a, d = anchor.astype(jnp.float32), delta.astype(jnp.float32)
    if not self.momentum:
      return (a - self.lr * d).astype(anchor.dtype), None
    m = self.momentum * momentum.astype(jnp.float32) + d
    update = d + self.momentum * m if self.nesterov else m
    return (a - self.lr * update).astype(anchor.dtype), m.astype(momentum.dtype)

  def apply(self, anchor, delta, momentum):
    """``step`` over trees: (new parameters, new momentum tree or ())."""
    if not self.momentum:
      return jax.tree.map(lambda a, d: self.step(a, d, None)[0], anchor, delta), ()
    pairs = jax.tree.map(self.step, anchor, delta, momentum)
    outer = jax.tree.structure(anchor)
    new, m = jax.tree.transpose(outer, jax.tree.structure((0, 0)), pairs)
    return new, m
