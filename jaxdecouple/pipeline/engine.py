"""The depth-wise (pipeline) engine: K contiguous stages on their devices, run by one driver.

What a stage is, computes and keeps is ``stage.py``. Everything about timing (which micro-batch a stage
forwards and back-propagates, when it updates) comes from ``schedule.Schedule``; the driver follows it
and checks, as it moves activations up and gradients down, that every gradient meets the forward it
belongs to. Within an iteration no stage waits for
another (unless the forward is locked), so with JAX's asynchronous dispatch the stages run at the same
time on their devices. Around the driver, in files of their own: where arrays live across processes
(``placement.py``), the log's description and the timed iteration (``accounting.py``), and the staleness
diagnosis against back-propagation (``diagnose.py``).
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxdecouple.data import Batch
from jaxdecouple.models import Model, relayout
from jaxdecouple.optim import Optimizer
from jaxdecouple.pipeline.correctors import Corrector
from jaxdecouple.pipeline.placement import StagePlace, is_local, move, on_one_device, place
from jaxdecouple.pipeline.schedule import Schedule
from jaxdecouple.pipeline.splits import Split
from jaxdecouple.pipeline.stage import KEEPS, AuxHeadState, Stage, StageState  # noqa: F401  (re-exported)


class PipelineState(NamedTuple):
  stages: tuple[StageState, ...]


class Pipeline:
  """Builds the stages of a split model, its initial state, and runs the schedule one iteration at a time."""

  def __init__(self, model: Model, split: Split, schedule: Schedule, devices: Sequence[jax.Device], *,
               keep: str, beta: float, optimizer: Optimizer, lr: Callable, inputs: Callable,
               split_backward: bool, corrector: Corrector | None = None, data_parallel: int = 1):
    if keep not in KEEPS:
      raise ValueError(f'keep must be one of {KEEPS}, got {keep!r}')
    self.model, self.split, self.schedule, self.optimizer = model, split, schedule, optimizer
    self.keep, self.beta, self.inputs = keep, beta, inputs
    K, D = schedule.num_stages, data_parallel  # D > 1: stage k on devices[k D : (k + 1) D] (placement.StagePlace)
    self.places = [StagePlace(devices[k * D:(k + 1) * D] if D > 1 else [devices[k % len(devices)]])
                   for k in range(K)]
    self.devices = [w.device for w in self.places]
    self.stages = [Stage(k, c, schedule, keep, beta, optimizer, lr, inputs, split_backward, d, model.num_classes,
                         model.dtype, corrector, model.aux_head, model.loss)
                   for k, (c, d) in enumerate(zip(model.cut(split.boundaries), self.devices))]
    for stage, where in zip(self.stages, self.places):
      stage.where = where
    self.message_bytes: list[int] = []
    self._tags: dict | None = None

  def init(self, rng: jax.Array, example: Batch) -> PipelineState:
    variables = self.model.init(rng, jnp.zeros((1, *example.images.shape[1:]), jnp.float32))
    x = jax.ShapeDtypeStruct(example.images.shape, example.images.dtype)
    labels = jax.ShapeDtypeStruct(example.labels.shape, example.labels.dtype)  # class ids, or detection boxes
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
        kept = stage.kept_structure(params, stats, x)
        ring = tuple(zeros(kept) for _ in range(stage.delay))
      inbox = zeros((x, labels)) if k > 0 and not self.schedule.forward_locked else ()
      grad_inbox = (zeros(y),) if k < self.schedule.last and self.schedule.sends_gradient(k + 1) else ()
      if k < self.schedule.last:
        self.message_bytes.append(y.size * y.dtype.itemsize * (2 if grad_inbox else 1) + labels.size * 4)
      aux = ()
      if stage.head is not None:  # its own key: the model's initial parameters stay the same
        head = stage.head.init(jax.random.fold_in(rng, 1000 + k), jnp.zeros((1, *y.shape[1:]), y.dtype), train=False)
        aux = AuxHeadState(head['params'], head.get('batch_stats', {}),
                           self.optimizer.for_aux_head.init(head['params']))
      accum = zeros(params) if self.schedule.accumulates(k) else ()
      corrector = stage.corrector.init(params) if stage.corrector is not None else ()
      if len(stage.where.devices) == 1:
        states.append(place(StageState(params, stats, self.optimizer.init(params), ring, inbox, grad_inbox,
                                       accum, aux, corrector), stage.device))
      else:  # what arrives with a micro-batch is split over the stage's devices, the rest replicated
        states.append(stage.where.state(StageState(params, stats, self.optimizer.init(params), ring, (), (), accum,
                                                   aux, corrector))._replace(inbox=stage.where.batch(inbox),
                                                                             grad_inbox=stage.where.batch(grad_inbox)))
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

  def step(self, state: PipelineState, batch: Batch, t: int, record=None) -> tuple[PipelineState, dict]:
    """Iteration t (the global step, known on the host) of every stage, then the exchange: outputs one
    stage up, input gradients one stage down. Micro-batch numbers travel beside the messages on the host,
    so a gradient that would meet the wrong forward stops the run instead of training silently. ``record``
    (a ``timeline.Recorder``) is told each stage's call: what it produces and what it waits for."""
    s, step = self.schedule, np.int32(t)
    if self._tags is None:  # a fresh or resumed run
      self._tags = self._in_flight(t)
    new_states, up, down, metrics = list(state.stages), {}, {}, {}
    for k, (stage, st) in enumerate(zip(self.stages, state.stages)):
      fb, bb = s.forward_batch(k, t), s.backward_batch(k, t)
      if k == 0:
        x, labels = place((batch.images, batch.labels), stage.device) if len(stage.where.devices) == 1 else \
            stage.where.batch((batch.images, batch.labels))
      elif s.forward_locked:
        x, labels = stage.where.batch(up[k - 1][1]) if fb is not None else (None, None)
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
      if record is not None:
        record(k, stage.where.devices, f'iteration {t}', (new_states[k], y, grad), (x, st.grad_inbox))
      if stage.delay and fb is not None:
        self._tags['ring', k, slot] = fb
      if y is not None:
        up[k] = (fb, (y, labels))
      if grad is not None:
        down[k] = (bb, grad)
    for k, stage in enumerate(self.stages):  # the exchange
      if k - 1 in up and not s.forward_locked:
        self._tags['up', k], message = up[k - 1]
        new_states[k] = new_states[k]._replace(inbox=stage.where.batch(message))
      if k + 1 in down:
        self._tags['down', k], message = down[k + 1]
        new_states[k] = new_states[k]._replace(grad_inbox=(stage.where.batch(message),))
    if jax.process_count() > 1 and metrics:  # to process 0, which writes them
      metrics = move(on_one_device(metrics, self.devices[-1]), jax.devices()[0])
      metrics = metrics if is_local(jax.devices()[0]) else {}
    return PipelineState(tuple(new_states)), metrics

  def eval_variables(self, state: PipelineState) -> dict:
    return whole_model(self.model, self.devices, state.stages, self.image_shape)


def whole_model(model: Model, devices: Sequence[jax.Device], stages: Sequence[StageState], image_shape) -> dict:
  """The whole model's variables from its stages' states, on this process's first device (across processes,
  every process receives every stage's parameters: each evaluates the same model)."""
  copies = {}
  for device in ([devices[0]] if jax.process_count() == 1 else
                 [next(d for d in jax.devices() if d.process_index == p) for p in range(jax.process_count())]):
    copies[device] = [move(on_one_device({'params': st.params, 'batch_stats': st.batch_stats}, first), device)
                      for st, first in zip(stages, devices)]
  mine = next(parts for device, parts in copies.items() if is_local(device))
  return relayout(mine, model.chain, image_shape)
