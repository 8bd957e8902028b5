"""The depth-wise (pipeline) engine: K contiguous stages on their devices, trained in lock-step.

Iteration t, stage k < K-1: (1) if its delayed gradient has arrived, multiply it by beta,
back-propagate it through the forward it saved ``delay_k`` iterations ago and update; (2) forward
its new input with the (updated) parameters and save that forward in its ring buffer. The last
stage does plain SGD on its input. Then outputs move up and input-gradients move down, each to its
neighbour's device. Within an iteration no stage waits for another, so with asynchronous dispatch
the stages run at the same time on their devices.

What a stage keeps of an old forward (``keep``):
  'vjp'        the jax.vjp residuals (old activations and the parameters they met): nothing recomputed;
  'recompute'  the stage input and the parameters it met; the forward is recomputed when the
               gradient arrives (same numbers, less memory, one extra forward);
  'replay'     the stage input only; when the gradient arrives the forward is replayed with the
               stage's current parameters, in training mode, so BatchNorm statistics move again (FR).

Forward-locked methods (``forward_locked``: DDG, FR) instead push micro-batch t through every stage
in order during iteration t, with the parameters each stage has before this iteration's update; then
every stage back-propagates its delayed gradient and updates, all at once.

Accumulation (``accumulation`` = M > 1, ADL): a stage sums the parameter gradients of M consecutive
backwards in an accumulator (part of its state) and takes one optimizer step per M of them, its
count starting at its first gradient; ``forward_first`` (ADL's mode A) forwards the new micro-batch
with the parameters from before this iteration's update instead of after it.

Local heads (``local_heads``, DGL): no gradient crosses a stage boundary. Every stage but the last
has an auxiliary classifier and takes, on each new input, one SGD step of itself and its head on the
head's loss; the output it sends up comes from that same forward and is a constant to the next stage.
A ring slot is a flat tuple of arrays (the vjp closure's leaves; its tree structure is captured when
the forward is traced), so the state has a fixed structure of plain arrays that checkpoints restore.
"""
from __future__ import annotations

import dataclasses
import itertools
import time
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxdecouple.data import Batch, train_inputs
from jaxdecouple.common import Setup, VjpStash, classification_loss, use_split_backward
from jaxdecouple.models import AuxHead, Chain, count_params, subset
from jaxdecouple.pipeline.splits import Split

KEEPS = ('vjp', 'recompute', 'replay')


@dataclasses.dataclass(frozen=True)
class PipelineSpec:
  """The knobs that make one pipeline method differ from another."""
  num_stages: int
  delays: tuple[int, ...]   # iterations between a stage's forward and the gradient for it
  keep: str = 'vjp'
  beta: float = 1.0         # gradient shrinking, applied to every non-last stage's incoming gradient
  forward_locked: bool = False
  accumulation: int = 1     # M: backwards summed into one optimizer step (ADL)
  forward_first: bool = False  # forward with the pre-update parameters (ADL's mode A)
  local_heads: bool = False    # each non-last stage trains on its own auxiliary classifier (DGL)

  def first_forward(self, k: int) -> int:
    return 0 if self.forward_locked else k

  def first_gradient(self, k: int) -> int:
    """The iteration at which stage k first back-propagates: its first forward plus its delay."""
    return self.first_forward(k) + self.delays[k]

  def backward_starts(self, k: int) -> int:
    """The iteration of stage k's first backward (the last stage's: its first input)."""
    return self.first_forward(k) if k == self.num_stages - 1 else self.first_gradient(k)

  def updates_at(self, k: int, t: int) -> bool:
    """Whether stage k takes an optimizer step at iteration t (after that iteration's backward).

    Every M-th backward, counting from the stage's first. The last stage additionally takes none
    before stage K-2 has been sent its first gradient (ADL); in this lock-step schedule that never
    holds an update back, because the last stage sends that gradient with its own first backward.
    """
    first = self.backward_starts(k)
    if t < first or (t - first + 1) % self.accumulation:
      return False
    if k == self.num_stages - 1 and k > 0:
      return t >= self.first_gradient(k - 1) - 1
    return True

  def first_update(self, k: int) -> int:
    return next(u for u in itertools.count(self.backward_starts(k)) if self.updates_at(k, u))

  def staleness(self, k: int) -> tuple[int, float]:
    """Stage k's staleness: (iterations between a forward and its backward, mean number of
    optimizer steps the stage takes between that forward and the step its gradient enters)."""
    delay = 0 if k == self.num_stages - 1 else self.delays[k]
    first, m = self.backward_starts(k), self.accumulation
    steps = [u for u in range(first + 4 * m * (delay + 1) + m) if self.updates_at(k, u)]
    counts = []
    for t in range(first + 2 * m * (delay + 1), first + 3 * m * (delay + 1)):  # the steady state
      enters = min(u for u in steps if u >= t)
      forward = t - delay  # it met the parameters after that iteration's step, unless forward_first
      counts.append(sum(1 for u in steps if (u >= forward if self.forward_first else u > forward)
                        and u < enters))
    return delay, sum(counts) / len(counts)


class StageState(NamedTuple):
  params: Any
  batch_stats: Any
  opt_state: Any
  ring: tuple          # delay_k slots, each a tuple of arrays (empty for the last stage)
  inbox: tuple         # (activation, labels) sent by stage k-1 last iteration; () for stage 0
  grad_inbox: tuple    # (gradient,) sent by stage k+1 last iteration; () for the last stage
  accum: Any = ()      # summed parameter gradients not yet applied (accumulation > 1), else ()
  aux: Any = ()        # local_heads: the auxiliary head's (params, batch_stats, opt_state), else ()


class PipelineState(NamedTuple):
  stages: tuple[StageState, ...]


class _Stage:
  """One stage's compiled functions on its device."""

  def __init__(self, index: int, chain: Chain, spec: PipelineSpec, setup: Setup, device: jax.Device):
    self.index, self.chain, self.spec, self.setup, self.device = index, chain, spec, setup, device
    self.first = index == 0
    self.last = index == spec.num_stages - 1
    self.delay = spec.delays[index]
    self.input_grad = not self.first and not spec.local_heads  # whether it sends a gradient down
    self.split_backward = use_split_backward(setup.config)
    self._stash = VjpStash()       # ring slots: the kept forward's vjp closure as flat arrays
    self._last_stash = VjpStash()  # the last stage's loss vjp, when its step is split in two calls
    self.forward = jax.jit(self._forward, donate_argnums=(1,))
    self.backward_update = jax.jit(self._backward_update, donate_argnums=(0, 1, 2),
                                   static_argnames=('recompute', 'apply'))
    self.residuals = jax.jit(self._residuals)
    self.replay = jax.jit(self._replay)
    # The consumed ring slot is donated too: its buffers hold the new slot (same shapes for 'vjp').
    self.backward_forward = jax.jit(self._backward_forward,
                                    donate_argnums=(0, 1, 2, 3, 4) if spec.keep == 'vjp' else (0, 1, 2, 3),
                                    static_argnames=('recompute', 'apply'))
    self.last_step = jax.jit(self._last_step, donate_argnums=(0, 1, 2, 3), static_argnames=('apply',))
    self.last_forward = jax.jit(self._last_forward, donate_argnums=(1,))
    self.last_backward = jax.jit(self._last_backward, donate_argnums=(0, 1, 2), static_argnames=('apply',))
    self.aux_head = AuxHead(setup.model.num_classes) if spec.local_heads and not self.last else None
    self.local_step = jax.jit(self._local_step, donate_argnums=(0, 1, 2, 3))
    self.local_forward = jax.jit(self._local_forward, donate_argnums=(2, 3))
    self.local_backward = jax.jit(self._local_backward, donate_argnums=(0, 1, 2))

  def _inputs(self, x, step):
    s = self.setup
    return train_inputs(x, step, s.config.seed, s.preprocess) if self.first else x

  def _apply(self, stats):
    return lambda params, x: self.chain.apply({'params': params, 'batch_stats': stats}, x, train=True)

  def _vjp(self, params, stats, x):
    if self.first:  # no gradient for the images
      y, vjp_fn, new_stats = jax.vjp(lambda p: self._apply(stats)(p, x), params, has_aux=True)
    else:
      y, vjp_fn, new_stats = jax.vjp(self._apply(stats), params, x, has_aux=True)
    return y, vjp_fn, new_stats

  def _forward(self, params, stats, x, step):
    """Training forward of a new micro-batch; returns output, new BN statistics and what to keep."""
    x = self._inputs(x, step)
    if self.spec.keep == 'vjp':
      y, vjp_fn, new_stats = self._vjp(params, stats, x)
      return y, new_stats, self._stash.flatten(vjp_fn)
    y, new_stats = self._apply(stats)(params, x)
    return y, new_stats, ((x,) if self.spec.keep == 'replay' else (x, params))

  def _backward_forward(self, params, opt_state, accum, stats, saved, grad, x, step, recompute: bool,
                        apply: bool):
    """A stage's whole steady-state iteration in one call: backward and update, then forward (or,
    with ``forward_first``, the forward with the parameters from before the update)."""
    if self.spec.forward_first:
      y, new_stats, new_saved = self._forward(params, stats, x, step)
    params, opt_state, accum, input_grad = self._backward_update(params, opt_state, accum, saved, grad,
                                                                 stats, step, recompute, apply)
    if not self.spec.forward_first:
      y, new_stats, new_saved = self._forward(params, stats, x, step)
    return params, opt_state, accum, new_stats, input_grad, y, new_saved

  def _replay(self, params, stats, x_old):
    """keep='replay': the old input's forward replayed with the current parameters (training mode).
    Returns the vjp residuals and the BatchNorm statistics the replay moved."""
    _, vjp_fn, new_stats = self._vjp(params, stats, x_old)
    return self._stash.flatten(vjp_fn), new_stats

  def _residuals(self, saved, stats):
    """keep='recompute': the old forward's vjp residuals, recomputed from its input and parameters."""
    x_old, params_old = saved
    return self._stash.flatten(self._vjp(params_old, stats, x_old)[1])

  def _update(self, grads, opt_state, params, accum, step, apply: bool):
    """Adds ``grads`` to the accumulator; with ``apply``, one optimizer step with the sum (without
    accumulation: one step with ``grads``)."""
    if self.spec.accumulation > 1:
      grads = jax.tree.map(jnp.add, accum, grads)
      if not apply:
        return params, opt_state, grads
      accum = jax.tree.map(jnp.zeros_like, grads)
    params, opt_state = self.setup.optimizer.update(grads, opt_state, params, self.setup.schedule(step))
    return params, opt_state, accum

  def _backward_update(self, params, opt_state, accum, saved, grad, stats, step, recompute: bool,
                       apply: bool = True):
    """Back-propagates beta * grad through the kept forward, then updates (see ``_update``).

    ``saved`` is the vjp residuals, or with ``recompute`` the old input and parameters, whose
    forward is then recomputed in this same call (see common.use_split_backward for why the CPU
    recomputes in a call of its own instead).
    """
    grad = grad * jnp.asarray(self.spec.beta, grad.dtype)
    if recompute:
      x_old, params_old = saved
      vjp_fn = self._vjp(params_old, stats, x_old)[1]
    else:
      vjp_fn = self._stash.unflatten(saved)
    grads = vjp_fn(grad)
    param_grads, input_grad = (grads[0], None) if self.first else grads
    params, opt_state, accum = self._update(param_grads, opt_state, params, accum, step, apply)
    return params, opt_state, accum, input_grad

  def _last_loss(self, stats, labels):
    def loss_fn(p, x):
      logits, new_stats = self._apply(stats)(p, x)
      loss, accuracy = classification_loss(logits, labels)
      return loss, (new_stats, accuracy)
    return loss_fn

  def _last_update(self, grads, opt_state, accum, params, step, apply):
    param_grads, input_grad = grads if self.input_grad else (grads[0], None)
    params, opt_state, accum = self._update(param_grads, opt_state, params, accum, step, apply)
    return params, opt_state, accum, input_grad, self.setup.schedule(step)

  def _last_step(self, params, opt_state, accum, stats, x, labels, step, apply: bool):
    """The last stage: plain SGD on its input, and the gradient with respect to that input."""
    x = self._inputs(x, step)
    argnums = (0, 1) if self.input_grad else (0,)
    (loss, (new_stats, accuracy)), grads = jax.value_and_grad(
        self._last_loss(stats, labels), argnums, has_aux=True)(params, x)
    params, opt_state, accum, input_grad, lr = self._last_update(grads, opt_state, accum, params, step,
                                                                 apply)
    metrics = {'train_loss': loss, 'train_accuracy': accuracy, 'learning_rate': lr}
    return params, opt_state, accum, new_stats, input_grad, metrics

  def _last_forward(self, params, stats, x, labels, step):
    """First half of the last stage's step when split (see common.use_split_backward)."""
    x = self._inputs(x, step)
    loss_fn = self._last_loss(stats, labels)
    if not self.input_grad:
      loss, vjp_fn, (new_stats, accuracy) = jax.vjp(lambda p: loss_fn(p, x), params, has_aux=True)
    else:
      loss, vjp_fn, (new_stats, accuracy) = jax.vjp(loss_fn, params, x, has_aux=True)
    return loss, accuracy, new_stats, self._last_stash.flatten(vjp_fn)

  def _last_backward(self, params, opt_state, accum, residuals, step, apply: bool):
    grads = self._last_stash.unflatten(residuals)(jnp.ones((), jnp.float32))
    return self._last_update(grads, opt_state, accum, params, step, apply)

  def _local_loss(self, stats, aux_stats, x, labels):
    def loss_fn(params, aux_params):
      y, new_stats = self._apply(stats)(params, x)
      logits, aux_vars = self.aux_head.apply({'params': aux_params, 'batch_stats': aux_stats}, y,
                                             train=True, mutable=['batch_stats'])
      loss, accuracy = classification_loss(logits, labels)
      return loss, (y, new_stats, aux_vars['batch_stats'], accuracy)
    return loss_fn

  def _local_update(self, grads, params, opt_state, aux, step):
    aux_params, aux_stats, aux_opt = aux
    lr = self.setup.schedule(step)
    params, opt_state = self.setup.optimizer.update(grads[0], opt_state, params, lr)
    aux_params, aux_opt = self.setup.optimizer.update(grads[1], aux_opt, aux_params, lr)
    return params, opt_state, (aux_params, aux_stats, aux_opt)

  def _local_step(self, params, opt_state, stats, aux, x, labels, step):
    """DGL: one SGD step of the stage and its auxiliary head on the head's loss."""
    x = self._inputs(x, step)
    (loss, (y, stats, aux_stats, _)), grads = jax.value_and_grad(
        self._local_loss(stats, aux[1], x, labels), (0, 1), has_aux=True)(params, aux[0])
    params, opt_state, aux = self._local_update(grads, params, opt_state, (aux[0], aux_stats, aux[2]), step)
    return params, opt_state, stats, aux, y, loss

  def _local_forward(self, params, aux_params, stats, aux_stats, x, labels, step):
    x = self._inputs(x, step)
    loss, vjp_fn, (y, stats, aux_stats, _) = jax.vjp(self._local_loss(stats, aux_stats, x, labels),
                                                     params, aux_params, has_aux=True)
    return loss, y, stats, aux_stats, self._last_stash.flatten(vjp_fn)

  def _local_backward(self, params, opt_state, aux, residuals, step):
    grads = self._last_stash.unflatten(residuals)(jnp.ones((), jnp.float32))
    return self._local_update(grads, params, opt_state, aux, step)

  def run_local(self, st: StageState, x, labels, step):
    """DGL's stage step, fused or as forward and backward calls. Returns the new state, the output
    to send up (from this step's forward, before the update) and the local loss."""
    if not self.split_backward:
      params, opt_state, stats, aux, y, loss = self.local_step(st.params, st.opt_state, st.batch_stats,
                                                              st.aux, x, labels, step)
    else:
      aux_params, aux_stats, aux_opt = st.aux
      loss, y, stats, aux_stats, residuals = self.local_forward(st.params, aux_params, st.batch_stats,
                                                                aux_stats, x, labels, step)
      params, opt_state, aux = self.local_backward(st.params, st.opt_state,
                                                   (aux_params, aux_stats, aux_opt), residuals, step)
    return st._replace(params=params, opt_state=opt_state, batch_stats=stats, aux=aux), y, loss

  def run_last(self, st: StageState, x, labels, step, apply: bool):
    """The last stage's step, fused or as forward and backward calls. Returns its new state, the
    gradient for its input and the training metrics."""
    if not self.split_backward:
      params, opt_state, accum, stats, input_grad, metrics = self.last_step(
          st.params, st.opt_state, st.accum, st.batch_stats, x, labels, step, apply=apply)
    else:
      loss, accuracy, stats, residuals = self.last_forward(st.params, st.batch_stats, x, labels, step)
      params, opt_state, accum, input_grad, lr = self.last_backward(st.params, st.opt_state, st.accum,
                                                                    residuals, step, apply=apply)
      metrics = {'train_loss': loss, 'train_accuracy': accuracy, 'learning_rate': lr}
    st = st._replace(params=params, opt_state=opt_state, accum=accum, batch_stats=stats)
    return st, input_grad, metrics

  def saved_shapes(self, params, stats, x_shape) -> tuple:
    """Shapes of one ring slot (tracing the forward also captures the vjp tree structure)."""
    x = jax.ShapeDtypeStruct(x_shape.shape, x_shape.dtype)
    return jax.eval_shape(self.forward, params, stats, x, np.int32(0))


class Pipeline:
  """Builds the stages of a split model, its initial state, and runs one lock-step iteration."""

  def __init__(self, setup: Setup, spec: PipelineSpec, split: Split, devices: Sequence[jax.Device]):
    if spec.keep not in KEEPS:
      raise ValueError(f'keep must be one of {KEEPS}, got {spec.keep!r}')
    self.setup, self.spec, self.split = setup, spec, split
    chains = setup.model.cut(split.boundaries)
    self.devices = [devices[k % len(devices)] for k in range(spec.num_stages)]
    self.stages = [_Stage(k, c, spec, setup, d) for k, (c, d) in enumerate(zip(chains, self.devices))]
    self.message_bytes: list[int] = []

  def init(self, rng: jax.Array, example: Batch) -> PipelineState:
    variables = self.setup.model.init(rng, jnp.zeros((1, *example.images.shape[1:]), jnp.float32))
    x = jax.ShapeDtypeStruct(example.images.shape, example.images.dtype)
    labels = jax.ShapeDtypeStruct(example.labels.shape, jnp.int32)
    stages, self.message_bytes = [], []
    for stage in self.stages:
      part = subset(variables, stage.chain.names)
      params, stats = part['params'], part.get('batch_stats', {})
      opt_state = self.setup.optimizer.init(params)
      y, _, saved = stage.saved_shapes(params, stats, x)
      zeros = lambda tree: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), tree)
      ring = tuple(zeros(saved) for _ in range(0 if stage.last else stage.delay))
      inbox = () if stage.first else zeros((x, labels))
      grad_inbox = () if stage.last or self.spec.local_heads else (zeros(y),)
      if not stage.last:
        self.message_bytes.append(y.size * y.dtype.itemsize * (1 if self.spec.local_heads else 2)
                                  + labels.size * 4)
      accum = zeros(params) if self.spec.accumulation > 1 else ()
      aux = ()
      if stage.aux_head is not None:  # its own key: the model's initial parameters stay the same
        aux_vars = stage.aux_head.init(jax.random.fold_in(rng, 1000 + stage.index),
                                       jnp.zeros((1, *y.shape[1:]), y.dtype), train=False)
        aux = (aux_vars['params'], aux_vars['batch_stats'], self.setup.optimizer.init(aux_vars['params']))
      stages.append(jax.device_put(StageState(params, stats, opt_state, ring, inbox, grad_inbox, accum, aux),
                                   stage.device))
      x = y
    return PipelineState(tuple(stages))

  def step(self, state: PipelineState, batch: Batch, t: int) -> tuple[PipelineState, dict]:
    """Iteration t of the lock-step pipeline (t is the global step, known on the host)."""
    if self.spec.forward_locked:
      return self._step_forward_locked(state, batch, t)
    if self.spec.local_heads:
      return self._step_local(state, batch, t)
    spec, step = self.spec, np.int32(t)
    new_states, sent_up, sent_down, metrics = [], [None] * spec.num_stages, [None] * spec.num_stages, {}
    for k, (stage, st) in enumerate(zip(self.stages, state.stages)):
      if stage.first:
        x, labels = jax.device_put((batch.images, batch.labels), stage.device)
        has_input = True
      else:
        (x, labels), has_input = st.inbox, t >= k
      apply = spec.updates_at(k, t)
      if stage.last:
        if has_input:
          st, sent_down[k], metrics = stage.run_last(st, x, labels, step, apply)
        new_states.append(st)
        continue
      params, opt_state, accum, stats, ring = st.params, st.opt_state, st.accum, st.batch_stats, st.ring
      slot = t % stage.delay
      saved = None
      if t >= spec.first_gradient(k):
        old, recompute = ring[slot], spec.keep == 'recompute'
        if recompute and stage.split_backward:
          old, recompute = stage.residuals(old, stats), False
        if has_input:  # the steady state: one call, the consumed slot's memory reused
          params, opt_state, accum, stats, sent_down[k], y, saved = stage.backward_forward(
              params, opt_state, accum, stats, old, st.grad_inbox[0], x, step, recompute=recompute,
              apply=apply)
        else:
          params, opt_state, accum, sent_down[k] = stage.backward_update(
              params, opt_state, accum, old, st.grad_inbox[0], stats, step, recompute=recompute,
              apply=apply)
      elif has_input:  # filling: nothing to back-propagate yet
        y, stats, saved = stage.forward(params, stats, x, step)
      if saved is not None:
        ring = ring[:slot] + (saved,) + ring[slot + 1:]
        sent_up[k] = (y, labels)
      new_states.append(st._replace(params=params, opt_state=opt_state, accum=accum, batch_stats=stats,
                                    ring=ring))
    for k, stage in enumerate(self.stages):  # communication between neighbours
      if k > 0 and sent_up[k - 1] is not None:
        new_states[k] = new_states[k]._replace(inbox=jax.device_put(sent_up[k - 1], stage.device))
      if not stage.last and sent_down[k + 1] is not None:
        new_states[k] = new_states[k]._replace(
            grad_inbox=(jax.device_put(sent_down[k + 1], stage.device),))
    return PipelineState(tuple(new_states)), metrics

  def _step_forward_locked(self, state: PipelineState, batch: Batch, t: int):
    """Iteration t of DDG / FR: micro-batch t through all stages in order, then delayed backwards."""
    spec, step = self.spec, np.int32(t)
    new_states, sent_down, metrics = list(state.stages), [None] * spec.num_stages, {}
    x, labels = jax.device_put((batch.images, batch.labels), self.stages[0].device)
    consumed = [None] * spec.num_stages
    for k, (stage, st) in enumerate(zip(self.stages, state.stages)):  # forward phase, in order
      if stage.last:
        new_states[k], sent_down[k], metrics = stage.run_last(st, x, labels, step, spec.updates_at(k, t))
        continue
      slot = t % stage.delay
      consumed[k] = st.ring[slot]  # the forward of iteration t - delay, read before it is replaced
      y, stats, saved = stage.forward(st.params, st.batch_stats, x, step)
      new_states[k] = st._replace(batch_stats=stats, ring=st.ring[:slot] + (saved,) + st.ring[slot + 1:])
      nxt = self.stages[k + 1].device
      x, labels = jax.device_put(y, nxt), jax.device_put(labels, nxt)
    for k, stage in enumerate(self.stages[:-1]):  # backward phase: every stage at once
      if t < spec.first_gradient(k):
        continue
      st = new_states[k]
      old, recompute, stats = consumed[k], False, st.batch_stats
      if spec.keep == 'replay':
        old, stats = stage.replay(st.params, stats, old[0])
      elif spec.keep == 'recompute':
        old, recompute = (stage.residuals(old, stats), False) if stage.split_backward else (old, True)
      params, opt_state, accum, sent_down[k] = stage.backward_update(
          st.params, st.opt_state, st.accum, old, st.grad_inbox[0], stats, step, recompute=recompute,
          apply=spec.updates_at(k, t))
      new_states[k] = st._replace(params=params, opt_state=opt_state, accum=accum, batch_stats=stats)
    for k, stage in enumerate(self.stages[:-1]):  # gradients move down for the next iteration
      if sent_down[k + 1] is not None:
        new_states[k] = new_states[k]._replace(
            grad_inbox=(jax.device_put(sent_down[k + 1], stage.device),))
    return PipelineState(tuple(new_states)), metrics

  def _step_local(self, state: PipelineState, batch: Batch, t: int):
    """Iteration t of DGL: every stage with an input takes its local step; outputs move up."""
    step, new_states, sent_up, metrics = np.int32(t), list(state.stages), {}, {}
    for k, (stage, st) in enumerate(zip(self.stages, state.stages)):
      if stage.first:
        x, labels = jax.device_put((batch.images, batch.labels), stage.device)
      elif t >= k:
        x, labels = st.inbox
      else:
        continue
      if stage.last:
        new_states[k], _, stage_metrics = stage.run_last(st, x, labels, step, True)
        metrics.update(stage_metrics)
      else:
        new_states[k], y, metrics[f'stage{k}_local_loss'] = stage.run_local(st, x, labels, step)
        sent_up[k] = (y, labels)
    for k in sent_up:
      new_states[k + 1] = new_states[k + 1]._replace(inbox=jax.device_put(sent_up[k], self.devices[k + 1]))
    return PipelineState(tuple(new_states)), metrics

  def eval_variables(self, state: PipelineState) -> dict:
    device = self.devices[0]
    params, stats = {}, {}
    for st in state.stages:
      params.update(jax.device_put(st.params, device))
      stats.update(jax.device_put(st.batch_stats, device))
    return {'params': params, 'batch_stats': stats}

  def describe(self, state: PipelineState) -> list[str]:
    spec = self.spec
    lines = [f'split ({self.split.how}) into {spec.num_stages} stages, keep={spec.keep}, beta={spec.beta}'
             + (f', accumulating {spec.accumulation} backwards per update' if spec.accumulation > 1 else '')
             + (', forward before update' if spec.forward_first else '') + ':']
    costs = self.split.stage_costs()
    total = sum(costs)
    for k, (stage, st) in enumerate(zip(self.stages, state.stages)):
      names = stage.chain.names
      lines.append(
          f'  stage {k} on {stage.device}: blocks {names[0]}..{names[-1]} ({len(names)}), '
          f'{count_params(st.params) / 1e6:.3f}M params, est. {costs[k] / 1e6:.1f} MFLOP/8 images '
          f'({100 * costs[k] / total:.0f}%), delay {0 if stage.last else stage.delay}, '
          f'staleness {spec.staleness(k)[1]:.2f} updates, '
          f'first update at iteration {spec.first_update(k)}'
          + (f', sends {self.message_bytes[k] / 1e6:.2f} MB/step to stage {k + 1}'
             if not stage.last else '')
          + (f'; auxiliary head {count_params(st.aux[0]) / 1e6:.3f}M params' if st.aux else ''))
    if spec.local_heads:
      extra = sum(count_params(st.aux[0]) for st in state.stages if st.aux)
      model = sum(count_params(st.params) for st in state.stages)
      lines.append(f'  auxiliary heads: {extra / 1e6:.3f}M extra parameters ({100 * extra / model:.1f}% of the '
                   f'model\'s {model / 1e6:.3f}M); evaluation uses the real head')
    return lines

  def timed_step(self, state: PipelineState, batch: Batch, t: int):
    """One iteration with each stage's own compute time measured (devices idle at the start).

    A stage's time is its completion time minus the completion of the stage before it on the same
    device (stages sharing a device run one after another in dispatch order). Returns (state,
    metrics, seconds per stage). Used every few hundred steps for the logs and by the benchmarks: it
    waits for the devices, so it is not how the ordinary steps run.
    """
    jax.block_until_ready(state)
    start = time.perf_counter()
    new_state, metrics = self.step(state, batch, t)
    pending = {k: jax.tree.leaves((s.params, s.batch_stats, s.ring)) for k, s in enumerate(new_state.stages)}
    done: dict[int, float] = {}
    while pending:
      for k in list(pending):
        if all(x.is_ready() for x in pending[k]):
          done[k] = time.perf_counter() - start
          del pending[k]
      time.sleep(0.0002)
    own, last_on_device = [], {}
    for k in sorted(done, key=done.get):
      device = self.devices[k]
      own.append((k, done[k] - last_on_device.get(device, 0.0)))
      last_on_device[device] = done[k]
    return new_state, metrics, [t for _, t in sorted(own)]
