"""train_and_evaluate(config, workdir): the method-agnostic training loop.

Data, steps, evaluation, logging, checkpoints and timing live here; what a step does is the method's
business (jaxdecouple.methods). Metrics stay on the device and are fetched every ``log_every_steps``
steps, so the loop never waits on the accelerator in between. The loop (``Loop.run``) reads top to
bottom: a step, then the periodic actions due after it (``clock.itstime``), each a method of ``Loop``;
the clocks pause around what is not training (``clock.Clock``).
"""
from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from jaxdecouple.checkpoint import Checkpointer
from jaxdecouple.clock import Clock, epoch_clock_at, itstime
from jaxdecouple.compilation_cache import counts as compilation_counts, use_compilation_cache
from jaxdecouple.data import TEXT_DATASETS, TrainOrder, load_dataset, preprocess_for
from jaxdecouple.data.holdout import hold_out
from jaxdecouple.data.stream import BlankImages, Prefetcher
from jaxdecouple.errors import CheckpointError, ConfigError, DivergenceError, fail
from jaxdecouple.evaluate import Evaluator
from jaxdecouple.liveness import mark_progress, watch
from jaxdecouple.memory import peak_memory
from jaxdecouple.methods import METHODS, Method, Setup, validate
from jaxdecouple.models import build_model, count_params
from jaxdecouple.optim import describe as describe_optimizer, make_optimizer, make_schedule
from jaxdecouple.process_start import start_processes, stop_before_work
from jaxdecouple.agreement import agree_on_config, agree_on_data
from jaxdecouple.processes import StopSignal, agree_on_failure, begin_run, peers_watched
from jaxdecouple.workdir import open_workdir, write_config
from jaxdecouple.writers import MetricWriter, format_duration, set_aside_earlier_metrics


@dataclasses.dataclass
class RunResult:
  """What a finished (or stopped) run leaves in memory, for notebooks and tests."""
  method: Method
  state: Any
  step: int
  last_eval: dict | None
  workdir: str
  total_steps: int = 0
  stop_requested: bool = False  # a SIGTERM or Ctrl-C came, even one as the last step's checkpoint was written:
  # a caller that runs one run after another (the study runner) starts no further run. (In one process; across
  # processes a stop is agreed at a step, and one after the last step is not seen here.)
  start_step: int = 0  # where this call started: 0, or the checkpoint's step it resumed from (the study runner
  # measures this machine's pace on the steps a call ran)

  @property
  def finished(self) -> bool:
    """Whether the run reached its last step (not stopped early by SIGTERM)."""
    return self.step >= self.total_steps

  @property
  def variables(self) -> dict:
    return self.method.eval_variables(self.state)


def use_cpu_devices(n: int) -> None:
  """Splits the host CPU into n JAX devices; only possible before JAX first runs anything."""
  if n <= 0:
    return
  try:
    jax.config.update('jax_num_cpu_devices', n)
  except RuntimeError:
    have = len(jax.devices('cpu'))
    if have != n:
      logging.warning('config.cpu_devices=%d ignored: JAX already started with %d CPU devices '
                      '(set JAX_NUM_CPU_DEVICES=%d before starting Python)', n, have, n)


def _finite(state) -> bool:
  """Whether every floating-point array of the state this process holds is finite, checked shard by shard
  on the host (a sharded array's mesh is not needed; on CPU the shards are read in place, elsewhere they are
  copied as the checkpoint that follows copies them). No device program: one would compile per array shape."""
  return all(np.isfinite(np.asarray(shard.data)).all() for x in jax.tree.leaves(state)
             if jnp.issubdtype(x.dtype, jnp.inexact) for shard in x.addressable_shards)


def build_setup(config, dataset) -> Setup:
  model = build_model(config.model, dataset.num_classes,
                      scan_min=config.scan_blocks if METHODS[config.method].scans_blocks else 0,
                      dtype=config.compute_dtype, init=config.model_init, head_norm=config.model_head_norm,
                      anchors=dataset.anchors)
  steps_per_epoch = len(dataset.x_train) // config.batch_size
  return Setup(config=config, model=model, preprocess=preprocess_for(dataset, config.data),
               optimizer=make_optimizer(config.optim, ends=(model.chain.names[0], model.chain.names[-1])),
               schedule=make_schedule(config.optim, steps_per_epoch),
               steps_per_epoch=steps_per_epoch, devices=jax.devices())


def train_and_evaluate(config, workdir: str) -> RunResult:
  """Trains ``config.method`` as configured, evaluating, logging and checkpointing into ``workdir``.

  Running again with the same workdir resumes from its latest checkpoint and, given the same
  config, ends exactly where an uninterrupted run ends.
  """
  begin_run()
  try:
    validate(config)
    use_compilation_cache(config.compilation_cache_dir)
  except ConfigError as e:  # across processes the others learn why before this one stops
    stop_before_work(config.distributed, e)
    raise
  use_cpu_devices(config.cpu_devices)
  start_processes(config.distributed, transfers=METHODS[config.method].transfers)
  agree_on_config(config, config.distributed.startup_timeout_s)
  with StopSignal(jax.process_count() > 1) as stop, peers_watched(config.distributed.heartbeat_timeout_s), \
      watch(config.distributed.heartbeat_timeout_s, config.distributed.stall_timeout_s):
    lock = open_workdir(config, workdir, jax.process_index() if jax.process_count() > 1 else None)
    try:
      checkpointer = Checkpointer(os.path.join(workdir, 'checkpoints'), config.keep_checkpoints,
                                  per_process=METHODS[config.method].pipelined)
      try:
        result = Loop(config, workdir, checkpointer).run(stop)
      finally:
        checkpointer.close()  # waits for the last save
    finally:
      lock.release()
    result.stop_requested = stop.requested
    return result


class Loop:
  """One run: its data, method and state, writer, evaluator and clocks; ``run`` trains it to the end."""

  def __init__(self, config, workdir: str, checkpointer: Checkpointer):
    self.config, self.workdir, self.checkpointer = config, workdir, checkpointer
    self.dataset = dataset = hold_out(load_dataset(config.data, config.dataset), config.data.holdout)
    # what the eval lines name: with data.holdout the records' test_* keys hold the hold-out split's figures
    self.eval_split = 'hold-out' if config.data.holdout else 'test'
    agree_on_data(dataset, config.distributed.data_timeout_s)
    mark_progress()  # loading may take minutes; the stall judge counts from here
    if config.batch_size > len(dataset.x_train):
      held = (f' left after data.holdout={config.data.holdout} took {len(dataset.x_test)} (hold out less)'
              if config.data.holdout else '')
      fail('batch_size', f'{config.batch_size} exceeds the {len(dataset.x_train)} training examples of {config.dataset}'
           f'{held}')
    self.setup = build_setup(config, dataset)
    self.spe = self.setup.steps_per_epoch
    self.total_steps = config.max_steps or config.num_epochs * self.spe
    self.order = TrainOrder(len(dataset.x_train), config.batch_size, config.seed)
    self.method = METHODS[config.method](self.setup)
    self.writer: MetricWriter | None = None  # opened once the state is restored (a refused resume writes nothing)
    self.evaluator, self.clock, self.pending = None, Clock(), []  # the evaluator: built at the first evaluation

  def batch(self, step: int):
    return self.method.train_batch(self.dataset.x_train, self.dataset.y_train, self.order, step)

  def run(self, stop: StopSignal) -> RunResult:
    """Starts or resumes, then steps to the end (or a stop), with the periodic actions after each step."""
    c, method, start_time = self.config, self.method, time.perf_counter()
    compilation_counts().reset()  # the programs of the time the first-step line gives
    state, start, carried = self.start()
    mark_progress()
    step, last_eval = start, None
    next_batch = Prefetcher(self.batch, start, self.total_steps, c.data.prefetch) if self.dataset.streamed else self.batch
    if stop.requested:
      logging.warning('stopped during start-up, before training; run again with the same --workdir')
      self.writer.close()
      return RunResult(method, state, start, None, self.workdir, self.total_steps, start_step=start)
    try:
      if start >= self.total_steps:  # resumed at its end: stopped after its last checkpoint, before its caller kept
        # the figures (a study's finished.json); those of the state it restored, the line already in its metrics
        last_eval = self.evaluate(state, start, again=True)
      for step in range(start, self.total_steps):
        batch = next_batch(step)
        if step > start and itstime(step, c.pipeline.diagnose_every_steps):
          self.diagnose(state, step)
        if itstime(step + 1, c.profile_every_steps):
          state, metrics, profile = method.profiled_step(state, batch, step)
          self.log_profile(step + 1, profile)
        else:
          state, metrics = method.step(state, batch, step)
        self.pending.append(metrics)
        self.clock.tick()
        mark_progress()  # for the stall judge (liveness.py), across processes
        if step == start:  # compilation is not timed
          jax.block_until_ready(state)
          cached = compilation_counts().summary()
          logging.info('first step (compilation included) took %.1f s%s', time.perf_counter() - start_time,
                       f' ({cached})' if cached else '')
          self.pending = []
          self.clock.start(carried)
        done = step + 1
        stop.poll(done)
        if itstime(done, c.log_every_steps):
          self.log(done)
        if itstime(done, c.eval_every_epochs * self.spe, self.total_steps, last=True):
          last_eval = self.evaluate(state, done)
        if itstime(done, c.checkpoint_every_steps, self.total_steps, last=True) or stop.requested:
          self.save(state, done)
        step = done
        if stop.requested:
          logging.warning('stopped at step %d; run again with the same --workdir to resume', done)
          break
    finally:
      self.writer.close()
      if self.dataset.streamed:
        next_batch.close()
    self.checkpointer.wait()
    took = format_duration(time.perf_counter() - start_time)
    if step < self.total_steps:  # stopped (the warning above says how to resume): not finished
      logging.info('saved at step %d of %d after %s', step, self.total_steps, took)
    else:
      logging.info('finished at step %d in %s; outputs in %s', step, took, self.workdir)
    return RunResult(method, state, step, last_eval, self.workdir, self.total_steps, start_step=start)

  def start(self) -> tuple[Any, int, tuple[float, int]]:
    """The initial state, or the latest checkpoint's: (state, its step, the interrupted epoch's clock)."""
    c, ds, method = self.config, self.dataset, self.method
    logging.info('%s on %s (%s, %d train / %d test images) with %s; %d step%s of batch %d (%d per epoch); '
                 'devices: %s',
                 c.method, c.dataset, ds.source, len(ds.x_train), len(ds.x_test), c.model, self.total_steps,
                 '' if self.total_steps == 1 else 's', c.batch_size, self.spe,
                 ', '.join(str(d) for d in self.setup.devices))
    if ds.streamed:
      logging.info('streaming %s: %d classes, %d-pixel crops decoded by %d processes, %d batches ahead; train %s, '
                   'test %s%s', c.dataset, ds.num_classes, c.data.image_size, c.data.workers or os.cpu_count() or 1,
                   c.data.prefetch, ds.x_train.files.where, ds.x_test.files.where,
                   ''.join(f', {k} {v.files.where} ({len(v)} images)' for k, v in ds.extra_tests.items()))
    # initialisation needs a batch's shapes only: streamed images are not decoded for it
    sample = BlankImages(ds.x_train) if ds.streamed else ds.x_train
    state = method.init(jax.random.key(c.seed), method.train_batch(sample, ds.y_train, self.order, 0))
    restored = self.checkpointer.restore_latest(lambda step: method.state_at(state, step))
    if restored is not None and restored[0] > self.total_steps:  # trained past this config's end: its figures
      # would be neither this config's nor the run's (num_epochs and max_steps may change on a resume)
      raise CheckpointError(
          f'the checkpoint in {self.workdir} is at step {restored[0]}, past this run\'s last step {self.total_steps} '
          '(num_epochs or max_steps lowered since it was written): set them back to resume it, or use another '
          '--workdir')
    # only now: a refused resume leaves the workdir as it was. Process 0 always; another process where its
    # workdir has none (a host with a workdir of its own: config.json is what a resume there checks)
    if jax.process_index() == 0 or not os.path.exists(os.path.join(self.workdir, 'config.json')):
      write_config(c, self.workdir)
    start, carried = 0, (0.0, 0)
    if restored is not None:
      start, state = restored
      carried = epoch_clock_at(self.workdir, start)
      logging.info('resumed from the checkpoint at step %d (epoch %.2f)%s', start, start / self.spe,
                   f'; the epoch under way had trained {carried[0]:.1f} s before the stop' if carried[1] else '')
    variables = method.eval_variables(state)
    logging.info('model %s: %d blocks, %.3fM parameters', c.model, len(self.setup.model.block_names),
                 count_params(variables['params']) / 1e6)
    logging.info('%s', describe_optimizer(c.optim))
    for line in method.describe(state):
      logging.info('%s', line)
    if restored is None and jax.process_index() == 0 and (aside := set_aside_earlier_metrics(self.workdir)):
      logging.info('no checkpoint to resume from: starting at step 0; the metrics of the earlier start moved to %s',
                   aside)
    self.writer = MetricWriter(self.workdir, enabled=jax.process_index() == 0)
    self.evaluator = Evaluator(method.predict_fn(), self.setup.preprocess, min(c.eval_batch_size, len(ds.x_test)),
                               jax.local_devices()[0], exact_batches=method.eval_uses_batch_statistics,
                               num_classes=ds.num_classes, detector=self.setup.model.detector)
    return state, start, carried

  def log(self, step: int) -> None:
    """The training metrics since the last log line, fetched from the device now."""
    values = [m for m in jax.device_get(self.pending) if m]
    elapsed, steps = self.clock.take_interval()
    self.pending = []
    rate = steps * self.config.batch_size / elapsed if elapsed > 0 else 0.0
    keys = dict.fromkeys(k for v in values for k in v)  # some only on some steps (a replica round's bytes)
    means = {k: float(np.mean([v[k] for v in values if k in v])) for k in keys}
    loss = means.get('train_loss', 0.0)  # read here anyway: the hot loop never waits for it
    failure = agree_on_failure(None if np.isfinite(loss) else f'the training loss is {loss}')
    if failure:  # every process stops at this step (a pipeline's loss is on the metrics' process only)
      self.diverged(step, failure)
    if not values:
      return
    eta = (self.total_steps - step) * elapsed / max(steps, 1)
    if self.dataset.streamed and self.dataset.x_train.skipped:
      means['skipped_images'] = self.dataset.x_train.skipped  # damaged images replaced so far (this process)
    self.writer.write('train', step, epoch=round(step / self.spe, 4), images_per_sec=round(rate, 1), **means)
    unit = 'sequences' if self.config.dataset in TEXT_DATASETS else 'images'  # (the record's key stays images_...)
    logging.info('step %d/%d (epoch %.2f): loss %.4f, lr %.4g, %.0f %s/s, ETA %s', step, self.total_steps,
                 step / self.spe, means.get('train_loss', float('nan')), means.get('learning_rate', float('nan')),
                 rate, unit, format_duration(eta))

  def evaluate(self, state, step: int, again: bool = False) -> dict:
    """Test figures of the whole network; the epoch's clock is read before and starts again after. ``again``: a
    state evaluated and logged before (a run resumed at its end): its figures, neither logged nor timed again."""
    if again:
      return {'kind': 'eval', 'step': int(step), **self._test_figures(state)}
    self.log(step)
    epoch_time, epoch_steps = self.clock.epoch()
    with self.clock.paused():
      t = time.perf_counter()
      result = self._test_figures(state)
      record = self.writer.write(
          'eval', step, epoch=round(step / self.spe, 4), **result, epoch_time_s=round(epoch_time, 3),
          eval_time_s=round(time.perf_counter() - t, 3),
          train_images_per_sec=round(epoch_steps * self.config.batch_size / max(epoch_time, 1e-9), 1))
      logging.info('epoch %.2f (step %d): %s %s %.4f, %s loss %.4f; %.1f s for the epoch', step / self.spe, step,
                   self.eval_split, 'mAP' if 'test_map' in result else 'accuracy', result['test_accuracy'],
                   self.eval_split, result['test_loss'], epoch_time)
    self.clock.next_epoch()
    mark_progress()
    return record

  def _test_figures(self, state) -> dict:
    variables = self.method.eval_variables(state)
    result = self.evaluator(variables, self.dataset.x_test, self.dataset.y_test)
    for prefix, images in self.dataset.extra_tests.items():  # e.g. the ImageNet-V2 test sets
      result.update(self.evaluator(variables, images, None, prefix))
    return result

  def save(self, state, done: int) -> None:
    """A checkpoint (never of a non-finite state); mid-epoch, with the epoch's clock so far."""
    failure = agree_on_failure(None if _finite(state) else f'the parameters are not finite (process '
                               f'{jax.process_index()})' if jax.process_count() > 1 else 'the parameters are not finite')
    if failure:  # (each process checks the parameters it holds; all stop if one of them is not finite)
      self.diverged(done, failure)
    self.checkpointer.save(done, state)
    mark_progress()
    if done % (self.config.eval_every_epochs * self.spe):  # a run resumed from here goes on with this clock
      seconds, steps = self.clock.epoch()
      self.writer.write('checkpoint', done, epoch=round(done / self.spe, 4), epoch_time_s=round(seconds, 3),
                        epoch_steps=steps)

  def diagnose(self, state, step: int) -> None:
    """Each stage's applied gradient against back-propagation's (not training time)."""
    with self.clock.paused():
      figures = self.method.diagnose(state, self.batch, step)
      self.writer.write('diagnose', step, epoch=round(step / self.spe, 4), **figures)
      logging.info('diagnose at step %d: %s', step, ', '.join(f'{k} {v}' for k, v in figures.items()))

  def log_profile(self, step: int, profile: dict) -> None:
    profile, passes = {**profile, **peak_memory(self.setup.devices)}, profile.get('timeline')
    if profile.pop('timeline', None):  # a pipeline's measured passes: a line of their own (plots.plot_timeline)
      self.writer.write('timeline', step, passes=passes)
    if profile:
      self.writer.write('profile', step, **profile)
      logging.info('profile at step %d: %s', step, ', '.join(f'{k} {v}' for k, v in profile.items()))

  def diverged(self, step: int, what: str):
    self.checkpointer.wait()
    steps = self.checkpointer.all_steps()
    raise DivergenceError(
        f'{what} at step {step}: training diverged. '
        + (f'The last finite checkpoint, step {steps[-1]}, is kept in {self.workdir}: lower optim.learning_rate (or '
           'add a warm-up) and resume from it with the same --workdir and --config.resume_changes=optim.learning_rate'
           ' (the fields you change), or use another --workdir'
           if steps else 'No checkpoint was written; lower optim.learning_rate or add a warm-up'))
