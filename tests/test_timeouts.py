"""The multi-process tests' timeouts (tests/conftest.py): scaled for a loaded or slow machine, never below the
limit written in the test, and a limit still reached fails with one line that says so (issue 43, item 5)."""
import re
import subprocess
import sys

import pytest

import conftest
from conftest import TIMEOUT_SCALE_ENV, timeout_scale_from


def test_the_scale_follows_the_load_the_probe_and_the_user():
  ref = conftest.PROBE_REFERENCE_S
  assert timeout_scale_from(0.3, 2, ref, None) == 1.0  # idle: the limits as written
  assert timeout_scale_from(0.3, 2, ref / 2, '') == 1.0  # a faster machine never lowers them
  assert timeout_scale_from(5.0, 2, ref, None) == 2.5  # load 5 on 2 cores
  assert timeout_scale_from(1.0, 2, 3 * ref, None) == pytest.approx(3.0)  # the probe took 3 times as long
  assert timeout_scale_from(100.0, 2, ref, None) == conftest.MAX_MEASURED_SCALE  # bounded: a hang still ends
  assert timeout_scale_from(5.0, 2, ref, '3') == 7.5  # the user's factor on top
  for bad in ('0.5', 'fast', 'nan'):
    with pytest.raises(ValueError, match=f'{TIMEOUT_SCALE_ENV}=.*at least 1'):
      timeout_scale_from(0.0, 2, ref, bad)


def test_the_session_scale_is_measured_once_and_never_shortens_a_limit():
  measured = conftest.machine_load()
  assert conftest.machine_load() is measured and measured['scale'] >= 1.0 and measured['cores'] >= 1
  assert conftest.scaled_timeout(120) == 120 * measured['scale'] >= 120


def test_the_timed_out_line_names_the_time_the_scale_and_the_setting(monkeypatch):
  monkeypatch.delenv(TIMEOUT_SCALE_ENV, raising=False)
  m = {'load': 5.0, 'cores': 2, 'probe_s': 0.2, 'scale': 2.5}
  line = conftest.timed_out_message(300, 751.4, 'waiting for process 1 to end', m)
  assert re.fullmatch(
      r'timed out after 751 s waiting for process 1 to end \(a 300 s limit, timeout scaled x2\.50 for a loaded '
      r'machine: load 5\.00 on 2 cores, a CPU probe of 0\.200 s against [\d.]+ s unloaded; load now [\d.]+\); '
      rf'the machine is loaded, rerun with {TIMEOUT_SCALE_ENV}=2', line), line
  monkeypatch.setenv(TIMEOUT_SCALE_ENV, '3')
  assert conftest.timed_out_message(300, 10, '', m).endswith(f'rerun with {TIMEOUT_SCALE_ENV}=6')


def test_a_process_past_its_scaled_limit_is_killed_and_fails_the_test_with_that_line(monkeypatch):
  monkeypatch.setattr(conftest, 'machine_load', lambda: {'load': 4.0, 'cores': 2, 'probe_s': 0.1, 'scale': 2.0})
  sleeper = [sys.executable, '-c', 'import time; print("started", flush=True); time.sleep(60)']
  with pytest.raises(pytest.fail.Exception, match=r'^timed out after 1 s running .* \(a 0\.5 s limit, timeout '
                     r'scaled x2\.00 for a loaded machine: load 4\.00 on 2 cores'):
    conftest.run_within(sleeper, 0.5, capture_output=True, text=True)
  proc = subprocess.Popen(sleeper, stdout=subprocess.PIPE, text=True)
  with pytest.raises(pytest.fail.Exception, match=r'waiting for the sleeper .*rerun with [\s\S]*started'):
    conftest.communicate_within(proc, 0.5, 'waiting for the sleeper')
  assert proc.poll() is not None  # killed
  proc = subprocess.Popen(sleeper, stdout=subprocess.DEVNULL)
  with pytest.raises(pytest.fail.Exception, match='timed out after 1 s waiting'):
    conftest.wait_within(proc, 0.5, 'waiting')
  assert proc.poll() is not None
  assert conftest.run_within([sys.executable, '-c', 'pass'], 0.5 * 60).returncode == 0  # in time: as before
