"""Staleness correctors: what a delayed pipeline stage does about the age of its gradients.

Stage k's gradient comes from a forward that met its parameters ``s`` optimizer steps before the step the
gradient enters (``Schedule.staleness(k)``: FDG's 2(K-1-k) - 1; ADL's about that over M); the schedule
knows it exactly, so every corrector here uses that ``s`` (and the stage's delay), never a guess. Each is
off by default. Notation: W_t the stage's parameters, Δ_t = W_t - W_{t-1} its last optimizer step
(learning rate included), g the delayed gradient (times beta), η_t the step's learning rate.

predict      weight prediction (SpecTrain: Chen et al. 2018, arXiv 1809.02839, W_hat = W_t - s·η·v_t with v
             the momentum; in the optimizer-agnostic form PipeMare and PipeOptim use): the forward, and the
             backward through it, run at W_hat = W_t + s·Δ_t, the parameters extrapolated over the s steps
             the gradient will be late along the optimizer's last step; the gradient is applied to the
             current parameters. Keeps Δ (one copy of the stage's parameters).
dc           delay compensation (DC-ASGD-c: Zheng et al., ICML 2017, arXiv 1609.08326, eq. 10):
             g_c = g + λ·g⊙g⊙(W_now - W_then), W_then the parameters the forward met; the first-order
             Taylor term of the gradient's change with the Hessian approximated by λ·g⊙g. Keeps W_then
             for each micro-batch in flight (delay copies of the stage's parameters).
pipemare_lr  PipeMare's learning-rate rescheduling (Yang et al., MLSys 2021, arXiv 1910.05124, T1; as
             PluralisResearch/AsyncPP implements it): η_k(t) = η(t)·τ_k^-(1 - min(t / T, 1)), τ_k =
             max(1, s): a stage's rate divided by its staleness at first, the division annealed away over
             T steps. Keeps nothing.
nesterov     the Nesterov look-ahead for delayed stages (Ajanthan et al., ICML 2025, arXiv 2505.01099, eq.
             10): d_t = γ·Δ_t; the forward at the look-ahead point W_t + d_t; the update W_{t+1} = W_t + d_t
             - c·η_t·(1 - γ)·(g + wd·W_t), wd the optimizer's weight decay (coupled, as SGD's), c the rate's
             scale (``lr_scale``, 1 in eq. 10); it replaces the optimizer on the delayed stages. Keeps Δ
             (one copy). Why c: under a steady gradient eq. 10's step tends to c·η·g, SGD's with momentum μ
             (PyTorch's buffer) to η·g / (1 - μ); at the same η the delayed stages would move 1 - μ times as
             far as the last stage (a tenth at μ = 0.9), and c = 1 / (1 - μ) gives them SGD's step.
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

CORRECTORS = ('none', 'predict', 'dc', 'pipemare_lr', 'nesterov')


class CorrectorState(NamedTuple):
  """What a stage's corrector keeps: its last step Δ (predict, nesterov) and, per ring slot, the parameters
  each forward in flight met (dc); () where unused."""
  last_update: Any = ()
  then: tuple = ()


@dataclasses.dataclass(frozen=True)
class Corrector:
  """One delayed stage's corrector. ``staleness``: the optimizer steps between its forward of a micro-batch
  and the step that micro-batch's gradient enters; ``delay``: the micro-batches in flight (ring slots)."""
  kind: str
  staleness: float
  delay: int
  dc_lambda: float = 0.04
  anneal_steps: int = 1
  gamma: float = 0.99
  weight_decay: float = 0.0
  lr_scale: float = 1.0

  def __post_init__(self):
    if self.kind not in CORRECTORS:
      raise ValueError(f'corrector {self.kind!r}: one of {", ".join(CORRECTORS)}')

  @property
  def keeps_last_update(self) -> bool:
    return self.kind in ('predict', 'nesterov')

  @property
  def keeps_then(self) -> bool:
    return self.kind == 'dc'

  def settings(self) -> str:
    """Its own settings, as the start-up log names them."""
    return {'dc': f'lambda {self.dc_lambda:g}, ', 'pipemare_lr': f'annealed over {self.anneal_steps} steps, ',
            'nesterov': f'gamma {self.gamma:g}, rate x{self.lr_scale:g}, '}.get(self.kind, '')

  def copies(self) -> int:
    """How many copies of the stage's parameters it keeps: at most the schedule's delay."""
    return int(self.keeps_last_update) + (self.delay if self.keeps_then else 0)

  def init(self, params) -> CorrectorState:
    zeros = lambda: jax.tree.map(jnp.zeros_like, params)
    return CorrectorState(zeros() if self.keeps_last_update else (),
                          tuple(zeros() for _ in range(self.delay)) if self.keeps_then else ())

  def forward_params(self, params, last_update):
    """The parameters the forward (and the backward through it) meets."""
    if self.kind == 'predict':
      return jax.tree.map(lambda p, d: p + jnp.asarray(self.staleness, p.dtype) * d, params, last_update)
    if self.kind == 'nesterov':
      return jax.tree.map(lambda p, d: p + jnp.asarray(self.gamma, p.dtype) * d, params, last_update)
    return params

  def gradient(self, grads, params, then):
    """The gradient to apply: DC-ASGD's compensation, else as it came."""
    if self.kind != 'dc':
      return grads
    lam = jnp.float32(self.dc_lambda)
    return jax.tree.map(lambda g, w, w0: g + (lam * g * g * (w - w0)).astype(g.dtype), grads, params, then)

  def learning_rate(self, lr, step, first_update: int):
    """PipeMare's per-stage rate: divided by τ = max(1, staleness), annealed linearly to none over T steps
    counted from the stage's first update."""
    if self.kind != 'pipemare_lr':
      return lr
    progress = jnp.minimum(jnp.maximum(step - first_update, 0).astype(jnp.float32) / self.anneal_steps, 1.0)
    return lr * jnp.float32(max(1.0, self.staleness)) ** -(1.0 - progress)

  def nesterov_update(self, grads, params, last_update, lr):
    """AsyncPP's eq. 10: W + γΔ - c·η(1 - γ)(g + wd·W). Returns (new parameters, their step Δ)."""
    g, wd, rate = jnp.float32(self.gamma), jnp.float32(self.weight_decay), lr * jnp.float32(self.lr_scale)
    new = jax.tree.map(lambda w, d, gr: w + g * d - rate * (1 - g) * (gr + wd * w), params, last_update, grads)
    return new, jax.tree.map(jnp.subtract, new, params)
