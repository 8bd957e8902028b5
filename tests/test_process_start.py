"""Ctrl-C while a process waits for the others to join stops it at once with one line (before: two Ctrl-Cs
ignored and an abort after about 310 s). The other start-up failures (a process alone past
distributed.startup_timeout_s, a taken port, configs that differ, a peer's missing data) are rows of
test_bad_inputs.py's multi-process table."""
import os
import signal
import subprocess
import sys
import time

from conftest import communicate_within, scaled_timeout
from test_multiprocess import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def launch(tmp_path, port, process_id=0, startup_s=5):
  cmd = [sys.executable, os.path.join(ROOT, 'main.py'), '--config=' + os.path.join(ROOT, 'configs/quickstart.py'),
         '--config.method=localsgd', '--config.model=preact_tiny', '--config.dataset=cifar10',
         '--config.data.source=synthetic', '--config.cpu_devices=1', '--config.replica.num_workers=2',
         f'--config.distributed.coordinator=127.0.0.1:{port}', '--config.distributed.num_processes=2',
         f'--config.distributed.process_id={process_id}', f'--config.distributed.startup_timeout_s={startup_s}',
         f'--workdir={tmp_path / "run"}']
  # restore_signals and a default SIGINT: a shell's background job would ignore Ctrl-C
  return subprocess.Popen(cmd, env={**os.environ, 'JAX_PLATFORMS': 'cpu'}, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, preexec_fn=lambda: signal.signal(signal.SIGINT,
                                                                                                 signal.SIG_DFL))


def errors(out):
  return [line for line in out.splitlines() if line.startswith('error:')]


def test_ctrl_c_while_waiting_for_the_others_stops_at_once(tmp_path):
  proc = launch(tmp_path, free_port(), startup_s=120)
  deadline = time.monotonic() + scaled_timeout(60)
  lines = []
  for line in proc.stdout:  # until the join has begun
    lines.append(line)
    if 'joining the run at' in line:
      break
    assert time.monotonic() < deadline, ''.join(lines)[-2000:]
  time.sleep(1)
  sent = time.monotonic()
  proc.send_signal(signal.SIGINT)
  out = communicate_within(proc, 30, 'waiting for the interrupted process')[0]
  assert proc.returncode == 130 and time.monotonic() - sent <= scaled_timeout(5), (''.join(lines) + out)[-2000:]
  assert len(errors(out)) == 1 and errors(out)[0].startswith(
      'error: interrupted while waiting for the other processes to join the coordinator at 127.0.0.1:'), out[-2000:]
