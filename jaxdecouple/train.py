"""train_and_evaluate(config, workdir): the method-agnostic training loop.

Data, steps, evaluation, logging, checkpoints and timing live here; what a step does is the
method's business (jaxdecouple.methods). Metrics stay on the device and are fetched every
``log_every_steps`` steps, so the loop never waits on the accelerator in between.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import signal
import socket
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from jaxdecouple import config as config_lib
from jaxdecouple.checkpoint import Checkpointer
from jaxdecouple.data import Preprocess, TrainOrder, load_dataset, normalize
from jaxdecouple.data.stream import BlankImages, Prefetcher
from jaxdecouple.errors import DivergenceError
from jaxdecouple.methods import METHODS, Method, Setup
from jaxdecouple.models import build_model, count_params
from jaxdecouple.optim import make_optimizer, make_schedule
from jaxdecouple.workdir import open_workdir, write_config
from jaxdecouple.writers import MetricWriter, format_duration


@dataclasses.dataclass
class RunResult:
  """What a finished (or stopped) run leaves in memory, for notebooks and tests."""
  method: Method
  state: Any
  step: int
  last_eval: dict | None
  workdir: str
  total_steps: int = 0

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


class Evaluator:
  """Test loss, top-1 (and, with 100 classes or more, top-5) accuracy of the whole network, batch by batch,
  on one device.

  ``predict(variables, images) -> logits`` is the method's (Method.predict_fn). The last, partial
  batch is padded to the batch size (one compiled shape) unless ``exact_batches``: predictions that
  use the batch's own BatchNorm statistics would change with padding, so it then runs at its size,
  and the examples go in a fixed shuffled order, because test sets stored by class (the CIFAR-10 JPEG
  copy) would otherwise give batches of one class, whose statistics are not the data's. A streamed test
  set (``y`` None) is decoded batch by batch, the next batch while the device works on this one.
  """

  TOP5_FROM_CLASSES = 100

  def __init__(self, predict, preprocess: Preprocess, batch_size: int, device: jax.Device,
               exact_batches: bool = False, num_classes: int = 0):
    self.batch_size = batch_size
    self.device = device
    self.exact_batches = exact_batches
    self.num_classes = num_classes

    @jax.jit
    def sums(variables, images, labels, mask):
      logits = predict(variables, normalize(images, preprocess)).astype(jnp.float32)
      losses = -jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=1)[:, 0]
      correct = jnp.argmax(logits, -1) == labels
      if logits.shape[-1] >= 5:
        correct5 = jnp.any(jax.lax.top_k(logits, 5)[1] == labels[:, None], axis=-1)
      else:
        correct5 = jnp.zeros_like(correct)
      return jnp.sum(losses * mask), jnp.sum(correct * mask), jnp.sum(correct5 * mask)

    self._sums = sums

  def _batches(self, x, y):
    """(images, labels) of each evaluation batch, in memory or decoded from a stream."""
    order = np.random.default_rng(0).permutation(len(x)) if self.exact_batches else None
    if y is not None:
      if order is not None:
        x, y = x[order], y[order]
      for start in range(0, len(x), self.batch_size):
        yield x[start:start + self.batch_size], y[start:start + self.batch_size]
      return
    order = np.arange(len(x)) if order is None else order
    chunks = [order[a:a + self.batch_size] for a in range(0, len(x), self.batch_size)]
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix='eval-prefetch') as ahead:
      next_batch = ahead.submit(x.take, chunks[0])
      for i in range(len(chunks)):
        batch = next_batch.result()
        if i + 1 < len(chunks):
          next_batch = ahead.submit(x.take, chunks[i + 1])
        yield batch

  def __call__(self, variables, x, y: np.ndarray | None, prefix: str = 'test') -> dict[str, float]:
    variables = jax.device_put(variables, self.device)
    b = self.batch_size
    parts = []
    for xb, yb in self._batches(x, y):
      mask = np.ones(len(xb), np.float32)
      if len(xb) < b and not self.exact_batches:  # pad the last batch: one compiled shape
        pad = b - len(xb)
        xb = np.concatenate([xb, np.zeros((pad, *xb.shape[1:]), xb.dtype)])
        yb = np.concatenate([yb, np.zeros(pad, yb.dtype)])
        mask = np.concatenate([mask, np.zeros(pad, np.float32)])
      parts.append(self._sums(variables, *jax.device_put((xb, yb, mask), self.device)))
    totals = np.sum(np.asarray(jax.device_get(parts), np.float64), axis=0)
    out = {f'{prefix}_loss': totals[0] / len(x), f'{prefix}_accuracy': totals[1] / len(x)}
    if self.num_classes >= self.TOP5_FROM_CLASSES:
      out[f'{prefix}_top5_accuracy'] = totals[2] / len(x)
    return {k: float(v) for k, v in out.items()}


def peak_memory(devices) -> dict[str, float]:
  """Peak bytes in use per device, where the backend reports it (GPUs and TPUs; not the CPU)."""
  out = {}
  for d in devices:
    try:
      stats = d.memory_stats() or {}
    except Exception:  # some backends raise instead of returning None
      stats = {}
    if 'peak_bytes_in_use' in stats:
      out[f'peak_memory_gb_{d.platform}{d.id}'] = round(stats['peak_bytes_in_use'] / 2**30, 3)
  return out


class _StopSignal:
  """Turns SIGTERM (preemption) into a clean stop after the current step, with a checkpoint. Across
  processes, JAX's preemption service catches SIGTERM in whichever process receives it and the
  processes agree on the step at which all of them stop (``poll``), so none is left waiting on a
  transfer or collective from one that stopped."""

  def __init__(self, processes: bool = False):
    self.requested = False
    self._previous = None
    self._processes = processes

  def poll(self, step: int) -> None:
    """Call after every step with the number of steps done, in every process."""
    if self._processes and not self.requested:
      from jax.experimental import multihost_utils
      if multihost_utils.reached_preemption_sync_point(step):
        logging.warning('a process received SIGTERM: every process saves a checkpoint at step %d and stops', step)
        self.requested = True

  def __enter__(self):
    """Installed for the whole run and removed only after the last checkpoint is written, so any number
    of SIGTERMs (or Ctrl-Cs) saves once and stops once."""
    self._previous = {}
    for sig in (signal.SIGINT,) if self._processes else (signal.SIGTERM, signal.SIGINT):
      try:  # across processes JAX's preemption notifier has SIGTERM; a Python handler would take it away
        self._previous[sig] = signal.signal(sig, self._handler)
      except ValueError:  # not in the main thread (e.g. some notebook kernels): no handler
        pass
    return self

  def _handler(self, signum, frame):
    if not self.requested:
      logging.warning('%s received: saving a checkpoint and stopping after this step',
                      signal.Signals(signum).name)
    self.requested = True

  def __exit__(self, *exc):
    for sig, previous in self._previous.items():
      signal.signal(sig, previous)


def _epoch_clock_at(workdir: str, step: int) -> tuple[float, int]:
  """The training seconds and timed steps of the epoch that was under way at the checkpoint of ``step``, from
  the ``checkpoint`` record written with it, so that a resumed run's epoch time counts the steps trained
  before the stop; (0.0, 0) where there is none (a checkpoint at an evaluation, a record of an earlier
  version, a process that writes no metrics)."""
  clock = (0.0, 0)
  try:
    with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
      lines = f.readlines()
  except OSError:  # none here (a process other than the first, on another host)
    return clock
  for line in lines:
    try:
      r = json.loads(line)
      if r.get('kind') == 'checkpoint' and r.get('step') == step:
        clock = (float(r['epoch_time_s']), int(r['epoch_steps']))  # the last one: a step may be saved twice
    except (ValueError, KeyError, TypeError, AttributeError):  # a line cut short by a killed process
      continue
  return clock


def _finite(state) -> bool:
  """Whether every floating-point array of the state this process holds is finite, checked shard by shard
  on the host (a sharded array's mesh is not needed; on CPU the shards are read in place, elsewhere they are
  copied as the checkpoint that follows copies them). No device program: one would compile per array shape."""
  return all(np.isfinite(np.asarray(shard.data)).all() for x in jax.tree.leaves(state)
             if jnp.issubdtype(x.dtype, jnp.inexact) for shard in x.addressable_shards)


def transfer_address(d) -> str:
  """Where this process receives transfers (pipeline messages, ResIST's blocks) from other processes: ``d.transfer_address``, or this
  host's address on the route to the coordinator, port = the coordinator's + 1 + process id."""
  if d.transfer_address:
    return d.transfer_address
  host, port = d.coordinator.rsplit(':', 1)
  with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # no packet is sent: it only picks the route
    try:
      s.connect((host, int(port)))
      here = s.getsockname()[0]
    except OSError:
      here = socket.gethostbyname(socket.gethostname())
  return f'{here}:{int(port) + 1 + d.process_id}'


def start_processes(d, transfers: bool = False) -> None:
  """Joins a multi-process run (config.distributed) before JAX computes anything; on CPUs the
  collectives between processes go through gloo; pipeline stages in different processes send their
  messages, and ResIST its blocks, with JAX's cross-process transfers, which listen on ``transfer_address``."""
  if not d.coordinator or jax.distributed.is_initialized():
    return
  if jax.config.jax_platforms in (None, '', 'cpu'):
    jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  if transfers and (d.transfer_address or d.coordinator != 'auto'):  # with 'auto', only when given
    jax.config.update('jax_cross_host_transfer_socket_address', transfer_address(d))
  if d.coordinator == 'auto':
    jax.distributed.initialize()
  else:
    jax.distributed.initialize(d.coordinator, num_processes=d.num_processes, process_id=d.process_id)
  logging.info('process %d of %d; %d local devices, %d in all', jax.process_index(), jax.process_count(),
               jax.local_device_count(), jax.device_count())


def build_setup(config, dataset) -> Setup:
  model = build_model(config.model, dataset.num_classes,
                      scan_min=config.scan_blocks if METHODS[config.method].scans_blocks else 0,
                      dtype=config.compute_dtype)
  steps_per_epoch = len(dataset.x_train) // config.batch_size
  if dataset.streamed:  # crops and flips were made on the host as the JPEGs were decoded
    preprocess = Preprocess(tuple(dataset.mean), tuple(dataset.std), 0, False, False)
  else:
    preprocess = Preprocess(tuple(dataset.mean), tuple(dataset.std), config.data.crop_padding,
                            config.data.flip, config.data.augment)
  return Setup(config=config, model=model, preprocess=preprocess,
               optimizer=make_optimizer(config.optim),
               schedule=make_schedule(config.optim, steps_per_epoch),
               steps_per_epoch=steps_per_epoch, devices=jax.devices())


def train_and_evaluate(config, workdir: str) -> RunResult:
  """Trains ``config.method`` as configured, evaluating, logging and checkpointing into ``workdir``.

  Running again with the same workdir resumes from its latest checkpoint and, given the same
  config, ends exactly where an uninterrupted run ends.
  """
  config_lib.validate(config)
  use_cpu_devices(config.cpu_devices)
  start_processes(config.distributed, transfers=METHODS[config.method].transfers)
  with _StopSignal(jax.process_count() > 1) as stop:
    lock = open_workdir(config, workdir, jax.process_index() if jax.process_count() > 1 else None)
    try:
      return _train(config, workdir, stop)
    finally:
      lock.release()


def _train(config, workdir: str, stop: _StopSignal) -> RunResult:
  checkpointer = Checkpointer(os.path.join(workdir, 'checkpoints'), config.keep_checkpoints,
                              per_process=METHODS[config.method].pipelined)
  try:
    return _train_with(config, workdir, stop, checkpointer)
  finally:
    checkpointer.close()  # waits for the last save


def _train_with(config, workdir: str, stop: _StopSignal, checkpointer: Checkpointer) -> RunResult:
  dataset = load_dataset(config.data, config.dataset)
  if config.batch_size > len(dataset.x_train):
    config_lib.fail('batch_size', f'{config.batch_size} exceeds the {len(dataset.x_train)} training '
                     f'examples of {config.dataset}')
  setup = build_setup(config, dataset)
  spe = setup.steps_per_epoch
  total_steps = config.max_steps or config.num_epochs * spe
  order = TrainOrder(len(dataset.x_train), config.batch_size, config.seed)
  method = METHODS[config.method](setup)

  logging.info('%s on %s (%s, %d train / %d test images) with %s; %d steps of batch %d '
               '(%d per epoch); devices: %s', config.method, config.dataset, dataset.source,
               len(dataset.x_train), len(dataset.x_test), config.model, total_steps, config.batch_size,
               spe, ', '.join(str(d) for d in setup.devices))
  if dataset.streamed:
    logging.info('streaming %s: %d classes, %d-pixel crops decoded by %d processes, %d batches ahead; train %s, '
                 'test %s%s', config.dataset, dataset.num_classes, config.data.image_size,
                 config.data.workers or os.cpu_count() or 1, config.data.prefetch, dataset.x_train.files.where,
                 dataset.x_test.files.where, ''.join(f', {k} {v.files.where} ({len(v)} images)'
                                                     for k, v in dataset.extra_tests.items()))

  # initialisation needs a batch's shapes only: streamed images are not decoded for it
  sample = BlankImages(dataset.x_train) if dataset.streamed else dataset.x_train
  state = method.init(jax.random.key(config.seed), method.train_batch(sample, dataset.y_train, order, 0))
  restored = checkpointer.restore_latest(lambda step: method.state_at(state, step))
  if jax.process_index() == 0:  # only now: a refused resume leaves the workdir as it was
    write_config(config, workdir)
  start, carried = 0, (0.0, 0)
  if restored is not None:
    start, state = restored
    carried = _epoch_clock_at(workdir, start)
    logging.info('resumed from the checkpoint at step %d (epoch %.2f)%s', start, start / spe,
                 f'; the epoch under way had trained {carried[0]:.1f} s before the stop' if carried[1] else '')
  variables = method.eval_variables(state)
  logging.info('model %s: %d blocks, %.3fM parameters', config.model, len(setup.model.block_names),
               count_params(variables['params']) / 1e6)
  for line in method.describe(state):
    logging.info('%s', line)

  writer = MetricWriter(workdir, enabled=jax.process_index() == 0)
  evaluator = Evaluator(method.predict_fn(), setup.preprocess, min(config.eval_batch_size, len(dataset.x_test)),
                        jax.local_devices()[0],
                        exact_batches=method.eval_uses_batch_statistics, num_classes=dataset.num_classes)
  eval_every = config.eval_every_epochs * spe
  pending: list[dict] = []
  last_eval, step = None, start
  interval_start, interval_steps = time.perf_counter(), 0
  # The epoch's training clock: seconds from epoch_start, over epoch_steps timed steps (a run's first step,
  # compilation, is not timed). A resumed run starts it where its checkpoint left it (carried).
  epoch_start, epoch_steps = time.perf_counter(), 0
  run_start = time.perf_counter()

  def diverged(step: int, what: str):
    checkpointer.wait()
    steps = checkpointer.all_steps()
    raise DivergenceError(
        f'{what} at step {step}: training diverged. '
        + (f'The last finite checkpoint, step {steps[-1]}, is kept in {workdir}: lower optim.learning_rate (or '
           'add a warm-up) and resume from it with the same --workdir and --config.resume_changes=optim.learning_rate'
           ' (the fields you change), or use another --workdir'
           if steps else f'No checkpoint was written; lower optim.learning_rate or add a warm-up'))

  def flush_metrics(step: int) -> None:
    nonlocal interval_start, interval_steps, pending
    values = [m for m in jax.device_get(pending) if m]
    now = time.perf_counter()
    elapsed = now - interval_start
    rate = interval_steps * config.batch_size / elapsed if elapsed > 0 else 0.0
    if values:
      keys = dict.fromkeys(k for v in values for k in v)  # some only on some steps (a replica round's bytes)
      means = {k: float(np.mean([v[k] for v in values if k in v])) for k in keys}
      if not np.isfinite(means.get('train_loss', 0.0)):  # read here anyway: the hot loop never waits for it
        diverged(step, f"the training loss is {means['train_loss']}")
      eta = (total_steps - step) * elapsed / max(interval_steps, 1)
      if dataset.streamed and dataset.x_train.skipped:
        means['skipped_images'] = dataset.x_train.skipped  # damaged images replaced so far (this process)
      writer.write('train', step, epoch=round(step / spe, 4), images_per_sec=round(rate, 1), **means)
      logging.info('step %d/%d (epoch %.2f): loss %.4f, lr %.4g, %.0f images/s, ETA %s', step,
                   total_steps, step / spe, means.get('train_loss', float('nan')),
                   means.get('learning_rate', float('nan')), rate, format_duration(eta))
    pending, interval_start, interval_steps = [], now, 0

  def run_eval(step: int) -> dict:
    nonlocal epoch_start, epoch_steps
    flush_metrics(step)
    epoch_time = time.perf_counter() - epoch_start
    t = time.perf_counter()
    variables = method.eval_variables(state)
    result = evaluator(variables, dataset.x_test, dataset.y_test)
    for prefix, images in dataset.extra_tests.items():  # e.g. the ImageNet-V2 test sets
      result.update(evaluator(variables, images, None, prefix))
    record = writer.write('eval', step, epoch=round(step / spe, 4), **result,
                          epoch_time_s=round(epoch_time, 3), eval_time_s=round(time.perf_counter() - t, 3),
                          train_images_per_sec=round(epoch_steps * config.batch_size / max(epoch_time, 1e-9), 1))
    logging.info('epoch %.2f (step %d): test accuracy %.4f, test loss %.4f; %.1f s for the epoch',
                 step / spe, step, result['test_accuracy'], result['test_loss'], epoch_time)
    epoch_start, epoch_steps = time.perf_counter(), 0
    return record

  def log_profile(step: int, profile: dict) -> None:
    profile = {**profile, **peak_memory(setup.devices)}
    if profile:
      writer.write('profile', step, **profile)
      logging.info('profile at step %d: %s', step, ', '.join(f'{k} {v}' for k, v in profile.items()))

  diagnose_every = config.pipeline.diagnose_every_steps
  batch_of = lambda m: method.train_batch(dataset.x_train, dataset.y_train, order, m)
  # streamed data: the next batches are decoded while the devices train on this one
  next_batch = Prefetcher(batch_of, start, total_steps, config.data.prefetch) if dataset.streamed else batch_of

  if stop.requested:
    logging.warning('stopped during start-up, before training; run again with the same --workdir')
    writer.close()
    return RunResult(method, state, start, None, workdir, total_steps)
  try:
    for step in range(start, total_steps):
      batch = next_batch(step)
      if diagnose_every and step > start and step % diagnose_every == 0:
        t = time.perf_counter()
        figures = method.diagnose(state, batch_of, step)
        writer.write('diagnose', step, epoch=round(step / spe, 4), **figures)
        logging.info('diagnose at step %d: %s', step, ', '.join(f'{k} {v}' for k, v in figures.items()))
        paused = time.perf_counter() - t  # not training time
        interval_start, epoch_start = interval_start + paused, epoch_start + paused
      if config.profile_every_steps and (step + 1) % config.profile_every_steps == 0:
        state, metrics, profile = method.profiled_step(state, batch, step)
        log_profile(step + 1, profile)
      else:
        state, metrics = method.step(state, batch, step)
      pending.append(metrics)
      interval_steps += 1
      epoch_steps += 1
      if step == start:  # exclude compilation from the throughput figures
        jax.block_until_ready(state)
        logging.info('first step (compilation included) took %.1f s', time.perf_counter() - run_start)
        pending, interval_start, interval_steps = [], time.perf_counter(), 0
        epoch_start, epoch_steps = time.perf_counter() - carried[0], carried[1]
      done = step + 1
      stop.poll(done)
      if done % config.log_every_steps == 0:
        flush_metrics(done)
      if done % eval_every == 0 or done == total_steps:
        last_eval = run_eval(done)
      if (config.checkpoint_every_steps and done % config.checkpoint_every_steps == 0) \
          or done == total_steps or stop.requested:
        if not _finite(state):  # never a non-finite state as the latest checkpoint
          diverged(done, 'the parameters are not finite')
        checkpointer.save(done, state)
        if done % eval_every:  # mid-epoch: a run resumed from here goes on with this epoch's clock
          writer.write('checkpoint', done, epoch=round(done / spe, 4), epoch_time_s=round(
              time.perf_counter() - epoch_start, 3), epoch_steps=epoch_steps)
      step = done
      if stop.requested:
        logging.warning('stopped at step %d; run again with the same --workdir to resume', done)
        break
  finally:
    writer.close()
    if dataset.streamed:
      next_batch.close()
  checkpointer.wait()
  took = format_duration(time.perf_counter() - run_start)
  if step < total_steps:  # stopped (the warning above says how to resume): not finished
    logging.info('saved at step %d of %d after %s', step, total_steps, took)
  else:
    logging.info('finished at step %d in %s', step, took)
  return RunResult(method, state, step, last_eval, workdir, total_steps)
