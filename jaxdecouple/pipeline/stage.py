"""One pipeline stage: its state and its compiled work on its device (the driver is ``engine.py``).

A stage is two choices. Where its gradient comes from (``Schedule.source``): a neighbour's delayed
gradient times beta, the loss (the last stage), or a local auxiliary head (DGL). And, when the gradient
comes late, what it keeps of a forward until then (``keep``):
  'vjp'        the jax.vjp residuals (old activations and the parameters they met): nothing recomputed;
  'recompute'  the stage input and the parameters it met; the forward is recomputed when the gradient
               arrives (same numbers, less memory, one extra forward);
  'replay'     the stage input only; the forward is replayed with the stage's current parameters, in
               training mode, so BatchNorm statistics move again (FR).
A ring slot is a flat tuple of arrays, so the state has a fixed structure of plain arrays that
checkpoints restore, pipeline in flight included (checkpoints keep the leaves in order, so the named
tuples here restore what plain tuples of the same leaves wrote).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from jaxdecouple.common import VjpStash, classification_loss, vjp_call
from jaxdecouple.models import AuxHead, Chain
from jaxdecouple.optim import Optimizer
from jaxdecouple.pipeline.correctors import Corrector, CorrectorState
from jaxdecouple.pipeline.schedule import Schedule

KEEPS = ('vjp', 'recompute', 'replay')


class AuxHeadState(NamedTuple):
  """A local head's auxiliary classifier (DGL): what it learns, its BatchNorm statistics, its optimizer."""
  params: Any
  batch_stats: Any
  opt_state: Any


class StageState(NamedTuple):
  params: Any
  batch_stats: Any
  opt_state: Any
  ring: tuple          # delay slots, each the kept forward of one micro-batch as a tuple of arrays
  inbox: tuple         # (activation, labels) sent up by stage k-1 last iteration; () if none comes
  grad_inbox: tuple    # (gradient,) sent down by stage k+1 last iteration; () if none comes
  accum: Any = ()      # summed parameter gradients not yet applied (Schedule.accumulates), else ()
  aux: Any = ()        # local head: its auxiliary classifier's AuxHeadState, else ()
  corrector: Any = ()  # a delayed stage's staleness corrector's CorrectorState (correctors.py), else ()


class Stage:
  """One stage's compiled work on its device."""

  def __init__(self, index: int, chain: Chain, schedule: Schedule, keep: str, beta: float,
               optimizer: Optimizer, lr: Callable, inputs: Callable, split: bool, device: jax.Device,
               num_classes: int, dtype=None, corrector: Corrector | None = None, aux_head=None,
               loss: Callable = classification_loss):
    self.index, self.chain, self.schedule, self.device = index, chain, schedule, device
    self.loss = loss  # the model's objective (Model.loss), of the last stage's outputs or a local head's
    self.optimizer, self.lr, self.split, self.beta = optimizer, lr, split, beta
    self.source, self.delay = schedule.source(index), schedule.delay(index)
    self.keep = keep if self.delay else None
    # a corrector acts on delayed stages only, with this stage's exact staleness and delay from the schedule
    self.corrector = dataclasses.replace(corrector, staleness=schedule.staleness(index), delay=self.delay) \
        if corrector is not None and corrector.kind != 'none' and self.delay else None
    self.sends_gradient = schedule.sends_gradient(index)
    self.forward_first = schedule.forward_before_update(index)
    self.inputs = inputs if index == 0 else (lambda x, step: x)  # stage 0: augmentation, normalisation
    head = aux_head if aux_head is not None else AuxHead(num_classes)  # the model's own, else the ADL code's
    self.head = head.clone(**({'dtype': dtype} if dtype is not None else {})) if self.source == 'local' else None
    self.stash = VjpStash()  # ring slots (keep='vjp') and residuals recomputed in a call of their own
    # The consumed ring slot is donated when its buffers can hold the new one (keep='vjp').
    self.iterate = jax.jit(self._iterate, donate_argnums=(0, 1, 2, 3, 4) if self.keep == 'vjp' else (0, 1, 2, 3),
                           static_argnames=('forward', 'backward', 'apply', 'residuals'))
    self.residuals = jax.jit(self.recompute)
    self.learn = vjp_call(lambda p, o, a, s, aux, x, apply, labels, step: self.vjp(p, s, aux, self.inputs(x, step), labels),
                          self._learn, split, donate=(0, 1, 2), static=(6,))

  def vjp(self, params, stats, aux, x, labels):
    """The stage's training forward of x, differentiated: (vjp_fn, (y, new_stats, extra)). vjp_fn maps the
    cotangent of its objective (its output, for a neighbour's gradient; its loss otherwise) to gradients
    for its parameters, then its input (if it sends a gradient down) or its head's parameters."""
    run = lambda p, x: self.chain.apply({'params': p, 'batch_stats': stats}, x, train=True)
    if self.source == 'neighbour':
      f = lambda p, x: (lambda y, s: (y, (y, s, ())))(*run(p, x))
    elif self.source == 'loss':
      def f(p, x):
        logits, s = run(p, x)
        loss, accuracy = self.loss(logits, labels)
        return loss, (None, s, {'train_loss': loss, 'train_accuracy': accuracy})
    else:
      def f(p, head_params):
        y, s = run(p, x)
        logits, head_vars = self.head.apply({'params': head_params, 'batch_stats': aux.batch_stats}, y, train=True,
                                            mutable=['batch_stats'])
        loss = self.loss(logits, labels)[0]
        return loss, (y, s, (head_vars.get('batch_stats', {}), {f'stage{self.index}_local_loss': loss}))
    if self.source == 'local':
      primals = (params, aux.params)
    elif self.sends_gradient:
      primals = (params, x)
    else:  # nothing to send down: no gradient for the input
      primals, f = (params,), functools.partial(lambda f, x, p: f(p, x), f, x)
    _, vjp_fn, out = jax.vjp(f, *primals, has_aux=True)
    return vjp_fn, out

  def _update(self, grads, params, opt_state, accum, step, apply: bool, last_update=(), then=()):
    """Adds ``grads`` (corrected, with a corrector) to the accumulator; with ``apply`` one optimizer step
    with the sum (without accumulation: one step with ``grads``). Returns the new parameters, optimizer
    state, accumulator and last step (Δ, kept for a corrector that needs it)."""
    c = self.corrector
    if c is not None:
      grads = c.gradient(grads, params, then)
    if self.schedule.accumulates(self.index):
      grads = jax.tree.map(jnp.add, accum, grads)
      if not apply:
        return params, opt_state, grads, last_update
      accum = jax.tree.map(jnp.zeros_like, grads)
    lr = self.lr(step) if c is None else c.learning_rate(self.lr(step), step, self.schedule.first_update(self.index))
    if c is not None and c.kind == 'nesterov':
      params, last_update = c.nesterov_update(grads, params, last_update, lr)
      return params, opt_state, accum, last_update
    new, opt_state = self.optimizer.update(grads, opt_state, params, lr)
    if c is not None and c.keeps_last_update:
      last_update = jax.tree.map(jnp.subtract, new, params)
    return new, opt_state, accum, last_update

  def _learn(self, vjp_fn, out, params, opt_state, accum, stats, aux, x, apply, labels, step):
    """A stage that learns from a loss of its own: the cotangent 1 through this forward, then the update."""
    y, stats, extra = out
    grads = vjp_fn(jnp.ones((), jnp.float32))
    params, opt_state, accum, _ = self._update(grads[0], params, opt_state, accum, step, apply)
    if self.source == 'local':
      head_stats, metrics = extra
      head_params, head_opt = self.optimizer.for_aux_head.update(grads[1], aux.opt_state, aux.params, self.lr(step))
      return params, opt_state, accum, stats, AuxHeadState(head_params, head_stats, head_opt), y, None, metrics
    input_grad = grads[1] if self.sends_gradient else None
    return params, opt_state, accum, stats, aux, None, input_grad, {**extra, 'learning_rate': self.lr(step)}

  def recompute(self, slot, params, stats):
    """The kept forward's vjp residuals, recomputed ('recompute': from its input and the parameters it
    met; 'replay': from its input with the current parameters, BatchNorm statistics moving), and the
    statistics after it."""
    x_old, met = slot if self.keep == 'recompute' else (slot[0], params)
    vjp_fn, (_, new_stats, _) = self.vjp(met, stats, (), x_old, None)
    return self.stash.flatten(vjp_fn), (new_stats if self.keep == 'replay' else stats)

  def _iterate(self, params, opt_state, accum, stats, slot, grad, x, step, last_update, then, *, forward: bool,
               backward: bool, apply: bool, residuals: bool):
    """A neighbour-taught stage's iteration: back-propagate beta x grad through the kept forward (the ring
    slot, or with ``residuals`` its vjp residuals already recomputed) and update; forward x, before or
    after the update as the schedule says, and keep it (its slot replaces the consumed one). With a
    corrector the forward meets its parameters (``forward_params``), the gradient is corrected against
    ``then`` (the parameters the consumed forward met), and the last step and the parameters this forward
    met are returned for its state."""
    y = new_slot = input_grad = met = None
    c = self.corrector

    def run_forward(params, stats):
      x_in = self.inputs(x, step)
      meets = params if c is None else c.forward_params(params, last_update)
      vjp_fn, (y, stats, _) = self.vjp(meets, stats, (), x_in, None)
      kept = {'vjp': lambda: self.stash.flatten(vjp_fn), 'recompute': lambda: (x_in, meets),
              'replay': lambda: (x_in,)}[self.keep]()
      return y, stats, kept, meets
    if forward and self.forward_first:
      y, stats, new_slot, met = run_forward(params, stats)
    if backward:
      if not residuals:
        slot, stats = self.recompute(slot, params, stats)
      grads = self.stash.unflatten(slot)(grad * jnp.asarray(self.beta, grad.dtype))
      params, opt_state, accum, last_update = self._update(grads[0], params, opt_state, accum, step, apply,
                                                           last_update, then)
      input_grad = grads[1] if self.sends_gradient else None
    if forward and not self.forward_first:
      y, stats, new_slot, met = run_forward(params, stats)
    return (params, opt_state, accum, stats, new_slot, y, input_grad, last_update,
            met if c is not None and c.keeps_then else None)

  def kept_structure(self, params, stats, x):
    """The shapes of a ring slot, the kept forward of an input like ``x`` (tracing the forward also
    records the kept vjp's structure)."""
    last_update = params if self.corrector is not None and self.corrector.keeps_last_update else ()
    return jax.eval_shape(functools.partial(self._iterate, forward=True, backward=False, apply=False,
                                            residuals=True), params, None, (), stats, (), None, x, 0, last_update, ())[4]

  def run(self, st: StageState, x, labels, step, forward: bool, backward: bool, apply: bool, slot: int):
    """The stage's iteration. Returns its new state, what it sends up (its output) and down (its input's
    gradient), and training metrics."""
    if self.source != 'neighbour':
      if not forward:
        return st, None, None, {}
      params, opt_state, accum, stats, aux, y, down, metrics = self.learn(
          st.params, st.opt_state, st.accum, st.batch_stats, st.aux, x, apply, labels, step)
      return st._replace(params=params, opt_state=opt_state, accum=accum, batch_stats=stats, aux=aux), y, down, metrics
    state = (st.params, st.opt_state, st.accum, st.batch_stats)
    kept, grad = (st.ring[slot], st.grad_inbox[0]) if backward else ((), None)
    c, corrector = self.corrector, st.corrector if self.corrector is not None else CorrectorState()
    last_update, then = corrector.last_update, corrector.then[slot] if corrector.then and backward else ()
    y = new_slot = met = None
    given = self.keep == 'vjp' or not backward
    if not given and self.split:  # XLA:CPU: the recomputation in a call of its own (see common.vjp_call)
      if forward and self.forward_first:  # it must meet the statistics after this iteration's forward
        *state, new_slot, y, _, _, met = self.iterate(*state, (), None, x, step, last_update, (), forward=True,
                                                      backward=False, apply=False, residuals=True)
        forward = False
      kept, stats = self.residuals(kept, state[0], state[3])
      state, given = (*state[:3], stats), True
    *state, slot_out, y_out, down, last_update, met_out = self.iterate(
        *state, kept, grad, x, step, last_update, then, forward=forward, backward=backward, apply=apply,
        residuals=given)
    new_slot, y = (new_slot, y) if slot_out is None else (slot_out, y_out)
    met = met if met_out is None else met_out
    ring = st.ring if new_slot is None else st.ring[:slot] + (new_slot,) + st.ring[slot + 1:]
    if c is not None:
      then_ring = corrector.then if met is None else corrector.then[:slot] + (met,) + corrector.then[slot + 1:]
      corrector = CorrectorState(last_update, then_ring)
    params, opt_state, accum, stats = state
    return st._replace(params=params, opt_state=opt_state, accum=accum, batch_stats=stats, ring=ring,
                       corrector=corrector if c is not None else st.corrector), y, down, {}
