"""The synchronous pipeline engine (GPipe, 1F1B, ZB-H1): K stages on their devices run one iteration's M
micro-batches in the order ``sync_schedule.SyncSchedule`` gives, then every stage takes one optimizer step
with its gradient averaged over the micro-batches. Nothing is stale: the update equals back-propagation's
on the whole batch with the gradient accumulated over M micro-batches, BatchNorm's statistics computed per
micro-batch (each stage's running statistics move once per micro-batch, in micro-batch order).

The driver dispatches every pass of the iteration in the schedule's order (``dispatch_order``): each device
queues its stage's passes in that order, and JAX's asynchronous dispatch lets stages on different devices
run at once, each waiting only for the activation or gradient it needs (a transfer between devices). Each
pass is its own compiled call: F returns the stage's output and its vjp residuals (``VjpStash``), B applies
the output's gradient (the loss's 1 at the last stage) and adds the weight gradient to the stage's sum
(ZB-H1: B the input's gradient only, W the weight gradient later, each its own call, so XLA drops the other
half). What a stage holds at once is counted from the residuals the driver really keeps
(``held``), beside the schedule's own count.

Between iterations nothing is in flight: a stage's state is its parameters, statistics and optimizer (the
``StageState`` of the asynchronous engine, with empty ring and inboxes), so checkpoints, resume and
evaluation are the same.

Within an iteration the passes hand over few arrays (``Packing``): on a GPU the host spends about 9 µs on
every array a compiled call takes or returns, whatever the method (benchmarks/records/2026-11-26d_h200), and a
pass handing over a ResNet-56 half's parameters, statistics, gradient sum and residuals leaf by leaf took about
450 arrays, 8,550 an iteration at K = 2, M = 4 (FDG: 1,444), which made GPipe and 1F1B 7x BP's time there. So
each stage packs its parameters and statistics once an iteration (``pack``: one buffer per dtype), keeps its
gradient sum packed, and a forward on one accelerator returns its residuals packed (``PACK_RESIDUALS_ON``);
the optimizer step unpacks. Packing is concatenation and slicing: the numbers are those of the leaves.

An iteration also launches few computations. XLA:CPU's client keeps at most about 32 computations in flight per
device; past that each dispatch waits for one to finish (measured: a chain of 60 dispatched back to back, the
first 31-32 returned at once and each later one after about a computation's time: benchmarks/dispatch_depth.py), so a driver that launches many
an iteration cannot run ahead of its device. Cutting the batch into micro-batches and averaging the logged metrics
with the learning rate were one eager operation each (about 15 an iteration at M = 4); they are one compiled
call each now (``prepare``, ``cut_labels``, ``summarise``). Measured on a 2-core Xeon, 2 processes x 1 core,
ResNet-56, batch 32, M = 4: ZB-H1's iterations streamed as training runs them went from 18-22% slower than
waited ones to 0-10% (docs/PERFORMANCE.md).
"""
from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxdecouple.common import VjpStash, classification_loss
from jaxdecouple.data import Batch
from jaxdecouple.models import Model, relayout
from jaxdecouple.optim import Optimizer
from jaxdecouple.pipeline.collectives import compiled_all_reduce_bytes
from jaxdecouple.pipeline.engine import PipelineState, whole_model
from jaxdecouple.pipeline.placement import StagePlace, device_bytes, is_local, move, on_one_device, place
from jaxdecouple.pipeline.splits import Split
from jaxdecouple.pipeline.stage import StageState
from jaxdecouple.pipeline.sync_schedule import SyncSchedule


# Platforms where a forward returns its residuals packed. Packing copies them (a concatenation, and slices at
# the backward): on a GPU the copy is far cheaper than the dispatch it saves, on XLA:CPU it is not (ResNet-56,
# batch 8, GPipe M = 4 on 2 cores: 368 ms an iteration with the residuals packed against 295 ms without).
PACK_RESIDUALS_ON = ('gpu', 'cuda', 'rocm', 'tpu')


class Packing:
  """Arrays as one flat buffer per dtype (in order of first appearance) and back, inside compiled calls: the
  layout (each leaf's shape and dtype, and a tree's structure) is recorded when ``pack`` is traced."""

  def __init__(self):
    self.layout: list[tuple[tuple[int, ...], jnp.dtype]] | None = None
    self.treedef = None

  def pack(self, tree) -> tuple:
    leaves, self.treedef = jax.tree.flatten(tree)
    self.layout = [(x.shape, x.dtype) for x in leaves]
    groups: dict = {}
    for x in leaves:
      groups.setdefault(jnp.dtype(x.dtype), []).append(jnp.ravel(x))
    return tuple(jnp.concatenate(g) if len(g) > 1 else g[0] for g in groups.values())

  def unpack(self, buffers):
    offsets, order, leaves = {}, {}, []
    for shape, dtype in self.layout:
      order.setdefault(jnp.dtype(dtype), len(order))
    for shape, dtype in self.layout:
      d = jnp.dtype(dtype)
      at, size = offsets.get(d, 0), int(np.prod(shape, dtype=np.int64))
      leaves.append(buffers[order[d]][at:at + size].reshape(shape))
      offsets[d] = at + size
    return jax.tree.unflatten(self.treedef, leaves)


class SyncStage:
  """One stage's compiled passes on its device (or devices: ``StagePlace``). The passes take the stage's
  parameters, statistics and gradient sum packed (``pack``), and on one device return residuals packed."""

  def __init__(self, index: int, chain, last: bool, where: StagePlace, optimizer: Optimizer, lr: Callable,
               micro_batches: int, loss: Callable = classification_loss):
    self.index, self.chain, self.last, self.where, self.device = index, chain, last, where, where.device
    self.optimizer, self.lr, self.micro_batches = optimizer, lr, micro_batches
    self.loss = loss  # the model's objective (Model.loss)
    self.stash = VjpStash()
    self.params, self.stats, self.residuals = Packing(), Packing(), Packing()
    # residuals packed only where dispatch is what costs (``PACK_RESIDUALS_ON``), and on one device: packing
    # batch-split activations with replicated parameters would gather them
    self.packs_residuals = len(where.devices) == 1 and where.device.platform in PACK_RESIDUALS_ON
    self.forward = jax.jit(self._forward)
    # the running sum is not donated: a timed iteration reads when each pass's output became ready
    self.backward = jax.jit(self._backward)
    self.backward_input = jax.jit(lambda residuals, g: self._vjp(residuals, g)[1])
    self.weight = jax.jit(lambda residuals, g, total: self._add(total, self._vjp(residuals, g)[0]))
    self.apply = jax.jit(self._apply, donate_argnums=(0, 1))
    self._pack = None  # compiled by ``pack`` for the parameters' placement
    self.kept_bytes: int | None = None  # per device, one micro-batch's residuals (the same every iteration)

  def pack(self, params, stats):
    """The iteration's packed parameters and statistics, and its zero gradient sum (packed as the parameters
    are), in one compiled call: zeros_like leaf by leaf was one dispatch per parameter array (about 170 for
    ResNet-56), which on a GPU took longer than the stage's passes (benchmarks/records/2026-11-26b_h200)."""
    if self._pack is None:
      def pack(p, s):
        flat = self.params.pack(p)
        return flat, self.stats.pack(s), tuple(jnp.zeros_like(b) for b in flat)
      same = next(iter(jax.tree.leaves(params))).sharding  # a stage's state lives replicated on its devices
      self._pack = jax.jit(pack, out_shardings=same)
    return self._pack(params, stats)

  def _add(self, total, weights):
    """The packed gradient sum plus a micro-batch's weight gradient (a tree laid out as the parameters)."""
    return tuple(a + b for a, b in zip(total, self.params.pack(weights)))

  def _forward(self, params, stats, x, labels):
    """F: the stage's training forward of micro-batch x (parameters and statistics packed). Returns (output or
    None, new statistics packed, the vjp's residuals, metrics). The last stage's objective is the micro-batch's
    mean loss."""
    params, stats = self.params.unpack(params), self.stats.unpack(stats)
    run = lambda p, x: self.chain.apply({'params': p, 'batch_stats': stats}, x, train=True)
    if self.last:
      def f(p, x):
        logits, s = run(p, x)
        loss, accuracy = self.loss(logits, labels)
        return loss, (s, {'train_loss': loss, 'train_accuracy': accuracy})
    else:
      f = lambda p, x: (lambda y, s: (y, (s, {})))(*run(p, x))
    primals = (params, x) if self.index > 0 else (params,)
    if self.index == 0:
      f = (lambda f: lambda p: f(p, x))(f)
    out, vjp_fn, (stats, metrics) = jax.vjp(f, *primals, has_aux=True)
    residuals = self.stash.flatten(vjp_fn)
    if self.packs_residuals:
      residuals = self.residuals.pack(residuals)
    return (None if self.last else out), self.stats.pack(stats), residuals, metrics

  def _vjp(self, residuals, g):
    """(weight gradient, input gradient or None) of the kept forward for its output's gradient g."""
    if self.packs_residuals:
      residuals = self.residuals.unpack(residuals)
    grads = self.stash.unflatten(residuals)(jnp.ones((), jnp.float32) if self.last else g)
    return grads[0], (grads[1] if self.index > 0 else None)

  def _backward(self, residuals, g, total):
    """B (whole): the input's gradient, and the weight gradient added to the stage's packed sum."""
    weights, inputs = self._vjp(residuals, g)
    return self._add(total, weights), inputs

  def _apply(self, params, opt_state, total, stats, step):
    """The iteration's optimizer step with the gradient averaged over the micro-batches; the statistics
    unpacked for the stage's state."""
    grads = jax.tree.map(lambda x: x / self.micro_batches, self.params.unpack(total))
    params, opt_state = self.optimizer.update(grads, opt_state, params, self.lr(step))
    return params, opt_state, self.stats.unpack(stats)


class SyncPipeline:
  """Builds the stages of a split model, its initial state, and runs one synchronous iteration at a time."""

  def __init__(self, model: Model, split: Split, schedule: SyncSchedule, devices: Sequence[jax.Device], *,
               optimizer: Optimizer, lr: Callable, inputs: Callable, data_parallel: int = 1):
    """Stage k runs on ``devices[k]`` (stages share devices when there are fewer than K), or with
    ``data_parallel`` = D > 1 on devices[k D : (k + 1) D]."""
    self.model, self.split, self.schedule, self.optimizer, self.inputs = model, split, schedule, optimizer, inputs
    K, D = schedule.num_stages, data_parallel
    self.places = [StagePlace(devices[k * D:(k + 1) * D] if D > 1 else [devices[k % len(devices)]])
                   for k in range(K)]
    self.devices = [w.device for w in self.places]
    self.stages = [SyncStage(k, c, k == schedule.last, w, optimizer, lr, schedule.micro_batches, model.loss)
                   for k, (c, w) in enumerate(zip(model.cut(split.boundaries), self.places))]
    M = schedule.micro_batches
    # one compiled call each, not one per eager operation (see the module's docstring): the batch prepared and cut
    # into its micro-batches (labels too); the logged metrics averaged over them, with the learning rate
    self.prepare = jax.jit(lambda images, step: tuple(jnp.split(self.inputs(images, step), M)))
    self.cut_labels = jax.jit(lambda labels: tuple(jnp.split(labels, M)))
    self.summarise = jax.jit(lambda metrics, step: {**{name: sum(m[name] for m in metrics) / M for name in metrics[0]},
                                                    'learning_rate': self.stages[-1].lr(step)})
    self.message_bytes: list[int] = []  # per stage: its outputs and the gradients coming back, one iteration
    self.held: list[int] = [0] * schedule.num_stages  # the most residuals the last iteration kept at once
    self.held_bytes: list[int] = [0] * schedule.num_stages
    # per stage: the bytes its devices put into all-reduces in an iteration (read from the compiled passes,
    # collectives.py; 0 for a stage on one device), known after the first profiled iteration
    self.allreduce_bytes: list[int] | None = None

  def init(self, rng: jax.Array, example: Batch) -> PipelineState:
    variables = self.model.init(rng, jnp.zeros((1, *example.images.shape[1:]), jnp.float32))
    self.image_shape = (1, *example.images.shape[1:])
    micro = example.images.shape[0] // self.schedule.micro_batches
    x = jax.ShapeDtypeStruct((micro, *example.images.shape[1:]), jnp.float32)
    states, self.message_bytes = [], []
    for k, stage in enumerate(self.stages):
      part = relayout([variables], stage.chain, (1, *x.shape[1:]))
      params, stats = part['params'], part.get('batch_stats', {})
      if k < self.schedule.last:
        y = jax.eval_shape(lambda p, s, x: stage.chain.apply({'params': p, 'batch_stats': s}, x, train=True)[0],
                           params, stats, x)
        # each micro-batch's activations up and gradients down; the labels once, at the first boundary: they go
        # straight from stage 0's device to the last stage's (step), not from stage to stage
        labels = micro * 4 if k == 0 else 0
        self.message_bytes.append(self.schedule.micro_batches * (2 * y.size * y.dtype.itemsize + labels))
        x = y
      states.append(stage.where.state(StageState(params, stats, self.optimizer.init(params), (), (), ())))
    return PipelineState(tuple(states))

  def step(self, state: PipelineState, batch: Batch, t: int, record=None) -> tuple[PipelineState, dict]:
    """Iteration t: every pass of the schedule, then one optimizer step per stage. ``record`` (a
    ``timeline.Recorder``) is told every call: what it produces and what it waits for."""
    record = record or (lambda *args: None)
    s, step, M = self.schedule, np.int32(t), self.schedule.micro_batches
    first, last = self.stages[0], self.stages[-1]
    if len(first.where.devices) == 1:
      images, labels = place((batch.images, batch.labels), first.device)
      inputs = self.prepare(images, step)
      labels = move(list(self.cut_labels(labels)), last.device)
    else:  # augmented on the whole batch (BP's draws), then each micro-batch split over the stage's devices
      images = jax.device_put(batch.images, first.where.split)
      inputs = [first.where.batch(x) for x in self.prepare(images, step)]
      labels = [last.where.batch(y) for y in np.split(np.asarray(batch.labels), M)]
    params, stats, totals = map(list, zip(*(stage.pack(st.params, st.batch_stats)
                                            for stage, st in zip(self.stages, state.stages))))
    arriving, gradients, kept, waiting, metrics = {}, {}, {}, {}, []
    shapes = {}  # (stage, pass) -> (function, its arguments' shapes and shardings): for allreduce_bytes
    count = record is not None and self.allreduce_bytes is None and any(len(w.devices) > 1 for w in self.places)

    def call(k, kind, fn, *args):
      if count and (k, kind) not in shapes:
        shapes[k, kind] = fn, jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
                                           if isinstance(x, jax.Array) else x, args)
      return fn(*args)
    held = [0] * s.num_stages
    self.held, self.held_bytes = [0] * s.num_stages, [0] * s.num_stages
    for k, (kind, m) in s.dispatch_order():
      stage = self.stages[k]
      if kind == 'F':
        x = inputs[m] if k == 0 else arriving.pop((k, m))
        y, stats[k], kept[k, m], extra = call(k, 'F', stage.forward, params[k], stats[k], x,
                                              labels[m] if stage.last else None)
        record(k, stage.where.devices, f'F{m}', (y, stats[k], kept[k, m], extra), x)
        held[k] += 1
        if held[k] > self.held[k]:
          if stage.kept_bytes is None:
            stage.kept_bytes = sum(device_bytes(r) for r in jax.tree.leaves(kept[k, m]))
          self.held[k] = held[k]
          self.held_bytes[k] = held[k] * stage.kept_bytes  # per device
        if stage.last:
          metrics.append(extra)
        else:
          arriving[k + 1, m] = self.stages[k + 1].where.batch(y)
        continue
      g = None if stage.last else gradients.pop((k, m)) if kind == 'B' else waiting.pop((k, m))
      if kind == 'W':
        totals[k] = call(k, 'W', stage.weight, kept.pop((k, m)), g, totals[k])
        record(k, stage.where.devices, f'W{m}', totals[k], g)
        held[k] -= 1
        continue
      if s.splits_backward:
        down = call(k, 'B', stage.backward_input, kept[k, m], g) if k > 0 else None
        waiting[k, m] = g
        if k > 0:  # stage 0 sends nothing down: its backward is all in W
          record(k, stage.where.devices, f'B{m}', down, g)
      else:
        totals[k], down = call(k, 'B', stage.backward, kept.pop((k, m)), g, totals[k])
        record(k, stage.where.devices, f'B{m}', (totals[k], down), g)
        held[k] -= 1
      if k > 0:
        gradients[k - 1, m] = self.stages[k - 1].where.batch(down)
    new = []
    for k, (stage, st) in enumerate(zip(self.stages, state.stages)):
      p, o, b = call(k, 'update', stage.apply, st.params, st.opt_state, totals[k], stats[k], step)
      record(k, stage.where.devices, 'update', (p, o))
      new.append(st._replace(params=p, opt_state=o, batch_stats=b))
    if count:
      self.allreduce_bytes = self._allreduce_bytes(shapes)
    out = self.summarise(metrics, step) if metrics else {}
    if jax.process_count() > 1 and out:  # to process 0, which writes them
      out = move(on_one_device(out, last.device), jax.devices()[0])
      out = out if is_local(jax.devices()[0]) else {}
    return PipelineState(tuple(new)), out

  def _allreduce_bytes(self, shapes: dict) -> list[int]:
    """Each stage's all-reduce bytes in an iteration: every pass's, read from its compiled program, times the
    passes of its kind the stage runs per iteration."""
    per_stage = []
    for k in range(self.schedule.num_stages):
      runs = {'update': 1}
      for kind, _ in self.schedule.order(k):
        runs[kind] = runs.get(kind, 0) + 1
      per_stage.append(sum(n * compiled_all_reduce_bytes(shapes[k, kind][0], *shapes[k, kind][1])
                           for kind, n in runs.items() if (k, kind) in shapes))
    return per_stage

  def eval_variables(self, state: PipelineState) -> dict:
    return whole_model(self.model, self.devices, state.stages, self.image_shape)
