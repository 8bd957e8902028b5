"""Pipeline methods with their stages in different processes (jax.distributed on loopback, JAX's
cross-process transfers between stages) give the one-process numbers, bit for bit, and survive faults."""
import atexit
import glob
import os
import shutil
import signal
import sys
import tempfile
import time

import numpy as np
import pytest


HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from conftest import (FAST_COMPILE_XLA_FLAGS, communicate_within, run_within, scaled_timeout, start_logged,  # noqa: E402
                      timed_out, wait_within)
# The workers and the reference compile the same stage programs: one compilation cache for all of them.
# XLA:CPU's convolutions and reductions split their sums by the size of the process's intra-op thread pool,
# max(PJRT_NPROC or the cores the process may use, its device count): left alone, on a host with one core a
# process of 1 device (pool 1) rounds differently from the reference of 2 (pool 2), by one ulp at the first
# step. PJRT_NPROC gives every process here the same pool (at least 2, the most devices any of them has; on
# 2 cores that is the default, on more it is the number of cores).
# The cache folder goes when this test process exits.
STAGE_PROGRAM_CACHE = tempfile.mkdtemp(prefix='jaxdecouple-pipeline-processes-')
atexit.register(shutil.rmtree, STAGE_PROGRAM_CACHE, ignore_errors=True)
ENV = {**os.environ, 'JAX_PLATFORMS': 'cpu', 'XLA_FLAGS': FAST_COMPILE_XLA_FLAGS, 'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS': '0',
       'JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES': '0', 'JAX_COMPILATION_CACHE_DIR': STAGE_PROGRAM_CACHE,
       'PJRT_NPROC': str(max(2, len(os.sched_getaffinity(0))))}
from test_multiprocess import free_port  # noqa: E402


def start(tmp_path, devices: int, runs: list[str], tag: str = 'p', port: int | None = None, workdir: str = 'w',
          env: dict | None = None):
  port = port or free_port()
  return [start_logged([sys.executable, os.path.join(HERE, 'pipeline_process_worker.py'), str(i), str(port),
                        str(devices), str(tmp_path / workdir), str(tmp_path / f'{tag}{i}'), *runs],
                       str(tmp_path / f'{tag}{i}.log'), env=env or ENV) for i in range(2)]


def beside_one_process(tmp_path, devices: int, runs: list[str], env: dict | None = None):
  """Both processes, and meanwhile the one-process reference on all their devices. Once more, on fresh ports
  and in a fresh workdir, where a port was taken between free_port's check and the processes' bind (another
  test's processes can take it in between: seen once in a fresh clone's suite). Returns (codes, logs, workdir)."""
  procs = start(tmp_path, devices, runs, env=env)
  one_process(tmp_path, 2 * devices, runs, env=env)
  codes, logs = finish(procs)
  if codes != [0, 0] and 'Address already in use' in logs:
    return (*finish(start(tmp_path, devices, runs, env=env, workdir='w_again')), tmp_path / 'w_again')
  return codes, logs, tmp_path / 'w'


def finish(procs, timeout=300):
  """Waits for both processes (``timeout``: seconds on an unloaded machine, scaled for this one)."""
  try:
    logs = [communicate_within(p, timeout, f'waiting for process {i} to end')[0] for i, p in enumerate(procs)]
  finally:
    for p in procs:  # JAX's preemption service takes SIGTERM: only SIGKILL stops a stuck worker
      p.kill()
  return [p.returncode for p in procs], '\n'.join(log[-4000:] for log in logs)


def sigterm_process_1_once(procs, pattern: str, at_least: int, run: str, tmp_path, steps: int,
                           sig: int = signal.SIGTERM, to: tuple[int, ...] = (1,)) -> int:
  """Waits until process 1 has written a checkpoint file matching ``pattern`` (its name starting with the
  step) for a step of at least ``at_least``, sends ``sig`` (SIGTERM, or SIGINT: Ctrl-C) to process 1 alone
  (or to the processes ``to``, at once, as a terminal's Ctrl-C reaches every process it started), and returns
  the step both processes stopped at (checked to be one step, before the end)."""
  start = time.time()
  deadline = start + scaled_timeout(300)
  while not [f for f in glob.glob(pattern) if int(os.path.basename(f).split('.')[0]) >= at_least]:
    if time.time() >= deadline:
      for p in procs:
        p.kill()
      timed_out(300, time.time() - start, f'waiting for a checkpoint of step {at_least} or later', finish(procs)[1])
    assert procs[1].poll() is None, finish(procs)[1]
    time.sleep(0.05)
  for i in to:
    procs[i].send_signal(sig)
  codes, logs = finish(procs)
  assert codes == [0, 0], logs
  stopped = [int(np.load(tmp_path / f'p{i}_{run}.npz')['__step__']) for i in range(2)]
  assert stopped[0] == stopped[1] < steps, stopped  # the same step in both
  return stopped[0]


def one_process(tmp_path, devices: int, runs: list[str], env: dict | None = None):
  """The same runs alone in one process with ``devices`` CPU devices (files ref_NAME.npz). A process,
  not this one: XLA:CPU's numbers depend on how many devices a process splits the cores into (this
  one has 4), not on which of them a stage runs on."""
  proc = run_within([sys.executable, os.path.join(HERE, 'pipeline_process_worker.py'), '-1', '0', str(devices),
                     str(tmp_path / 'single'), str(tmp_path / 'ref'), *runs], 300, 'in the one-process reference',
                    env=env or ENV, capture_output=True, text=True)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def assert_same(path, reference):
  got, want = np.load(path), np.load(reference)
  assert sorted(got.files) == sorted(want.files)
  for key in want.files:
    if key not in ('__accuracy__', '__decoded__'):
      np.testing.assert_array_equal(got[key], want[key], err_msg=key)
  assert float(got['__accuracy__']) == float(want['__accuracy__'])


def test_every_pipeline_method_over_two_processes_matches_one_process(tmp_path):
  """K = 2, one CPU device per process: stage 0 in process 0, stage 1 in process 1. FDG on streamed JPEGs,
  which only stage 0's process reads (FDG on data in memory: the tests below); DDG and DGL on data in memory.
  (The synchronous schedules across processes: the K x D test below. ADL is FDG's path with accumulation and
  FR DDG's with a replay, so neither crosses processes differently: they left this test to keep the suite
  within its time, as ZB-H1 did; each was checked across processes before, docs/METHODS.md.) And ResIST on
  streamed JPEGs, 2 workers on 2 processes: each process decodes only its own worker's images."""
  from jaxdecouple.data.imagenet import write_fake_folder
  ENV['STREAM_FOLDER'] = write_fake_folder(str(tmp_path / 'jpegs'))
  # 4 steps: twice the pipeline's fill at K = 2 (stage 0's gradients are 2(K - 1) = 2 steps old)
  runs = ['fdg_stream:fdg:2:4'] + [f'{m}:{m}:2:4' for m in ('ddg', 'dgl')]
  runs += ['resist_stream:resist:2:4']  # rounds end at steps 2 and 4; a mean of 2 workers rounds alike in any order
  codes, logs, workdir = beside_one_process(tmp_path, 1, runs)
  assert codes == [0, 0], logs
  for run in runs:
    name = run.split(':')[0]
    for i in range(2):  # both processes evaluate the whole model, received from its stages
      assert_same(tmp_path / f'p{i}_{name}.npz', tmp_path / f'ref_{name}.npz')
    decoded = [int(np.load(tmp_path / f'{who}_{name}.npz')['__decoded__']) for who in ('ref', 'p0', 'p1')]
    if name == 'resist_stream':  # 2 workers x batch 8 x 4 steps, half of them in each process
      assert decoded == [64, 32, 32], decoded
    elif name.endswith('_stream'):  # batch 8 x 4 steps (none for the initialisation), all by stage 0's process
      assert decoded == [32, 32, 0], decoded
  assert os.path.exists(workdir / 'ddg' / 'metrics.jsonl')  # written by process 0
  assert sorted(os.listdir(workdir / 'ddg' / 'checkpoints')) == ['process_0', 'process_1']


def test_stages_over_two_processes_of_two_devices_each(tmp_path):
  """K = 2 x D = 2 (pipeline.data_parallel): stage 0 on process 0's two devices, stage 1 on process 1's, each
  batch split over them, activations, gradients and labels sent between the processes' device pairs; FDG and
  1F1B give the one-process numbers on 4 devices bit for bit, and DGL (its auxiliary heads on each stage's two
  devices). In the same launch, FDG with K = 4 stages over the
  two processes of two devices (stages 0-1 in process 0, 2-3 in process 1; 8 steps, twice its fill). Every
  process here gets an intra-op pool of 4 (the reference's device count), so that the reductions split alike."""
  runs = ['fdg_dp:fdg:2:4:dp=2', '1f1b_dp:1f1b:2:4:dp=2', 'dgl_dp:dgl:2:4:dp=2', 'fdg4:fdg:4:8']
  env = {**ENV, 'PJRT_NPROC': '4'}
  codes, logs, _ = beside_one_process(tmp_path, 2, runs, env=env)
  assert codes == [0, 0], logs
  for run in runs:
    name = run.split(':')[0]
    for i in range(2):
      assert_same(tmp_path / f'p{i}_{name}.npz', tmp_path / f'ref_{name}.npz')


def test_a_killed_process_and_a_sigterm_resume_exactly_with_a_workdir_per_host(tmp_path):
  """Two hosts need not share a filesystem or a path: process 0 writes under host0/, process 1 under host1/.
  Process 1 dies right after its checkpoint at step 4 (kill -9); process 0 stops by itself within a minute
  with the line naming process 1 and step 4 (the newest step both wrote); both restart and
  agree on the checkpoint to resume from (keyed by the run, not by a path): step 4, not 0. Then a SIGTERM to
  process 1 alone stops both at the same step with a checkpoint. With process 1's checkpoints folder moved
  away, a restart stops both with one line (before: both restarted from step 0 without a word). Put back, and
  process 1's newest checkpoint damaged, a restart resumes both from the step before (before: process 1 fell
  back alone and the two resumed misaligned) and finishes. The end equals an uninterrupted run in one process,
  bit for bit."""
  steps, host = 40, 'host{process}'
  ckpt = [tmp_path / f'host{i}' / 'r' / 'checkpoints' / f'process_{i}' for i in range(2)]
  procs = start(tmp_path, 1, [f'r:fdg:2:{steps}:ckpt=2:die=1@4'], workdir=host)
  assert wait_within(procs[1], 300, 'waiting for process 1 to die at step 4') == -signal.SIGKILL
  # the survivor stops by itself within a minute with one line naming the dead process and the newest step both
  # wrote, exit 2: not an abort (-6) in JAX's shutdown, not a hang
  out = communicate_within(procs[0], 60, 'waiting for process 0 to stop after process 1 died')[0]
  last = [line for line in out.splitlines() if line.startswith('error:')]
  assert procs[0].returncode == 2 and len(last) == 1 and 'Traceback' not in out, out[-3000:]
  assert last[0].startswith('error: process 1 stopped answering during a collective or transfer') and \
      'the newest checkpoint every process wrote is step 4' in last[0], out[-3000:]
  assert '4.npz' in os.listdir(ckpt[1]) and not os.path.exists(tmp_path / 'host0' / 'r' / 'checkpoints' / 'process_1')

  procs = start(tmp_path, 1, [f'r:fdg:2:{steps}:ckpt=2'], workdir=host)  # resumes at step 4 (the newest both have)
  stopped = sigterm_process_1_once(procs, str(ckpt[1] / '*.npz'), 10, 'r', tmp_path, steps)
  for i in range(2):
    assert f'{stopped}.npz' in os.listdir(ckpt[i])
  from jaxdecouple.writers import read_metrics
  trained = [r['step'] for r in read_metrics(str(tmp_path / 'host0' / 'r')) if r['kind'] == 'train']
  assert trained.count(2) == 1 and trained.count(4) <= 2, trained  # resumed at step 4, not restarted from 0

  os.rename(ckpt[1], str(ckpt[1]) + '.away')  # one process's checkpoints missing
  codes, logs = finish(start(tmp_path, 1, [f'r:fdg:2:{steps}:ckpt=2'], tag='missing', workdir=host), timeout=120)
  assert codes == [2, 2] and logs.count('error: the processes share no checkpoint step to resume from '
                                        '(process 0: ') == 2, logs
  assert not glob.glob(str(ckpt[1] / '*.npz'))  # the refused start wrote no checkpoint in the folder it made
  shutil.rmtree(ckpt[1])
  os.rename(str(ckpt[1]) + '.away', ckpt[1])
  with open(ckpt[1] / f'{stopped}.npz', 'r+b') as f:  # process 1's newest checkpoint damaged (bytes flipped)
    f.seek(200)
    f.write(bytes(b ^ 0xFF for b in f.read(8)))

  procs = start(tmp_path, 1, [f'r:fdg:2:{steps}:ckpt=2'], tag='end', workdir=host)
  one_process(tmp_path, 2, [f'r:fdg:2:{steps}:ckpt=2'])
  codes, logs = finish(procs)
  assert codes == [0, 0], logs
  assert f'checkpoint at step {stopped} is damaged in process 1' in logs, logs  # process 0 skipped its intact one
  assert f'{stopped}.npz.damaged' in os.listdir(ckpt[1]), os.listdir(ckpt[1])
  assert 'no config.json' not in logs, logs  # each host's workdir has its own
  assert_same(tmp_path / 'end0_r.npz', tmp_path / 'ref_r.npz')
  assert_same(tmp_path / 'end1_r.npz', tmp_path / 'ref_r.npz')


@pytest.mark.parametrize('method, to', [('fdg', (1,)), ('resist', (0, 1))], ids=['fdg-process-1', 'resist-both'])
def test_a_ctrl_c_to_one_or_both_processes_stops_both_at_one_step(tmp_path, method, to):
  """A Ctrl-C (SIGINT) to process 1 alone of an FDG pipeline (K = 2, a stage in each process, activations and
  gradients crossing every step), or to both processes of a ResIST run (2 workers, blocks travelling every 2
  steps) at once, as a terminal sends it to every process it started (the issue saw one handler never run),
  whatever step each has reached, stops both at the same step with a checkpoint in each (neither is left
  waiting in a transfer or an all-reduce), as a SIGTERM to one does (the kill/SIGTERM test above). Ctrl-C is
  one mechanism whatever the method (processes.StopSignal hands it to JAX's preemption service, as SIGTERM),
  so the two cases split the methods between them to keep the suite within its time. (That a 2-process
  ResIST run resumes exactly from its checkpoints: tests/test_multiprocess.py.)"""
  steps, ckpt = 60, tmp_path / 'w' / 'c' / 'checkpoints'
  procs = start(tmp_path, 1, [f'c:{method}:2:{steps}:ckpt=2'])
  pattern = str(ckpt / 'process_1' / '*.npz') if method == 'fdg' else str(ckpt / 'checksums' / '*.process_1.json')
  stopped = sigterm_process_1_once(procs, pattern, 6, 'c', tmp_path, steps, sig=signal.SIGINT, to=to)
  for i in range(2):
    assert os.path.exists(ckpt / f'process_{i}' / f'{stopped}.npz' if method == 'fdg' else
                          ckpt / 'checksums' / f'{stopped}.process_{i}.json'), os.listdir(ckpt)


def test_a_layout_that_leaves_a_process_idle_stops_at_start_up(tmp_path):
  codes, logs = finish(start(tmp_path, 2, ['one:fdg:1:2']))  # K = 1: process 1 would hold no stage
  assert codes != [0, 0]
  assert 'pipeline.num_stages' in logs and 'without a stage' in logs


def test_divergence_over_processes_stops_every_process_with_one_line(tmp_path):
  """FDG K = 2 over 2 processes at a learning rate of 1e6, no checkpoint before the divergence: the loss lives
  on process 0 alone, yet both processes stop at the same step with the one line, exit 2, no traceback and
  no abort (before: process 0 stopped, process 1 went on into a transfer from it and aborted, -6)."""
  port = free_port()
  common = ['--config=configs/quickstart.py', '--config.method=fdg', '--config.dataset=cifar10',
            '--config.data.source=synthetic', '--config.model=resnet8', '--config.max_steps=20',
            '--config.cpu_devices=1', '--config.optim.learning_rate=1e6', '--config.log_every_steps=2',
            '--config.checkpoint_every_steps=100', f'--config.distributed.coordinator=127.0.0.1:{port}',
            '--config.distributed.num_processes=2']
  procs = [start_logged([sys.executable, 'main.py', *common, f'--config.distributed.process_id={i}',
                         f'--workdir={tmp_path / str(i)}'], str(tmp_path / f'main{i}.log'), separate_stderr=True,
                        cwd=os.path.dirname(HERE), env=ENV) for i in range(2)]
  try:
    outs = [communicate_within(p, 300, f'waiting for process {i} to end') for i, p in enumerate(procs)]
  finally:
    for p in procs:
      p.kill()
  steps = set()
  for p, (_, err) in zip(procs, outs):
    errors = [line for line in err.splitlines() if line.startswith('error:')]
    assert p.returncode == 2 and len(errors) == 1 and 'training diverged' in errors[0], (p.returncode, err[-3000:])
    assert 'Traceback' not in err, err[-3000:]
    steps.add(int(errors[0].split(' at step ')[1].split(':')[0]))
  assert len(steps) == 1, steps  # the same step in both


def test_a_deadlocked_main_thread_stops_every_process_with_one_line(tmp_path):
  """One process's main thread deadlocks right after its checkpoint at step 4 (a lock taken twice), its other
  threads running on, so it keeps beating and the heartbeat alone never stops anyone (before: both waited for
  ever). With distributed.stall_timeout_s = 10 (scaled for a loaded machine), that process stops with one line
  naming itself and where its main thread is stuck, and the other (waiting for its activations or gradients,
  or in an agreement) stops with that line; both exit 2 within a bound (not -6: process 0 hosts the
  coordination service, and the two leave it together), and the checkpoint of step 4 both wrote is named and
  intact. Both cases (process 0 stuck, process 1 stuck) run at once, each a 2-process run of its own: most of
  their time is the stall's wait, which they then share."""
  steps = 60
  # 10 s on an unloaded machine: more than the first step's compilation, which marks no progress while it runs
  stall_s = round(scaled_timeout(10))
  procs = {stuck: start(tmp_path, 1, [f'st:fdg:2:{steps}:ckpt=2:stall={stuck}@4:stall_s={stall_s}'],
                        tag=f'stuck{stuck}_p', workdir=f'w{stuck}') for stuck in (0, 1)}
  try:
    outs = {stuck: [communicate_within(p, 150, f'waiting for process {i} to stop after process {stuck} deadlocked')[0]
                    for i, p in enumerate(pair)] for stuck, pair in procs.items()}
  finally:
    for pair in procs.values():
      for p in pair:
        p.kill()
  for stuck, pair in procs.items():
    other, out, ckpt = 1 - stuck, outs[stuck], tmp_path / f'w{stuck}' / 'st' / 'checkpoints'
    lines = [[line for line in o.splitlines() if line.startswith('error:')] for o in out]
    assert [p.returncode for p in pair] == [2, 2] and [len(x) for x in lines] == [1, 1], (stuck, out)
    assert not any('Traceback' in o for o in out), (stuck, out)
    mine = lines[stuck][0]
    assert mine.startswith(f"error: process {stuck}'s main thread has made no progress for ") and \
        'in deadlock (from train.py' in mine and 'the newest checkpoint every process wrote is step 4' in mine, mine
    who = 'process 0 (it runs the coordination service)' if stuck == 0 else 'process 1'
    assert lines[other][0] == f'error: another process stopped ({who}: {mine[len("error: "):]}); fix that and ' \
        'restart every process with the same --workdir', lines
    for i in range(2):
      assert '4.npz' in os.listdir(ckpt / f'process_{i}'), os.listdir(ckpt / f'process_{i}')
