"""The depth-wise (pipeline) engine: K contiguous stages on their devices, run by one driver.

A stage is two choices. Where its gradient comes from (``Schedule.source``): a neighbour's delayed
gradient times beta, the loss (the last stage), or a local auxiliary head (DGL). And, when the gradient
comes late, what it keeps of a forward until then (``keep``):
  'vjp'        the jax.vjp residuals (old activations and the parameters they met): nothing recomputed;
  'recompute'  the stage input and the parameters it met; the forward is recomputed when the gradient
               arrives (same numbers, less memory, one extra forward);
  'replay'     the stage input only; the forward is replayed with the stage's current parameters, in
               training mode, so BatchNorm statistics move again (FR).
Everything about timing (which micro-batch a stage forwards and back-propagates, when it updates) comes
from ``schedule.Schedule``; the driver follows it and checks, as it moves activations up and gradients
down, that every gradient meets the forward it belongs to. Within an iteration no stage waits for
another (unless the forward is locked), so with JAX's asynchronous dispatch the stages run at the same
time on their devices. A ring slot is a flat tuple of arrays, so the state has a fixed structure of
plain arrays that checkpoints restore, pipeline in flight included.
"""
from __future__ import annotations

import functools
import time
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxdecouple.common import VjpStash, classification_loss, vjp_call
from jaxdecouple.data import Batch
from jaxdecouple.models import AuxHead, Chain, Model, count_params, relayout
from jaxdecouple.optim import Optimizer
from jaxdecouple.pipeline.schedule import Schedule
from jaxdecouple.pipeline.splits import Split

KEEPS = ('vjp', 'recompute', 'replay')


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


class StageState(NamedTuple):
  params: Any
  batch_stats: Any
  opt_state: Any
  ring: tuple          # delay slots, each the kept forward of one micro-batch as a tuple of arrays
  inbox: tuple         # (activation, labels) sent up by stage k-1 last iteration; () if none comes
  grad_inbox: tuple    # (gradient,) sent down by stage k+1 last iteration; () if none comes
  accum: Any = ()      # summed parameter gradients not yet applied (accumulation > 1), else ()
  aux: Any = ()        # local head: the auxiliary classifier's (params, batch_stats, opt_state), else ()


class PipelineState(NamedTuple):
  stages: tuple[StageState, ...]


class Stage:
  """One stage's compiled work on its device."""

  def __init__(self, index: int, chain: Chain, schedule: Schedule, keep: str, beta: float,
               optimizer: Optimizer, lr: Callable, inputs: Callable, split: bool, device: jax.Device,
               num_classes: int, dtype=None):
    self.index, self.chain, self.schedule, self.device = index, chain, schedule, device
    self.optimizer, self.lr, self.split, self.beta = optimizer, lr, split, beta
    self.source, self.delay = schedule.source(index), schedule.delay(index)
    self.keep = keep if self.delay else None
    self.sends_gradient = schedule.sends_gradient(index)
    self.forward_first = schedule.forward_before_update(index)
    self.inputs = inputs if index == 0 else (lambda x, step: x)  # stage 0: augmentation, normalisation
    self.head = AuxHead(num_classes, **({'dtype': dtype} if dtype is not None else {})) \
        if self.source == 'local' else None
    self._kept = VjpStash()  # ring slots (keep='vjp') and residuals recomputed in a call of their own
    # The consumed ring slot is donated when its buffers can hold the new one (keep='vjp').
    self.iterate = jax.jit(self._iterate, donate_argnums=(0, 1, 2, 3, 4) if self.keep == 'vjp' else (0, 1, 2, 3),
                           static_argnames=('forward', 'backward', 'apply', 'residuals'))
    self.residuals = jax.jit(self._residuals)
    self.learn = vjp_call(lambda p, o, a, s, aux, x, apply, labels, step: self._vjp(p, s, aux, self.inputs(x, step), labels),
                          self._learn, split, donate=(0, 1, 2), static=(6,))

  def _vjp(self, params, stats, aux, x, labels):
    """The stage's training forward of x, differentiated: (vjp_fn, (y, new_stats, extra)). vjp_fn maps the
    cotangent of its objective (its output, for a neighbour's gradient; its loss otherwise) to gradients
    for its parameters, then its input (if it sends a gradient down) or its head's parameters."""
    run = lambda p, x: self.chain.apply({'params': p, 'batch_stats': stats}, x, train=True)
    if self.source == 'neighbour':
      f = lambda p, x: (lambda y, s: (y, (y, s, ())))(*run(p, x))
    elif self.source == 'loss':
      def f(p, x):
        logits, s = run(p, x)
        loss, accuracy = classification_loss(logits, labels)
        return loss, (None, s, {'train_loss': loss, 'train_accuracy': accuracy})
    else:
      def f(p, head_params):
        y, s = run(p, x)
        logits, head_vars = self.head.apply({'params': head_params, 'batch_stats': aux[1]}, y, train=True,
                                            mutable=['batch_stats'])
        loss = classification_loss(logits, labels)[0]
        return loss, (y, s, (head_vars['batch_stats'], {f'stage{self.index}_local_loss': loss}))
    if self.source == 'local':
      primals = (params, aux[0])
    elif self.sends_gradient:
      primals = (params, x)
    else:  # nothing to send down: no gradient for the input
      primals, f = (params,), functools.partial(lambda f, x, p: f(p, x), f, x)
    _, vjp_fn, out = jax.vjp(f, *primals, has_aux=True)
    return vjp_fn, out

  def _update(self, grads, params, opt_state, accum, step, apply: bool):
    """Adds ``grads`` to the accumulator; with ``apply`` one optimizer step with the sum (without
    accumulation: one step with ``grads``)."""
    if self.schedule.accumulation > 1:
      grads = jax.tree.map(jnp.add, accum, grads)
      if not apply:
        return params, opt_state, grads
      accum = jax.tree.map(jnp.zeros_like, grads)
    params, opt_state = self.optimizer.update(grads, opt_state, params, self.lr(step))
    return params, opt_state, accum

  def _learn(self, vjp_fn, out, params, opt_state, accum, stats, aux, x, apply, labels, step):
    """A stage that learns from a loss of its own: the cotangent 1 through this forward, then the update."""
    y, stats, extra = out
    grads = vjp_fn(jnp.ones((), jnp.float32))
    params, opt_state, accum = self._update(grads[0], params, opt_state, accum, step, apply)
    if self.source == 'local':
      head_stats, metrics = extra
      head_params, head_opt = self.optimizer.update(grads[1], aux[2], aux[0], self.lr(step))
      return params, opt_state, accum, stats, (head_params, head_stats, head_opt), y, None, metrics
    input_grad = grads[1] if self.sends_gradient else None
    return params, opt_state, accum, stats, aux, None, input_grad, {**extra, 'learning_rate': self.lr(step)}

  def _residuals(self, slot, params, stats):
    """The kept forward's vjp residuals, recomputed ('recompute': from its input and the parameters it
    met; 'replay': from its input with the current parameters, BatchNorm statistics moving), and the
    statistics after it."""
    x_old, met = slot if self.keep == 'recompute' else (slot[0], params)
    vjp_fn, (_, new_stats, _) = self._vjp(met, stats, (), x_old, None)
    return self._kept.flatten(vjp_fn), (new_stats if self.keep == 'replay' else stats)

  def _iterate(self, params, opt_state, accum, stats, slot, grad, x, step, *, forward: bool,
               backward: bool, apply: bool, residuals: bool):
    """A neighbour-taught stage's iteration: back-propagate beta x grad through the kept forward (the ring
    slot, or with ``residuals`` its vjp residuals already recomputed) and update; forward x, before or
    after the update as the schedule says, and keep it (its slot replaces the consumed one)."""
    y = new_slot = input_grad = None

    def run_forward(params, stats):
      x_in = self.inputs(x, step)
      vjp_fn, (y, stats, _) = self._vjp(params, stats, (), x_in, None)
      kept = {'vjp': lambda: self._kept.flatten(vjp_fn), 'recompute': lambda: (x_in, params),
              'replay': lambda: (x_in,)}[self.keep]()
      return y, stats, kept
    if forward and self.forward_first:
      y, stats, new_slot = run_forward(params, stats)
    if backward:
      if not residuals:
        slot, stats = self._residuals(slot, params, stats)
      grads = self._kept.unflatten(slot)(grad * jnp.asarray(self.beta, grad.dtype))
      params, opt_state, accum = self._update(grads[0], params, opt_state, accum, step, apply)
      input_grad = grads[1] if self.sends_gradient else None
    if forward and not self.forward_first:
      y, stats, new_slot = run_forward(params, stats)
    return params, opt_state, accum, stats, new_slot, y, input_grad

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
    y = new_slot = None
    given = self.keep == 'vjp' or not backward
    if not given and self.split:  # XLA:CPU: the recomputation in a call of its own (see common.vjp_call)
      if forward and self.forward_first:  # it must meet the statistics after this iteration's forward
        *state, new_slot, y, _ = self.iterate(*state, (), None, x, step, forward=True, backward=False,
                                              apply=False, residuals=True)
        forward = False
      kept, stats = self.residuals(kept, state[0], state[3])
      state, given = (*state[:3], stats), True
    *state, slot_out, y_out, down = self.iterate(*state, kept, grad, x, step, forward=forward,
                                                 backward=backward, apply=apply, residuals=given)
    new_slot, y = (new_slot, y) if slot_out is None else (slot_out, y_out)
    ring = st.ring if new_slot is None else st.ring[:slot] + (new_slot,) + st.ring[slot + 1:]
    params, opt_state, accum, stats = state
    return st._replace(params=params, opt_state=opt_state, accum=accum, batch_stats=stats, ring=ring), y, down, {}

  def applied_gradients(self, st: StageState, x, labels, step, slot: int):
    """The parameter gradient the stage would apply at this iteration (times beta for a neighbour's),
    without updating anything: for the staleness diagnostics."""
    if self.source != 'neighbour':
      return self._vjp(st.params, st.batch_stats, st.aux, self.inputs(x, step), labels)[0](jnp.ones((), jnp.float32))[0]
    kept = st.ring[slot]
    if self.keep != 'vjp':
      kept, _ = self._residuals(kept, st.params, st.batch_stats)
    return self._kept.unflatten(kept)(st.grad_inbox[0] * jnp.asarray(self.beta, jnp.float32))[0]


class Pipeline:
  """Builds the stages of a split model, its initial state, and runs the schedule one iteration at a time."""

  def __init__(self, model: Model, split: Split, schedule: Schedule, devices: Sequence[jax.Device], *,
               keep: str, beta: float, optimizer: Optimizer, lr: Callable, inputs: Callable,
               split_backward: bool):
    if keep not in KEEPS:
      raise ValueError(f'keep must be one of {KEEPS}, got {keep!r}')
    self.model, self.split, self.schedule, self.optimizer = model, split, schedule, optimizer
    self.keep, self.beta, self.inputs = keep, beta, inputs
    self.devices = [devices[k % len(devices)] for k in range(schedule.num_stages)]
    self.stages = [Stage(k, c, schedule, keep, beta, optimizer, lr, inputs, split_backward, d, model.num_classes,
                         model.dtype)
                   for k, (c, d) in enumerate(zip(model.cut(split.boundaries), self.devices))]
    self.message_bytes: list[int] = []
    self._tags: dict | None = None

  def init(self, rng: jax.Array, example: Batch) -> PipelineState:
    variables = self.model.init(rng, jnp.zeros((1, *example.images.shape[1:]), jnp.float32))
    x = jax.ShapeDtypeStruct(example.images.shape, example.images.dtype)
    labels = jax.ShapeDtypeStruct(example.labels.shape, jnp.int32)
    zeros = lambda tree: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), tree)
    states, self.message_bytes, self._tags = [], [], None
    self.image_shape = (1, *example.images.shape[1:])
    for k, stage in enumerate(self.stages):
      part = relayout([variables], stage.chain, (1, *x.shape[1:]))
      params, stats = part['params'], part.get('batch_stats', {})
      y = jax.eval_shape(lambda p, s, x: stage.chain.apply({'params': p, 'batch_stats': s}, stage.inputs(x, 0),
                                                           train=True)[0], params, stats, x)
      ring = ()
      if stage.delay:  # tracing the forward also records the kept vjp's structure
        kept = jax.eval_shape(functools.partial(stage._iterate, forward=True, backward=False, apply=False,
                                                residuals=True), params, None, (), stats, (), None, x, 0)[4]
        ring = tuple(zeros(kept) for _ in range(stage.delay))
      inbox = zeros((x, labels)) if k > 0 and not self.schedule.forward_locked else ()
      grad_inbox = (zeros(y),) if k < self.schedule.last and self.schedule.sends_gradient(k + 1) else ()
      if k < self.schedule.last:
        self.message_bytes.append(y.size * y.dtype.itemsize * (2 if grad_inbox else 1) + labels.size * 4)
      aux = ()
      if stage.head is not None:  # its own key: the model's initial parameters stay the same
        head = stage.head.init(jax.random.fold_in(rng, 1000 + k), jnp.zeros((1, *y.shape[1:]), y.dtype), train=False)
        aux = (head['params'], head['batch_stats'], self.optimizer.init(head['params']))
      accum = zeros(params) if self.schedule.accumulation > 1 else ()
      states.append(place(StageState(params, stats, self.optimizer.init(params), ring, inbox, grad_inbox,
                                     accum, aux), stage.device))
      x = y
    return PipelineState(tuple(states))

  def _in_flight(self, t: int) -> dict:
    """What the schedule says the inboxes and ring slots hold at the start of iteration t: micro-batches."""
    s, tags = self.schedule, {}
    for k, stage in enumerate(self.stages):
      if k > 0:
        tags['up', k] = s.forward_batch(k - 1, t - 1)
      if k < s.last:
        tags['down', k] = s.backward_batch(k + 1, t - 1)
      for d in range(1, stage.delay + 1):
        if (m := s.forward_batch(k, t - d)) is not None:
          tags['ring', k, m % stage.delay] = m
    return tags

  def _expect(self, key, want: int, what: str) -> None:
    if self._tags.get(key) != want:
      raise RuntimeError(f'the pipeline schedule and its exchange disagree: {what} should meet micro-batch '
                         f'{want}, the exchange brought {self._tags.get(key)}')

  def step(self, state: PipelineState, batch: Batch, t: int) -> tuple[PipelineState, dict]:
    """Iteration t (the global step, known on the host) of every stage, then the exchange: outputs one
    stage up, input gradients one stage down. Micro-batch numbers travel beside the messages on the host,
    so a gradient that would meet the wrong forward stops the run instead of training silently."""
    s, step = self.schedule, np.int32(t)
    if self._tags is None:  # a fresh or resumed run
      self._tags = self._in_flight(t)
    new_states, up, down, metrics = list(state.stages), {}, {}, {}
    for k, (stage, st) in enumerate(zip(self.stages, state.stages)):
      fb, bb = s.forward_batch(k, t), s.backward_batch(k, t)
      if k == 0:
        x, labels = place((batch.images, batch.labels), stage.device)
      elif s.forward_locked:
        x, labels = move(up[k - 1][1], stage.device) if fb is not None else (None, None)
      else:
        x, labels = st.inbox
        if fb is not None:
          self._expect(('up', k), fb, f'stage {k} forward at iteration {t}')
      backward = stage.delay > 0 and bb is not None
      if backward:
        self._expect(('down', k), bb, f'stage {k} backward at iteration {t}')
        self._expect(('ring', k, bb % stage.delay), bb, f'stage {k} kept forward at iteration {t}')
      slot = next((m for m in (fb, bb) if m is not None), 0) % max(stage.delay, 1)
      new_states[k], y, grad, stage_metrics = stage.run(st, x, labels, step, forward=fb is not None,
                                                        backward=backward, apply=s.updates_at(k, t), slot=slot)
      metrics.update(stage_metrics)
      if stage.delay and fb is not None:
        self._tags['ring', k, slot] = fb
      if y is not None:
        up[k] = (fb, (y, labels))
      if grad is not None:
        down[k] = (bb, grad)
    for k, stage in enumerate(self.stages):  # the exchange
      if k - 1 in up and not s.forward_locked:
        self._tags['up', k], message = up[k - 1]
        new_states[k] = new_states[k]._replace(inbox=move(message, stage.device))
      if k + 1 in down:
        self._tags['down', k], message = down[k + 1]
        new_states[k] = new_states[k]._replace(grad_inbox=(move(message, stage.device),))
    if jax.process_count() > 1 and metrics:  # to process 0, which writes them
      metrics = move(metrics, jax.devices()[0])
      metrics = metrics if is_local(jax.devices()[0]) else {}
    return PipelineState(tuple(new_states)), metrics

  def eval_variables(self, state: PipelineState) -> dict:
    """The whole model's variables on this process's first device (across processes, every process
    receives every stage's parameters: each evaluates the same model)."""
    copies = {}
    for device in ([self.devices[0]] if jax.process_count() == 1 else
                   [next(d for d in jax.devices() if d.process_index == p) for p in range(jax.process_count())]):
      copies[device] = [move({'params': st.params, 'batch_stats': st.batch_stats}, device)
                        for st in state.stages]
    mine = next(parts for device, parts in copies.items() if is_local(device))
    return relayout(mine, self.model.chain, self.image_shape)

  @functools.cached_property
  def _diagnostics(self):
    """(BP's parameter gradients of the whole model on a batch; a stage's input from the stages below
    it): the forwards in training mode, as that micro-batch was augmented, nothing updated."""
    def bp_grads(variables, images, labels, step):
      def loss(params):
        logits, _ = self.model.apply({'params': params, 'batch_stats': variables['batch_stats']},
                                     self.inputs(images, step), train=True)
        return classification_loss(logits, labels)[0]
      return jax.grad(loss)(variables['params'])

    def below(variables, images, step, k):
      chain = self.model.chain.slice(0, self.split.boundaries[k - 1])
      return chain.apply(variables, self.inputs(images, step), train=True)[0]
    applied = [jax.jit(stage.applied_gradients, static_argnums=(4,)) for stage in self.stages]
    return jax.jit(bp_grads), jax.jit(below, static_argnums=(3,)), applied

  def diagnose(self, state: PipelineState, batch_of: Callable[[int], Batch], t: int) -> dict[str, float]:
    """Call before step t. For every stage that learns at iteration t: the cosine similarity and the
    norm ratio between the gradient it is about to apply (delayed and times beta, or from its own loss)
    and plain back-propagation's at every stage's current parameters on the same micro-batch. Costs
    about one forward and backward of the whole model per stage; waits for the devices."""
    s, out = self.schedule, {}
    bp_grads, below, applied = self._diagnostics
    variables = self.eval_variables(state)
    for k, (stage, st) in enumerate(zip(self.stages, state.stages)):
      m = s.backward_batch(k, t)
      if m is None or (not stage.delay and s.forward_batch(k, t) is None):
        continue
      batch = batch_of(m)
      images, labels = jax.device_put((batch.images, batch.labels), self.devices[0])
      if stage.delay or k == 0:
        x = images
      elif s.forward_locked:  # its input is made in this same iteration, with the current parameters
        x = below(variables, images, np.int32(m), k)
      else:
        x = st.inbox[0]
      mine = applied[k](st, jax.device_put(x, stage.device), jax.device_put(labels, stage.device), np.int32(t),
                        m % stage.delay if stage.delay else 0)
      full = bp_grads(variables, images, labels, np.int32(m))
      a, b = (jnp.concatenate([v.ravel() for v in jax.tree.leaves(g)])
              for g in jax.device_put((mine, {n: full[n] for n in mine}), self.devices[0]))
      cosine, ratio = jax.device_get((jnp.dot(a, b) / (jnp.linalg.norm(a) * jnp.linalg.norm(b)),
                                      jnp.linalg.norm(a) / jnp.linalg.norm(b)))
      out[f'stage{k}_cosine'], out[f'stage{k}_norm_ratio'] = round(float(cosine), 5), round(float(ratio), 5)
    return out

  def describe(self, state: PipelineState) -> list[str]:
    s = self.schedule
    lines = [f'split ({self.split.how}) into {s.num_stages} stages, keep={self.keep}, beta={self.beta}'
             + (f', accumulating {s.accumulation} backwards per update' if s.accumulation > 1 else '')
             + (', forward before update' if s.forward_first else '') + ':']
    costs = self.split.stage_costs()
    total = sum(costs)
    for k, (stage, st) in enumerate(zip(self.stages, state.stages)):
      names = stage.chain.names
      lines.append(
          f'  stage {k} on {stage.device}'
          + (f' (process {stage.device.process_index})' if jax.process_count() > 1 else '') + f': blocks {names[0]}..{names[-1]} ({len(names)}), '
          f'{count_params(st.params) / 1e6:.3f}M params, est. {costs[k] / 1e6:.1f} MFLOP/8 images '
          f'({100 * costs[k] / total:.0f}%), delay {s.delay(k)}, staleness {s.staleness(k):.2f} updates, '
          f'first update at iteration {s.first_update(k)}'
          + (f', sends {self.message_bytes[k] / 1e6:.2f} MB/step to stage {k + 1}' if k < s.last else '')
          + (f'; auxiliary head {count_params(st.aux[0]) / 1e6:.3f}M params' if st.aux else ''))
    if s.local_heads:
      extra = sum(count_params(st.aux[0]) for st in state.stages if st.aux)
      model = sum(count_params(st.params) for st in state.stages)
      lines.append(f'  auxiliary heads: {extra / 1e6:.3f}M extra parameters ({100 * extra / model:.1f}% of the '
                   f'model\'s {model / 1e6:.3f}M); evaluation uses the real head')
    lines.append('  schedule (F<m>: forward of micro-batch m, B<m>: its backward, *: optimizer step):')
    lines.extend('    ' + line for line in s.table(2 * s.num_stages + s.accumulation).splitlines())
    return lines

  def timed_step(self, state: PipelineState, batch: Batch, t: int):
    """One iteration with each stage's own compute time measured (devices idle at the start).

    A stage's time is its completion time minus the completion of the stage before it on the same
    device (stages sharing a device run one after another in dispatch order). Returns (state,
    metrics, {stage: seconds}) for the stages this process drives (all, in one process). Used every few hundred steps for the logs and by the benchmarks: it
    waits for the devices, so it is not how the ordinary steps run.
    """
    jax.block_until_ready(state)
    start = time.perf_counter()
    new_state, metrics = self.step(state, batch, t)
    pending = {k: jax.tree.leaves((s.params, s.batch_stats, s.ring)) for k, s in enumerate(new_state.stages)
               if is_local(self.devices[k])}  # across processes: the stages this one drives
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
    return new_state, metrics, dict(sorted(own))
