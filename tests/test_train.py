"""The training loop: BP against a sequential reference, outputs, exact resume, damaged checkpoints."""
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from conftest import (assert_trees_close, assert_trees_equal, communicate_within, reference_objective, run_within, scaled_timeout, sgd_step,
                      timed_out, tiny_config)
from jaxdecouple.data import Preprocess, TrainOrder, load_dataset, preprocess_for, train_inputs
from jaxdecouple.errors import CheckpointError
from jaxdecouple.models import build_model
from jaxdecouple.train import train_and_evaluate
from jaxdecouple.writers import read_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def reference_bp(config, steps, tx=None):
  """Plain sequential BP written from the definition: same init, batches and augmentation keys. ``tx``: an
  optax transformation (its learning rate inside, constant) in place of the papers' SGD."""
  ds = load_dataset(config.data, config.dataset)
  model = build_model(config.model, ds.num_classes, anchors=ds.anchors)
  objective_of = reference_objective(ds)  # cross-entropy, or YOLO-v2's loss on a detection data set
  variables = model.init(jax.random.key(config.seed), jnp.zeros((1, *ds.image_shape)))
  params, stats = variables['params'], variables['batch_stats']
  momentum = tx.init(params) if tx else jax.tree.map(jnp.zeros_like, params)
  order = TrainOrder(len(ds.x_train), config.batch_size, config.seed)
  pre = preprocess_for(ds, config.data)  # crop 4, flip, normalised (text: the bytes as they are)
  spe = order.steps_per_epoch
  assert not tx or steps <= (config.optim.milestones or (float('inf'),))[0] * spe  # tx's rate: before a milestone
  forward = jax.jit(lambda p, s, x: model.apply({'params': p, 'batch_stats': s}, x, train=True))  # speed only
  for t in range(steps):
    idx = order.indices(t)
    x = train_inputs(jnp.asarray(ds.x_train[idx]), t, config.seed, pre)
    y = jnp.asarray(ds.y_train[idx])

    def loss(p):
      logits, new = forward(p, stats, x)
      return objective_of(logits, y), new
    grads, stats = jax.grad(loss, has_aux=True)(params)
    if tx:
      updates, momentum = tx.update(grads, momentum, params)
      params = optax.apply_updates(params, updates)
      continue
    lr = config.optim.learning_rate * (0.1 if t >= config.optim.milestones[0] * spe else 1.0)
    params, momentum = sgd_step(params, momentum, grads, lr)  # conftest: weight decay, momentum 0.9
  return {'params': params, 'batch_stats': stats}


def test_bp_matches_the_sequential_reference(workdir):
  config = tiny_config(**{'optim.learning_rate': 0.005})  # see conftest.assert_trees_close
  result = train_and_evaluate(config, workdir)
  assert result.step == 16
  assert_trees_close(result.variables, reference_bp(config, 16), tol=5e-4)
  # sharp: the reference at 1.2 times the rate is far (DP's, K = 1's and S = 1's checks lean on this one)
  with pytest.raises(AssertionError, match='max error'):
    assert_trees_close(result.variables, reference_bp(tiny_config(**{'optim.learning_rate': 0.006}), 16), tol=5e-4)


def test_bp_learns_and_writes_metrics(workdir, monkeypatch):
  # an earlier start that left no checkpoint (killed before its first), evaluated at a step this run never does:
  # its lines are set aside, not mixed into this run's
  os.makedirs(workdir, exist_ok=True)
  stale = json.dumps({'kind': 'eval', 'step': 12, 'epoch': 1.5, 'test_accuracy': 0.0, 'test_loss': 9.0}) + '\n'
  with open(os.path.join(workdir, 'metrics.jsonl'), 'w') as f:
    f.write(stale)
  train_and_evaluate(tiny_config(), workdir)
  assert open(os.path.join(workdir, 'metrics.before-restart-1.jsonl')).read() == stale
  records = read_metrics(workdir)
  train = [r for r in records if r['kind'] == 'train']
  evals = [r for r in records if r['kind'] == 'eval']
  assert [r['step'] for r in evals] == [8, 16]
  for r in evals:
    assert {'step', 'epoch', 'test_accuracy', 'test_loss', 'epoch_time_s'} <= set(r)
    assert 0 <= r['test_accuracy'] <= 1
  for r in train:
    assert {'step', 'train_loss', 'learning_rate', 'images_per_sec', 'epoch'} <= set(r)
  assert train[-1]['learning_rate'] == pytest.approx(0.01)
  assert evals[-1]['test_accuracy'] > 0.3  # synthetic classes are easy: it learned something
  # called again on the finished run (stopped after its last checkpoint, before a study kept its figures): the
  # figures of the state it restores, the run's own last ones, and no line written again
  again = train_and_evaluate(tiny_config(), workdir)
  assert again.step == 16 and again.last_eval['step'] == 16
  assert {k: again.last_eval[k] for k in ('test_accuracy', 'test_loss')} == pytest.approx(
      {k: evals[-1][k] for k in ('test_accuracy', 'test_loss')}, rel=1e-5)
  assert [r for r in read_metrics(workdir) if r['kind'] == 'eval'] == evals
  # its end lowered below the checkpoint: refused before anything is written (a run trained on the old schedule
  # past the new end would be recorded as this config's)
  with pytest.raises(CheckpointError, match="at step 16, past this run's last step 8 .num_epochs or max_steps"):
    train_and_evaluate(tiny_config(max_steps=8), workdir)
  assert json.load(open(os.path.join(workdir, 'config.json')))['max_steps'] == 0
  # a restore that runs out of memory is the machine's trouble: one line, and the checkpoint is not moved aside
  from jaxdecouple import checkpoint

  def no_memory(*args):
    raise MemoryError()
  monkeypatch.setattr(checkpoint, 'unpack', no_memory)
  with pytest.raises(CheckpointError, match='at step 16 .* ran out of memory .MemoryError: no message.; it is kept'):
    train_and_evaluate(tiny_config(), workdir)
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == ['16', 'checksums']


def test_same_config_same_run(workdir, tmp_path):
  a = train_and_evaluate(tiny_config(max_steps=5), workdir)
  b = train_and_evaluate(tiny_config(max_steps=5), str(tmp_path / 'other'))
  assert_trees_equal(a.variables, b.variables)


KILLED_RUN = textwrap.dedent('''
    import sys, time
    sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
    from conftest import tiny_config
    from jaxdecouple.methods.bp import BP
    from jaxdecouple.train import train_and_evaluate
    original = BP.step
    def slow_step(self, state, batch, step):
      time.sleep(0.15)  # slow enough for the parent to kill it mid-run
      return original(self, state, batch, step)
    BP.step = slow_step
    train_and_evaluate(tiny_config(checkpoint_every_steps=4), {workdir!r})
''')


def test_killed_run_resumes_exactly(workdir, tmp_path):
  script = tmp_path / 'run.py'
  script.write_text(KILLED_RUN.format(root=ROOT, tests=os.path.join(ROOT, 'tests'), workdir=workdir))
  proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  ckpt = os.path.join(workdir, 'checkpoints')
  deadline = time.time() + 120
  while time.time() < deadline and not (os.path.isdir(ckpt) and '8' in os.listdir(ckpt)):
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  steps = sorted(int(d) for d in os.listdir(ckpt) if d.isdigit())
  assert steps and max(steps) < 16, f'the run was not killed mid-way: {steps}'
  resumed = train_and_evaluate(tiny_config(checkpoint_every_steps=4), workdir)
  whole = train_and_evaluate(tiny_config(checkpoint_every_steps=4), str(tmp_path / 'whole'))
  assert resumed.step == whole.step == 16
  assert_trees_equal(resumed.state, whole.state)


class Crash(Exception):
  pass


def test_a_resumed_epoch_counts_the_training_before_the_stop(workdir, monkeypatch):
  """Accuracy against wall-clock sums the epochs' training times (epoch_time_s). An epoch cut by a crash and
  resumed counts the steps it trained before the crash, from the record written with the checkpoint, and
  neither the time between the runs nor the resumed run's first step (compilation). Each step sleeps a
  known time, so the bounds hold on any machine."""
  from jaxdecouple.methods.bp import BP
  original, pause = BP.step, 0.1

  def slow(crash_at):
    def step(self, state, batch, step):
      if step == crash_at:
        raise Crash()
      time.sleep(pause)
      return original(self, state, batch, step)
    return step
  monkeypatch.setattr(BP, 'step', slow(crash_at=5))
  with pytest.raises(Crash):
    train_and_evaluate(tiny_config(checkpoint_every_steps=4), workdir)
  saved = [r for r in read_metrics(workdir) if r['kind'] == 'checkpoint']
  assert [(r['step'], r['epoch_steps']) for r in saved] == [(4, 3)]  # steps 1-3 timed; step 0 compiles
  assert saved[0]['epoch_time_s'] >= 3 * pause
  time.sleep(1.0)  # between the runs: not training time
  monkeypatch.setattr(BP, 'step', slow(crash_at=None))
  began = time.perf_counter()
  train_and_evaluate(tiny_config(checkpoint_every_steps=4), workdir)
  resumed = time.perf_counter() - began
  epoch = next(r for r in read_metrics(workdir) if r['kind'] == 'eval' and r['step'] == 8)
  before = saved[0]['epoch_time_s']
  assert before + 3 * pause <= epoch['epoch_time_s'] < before + resumed  # steps 5-7 after the resume
  batch = tiny_config().batch_size
  assert epoch['train_images_per_sec'] == pytest.approx(6 * batch / epoch['epoch_time_s'], rel=0.01)  # 6 timed steps
  fresh = next(r for r in read_metrics(workdir) if r['kind'] == 'eval' and r['step'] == 16)
  assert fresh['epoch_time_s'] >= 8 * pause  # the next epoch: all 8 steps, nothing carried into it
  assert [r['step'] for r in read_metrics(workdir) if r['kind'] == 'checkpoint'] == [4, 12]


# orbax's reader threads finish after the failed restore and complain that their event loop closed.
@pytest.mark.filterwarnings('ignore::pytest.PytestUnraisableExceptionWarning')
@pytest.mark.parametrize('damage', ['truncated', 'corrupted'])
def test_damaged_latest_checkpoint_falls_back_to_the_previous(damage, workdir, tmp_path, caplog):
  """Truncated files fail to restore; a few garbage bytes in the biggest data file restore without an
  error (orbax does not verify content), and only the checksums written with the step catch them."""
  first = train_and_evaluate(tiny_config(max_steps=12, checkpoint_every_steps=4), workdir)  # at 8 and 12 kept
  latest = os.path.join(workdir, 'checkpoints', '12')
  chunks = [os.path.join(d, f) for d, _, files in os.walk(latest) for f in files if d.endswith('/d')]
  if damage == 'truncated':
    for path in chunks:  # the array data chunks
      with open(path, 'wb') as fh:
        fh.write(b'\0' * 7)
  else:
    biggest = max(chunks, key=os.path.getsize)
    with open(biggest, 'r+b') as fh:
      fh.seek(os.path.getsize(biggest) // 2)
      fh.write(b'\xff\x7f\xc0\x7f garbage')
  resumed = train_and_evaluate(tiny_config(checkpoint_every_steps=4), workdir)
  # (the checkpointer's own lines: orbax's abandoned reader futures of an earlier test may log 'damaged' paths too)
  warnings = [r.getMessage() for r in caplog.records if r.getMessage().startswith('checkpoint at step')]
  assert warnings and (damage == 'truncated' or 'differs from its checksums' in warnings[0]), warnings
  assert os.path.isdir(latest + '.damaged') and os.path.isdir(latest)  # kept aside, then rewritten
  if damage == 'truncated':  # the resumed run's numbers: checked once, below, where only checksums can tell
    return
  whole = train_and_evaluate(tiny_config(checkpoint_every_steps=4), str(tmp_path / 'whole'))
  assert_trees_equal(resumed.state, whole.state)
  del first


def test_checkpoints_of_the_other_layout_are_refused_before_anything_is_written(tmp_path, monkeypatch):
  """A pipeline over processes keeps checkpoints/process_P/STEP.npz, every other run checkpoints/STEP/: either
  finding the other's would start again from step 0 beside checkpoints it cannot read. (The one-process side
  through main.py: test_bad_inputs.py.)"""
  from jaxdecouple.checkpoint import Checkpointer
  per_process = tmp_path / 'a' / 'checkpoints'
  for i in range(2):
    os.makedirs(per_process / f'process_{i}')
    np.savez(per_process / f'process_{i}' / '4.npz', np.zeros(3))
  with pytest.raises(CheckpointError, match=r'written per process \(process_0, process_1: a pipeline over 2 processes\)'):
    Checkpointer(str(per_process), keep=2)
  one_folder = tmp_path / 'b' / 'checkpoints'
  os.makedirs(one_folder / '4')
  monkeypatch.setattr(jax, 'process_count', lambda: 2)  # as a pipeline over 2 processes sees it, before any exchange
  with pytest.raises(CheckpointError, match=r'\(steps 4\) were written into one folder .* a pipeline over 2 processes'):
    Checkpointer(str(one_folder), keep=2, per_process=True)
  assert sorted(os.listdir(one_folder)) == ['4']  # nothing written


def test_a_damaged_checkpoint_that_cannot_be_moved_aside_stops_with_one_line(tmp_path, monkeypatch):
  """Moving a damaged step aside is what lets the next run write it again: where the rename fails, the run stops
  with one line (over processes, only after every process has met, so that none is left waiting)."""
  from jaxdecouple.checkpoint import Checkpointer
  ckpt = Checkpointer(str(tmp_path / 'checkpoints'), keep=2)
  ckpt.save(2, {'w': jnp.arange(4.0)})
  ckpt.close()
  with open(tmp_path / 'checkpoints' / 'checksums' / '2.json', 'w') as f:
    f.write('[0]')  # the arrays no longer match their checksums: damaged
  def refuse(*_):
    raise PermissionError(13, 'Permission denied', str(tmp_path / 'checkpoints' / '2'))
  monkeypatch.setattr(os, 'rename', refuse)
  with pytest.raises(CheckpointError, match=r'at step 2 .* could not be moved aside \(Permission denied: '):
    Checkpointer(str(tmp_path / 'checkpoints'), keep=2).restore_latest({'w': jnp.zeros(4)})


def test_checkpoint_of_another_config_is_refused(workdir):
  train_and_evaluate(tiny_config(max_steps=4), workdir)
  with pytest.raises(CheckpointError, match='another config: model "resnet8" -> "resnet14"'):
    train_and_evaluate(tiny_config(model='resnet14'), workdir)
  os.remove(os.path.join(workdir, 'config.json'))  # a workdir of an earlier version: the arrays still differ
  with pytest.raises(CheckpointError, match=r'different config, or by a version of jaxdecouple that keeps another '
                     r'state for it \(its state has 60 arrays, this config makes 108'):
    train_and_evaluate(tiny_config(model='resnet14'), workdir)
  with pytest.raises(CheckpointError, match=r'another state for it \(\d of its 60 arrays have other shapes, the first '
                     r'\(array \d+\) \(10,\) where this config makes \(100,\)'):
    train_and_evaluate(tiny_config(dataset='cifar100'), workdir)


def test_tensorboard_events_when_a_writer_library_is_installed(workdir, monkeypatch):
  scalars = []

  class SummaryWriter:
    def __init__(self, logdir):
      self.logdir = logdir

    def add_scalar(self, tag, value, step):
      scalars.append((tag, value, step))

    def flush(self):
      pass

    def close(self):
      pass
  monkeypatch.setitem(sys.modules, 'tensorboardX', types.SimpleNamespace(SummaryWriter=SummaryWriter))
  train_and_evaluate(tiny_config(max_steps=8), workdir)
  tags = {t for t, _, _ in scalars}
  assert {'train/train_loss', 'eval/test_accuracy', 'train/images_per_sec'} <= tags
  assert ('eval/test_accuracy', 8) in {(t, s) for t, _, s in scalars}


@pytest.mark.parametrize('method, keep', [('bp', 'vjp'), ('fdg', 'recompute'), ('ddg', 'recompute'), ('dgl', 'vjp')])
def test_split_and_fused_backward_agree(method, keep, workdir, tmp_path):
  """The CPU default (forward and backward as two compiled calls) is the same step as the GPUs' one
  call: for BP, the pipeline's last stage, a recomputed forward in a stage's backward (FDG's fused
  backward-and-forward, the forward-locked DDG's backward) and DGL's local step."""
  kw = {'method': method, 'max_steps': 6, 'pipeline.num_stages': 2, 'optim.learning_rate': 0.005,
        'pipeline.keep': keep}
  split = train_and_evaluate(tiny_config(split_backward='on', **kw), workdir)
  fused = train_and_evaluate(tiny_config(split_backward='off', **kw), str(tmp_path / 'fused'))
  assert_trees_close(split.variables, fused.variables, tol=1e-4)


def test_sigterm_saves_a_checkpoint_and_resumes_exactly(workdir, tmp_path, signals=3):
  """Preemption: SIGTERM stops after the current step with a checkpoint and exit status 0; three SIGTERMs
  50 ms apart save once and stop once (the handler stays until the checkpoint is written), as one does."""
  script = tmp_path / 'run.py'
  script.write_text(KILLED_RUN.format(root=ROOT, tests=os.path.join(ROOT, 'tests'), workdir=workdir)
                    .replace('checkpoint_every_steps=4', 'checkpoint_every_steps=0')
                    .replace('import sys, time', 'import sys, time\nfrom absl import logging; logging.set_verbosity("info")'))
  proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
  metrics = os.path.join(workdir, 'metrics.jsonl')
  start = time.time()
  while not (os.path.exists(metrics) and '"step": 4' in open(metrics).read()):
    if time.time() > start + scaled_timeout(120):
      proc.kill()
      timed_out(120, time.time() - start, 'waiting for the run to log step 4', proc.communicate()[1])
    time.sleep(0.05)
  for i in range(signals):
    time.sleep(0.05 if i else 0)
    proc.send_signal(signal.SIGTERM)
  _, stderr = communicate_within(proc, 120, 'waiting for the run to stop after SIGTERM')
  assert proc.returncode == 0, stderr[-2000:]
  steps = sorted(int(d) for d in os.listdir(os.path.join(workdir, 'checkpoints')) if d.isdigit())
  assert len(steps) == 1 and 4 <= steps[0] < 16 and 'SIGTERM' in stderr
  assert f'saved at step {steps[0]} of 16' in stderr and 'finished at step' not in stderr  # stopped, not done
  resumed = train_and_evaluate(tiny_config(checkpoint_every_steps=0), workdir)
  whole = train_and_evaluate(tiny_config(checkpoint_every_steps=0), str(tmp_path / 'whole'))
  assert_trees_equal(resumed.state, whole.state)


def test_peak_memory_is_reported_where_the_backend_has_it():
  from jaxdecouple.memory import peak_memory

  class Device:
    def __init__(self, id, stats):
      self.platform, self.id, self._stats = 'gpu', id, stats

    def memory_stats(self):
      return self._stats
  out = peak_memory([Device(0, {'peak_bytes_in_use': 3 * 2**30}), Device(1, None)] + jax.devices()[:1])
  assert out == {'peak_memory_gb_gpu0': 3.0}  # no stats (None, or the CPU): nothing reported


def test_batch_statistics_evaluation_mixes_classes_in_every_batch():
  """A predictor that centres each batch, as BatchNorm with batch statistics does, is right only when a
  batch mixes the classes: on a test set stored by class (the CIFAR-10 JPEG copy) it must still be."""
  import numpy as np
  from jaxdecouple.evaluate import Evaluator
  x = np.repeat(np.array([50, 200], np.uint8), 500).reshape(1000, 1, 1, 1)  # class 0, then class 1
  y = np.repeat(np.array([0, 1], np.int32), 500)

  def predict(_, images):
    centred = (images - images.mean()).reshape(len(images), 1)
    return jnp.concatenate([-centred, centred], axis=1)
  pre = Preprocess((0.0,), (1.0,), 0, False, False)
  assert Evaluator(predict, pre, 100, jax.devices()[0], exact_batches=True)({}, x, y)['test_accuracy'] > 0.95
  # What it measured before: every batch of one class, centred to zero, predicted as class 0.
  assert Evaluator(predict, pre, 100, jax.devices()[0])({}, x, y)['test_accuracy'] == 0.5


def test_evaluators_of_equal_networks_share_one_program_and_evaluate_alike():
  """A method's predictor is a value (models.core.Predict): two runs of one network in a process (a study's, a
  test suite's) evaluate with the program the first one built, and a different network or mode builds its own."""
  import numpy as np
  from jaxdecouple import evaluate
  from jaxdecouple.models import build_model
  a, b = build_model('resnet8', 10), build_model('resnet8', 10)
  assert a.predict() == b.predict() and hash(a.predict()) == hash(b.predict()) and a.predict() != a.predict(True)
  x = np.random.default_rng(0).integers(0, 256, (8, 32, 32, 3), np.uint8)
  y = np.arange(8, dtype=np.int32) % 10
  variables = jax.jit(a.init)(jax.random.key(0), jnp.zeros((1, 32, 32, 3)))
  pre = Preprocess((0.5,) * 3, (0.25,) * 3, 0, False, False)
  before = evaluate._sums._cache_size()
  first = evaluate.Evaluator(a.predict(), pre, 8, jax.devices()[0])(variables, x, y)
  second = evaluate.Evaluator(b.predict(), pre, 8, jax.devices()[0])(variables, x, y)
  assert evaluate._sums._cache_size() == before + 1 and first == second
  # the same as the model's own forward, in evaluation mode
  logits = np.asarray(a.apply(variables, (x / 255.0 - 0.5) / 0.25, train=False)[0], np.float64)
  expected = np.mean(-(logits - np.log(np.exp(logits).sum(1, keepdims=True)))[np.arange(8), y])
  assert abs(first['test_loss'] - expected) < 1e-5 and first['test_accuracy'] == np.mean(logits.argmax(1) == y)
  evaluate.Evaluator(a.predict(True), pre, 8, jax.devices()[0])(variables, x, y)
  assert evaluate._sums._cache_size() == before + 2  # batch statistics: another program


@pytest.mark.parametrize('method', ['bp', 'fdg'])
def test_divergence_stops_the_run_and_keeps_the_last_finite_checkpoint(method, workdir):
  """A learning rate of 1e6: the run stops with one error naming the step, never saves a non-finite state,
  and the checkpoint it names restores finite."""
  from jaxdecouple.errors import DivergenceError
  kw = {'method': method, 'max_steps': 20, 'checkpoint_every_steps': 1, 'keep_checkpoints': 2,
        'log_every_steps': 2, 'pipeline.num_stages': 2}
  with pytest.raises(DivergenceError, match=r'at step \d+: training diverged. The last finite checkpoint, step (\d+)') as e:
    train_and_evaluate(tiny_config(**kw, **{'optim.learning_rate': 1e6}), workdir)
  kept = int(re.search(r'checkpoint, step (\d+)', str(e.value)).group(1))
  steps = sorted(int(d) for d in os.listdir(os.path.join(workdir, 'checkpoints')) if d.isdigit())
  assert steps and steps[-1] == kept
  with pytest.raises(CheckpointError, match='resume_changes=optim.learning_rate'):  # a lower rate: said on purpose
    train_and_evaluate(tiny_config(**{**kw, 'max_steps': kept}), workdir)
  resumed = train_and_evaluate(tiny_config(**{**kw, 'max_steps': kept, 'resume_changes': 'optim.learning_rate'}),
                               workdir)  # nothing left to train
  assert resumed.step == kept
  assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(resumed.variables))


def test_a_stale_lock_of_a_killed_run_is_taken_over(workdir, caplog):
  """A run killed with -9 leaves its name in WORKDIR/lock but not the lock (the kernel drops it): the next
  run takes it over with a warning naming the dead holder, and an ended run leaves it empty."""
  os.makedirs(workdir)
  subprocess.run([sys.executable, '-c', 'import os, sys; sys.path.insert(0, sys.argv[1]); '
                  'from jaxdecouple.workdir import WorkdirLock; WorkdirLock(sys.argv[2]).acquire(); os._exit(9)',
                  ROOT, workdir], check=False)  # noqa: E501
  with open(os.path.join(workdir, 'lock')) as f:
    holder = f.read().strip()
  assert holder.startswith('host ')
  train_and_evaluate(tiny_config(max_steps=2), workdir)
  assert any('took over' in r.getMessage() and holder in r.getMessage() for r in caplog.records)
  assert os.path.getsize(os.path.join(workdir, 'lock')) == 0


def test_no_space_for_a_checkpoint_stops_with_one_error_and_keeps_the_earlier_ones(workdir, monkeypatch):
  """The free space is checked before each save: a full disk stops the run with one line instead of a
  failed write, and the run resumes from its last checkpoint once there is space."""
  import collections
  import jaxdecouple.checkpoint as checkpoint
  usage, real = collections.namedtuple('usage', 'total used free'), checkpoint.shutil.disk_usage
  free = {'bytes': 10**12}
  monkeypatch.setattr(checkpoint.shutil, 'disk_usage', lambda p: usage(free['bytes'], 0, free['bytes']))
  original_save = checkpoint.Checkpointer.save

  def save(self, step, state):
    if step == 8:
      free['bytes'] = 2**20  # the disk fills between the checkpoints at 4 and 8
    return original_save(self, step, state)
  monkeypatch.setattr(checkpoint.Checkpointer, 'save', save)
  with pytest.raises(CheckpointError, match=r'not enough disk space for the checkpoint at step 8 .* 1 MiB free, '
                                            r'about \d+ MiB needed.*resume from step 4'):
    train_and_evaluate(tiny_config(checkpoint_every_steps=4), workdir)
  monkeypatch.setattr(checkpoint.shutil, 'disk_usage', real)
  assert train_and_evaluate(tiny_config(checkpoint_every_steps=4), workdir).step == 16


def test_a_failed_checkpoint_write_exits_promptly_with_one_line(workdir):
  """A write that fails (here: files limited to 1 MiB, as a full quota would) exits with status 2 and one
  error line naming the step, within seconds, instead of hanging on orbax's waiting threads."""
  run = (
      'import resource, runpy, signal, sys\n'
      'signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n'
      'resource.setrlimit(resource.RLIMIT_FSIZE, (2**20, 2**20))\n'
      'sys.argv = ["main.py"] + sys.argv[1:]\n'
      'runpy.run_path("main.py", run_name="__main__")\n')
  proc = run_within([sys.executable, '-c', run, '--config=configs/quickstart.py', '--config.data.source=synthetic',
                     '--config.batch_size=32', '--config.max_steps=4', '--config.checkpoint_every_steps=2',
                     '--config.cpu_devices=0', f'--workdir={workdir}'], 240, 'main.py with a full disk', cwd=ROOT,
                    capture_output=True, text=True)
  errors = [line for line in proc.stderr.splitlines() if line.startswith('error:')]
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert len(errors) == 1 and 'writing the checkpoint at step 2' in errors[0] and 'File too large' in errors[0]
  assert 'Traceback' not in proc.stderr, proc.stderr[-3000:]


def test_a_failed_write_names_the_os_reason_however_long_the_path(tmp_path):
  """The OS's reason stays in the one line when the failing file's path is long (Python's own text puts the
  path last, and the line keeps the end of a long text: a deep workdir once left 'File too large' out)."""
  from jaxdecouple.checkpoint import Checkpointer
  ckpt = Checkpointer(str(tmp_path / 'checkpoints'), keep=2)
  deep = str(tmp_path / ('d' * 200) / 'ocdbt.process_0' / 'd' / '1e25ed22b2970875a0e614da5d6d6216')
  with pytest.raises(CheckpointError, match=r'at step 2 .* failed \(OSError: File too large: \.\.\..*/d/1e25ed22'):
    with ckpt._writing(2):
      raise ValueError('what orbax wraps it in') from OSError(27, 'File too large', deep)
  ts = f'Error writing "{deep}": Failed to write 7450624 bytes to file 16: File too large [os_error_code=\'27\'] ' + 'x' * 200
  with pytest.raises(CheckpointError, match=r'at step 4 .* failed \(ValueError: File too large \(os_error_code 27\)\)'):
    with ckpt._writing(4):
      raise ValueError(ts)  # tensorstore's text, its reason in the middle


def test_bfloat16_compute_trains_like_float32(workdir, tmp_path):
  """compute_dtype='bfloat16': the convolutions see bfloat16 and the logits come out float32; parameters,
  optimizer state and BatchNorm statistics stay float32 (the messages between pipeline stages are bfloat16).
  Over 16 steps of BP the training loss stays within 0.15 of float32's (bfloat16 keeps 8 bits of mantissa:
  the runs drift apart step by step, but learn alike)."""
  model = build_model('resnet8', 10, dtype='bfloat16')
  x = jnp.zeros((2, 32, 32, 3))
  variables = model.init(jax.random.key(0), x)
  assert all(v.dtype == jnp.float32 for v in jax.tree.leaves(variables))
  logits, stats = model.apply(variables, x, train=True)
  assert logits.dtype == jnp.float32 and all(s.dtype == jnp.float32 for s in jax.tree.leaves(stats))
  program = jax.make_jaxpr(lambda v: model.apply(v, x, train=False))(variables)
  convs = [e for e in program.jaxpr.eqns if e.primitive.name == 'conv_general_dilated']
  assert convs and all(e.invars[0].aval.dtype == jnp.bfloat16 for e in convs)

  kw = {'max_steps': 16, 'log_every_steps': 4, 'optim.milestones': ()}
  runs = {dtype: train_and_evaluate(tiny_config(compute_dtype=dtype, **kw), str(tmp_path / dtype))
          for dtype in ('float32', 'bfloat16')}
  losses = {dtype: [m['train_loss'] for m in read_metrics(r.workdir) if m['kind'] == 'train']
            for dtype, r in runs.items()}
  assert all(v.dtype == jnp.float32 for v in jax.tree.leaves(runs['bfloat16'].state))
  assert losses['float32'][-1] < losses['float32'][0]  # it learns at all
  assert max(abs(a - b) for a, b in zip(losses['float32'], losses['bfloat16'])) < 0.15, losses
  # FDG K = 2: the activations stage 1 receives and the gradient stage 0 receives are bfloat16 messages
  fdg = train_and_evaluate(tiny_config(method='fdg', compute_dtype='bfloat16', max_steps=1,
                                       **{'pipeline.num_stages': 2}), str(tmp_path / 'fdg'))
  (x, _), (grad,) = fdg.state.stages[1].inbox, fdg.state.stages[0].grad_inbox
  assert x.dtype == grad.dtype == jnp.bfloat16


def test_library_logs_are_quiet_wherever_the_environment_lives():
  """The console keeps this package's INFO lines and drops other libraries' (orbax logs every file it writes),
  told apart by where the file lies: a library in a virtual environment under a folder named jaxdecouple is
  still a library (its INFO lines once passed as ours, found by .ci/lower_bounds, whose venv is so named), and
  only the checkout's main.py counts as ours, not another package's."""
  import logging
  from jaxdecouple import writers
  record = lambda path, level=logging.INFO: logging.LogRecord('absl', level, path, 1, 'm', None, None)
  quiet = writers._QuietLibraries()
  assert quiet.filter(record(os.path.join(os.path.dirname(writers.__file__), 'train.py')))
  assert quiet.filter(record(os.path.join(ROOT, 'main.py')))
  site = os.path.join(os.sep, 'home', 'u', 'jaxdecouple', '.venv', 'lib', 'python3.11', 'site-packages')
  orbax = os.path.join(site, 'orbax', 'checkpoint', 'checkpoint_manager.py')
  assert not quiet.filter(record(orbax))
  assert not quiet.filter(record(os.path.join(site, 'tensorflow_datasets', 'scripts', 'cli', 'main.py')))
  assert quiet.filter(record(os.path.join(site, 'optax', 'x.py'), logging.WARNING))  # everyone's warnings
  assert not quiet.filter(record(orbax, logging.ERROR))  # orbax's errors: reported once, by checkpoint.py
