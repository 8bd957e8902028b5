"""Bad input, as a new user would give it: every case stops ``python main.py`` with exit status 2 and exactly
one ``error:`` line naming the field, flag or file, no traceback, and no training started (no "first step"
line, no checkpoint or metrics written, and a workdir that had checkpoints left exactly as it was).

The cases run through tests/bad_input_driver.py: main.py imported once, each case in a forked child, as
``python main.py ARGS`` would run it. A table per kind of input (command line, config values, data, workdir,
checkpoints); each test reports every case that misbehaved, not only the first.
"""
import json
import os
import shutil
import sys
import zipfile

import numpy as np
import pytest

from conftest import FAST_COMPILE_XLA_FLAGS, popen_with_ctrl_c, run_within, scaled_timeout, timed_out_message

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASE_TIMEOUT_S = 120  # a case that runs longer hangs (on an unloaded machine; scaled for this one)
# A config that would train in seconds on synthetic data, were nothing wrong.
Q = ['--config=configs/quickstart.py', '--config.data.source=synthetic', '--config.batch_size=32',
     '--config.max_steps=2', '--config.cpu_devices=0']


def run_cases(tmp_path, cases):
  """{id: (rc, output)} for [(id, argv, ...)], run by the driver; argv without --workdir gets a fresh one."""
  table = []
  for case_id, argv, *_ in cases:
    if not any(a.startswith('--workdir') for a in argv) and any(a.startswith('--config=') for a in argv):
      argv = [*argv, f'--workdir={tmp_path / "w" / case_id}']
    table.append({'id': case_id, 'argv': argv, 'timeout': scaled_timeout(CASE_TIMEOUT_S)})
  with open(tmp_path / 'cases.json', 'w', encoding='utf-8') as f:
    json.dump(table, f)
  env = {**os.environ, 'JAX_NUM_CPU_DEVICES': '2', 'XLA_FLAGS': '--xla_force_host_platform_device_count=2 ' + FAST_COMPILE_XLA_FLAGS}
  run_within([sys.executable, os.path.join(ROOT, 'tests', 'bad_input_driver.py'), str(tmp_path / 'cases.json'),
              str(tmp_path / 'results.json')], 900, f'running {len(cases)} bad-input cases', check=True, env=env)
  with open(tmp_path / 'results.json', encoding='utf-8') as f:
    return json.load(f)


def snapshot(folder):
  """Every file under ``folder`` with its size and modification time (the lock file aside)."""
  out = {}
  for dirpath, _, files in os.walk(folder):
    for name in files:
      path = os.path.join(dirpath, name)
      if not name.startswith('lock'):
        out[os.path.relpath(path, folder)] = (os.path.getsize(path), os.stat(path).st_mtime_ns)
  return out


def check(tmp_path, cases, untouched=None):
  """Runs the cases; asserts each one's contract; ``untouched``: a folder no case may change."""
  before = snapshot(untouched) if untouched else None
  results = run_cases(tmp_path, cases)
  problems = []
  for case_id, argv, expected in cases:
    r = results[case_id]
    out, errors = r['output'], [line for line in r['output'].splitlines() if line.startswith('error:')]
    workdir = tmp_path / 'w' / case_id
    why = []
    if r['rc'] != 2:
      why.append(f'exit status {r["rc"]}' if r['rc'] is not None else
                 f'killed: a hang, or {timed_out_message(CASE_TIMEOUT_S, r["seconds"])}')
    if len(errors) != 1:
      why.append(f'{len(errors)} error lines')
    elif expected not in errors[0]:
      why.append(f'the error does not name {expected!r}')
    if 'Traceback' in out:
      why.append('a traceback')
    if 'first step' in out or (workdir / 'metrics.jsonl').exists() or (workdir / 'checkpoints' / '2').exists():
      why.append('training started')
    if why:
      problems.append(f'{case_id} ({" ".join(argv)}): {"; ".join(why)}\n    {out.strip()[-600:]}')
  if untouched:
    assert snapshot(untouched) == before, 'a refused case changed the workdir'
  assert not problems, f'{len(problems)} of {len(cases)} cases misbehaved:\n' + '\n'.join(problems)


def write(path, text):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(text)
  return str(path)


def test_bad_command_lines(tmp_path):
  d = tmp_path / 'configs'
  syntax = write(d / 'syntax.py', 'def get_config(:\n  pass\n')
  no_get = write(d / 'no_get.py', 'x = 1\n')
  raises = write(d / 'raises.py', 'def get_config():\n  raise RuntimeError("boom")\n')
  returns = write(d / 'returns.py', 'def get_config():\n  return 42\n')
  imports = write(d / 'imports.py', 'import not_a_module_anywhere\n')
  text = write(d / 'notes.txt', 'batch_size = 3\n')
  check(tmp_path, [
      ('no-config', ['--workdir=x'], '--config is required'),
      ('config-missing', ['--config=configs/nope.py'], 'configs/nope.py: no such file'),
      ('config-syntax', [f'--config={syntax}'], 'syntax error at line 1'),
      ('config-without-get-config', [f'--config={no_get}'], 'defines no get_config()'),
      ('config-get-config-raises', [f'--config={raises}'], 'get_config() raised RuntimeError: boom'),
      ('config-returns-no-config', [f'--config={returns}'], 'get_config() returned a int'),
      ('config-import-fails', [f'--config={imports}'], "No module named 'not_a_module_anywhere'"),
      ('config-not-python', [f'--config={text}'], 'not a Python config file'),
      ('config-folder', ['--config=configs'], 'configs'),
      ('stray-argument', ['train', *Q], 'unexpected argument train'),
      ('unknown-flag', [*Q, '--learning_rate=0.1'], "'learning_rate'"),
      ('unknown-field', [*Q, '--config.optim.lr=0.1'], 'config.optim.lr: unknown field'),
      ('override-of-a-group', [*Q, '--config.optim=3'], 'optim'),
      ('not-a-number', [*Q, '--config.batch_size=abc'], 'batch_size'),
      ('empty-workdir', [*Q, '--workdir='], '--workdir is empty'),
      ('blank-workdir', [*Q, '--workdir=  '], '--workdir is empty'),
  ])


def test_bad_config_values(tmp_path):
  d = tmp_path / 'configs'
  nan = write(d / 'nan_milestones.py', 'from configs.quickstart import get_config as q\n'
              'def get_config():\n  c = q()\n  c.optim.milestones = (1, float("nan"))\n  return c\n')
  huge = write(d / 'huge_milestones.py', 'from configs.quickstart import get_config as q\n'
               'def get_config():\n  c = q()\n  c.optim.milestones = (1e300,)\n  return c\n')
  nan_q = [f'--config={nan}', *Q[1:]]
  huge_q = [f'--config={huge}', *Q[1:]]
  a_file = write(d / 'a_file', 'not a folder\n')
  check(tmp_path, [
      ('method', [*Q, '--config.method=sgd'], 'config.method'),
      ('model', [*Q, '--config.model=resnet9'], 'config.model'),
      ('model-too-deep', [*Q, '--config.model=resnet600002'], 'at most 1000'),
      ('dataset', [*Q, '--config.dataset=mnist'], 'config.dataset'),
      ('batch-size-zero', [*Q, '--config.batch_size=0'], 'config.batch_size'),
      ('batch-size-negative', [*Q, '--config.batch_size=-8'], 'config.batch_size'),
      ('batch-size-beyond-data', [*Q, '--config.batch_size=100000'], 'config.batch_size'),
      ('epochs-zero', [*Q, '--config.num_epochs=0'], 'config.num_epochs'),
      ('learning-rate-negative', [*Q, '--config.optim.learning_rate=-1'], 'config.optim.learning_rate'),
      ('learning-rate-nan', [*Q, '--config.optim.learning_rate=nan'], 'config.optim.learning_rate'),
      ('momentum', [*Q, '--config.optim.momentum=1.5'], 'config.optim.momentum'),
      ('milestones-nan-in-file', nan_q, 'config.optim.milestones'),
      ('milestones-huge-in-file', huge_q, 'config.optim.milestones'),
      ('milestones-beyond-the-run', [*Q, '--config.optim.milestones=(2, 5)'], 'beyond num_epochs=3'),
      ('milestones-decreasing', [*Q, '--config.optim.milestones=(2, 1)'], 'config.optim.milestones'),
      ('warmup-huge', [*Q, '--config.optim.warmup=constant', '--config.optim.warmup_epochs=1e300'],
       'config.optim.warmup_epochs'),
      ('warmup-unknown', [*Q, '--config.optim.warmup=cosine'], 'config.optim.warmup'),
      ('seed-huge', [*Q, '--config.seed=100000000000000000000'], 'config.seed'),
      ('seed-negative', [*Q, '--config.seed=-1'], 'config.seed'),
      ('eval-batch-huge', [*Q, '--config.eval_batch_size=100000000'], 'config.eval_batch_size'),
      ('cpu-devices-huge', [*Q, '--config.cpu_devices=4096'], 'config.cpu_devices'),
      ('keep-no-checkpoints', [*Q, '--config.keep_checkpoints=0'], 'config.keep_checkpoints'),
      ('log-never', [*Q, '--config.log_every_steps=0'], 'config.log_every_steps'),
      ('stages-zero', [*Q, '--config.pipeline.num_stages=0'], 'config.pipeline.num_stages'),
      ('stages-more-than-blocks', [*Q, '--config.pipeline.num_stages=64'], 'config.pipeline.num_stages'),
      ('replica-devices-not-dividing', [*Q, '--config.method=resist', '--config.model=preact_tiny',
                                        '--config.replica.num_devices=3'], 'config.replica.num_devices'),
      ('replica-workers-beyond-blocks', [*Q, '--config.method=resist', '--config.model=preact_tiny',
                                         '--config.replica.num_workers=64'], 'config.replica.num_workers'),
      # issue 42: the outer optimizer and compressed updates
      ('outer-lr-out-of-range', [*Q, '--config.method=resist', '--config.model=preact_tiny',
                                 '--config.replica.outer_lr=0'], 'config.replica.outer_lr'),
      ('outer-momentum-out-of-range', [*Q, '--config.method=localsgd', '--config.model=preact_tiny',
                                       '--config.replica.outer_momentum=1.2'], 'config.replica.outer_momentum'),
      ('update-compression-without-rounds', [*Q, '--config.method=fdg', '--config.replica.compress=updates'],
       'config.replica.compress'),
      ('outer-step-on-compressed-weights', [*Q, '--config.method=resist', '--config.model=preact_tiny',
                                            '--config.replica.outer_lr=0.7', '--config.replica.quantize_bits=8'],
       'config.replica.compress'),
      ('coordinator', [*Q, '--config.distributed.coordinator=localhost'], 'config.distributed.coordinator'),
      ('npz-without-path', [*Q, '--config.data.source=npz'], 'config.data.path'),
      ('resume-changes-unknown', [*Q, '--config.resume_changes=optim.lr'], 'config.resume_changes'),
      ('compute-dtype', [*Q, '--config.compute_dtype=float16'], 'config.compute_dtype'),
      ('compilation-cache-unwritable', [*Q, f'--config.compilation_cache_dir={a_file}/xla'],
       'config.compilation_cache_dir'),
      ('vit-patch-not-dividing', [*Q, '--config.model=vit2_d32_p5', '--config.dataset=cifar10'], 'config.model'),
      ('gpt-sequence-beyond-positions', [*Q, '--config.model=gpt_tiny', '--config.dataset=fortunes',
                                         '--config.data.sequence_length=65'], 'config.data.sequence_length'),
      ('gpt-on-images', [*Q, '--config.model=gpt_tiny'], 'config.model'),
  ])


def test_bad_data(tmp_path):
  d = tmp_path / 'data'
  d.mkdir()
  text = write(d / 'notes.npz', 'not arrays\n')
  np.savez(d / 'keys.npz', images=np.zeros((4, 28, 28, 1), np.uint8))
  np.savez(d / 'shape.npz', x_train=np.zeros((8, 32, 32, 3), np.uint8), y_train=np.zeros(8, np.int64),
           x_test=np.zeros((4, 32, 32, 3), np.uint8), y_test=np.zeros(4, np.int64))
  np.savez(d / 'labels.npz', x_train=np.zeros((8, 28, 28, 1), np.uint8), y_train=np.full(8, 12),
           x_test=np.zeros((4, 28, 28, 1), np.uint8), y_test=np.zeros(4, np.int64))
  np.savez(d / 'floats.npz', x_train=np.zeros((8, 28, 28, 1), np.float32), y_train=np.zeros(8, np.int64),
           x_test=np.zeros((4, 28, 28, 1), np.float32), y_test=np.zeros(4, np.int64))
  np.savez(d / 'good.npz', x_train=np.zeros((64, 28, 28, 1), np.uint8), y_train=np.zeros(64, np.int64),
           x_test=np.zeros((16, 28, 28, 1), np.uint8), y_test=np.zeros(16, np.int64))
  with open(d / 'good.npz', 'rb') as f:
    (d / 'truncated.npz').write_bytes(f.read()[:3000])
  with zipfile.ZipFile(d / 'bad_member.npz', 'w') as z:
    z.writestr('x_train.npy', b'\x93NUMPY garbage')
  real = [a for a in Q if not a.startswith('--config.data.source')]  # Fashion-MNIST, as the quickstart reads it
  gpt = ['--config.model=gpt_tiny', '--config.dataset=text', '--config.data.sequence_length=32']  # a text file
  check(tmp_path, [
      ('path-missing', [*real, f'--config.data.path={d}/none.npz'], 'none.npz does not exist'),
      ('path-is-text', [*real, f'--config.data.path={text}'], 'notes.npz is not an .npz file'),
      ('path-is-folder', [*real, f'--config.data.path={d}'], 'is a folder'),
      ('path-lacks-arrays', [*real, f'--config.data.path={d}/keys.npz'], 'keys.npz lacks arrays'),
      ('path-wrong-shape', [*real, f'--config.data.path={d}/shape.npz'], 'shape.npz: x_train has shape'),
      ('path-labels-out-of-range', [*real, f'--config.data.path={d}/labels.npz'], 'labels.npz: y_train'),
      ('path-float-pixels', [*real, f'--config.data.path={d}/floats.npz'], 'floats.npz: x_train has dtype'),
      ('path-truncated', [*real, f'--config.data.path={d}/truncated.npz'], 'truncated.npz'),
      ('path-damaged-member', [*real, f'--config.data.path={d}/bad_member.npz'], 'bad_member.npz'),
      ('source-npz-path-missing', [*real, '--config.data.source=npz', f'--config.data.path={d}/none.npz'],
       'none.npz does not exist'),
      ('idx-folder-empty', [*real, '--config.data.source=idx', f'--config.data.idx_dir={d}'],
       'train-images-idx3-ubyte.gz not found'),
      ('text-missing', [*real, *gpt, f'--config.data.path={d}/none.txt'], 'none.txt does not exist'),
      ('text-too-short', [*real, *gpt, f'--config.data.path={text}'], 'too few for data.sequence_length=32'),
  ])


def test_bad_streamed_data(tmp_path):
  """dataset=imagenet: folders, sources and ImageNet-V2 sets that cannot serve, refused before compute."""
  from jaxdecouple.data import imagenet
  good = imagenet.write_fake_folder(str(tmp_path / 'good'), train_per_class=2, val_per_class=1, sizes=(20, 24))

  def variant(name, change):
    root = tmp_path / name
    shutil.copytree(good, root)
    change(root)
    return str(root)

  def flat(root):  # images straight in train/, no class folders
    for c in list((root / 'train').iterdir()):
      for f in c.iterdir():
        f.rename(root / 'train' / f.name)
      c.rmdir()

  flat_root = variant('flat', flat)
  png_root = variant('png', lambda r: (r / 'train' / 'n00000000' / 'x.png').write_bytes(b'\x89PNG'))
  extra_root = variant('extra', lambda r: shutil.copytree(r / 'val' / 'n00000000', r / 'val' / 'n12345678'))
  manual = tmp_path / 'manual'
  manual.mkdir()
  i = [a for a in Q if not a.startswith('--config.data.source')] + [
      '--config.dataset=imagenet', '--config.model=resnet8', '--config.data.image_size=16', '--config.batch_size=2']
  check(tmp_path, [
      ('imagenet-no-class-folders', [*i, f'--config.data.path={flat_root}'], 'has no class folders'),
      ('imagenet-not-jpeg', [*i, f'--config.data.path={png_root}'], 'x.png is not a JPEG file'),
      ('imagenet-classes-differ', [*i, f'--config.data.path={extra_root}'], 'n12345678'),
      ('imagenet-path-missing', [*i, f'--config.data.path={tmp_path}/none'], 'none does not exist'),
      ('imagenet-path-is-npz-source', [*i, '--config.data.source=npz', f'--config.data.path={good}'],
       'config.data.source'),
      ('folder-source-for-cifar10', [*Q[:1], '--config.data.source=folder', f'--config.data.path={good}'],
       'config.data.source'),
      ('imagenet-manual-dir-missing', [*i, '--config.data.source=tfds', f'--config.data.tfds_data_dir={tmp_path}/tfds',
                                       f'--config.data.tfds_manual_dir={tmp_path}/nowhere'], 'nowhere does not exist'),
      ('imagenet-manual-dir-empty', [*i, '--config.data.source=tfds', f'--config.data.tfds_data_dir={tmp_path}/tfds',
                                     f'--config.data.tfds_manual_dir={manual}'], 'lacks ILSVRC2012_img_train.tar'),
      ('imagenet-v2-unknown', [*i, f'--config.data.path={good}', '--config.data.imagenet_v2=matched'],
       'config.data.imagenet_v2'),
      ('imagenet-v2-dir-missing', [*i, f'--config.data.path={good}', '--config.data.imagenet_v2=topimages',
                                   f'--config.data.imagenet_v2_dir={tmp_path}/v2'], 'imagenetv2-top-images-format-val'),
      ('imagenet-v2-for-cifar10', [*Q, '--config.data.imagenet_v2=all'], 'config.data.imagenet_v2'),
  ])


def test_bad_workdirs(tmp_path):
  from jaxdecouple.workdir import WorkdirLock
  a_file = write(tmp_path / 'a_file', 'x')
  (tmp_path / 'ckfile').mkdir()
  write(tmp_path / 'ckfile' / 'checkpoints', 'x')
  busy = tmp_path / 'busy'
  busy.mkdir()
  lock = WorkdirLock(str(busy)).acquire()  # a run holds it: this (live) test process
  try:
    check(tmp_path, [
        ('workdir-is-a-file', [*Q, f'--workdir={a_file}'], 'a_file is a file, not a folder'),
        ('workdir-under-a-file', [*Q, f'--workdir={a_file}/run'], f'cannot write in the workdir {a_file}/run'),
        ('workdir-read-only', [*Q, '--workdir=/sys/jaxdecouple-run'], 'cannot write in the workdir /sys/'),
        ('checkpoints-is-a-file', [*Q, f'--workdir={tmp_path}/ckfile'], 'checkpoints is a file'),
        ('workdir-in-use', [*Q, f'--workdir={busy}'], f'is in use by another run (host {os.uname().nodename}, '
                                                      f'pid {os.getpid()}'),
    ])
  finally:
    lock.release()


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
  """A workdir with checkpoints at steps 2 and 4 (FDG, K = 2, synthetic data)."""
  workdir = tmp_path_factory.mktemp('trained') / 'run'
  env = {**os.environ, 'JAX_NUM_CPU_DEVICES': '2', 'XLA_FLAGS': '--xla_force_host_platform_device_count=2 ' + FAST_COMPILE_XLA_FLAGS}
  run_within([sys.executable, 'main.py', *Q[:-2], '--config.max_steps=4', '--config.checkpoint_every_steps=2',
              '--config.log_every_steps=2', f'--workdir={workdir}'], 300, 'training the workdir to resume', cwd=ROOT,
             env=env, check=True, capture_output=True)
  return workdir


def test_bad_checkpoints(tmp_path, trained):
  damaged = tmp_path / 'damaged'
  shutil.copytree(trained, damaged)
  for step in ('2', '4'):
    os.rename(damaged / 'checkpoints' / step, damaged / 'checkpoints' / f'{step}.damaged')
  old = tmp_path / 'old'  # a workdir of an earlier version: no config.json, so only the arrays are compared
  shutil.copytree(trained, old)
  os.remove(old / 'config.json')
  per_process = tmp_path / 'per_process'  # the layout of a pipeline over 2 processes, resumed in one process
  shutil.copytree(trained, per_process, ignore=shutil.ignore_patterns('checkpoints'))
  for i in range(2):
    os.makedirs(per_process / 'checkpoints' / f'process_{i}')
    np.savez(per_process / 'checkpoints' / f'process_{i}' / '4.npz', np.zeros(3))
  on = [*Q[:-2], '--config.max_steps=6', f'--workdir={trained}']
  check(tmp_path, [
      ('resume-other-model', [*on, '--config.model=resnet14'], 'model "resnet8" -> "resnet14"'),
      ('resume-other-method', [*on, '--config.method=ddg'], 'method "fdg" -> "ddg"'),
      ('resume-other-learning-rate', [*on, '--config.optim.learning_rate=0.5'], 'optim.learning_rate 0.1 -> 0.5'),
      ('resume-other-seed', [*on, '--config.seed=7'], 'seed 0 -> 7'),
      ('resume-other-beta', [*on, '--config.pipeline.beta=0.5'], 'pipeline.beta 1.0 -> 0.5'),
      ('resume-other-momentum', [*on, '--config.optim.momentum=0.5'], 'optim.momentum 0.9 -> 0.5'),
      ('resume-other-batch-size', [*on, '--config.batch_size=16'], 'batch_size 32 -> 16'),
      ('resume-other-stages', [*on, '--config.pipeline.num_stages=3'], 'pipeline.num_stages 2 -> 3'),
      ('resume-two-fields', [*on, '--config.seed=7', '--config.optim.nesterov=True'],
       'resume_changes=optim.nesterov,seed'),
      ('resume-change-not-allowed', [*on, '--config.seed=7', '--config.resume_changes=optim.learning_rate'],
       'seed 0 -> 7'),
      ('resume-old-workdir-other-classes', [*Q[:-2], '--config.dataset=cifar10', '--config.max_steps=6',
                                            f'--workdir={old}'], 'have other shapes'),
      ('every-checkpoint-damaged', [*Q[:-2], '--config.max_steps=6', f'--workdir={damaged}'],
       'every checkpoint in'),
      ('resume-per-process-checkpoints-in-one-process', [*Q[:-2], '--config.max_steps=6', f'--workdir={per_process}'],
       'were written per process (process_0, process_1: a pipeline over 2 processes)'),
  ], untouched=trained)


# Multi-process runs (issue 43): two real processes on loopback (or one, where its peer never comes), every
# case of the table launched at once, each with a port of its own and bounded. The contract per process: the
# exit status, exactly one ``error:`` line holding the expected words, no traceback, no training started (no
# checkpoint or metrics written), and an exit within its bound: the start-up agreement's timeout where a peer
# is absent, a few seconds past the meeting otherwise.
MP_STARTUP_S = 10  # distributed.startup_timeout_s in the cases: how long a process waits for the others
MP_BASE = ['--config=configs/quickstart.py', '--config.method=localsgd', '--config.model=preact_tiny',
           '--config.dataset=cifar10', '--config.data.source=synthetic', '--config.batch_size=16',
           '--config.cpu_devices=1', '--config.replica.num_workers=2', '--config.max_steps=2',
           '--config.distributed.num_processes=2', f'--config.distributed.startup_timeout_s={MP_STARTUP_S}',
           '--config.distributed.heartbeat_timeout_s=30']
NOT_ALL_JOINED = 'not every one of the 2 processes joined the coordinator'


def mp_cases(tmp_path):
  """[(id, {process id: its extra flags}, {process id: (exit status, words its one error line holds)})];
  '{port}' in a flag or the words is the case's coordinator port, '{port_1}' the next one, '{other_port}' another
  free one; a flag 'TAKEN+N' has another program listen on the coordinator's port + N before the case starts."""
  rng = np.random.default_rng(0)
  data = tmp_path / 'c10.npz'
  np.savez(data, x_train=rng.integers(0, 256, (64, 32, 32, 3), dtype=np.uint8), y_train=np.arange(64) % 10,
           x_test=rng.integers(0, 256, (16, 32, 32, 3), dtype=np.uint8), y_test=np.arange(16) % 10)
  missing = tmp_path / 'missing.npz'
  fewer = tmp_path / 'c10_fewer.npz'  # the same format, 48 training images instead of 64
  np.savez(fewer, x_train=rng.integers(0, 256, (48, 32, 32, 3), dtype=np.uint8), y_train=np.arange(48) % 10,
           x_test=rng.integers(0, 256, (16, 32, 32, 3), dtype=np.uint8), y_test=np.arange(16) % 10)
  npz = ['--config.data.source=npz']
  fdg = ['--config.method=fdg', '--config.model=resnet8', '--config.pipeline.num_stages=2']
  return [
      ('process-1-alone', {1: []}, {1: (2, NOT_ALL_JOINED)}),
      ('process-0-alone', {0: []}, {0: (2, NOT_ALL_JOINED)}),
      ('three-processes-told-to-two', {i: ['--config.distributed.num_processes=3'] for i in (0, 1)},
       {i: (2, 'not every one of the 3 processes joined the coordinator') for i in (0, 1)}),
      ('process-1-at-another-port', {0: [], 1: ['--config.distributed.coordinator=127.0.0.1:{other_port}']},
       {0: (2, NOT_ALL_JOINED), 1: (2, NOT_ALL_JOINED)}),
      ('coordinator-port-taken', {0: ['TAKEN+0'], 1: []},  # by another program, listening there
       {0: (2, 'config.distributed.coordinator: 127.0.0.1:{port} (the coordinator\'s port (process 0 listens '
               'there)) cannot be listened on: Address already in use'), 1: (2, NOT_ALL_JOINED)}),
      ('transfer-port-taken', {0: [*fdg, 'TAKEN+1'], 1: fdg},  # process 0's: the coordinator's port + 1
       {0: (2, "config.distributed.transfer_address: 127.0.0.1:{port_1} (process 0's transfer port"),
        1: (2, NOT_ALL_JOINED)}),
      # configs that differ: a nested field, and another method (another engine's layout on each process); the
      # comparison field by field (seed, batch size, steps, stages, ...) is test_process_start's, in one process
      ('another-learning-rate-on-process-1', {0: [], 1: ['--config.optim.learning_rate=0.2']},
       {i: (2, 'config.optim.learning_rate: process') for i in (0, 1)}),
      ('another-method-on-process-1', {0: [], 1: fdg}, {i: (2, 'config.method: process') for i in (0, 1)}),
      ('other-data-on-process-1', {0: [*npz, f'--config.data.path={data}'], 1: [*npz, f'--config.data.path={fewer}']},
       {i: (2, 'config.data.path: the processes read different data (training examples: process') for i in (0, 1)}),
      # a config value that fails its checks on one process: it joins anyway to tell the others (process 0
      # hosts the coordination service, so it leaves only once the other has read its line)
      ('bad-value-on-process-1', {0: [], 1: ['--config.batch_size=0']},
       {0: (2, 'another process stopped (process 1: config.batch_size: must be positive, got 0)'),
        1: (2, 'config.batch_size: must be positive, got 0')}),
      ('bad-value-on-process-0', {0: ['--config.optim.learning_rate=-1'], 1: []},
       {0: (2, 'config.optim.learning_rate: must be positive'),
        1: (2, 'another process stopped (process 0: config.optim.learning_rate: must be positive')}),
      ('bad-value-and-no-peer', {1: ['--config.batch_size=0']}, {1: (2, 'config.batch_size: must be positive, got 0')}),
      ('bad-value-on-every-process', {i: ['--config.batch_size=0'] for i in (0, 1)},  # all leave together at once
       {i: (2, 'config.batch_size: must be positive, got 0') for i in (0, 1)}),
      ('training-data-missing-on-process-1', {0: [*npz, f'--config.data.path={data}'],
                                              1: [*npz, f'--config.data.path={missing}']},
       {0: (2, f'another process stopped (process 1: data.path={missing} does not exist: give an .npz file'),
        1: (2, f'data.path={missing} does not exist')}),
  ]


def prior_work(workdir, process: int, pipelined: bool, write: bool = True) -> dict:
  """An earlier run's work in a case's workdir, which the refused start must leave as it was ("no work lost"):
  a checkpoint of step 2 laid out as the process's method writes it (a pipeline's per-process archive, or a
  step folder) and a line of metrics ({path in the workdir: its bytes}). The checkpoint's bytes are not a valid
  one, so a start that went as far as restoring it would set it aside as damaged, and one that trained would
  add steps or metrics: either is reported."""
  checkpoint = f'checkpoints/process_{process}/2.npz' if pipelined else 'checkpoints/2/default/data'
  files = {checkpoint: b'an earlier run\'s checkpoint of step 2\n' * 16,
           'metrics.jsonl': b'{"step": 2, "kind": "train", "loss": 2.3}\n'}
  for name, content in files.items() if write else ():
    (workdir / name).parent.mkdir(parents=True, exist_ok=True)
    (workdir / name).write_bytes(content)
  return files


def test_bad_multi_process_runs(tmp_path):
  """Every case in the table at once (their processes mostly wait, so the table costs about its slowest case);
  reports every case that misbehaved. Each process's workdir holds an earlier run's work (``prior_work``), which
  must come out unchanged."""
  import socket
  import subprocess
  import time
  from conftest import FAST_COMPILE_XLA_FLAGS
  from test_multiprocess import free_port
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu', 'XLA_FLAGS': FAST_COMPILE_XLA_FLAGS}
  cases, running, taken, used, logs = mp_cases(tmp_path), [], [], set(), []

  def fresh_port():  # free now, and no other case's: nothing listens on a case's ports before it starts
    while True:
      port = free_port()
      if not {port, port + 1, port + 2} & used:
        used.update({port, port + 1, port + 2})
        return port
  for case_id, flags, expected in cases:
    port, other_port = fresh_port(), fresh_port()
    for offset in [int(a[len('TAKEN+'):]) for extra in flags.values() for a in extra if a.startswith('TAKEN+')]:
      listener = socket.socket()  # another program on the coordinator's port (+ 0) or a transfer port
      listener.bind(('127.0.0.1', port + offset))
      listener.listen()
      taken.append(listener)
    expected.update({i: (status, words.format(port=port, port_1=port + 1)) for i, (status, words) in expected.items()})
    for i, extra in flags.items():
      prior_work(tmp_path / 'mp' / case_id / str(i), i, '--config.method=fdg' in extra)
      argv = [sys.executable, 'main.py', *MP_BASE, f'--config.distributed.coordinator=127.0.0.1:{port}',
              f'--config.distributed.process_id={i}', f'--workdir={tmp_path / "mp" / case_id / str(i)}',
              *(a.format(port=port, other_port=other_port) for a in extra if not a.startswith('TAKEN+'))]
      log = open(tmp_path / f'mp-{case_id}-{i}.log', 'w+', encoding='utf-8')  # a file: never a full pipe
      running.append((case_id, i, time.monotonic(), popen_with_ctrl_c(
          argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)))
      logs.append(log)
  bound = scaled_timeout(MP_STARTUP_S + 60)  # the agreement's timeout, start-up and the stop, on this machine
  problems, expect = [], {case_id: expected for case_id, _, expected in cases}
  expect_flags = {case_id: flags for case_id, flags, _ in cases}
  ended = {}  # process -> when it exited (polled together: each one's own time, not its turn in the list)
  try:
    while len(ended) < len(running) and time.monotonic() < running[0][2] + bound:
      for _, _, _, proc in running:
        if proc not in ended and proc.poll() is not None:
          ended[proc] = time.monotonic()
      time.sleep(0.1)
    for case_id, i, began, proc in running:
      if proc not in ended:
        proc.kill()
      proc.wait()
      out = (tmp_path / f'mp-{case_id}-{i}.log').read_text(encoding='utf-8')
      took = ended.get(proc, time.monotonic()) - began
      status, words = expect[case_id][i]
      errors = [line for line in out.splitlines() if line.startswith('error:')]
      workdir = tmp_path / 'mp' / case_id / str(i)
      why = []
      # a peer absent: the agreement's timeout and the stop; else the meeting (every case's processes start at
      # once, so on 2 cores the last of them reaches the coordinator tens of seconds after the first) and the stop
      limit = scaled_timeout(MP_STARTUP_S + 45 if 'joined the coordinator' in words else 45)
      if proc.returncode != -9 and took > limit:
        why.append(f'took {took:.0f} s, more than the {limit:.0f} s this case may take here')
      if proc.returncode != status:
        why.append(f'exit status {proc.returncode}' if proc.returncode != -9 else
                   f'killed: a hang, or {timed_out_message(MP_STARTUP_S + 60, took)}')
      if len(errors) != 1:
        why.append(f'{len(errors)} error lines')
      elif words not in errors[0]:
        why.append(f'the error does not hold {words!r}')
      if 'Traceback' in out or 'Segmentation' in out:
        why.append('a traceback or a crash')
      pipelined = '--config.method=fdg' in expect_flags[case_id].get(i, [])
      lost = [name for name, content in prior_work(workdir, i, pipelined, write=False).items()
              if not (workdir / name).is_file() or (workdir / name).read_bytes() != content]
      if lost:  # moved aside as damaged, rewritten, or deleted: the stop came too late
        why.append(f'the earlier run\'s files changed: {lost}')
      steps = [p for p in workdir.glob('checkpoints/**/*') if p.name.isdigit() or  # a step's folder or archive
               (p.name.endswith('.npz') and p.name[:-4].isdigit())]
      if 'first step' in out or len(steps) > 1:
        why.append('training started')
      if why:
        problems.append(f'{case_id}, process {i} ({took:.0f} s): {"; ".join(why)}\n    {out.strip()[-600:]}')
  finally:
    for *_, proc in running:
      proc.kill()
    for listener in taken:
      listener.close()
    for log in logs:
      log.close()
  assert not problems, f'{len(problems)} of {len(running)} processes misbehaved:\n' + '\n'.join(problems)
