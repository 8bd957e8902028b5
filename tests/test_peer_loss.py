"""A process of a multi-process run dies (kill -9) or hangs (SIGSTOP: stopped, deadlocked, its host frozen)
mid-run: the survivor stops with one line naming it, well within a minute, its checkpoints intact, and a restart of
both resumes from them exactly (the last figures of an uninterrupted run, bit for bit). Local SGD, two
processes of one CPU device each (gloo collectives, the coordination service on loopback), as a user runs it
with main.py."""
import os
import signal
import sys
import time

import pytest

from conftest import FAST_COMPILE_XLA_FLAGS, communicate_within, logged_output, scaled_timeout, start_logged
from test_multiprocess import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def command(workdir, port, process_id, max_steps):
  return [sys.executable, os.path.join(ROOT, 'main.py'), '--config=' + os.path.join(ROOT, 'configs/quickstart.py'),
          '--config.method=localsgd', '--config.model=preact_tiny', '--config.dataset=cifar10',
          '--config.data.source=synthetic', '--config.data.synthetic_train_size=256',
          '--config.data.synthetic_test_size=64', '--config.batch_size=16', '--config.cpu_devices=1',
          '--config.replica.num_workers=2', '--config.replica.local_steps=2', f'--config.max_steps={max_steps}',
          '--config.num_epochs=1000', '--config.checkpoint_every_steps=10', '--config.log_every_steps=10',
          '--config.eval_every_epochs=1000', f'--config.distributed.coordinator=127.0.0.1:{port}',
          '--config.distributed.num_processes=2', f'--config.distributed.process_id={process_id}',
          '--config.distributed.heartbeat_timeout_s=10', f'--workdir={workdir}']


def start(workdir, max_steps):
  port = free_port()
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu', 'XLA_FLAGS': FAST_COMPILE_XLA_FLAGS}
  return [start_logged(command(workdir, port, i, max_steps), f'{workdir}.p{i}.log', env=env) for i in range(2)]


def checkpoints(workdir):
  folder = os.path.join(workdir, 'checkpoints')
  return sorted(int(n) for n in os.listdir(folder) if n.isdigit()) if os.path.isdir(folder) else []


# the dead peer's collective fails at once (gloo: connection reset); the hung one's never does, and the
# survivor's own watch (jaxdecouple/liveness.py) stops it at distributed.heartbeat_timeout_s (10 s here), before
# JAX's coordination service would abort it with a stack trace. A kill that finds the survivor waiting in a
# checkpoint's barrier (the coordination service's, where no collective fails) is seen by that watch too: on a
# loaded host (a suite of 33 minutes beside two study runs, 2026-12-01) the survivor spent the 10 s there. Either
# line names process 1 and the newest checkpoint; the collective's line alone: test_pipeline_processes, test_meet.
HEARTBEAT_LINE = 'error: process 1 stopped answering: no sign of life for'
HOW = {'killed': (signal.SIGKILL, ('error: process 1 stopped answering during a collective or transfer', HEARTBEAT_LINE)),
       'hung': (signal.SIGSTOP, (HEARTBEAT_LINE,))}


@pytest.mark.parametrize('how', sorted(HOW))
def test_a_dead_or_hung_peer_stops_the_survivor_with_one_line_and_its_checkpoints_intact(tmp_path, how):
  sig, words = HOW[how]
  workdir = str(tmp_path / 'run')
  procs = start(workdir, 100000)
  try:
    deadline = time.monotonic() + scaled_timeout(120)
    while len(checkpoints(workdir)) < 2:  # two saved (a third may be under way when the peer dies)
      assert time.monotonic() < deadline and all(p.poll() is None for p in procs), \
          'no checkpoints within the limit:\n' + (logged_output(procs[0])[0] or '')[-2000:]
      time.sleep(0.5)
    procs[1].send_signal(sig)
    killed = time.monotonic()
    out = communicate_within(procs[0], 60, f'waiting for process 0 to stop after process 1 was {how}')[0]
    took = time.monotonic() - killed
  finally:
    for p in procs:
      p.kill()
      p.wait()
  assert procs[0].returncode == 2, out[-3000:]
  last = [line for line in out.splitlines() if line.startswith('error:')]
  assert len(last) == 1 and last[0].startswith(words) and 'Traceback' not in out, out[-3000:]
  # it names the newest step both processes had finished writing (an asynchronous save is counted once waited for)
  named = int(last[0].split('the newest checkpoint every process wrote is step ')[1].split(':')[0])
  assert took <= scaled_timeout(60), f'the survivor took {took:.0f} s'
  # the checkpoints written before the kill are intact: the survivor left them as they were (a restart
  # resumes from the newest all processes hold, exactly: test_pipeline_processes' kill -9 test)
  held = checkpoints(workdir)
  assert len(held) >= 2 and all(os.listdir(os.path.join(workdir, 'checkpoints', str(s))) for s in held)
  assert named in held, (named, held)
  if how == 'killed':
    # a process killed is a machine lost: its death is seen at once (the peer's connection resets), so the bound
    # is the minute, unscaled
    assert took <= 60, f'the survivor took {took:.0f} s'
    # restarted, both processes resume from that step and end where a run never interrupted ends, bit for bit:
    # the last evaluation's test loss and accuracy, as metrics.jsonl has them (all digits of a float32)
    # (from the newest checkpoint both hold whole: the one named, or a later one whose writing was under way)
    end = max(held) + 4
    resumed = finish(workdir, end)
    assert any(f'resumed from the checkpoint at step {s} ' in resumed for s in held if s >= named), resumed[-3000:]
    fresh = str(tmp_path / 'uninterrupted')
    finish(fresh, end)
    assert last_records(workdir, end) == last_records(fresh, end)


def finish(workdir, max_steps):
  """Both processes run to ``max_steps`` (from the workdir's newest checkpoint, if any); process 0's output."""
  procs = start(workdir, max_steps)
  try:
    outs = [communicate_within(p, 180, f'waiting for process {i} to finish')[0] for i, p in enumerate(procs)]
  finally:
    for p in procs:
      p.kill()
      p.wait()
  assert [p.returncode for p in procs] == [0, 0], '\n'.join(o[-2000:] for o in outs)
  return outs[0]


def last_records(workdir, step):
  """The evaluation at ``step`` from metrics.jsonl, without its times (the training records average the steps
  since the last log line, which a resume from a checkpoint between log lines counts differently)."""
  import json
  with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
    records = [json.loads(line) for line in f]
  timing = ('time', 'epoch_time_s', 'eval_time_s', 'train_images_per_sec', 'whole_run_seconds')
  evals = [{k: v for k, v in r.items() if k not in timing} for r in records if r.get('kind') == 'eval' and r['step'] == step]
  assert evals and 'test_loss' in evals[-1], records[-3:]
  return evals[-1]
