"""Ctrl-C while a process waits for the others to join stops it at once with one line (before: two Ctrl-Cs
ignored and an abort after about 310 s). The other start-up failures (a process alone past
distributed.startup_timeout_s, a taken port, configs that differ, a peer's missing data) are rows of
test_bad_inputs.py's multi-process table; the config agreement's comparison, field by field, is here, against
a peer that shows its config through a stand-in for the coordinator's key-value store."""
import os
import signal
import subprocess
import sys
import time

from conftest import communicate_within, popen_with_ctrl_c, scaled_timeout
from test_multiprocess import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def launch(tmp_path, port, process_id=0, startup_s=5):
  cmd = [sys.executable, os.path.join(ROOT, 'main.py'), '--config=' + os.path.join(ROOT, 'configs/quickstart.py'),
         '--config.method=localsgd', '--config.model=preact_tiny', '--config.dataset=cifar10',
         '--config.data.source=synthetic', '--config.cpu_devices=1', '--config.replica.num_workers=2',
         f'--config.distributed.coordinator=127.0.0.1:{port}', '--config.distributed.num_processes=2',
         f'--config.distributed.process_id={process_id}', f'--config.distributed.startup_timeout_s={startup_s}',
         f'--workdir={tmp_path / "run"}']
  # a default SIGINT in the child: a shell's background job would ignore Ctrl-C
  return popen_with_ctrl_c(cmd, env={**os.environ, 'JAX_PLATFORMS': 'cpu'}, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)


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


CHILDS_SIGINT = "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"


def test_a_started_process_takes_ctrl_c_even_when_this_one_ignores_it_and_jax_sees_no_fork():
  """popen_with_ctrl_c (conftest), in a process that imported JAX and ignores SIGINT (a shell's background job):
  the child it starts takes Ctrl-C (Python's KeyboardInterrupt handler in place), where a plain Popen's child
  ignores it too; and JAX, its devices started, does not warn of a fork of its multithreaded process, as it did at
  each start with preexec_fn, the way before (the suite's two warnings)."""
  parent = f"""
import signal, subprocess, sys
sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
import jax
from conftest import popen_with_ctrl_c
jax.devices()  # JAX's threads started: from now on it warns at a fork
signal.signal(signal.SIGINT, signal.SIG_IGN)
child = [sys.executable, '-c', {CHILDS_SIGINT!r}]
for start in (popen_with_ctrl_c, subprocess.Popen):
  print(start.__name__, start(child, stdout=subprocess.PIPE, text=True).communicate()[0].strip())
print('still ignored here:', signal.getsignal(signal.SIGINT) is signal.SIG_IGN)
"""
  out = subprocess.run([sys.executable, '-c', parent], capture_output=True, text=True, timeout=scaled_timeout(60))
  assert out.returncode == 0 and 'fork' not in out.stderr, out.stderr[-2000:]
  assert out.stdout.split('\n')[:3] == ['popen_with_ctrl_c True', 'Popen False', 'still ignored here: True'], out


class _Coordinator:
  """The coordinator's key-value store as the agreement sees it, for one peer (process 1) that never shows
  anything: each wait raises what the real client raises, ``waiting`` (a deadline, or Ctrl-C)."""

  def __init__(self, waiting):
    self.waiting, self.published = waiting, {}

  def key_value_set(self, key, value):
    self.published[key] = value

  def blocking_key_value_get(self, key, timeout_ms):
    raise self.waiting

  def key_value_try_get(self, key):
    raise KeyError(key)  # process 1 published no reason of its own


def _as_process_0_of_2(monkeypatch, waiting):
  import jax
  from jax._src import distributed
  monkeypatch.setattr(jax, 'process_count', lambda: 2)
  monkeypatch.setattr(jax, 'process_index', lambda: 0)
  monkeypatch.setattr(distributed.global_state, 'client', _Coordinator(waiting))


def test_ctrl_c_in_the_agreement_is_one_line_with_the_interrupt_status(monkeypatch):
  """After the join, a process waits for the others' configs a second at a time, before any signal handler of the
  run is installed; Ctrl-C there (before: a KeyboardInterrupt traceback) is one line, and main.py exits with the
  error's status, 130."""
  import pytest
  from jaxdecouple.agreement import agree_on_config
  from jaxdecouple.errors import InterruptedWhileWaiting, JaxDecoupleError
  from conftest import tiny_config
  _as_process_0_of_2(monkeypatch, KeyboardInterrupt())
  with pytest.raises(InterruptedWhileWaiting, match='interrupted while waiting for the other processes to show '
                     'their config') as raised:
    agree_on_config(tiny_config(), 30.0)
  assert isinstance(raised.value, JaxDecoupleError) and raised.value.exit_code == 130


def test_each_agreement_names_its_own_bound(monkeypatch):
  """The configs are shown right after the join (``startup_timeout_s``, 30 s by default); the data only once each
  host has loaded it, which may take minutes (``data_timeout_s``, 600 s): each wait's line names its field."""
  import numpy as np
  import pytest
  from jaxdecouple.agreement import agree_on_config, agree_on_data
  from jaxdecouple.config import get_default_config
  from jaxdecouple.errors import ConfigError
  from conftest import tiny_config
  assert get_default_config().distributed.startup_timeout_s == 30.0
  assert get_default_config().distributed.data_timeout_s == 600.0
  _as_process_0_of_2(monkeypatch, RuntimeError('DEADLINE_EXCEEDED'))
  with pytest.raises(ConfigError, match=r'config.distributed.startup_timeout_s: process 1 did not show its config '
                     r'within 0.01 s .* raise config.distributed.startup_timeout_s'):
    agree_on_config(tiny_config(), 0.01)

  class Data:
    x_train, x_test, num_classes = np.zeros((4, 2, 2, 3), np.uint8), np.zeros((2, 2, 2, 3), np.uint8), 10
  with pytest.raises(ConfigError, match=r'config.distributed.data_timeout_s: process 1 did not show its data '
                     r'within 0.01 s .* raise config.distributed.data_timeout_s'):
    agree_on_data(Data(), 0.01)


def test_ctrl_c_while_waiting_for_the_others_data_stops_at_once(monkeypatch):
  """Loading the data happens inside the run, where a Ctrl-C is the run's agreed stop (handed to JAX's
  preemption service as this process's SIGTERM) and was taken only at the first step, once every process had
  shown its data, possibly minutes later. Now the wait for the others' data ends with one line, exit 130: it
  publishes its line marked as leaving together, and leaves with the others once they have read it
  (processes.stop_together)."""
  import signal
  import numpy as np
  import pytest
  from jaxdecouple import processes
  from jaxdecouple.agreement import agree_on_data
  from jaxdecouple.errors import InterruptedWhileWaiting
  _as_process_0_of_2(monkeypatch, RuntimeError('DEADLINE_EXCEEDED'))  # process 1 still loading
  forwarded = []
  monkeypatch.setattr(processes.os, 'kill', lambda pid, sig: forwarded.append(sig))  # JAX's service is absent here

  class Data:
    x_train, x_test, num_classes = np.zeros((4, 2, 2, 3), np.uint8), np.zeros((2, 2, 2, 3), np.uint8), 10
  with processes.StopSignal(processes=True) as stop:
    stop._handler(signal.SIGINT, None)  # the Ctrl-C, as the installed handler receives it
    assert forwarded == [signal.SIGTERM]  # the agreed stop is still asked for
    with pytest.raises(InterruptedWhileWaiting, match='interrupted while waiting for the other processes to show '
                       'their data') as raised:
      agree_on_data(Data(), 600.0)
  assert raised.value.exit_code == 130
  from jax._src import distributed
  together = processes.TOGETHER_KEY.format(processes._RUN[0], 0)
  assert distributed.global_state.client.published.get(together) == '1'  # the others leave with it
  with processes.StopSignal(processes=True):  # a new run starts uninterrupted
    assert not processes.INTERRUPTED.is_set()


class _Peer(_Coordinator):
  """Process 1 has shown ``theirs`` (a flat {field: value} dict of its config), as the agreement publishes it."""

  def __init__(self, theirs):
    super().__init__(None)
    self.theirs = theirs

  def blocking_key_value_get(self, key, timeout_ms):
    assert key.endswith('/1'), key  # only the other process's config is read
    import json
    return json.dumps(self.theirs, sort_keys=True)


def _shown(config) -> dict:
  """A config as a process shows it to the others: every field, flat, but those it may set its own way."""
  import json
  from jaxdecouple.agreement import PER_PROCESS
  from jaxdecouple.workdir import flat
  return {k: v for k, v in flat(json.loads(config.to_json_best_effort())).items() if k not in PER_PROCESS}


def test_a_field_that_differs_on_another_process_is_named_with_both_values(monkeypatch):
  """The agreement's comparison, field by field, against process 1's config with one field changed at a time (the
  multi-process table of test_bad_inputs runs two of these with real processes): the line names the field and
  both processes' values in JSON; several differences name the first in sorted order; the fields a process sets
  its own way (``PER_PROCESS``: its id, its data's path, its cache) differ freely; identical configs pass."""
  import json
  import pytest
  from jax._src import distributed
  from jaxdecouple.agreement import agree_on_config
  from jaxdecouple.errors import ConfigError
  from conftest import tiny_config
  mine = tiny_config()
  changed = {'seed': 1, 'batch_size': 32, 'max_steps': 3, 'method': 'fdg', 'pipeline.num_stages': 3,
             'optim.learning_rate': 0.2, 'optim.milestones': [1, 2], 'data.synthetic_train_size': 256}
  _as_process_0_of_2(monkeypatch, None)
  for field, value in changed.items():
    theirs = {**_shown(mine), field: value}
    distributed.global_state.client = _Peer(theirs)
    with pytest.raises(ConfigError) as raised:
      agree_on_config(mine, 30.0)
    assert str(raised.value) == (
        f'config.{field}: process 0 has {json.dumps(_shown(mine)[field])}, process 1 has {json.dumps(value)}; '
        'every process needs the same config (only distributed.process_id, distributed.transfer_address, '
        'compilation_cache_dir, data.path, data.idx_dir, data.tfds_data_dir, data.tfds_manual_dir, '
        'data.imagenet_v2_dir, data.workers, data.prefetch may differ)'), field
  distributed.global_state.client = _Peer({**_shown(mine), 'seed': 5, 'batch_size': 8})
  with pytest.raises(ConfigError, match=r'^config\.batch_size: process 0 has 16, process 1 has 8;'):
    agree_on_config(mine, 30.0)
  distributed.global_state.client = _Peer({**_shown(mine), 'optim.extra_field': 1})  # a field only process 1 has
  with pytest.raises(ConfigError, match=r'^config\.optim\.extra_field: process 0 has null, process 1 has 1;'):
    agree_on_config(mine, 30.0)
  # what process 0 really publishes (identical configs pass) is what a process 1 that differs only in its own
  # fields is held against: it passes too, and those fields were never shown
  distributed.global_state.client = peer = _Peer(_shown(mine))
  agree_on_config(mine, 30.0)
  published = json.loads(next(v for k, v in peer.published.items() if k.endswith('/0')))
  assert published == _shown(mine) and 'seed' in published and 'data.path' not in published
  own = tiny_config(**{'distributed.process_id': 1, 'data.path': '/elsewhere/c10.npz', 'compilation_cache_dir': '',
                       'data.workers': 3})
  distributed.global_state.client = _Peer(published)
  agree_on_config(own, 30.0)
