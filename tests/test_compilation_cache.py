"""config.compilation_cache_dir: where a run keeps XLA's compiled programs, and a later run (or a resume) loading them
instead of compiling, with the same numbers."""
import json
import os
import sys

import jax
import pytest

from conftest import FAST_COMPILE_XLA_FLAGS, run_within
from jaxdecouple import compilation_cache as cache_module
from jaxdecouple.compilation_cache import choose_folder, default_folder, use_compilation_cache

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_folder_is_the_settings_then_jaxs_then_the_users_cache(monkeypatch, tmp_path):
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'xdg'))
  assert default_folder() == str(tmp_path / 'xdg' / 'jaxdecouple' / 'xla')
  monkeypatch.delenv('XDG_CACHE_HOME')
  monkeypatch.setenv('HOME', str(tmp_path / 'home'))
  assert default_folder() == str(tmp_path / 'home' / '.cache' / 'jaxdecouple' / 'xla')
  assert choose_folder('auto', None) == (default_folder(), 'the default')
  assert choose_folder('auto', '/j')[0] == '/j'  # JAX_COMPILATION_CACHE_DIR (or jax.config) given before the run
  assert choose_folder('/mine', '/j') == ('/mine', 'config.compilation_cache_dir')  # the config's own folder wins
  assert choose_folder('~/c', None)[0] == str(tmp_path / 'home' / 'c')
  monkeypatch.chdir(tmp_path)
  assert choose_folder('rel', None)[0] == str(tmp_path / 'rel')  # absolute: JAX would read it from wherever it is
  assert choose_folder('gs://bucket/xla', None)[0] == 'gs://bucket/xla'  # a remote folder goes to JAX as it is
  assert choose_folder('file:///tmp/x', None)[0] == '/tmp/x'  # a local one named as a URL: its path
  assert choose_folder('auto', 'j_rel')[0] == str(tmp_path / 'j_rel')  # JAX's own, relative: absolute too
  assert choose_folder('', '/j')[0] is None
  # JAX's cache turned off before the first run (JAX_ENABLE_COMPILATION_CACHE=false): 'auto' keeps it off, a
  # folder the config names still gets one
  assert choose_folder('auto', '/j', jax_enabled=False)[0] is None
  assert choose_folder('auto', None, jax_enabled=False)[0] is None
  assert choose_folder('/mine', None, jax_enabled=False)[0] == '/mine'


@pytest.fixture
def jax_cache_restored():
  """The session's cache (conftest) as it was after the test, whatever the test pointed JAX at."""
  from jax.experimental.compilation_cache import compilation_cache as cc
  before = jax.config.jax_compilation_cache_dir, jax.config.jax_enable_compilation_cache, dict(cache_module._BEFORE)
  yield
  cc.reset_cache()
  jax.config.update('jax_compilation_cache_dir', before[0])
  jax.config.update('jax_enable_compilation_cache', before[1])
  cache_module._BEFORE.clear()
  cache_module._BEFORE.update(before[2])


def test_runs_in_one_process_each_get_the_folder_they_name(tmp_path, monkeypatch, jax_cache_restored, caplog):
  """A notebook's runs one after another: a run naming a folder gets it (JAX's open cache closed first), '' turns
  the cache off, and 'auto' goes back to JAX's folder as it was before the first run, not the last run's; a remote
  folder is handed over untouched (no local folder made for it); 'auto' where JAX's cache was turned off before the
  first run stays without one; the default folder unwritable warns and the run goes on without a cache. After each
  switch a small program is compiled: its entry lands in the folder of the run under way and in no other (JAX's
  open cache and its once-per-process answer to "is a cache used" are reset at each switch, or the entries would
  go on landing in the first folder, or nowhere after a '')."""
  first = cache_module._BEFORE.get('folder', jax.config.jax_compilation_cache_dir)
  a, b = str(tmp_path / 'a'), str(tmp_path / 'b')
  entries = lambda folder: sorted(os.listdir(folder)) if os.path.isdir(folder) else []
  constants = iter(range(1, 100))

  def compile_one():  # a program no earlier compilation made (its constant is new), kept whatever its compile
    # time (conftest sets the session's minimum to 0)
    c = float(next(constants)) + 0.25
    jax.jit(lambda x: x * c + 7.5).lower(1.0).compile()
  assert use_compilation_cache(a) == a and jax.config.jax_compilation_cache_dir == a and os.path.isdir(a)
  compile_one()
  in_a = entries(a)
  assert in_a
  assert use_compilation_cache(b) == b and jax.config.jax_compilation_cache_dir == b
  compile_one()
  assert entries(a) == in_a and entries(b)
  in_b = entries(b)
  assert use_compilation_cache('') is None and not jax.config.jax_enable_compilation_cache
  compile_one()
  assert entries(a) == in_a and entries(b) == in_b
  assert use_compilation_cache(a) == a
  compile_one()
  assert len(entries(a)) > len(in_a) and entries(b) == in_b  # on again after '': into the folder named now
  assert use_compilation_cache('auto') == first and jax.config.jax_enable_compilation_cache
  monkeypatch.setitem(cache_module._BEFORE, 'enabled', False)  # JAX_ENABLE_COMPILATION_CACHE=false before the run
  with caplog.at_level('INFO'):
    assert use_compilation_cache('auto') is None and not jax.config.jax_enable_compilation_cache
  assert any('compilation cache: none (JAX_ENABLE_COMPILATION_CACHE=false' in r.getMessage() for r in caplog.records)
  monkeypatch.setitem(cache_module._BEFORE, 'enabled', True)
  monkeypatch.chdir(tmp_path)
  assert use_compilation_cache('gs://bucket/xla') == 'gs://bucket/xla' and not os.path.exists(tmp_path / 'gs:')
  blocker = tmp_path / 'a_file'
  blocker.write_text('x')
  monkeypatch.setenv('XDG_CACHE_HOME', str(blocker))
  monkeypatch.setitem(cache_module._BEFORE, 'folder', None)  # as on a machine where JAX was given no folder
  with caplog.at_level('WARNING'):
    assert use_compilation_cache('auto') is None and not jax.config.jax_enable_compilation_cache
  assert any('compilation cache: none: ' in r.getMessage() and 'cannot be written' in r.getMessage()
             for r in caplog.records), caplog.text


def run(tmp_path, name, cache_setting, env_folder=None):
  """main.py's quickstart on synthetic data, 6 steps; (its log, its last evaluation without times)."""
  env = {k: v for k, v in os.environ.items() if k != 'JAX_COMPILATION_CACHE_DIR'}
  env.update({'JAX_PLATFORMS': 'cpu', 'XLA_FLAGS': FAST_COMPILE_XLA_FLAGS,
              'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS': '0'})  # the tiny programs compile in well under 1 s
  if env_folder:
    env['JAX_COMPILATION_CACHE_DIR'] = env_folder
  workdir = tmp_path / name
  proc = run_within([sys.executable, os.path.join(ROOT, 'main.py'), '--config=configs/quickstart.py',
                     '--config.data.source=synthetic', '--config.batch_size=32', '--config.max_steps=6',
                     '--config.cpu_devices=1', f'--config.compilation_cache_dir={cache_setting}',
                     f'--workdir={workdir}'], 240, f'main.py ({name})', cwd=ROOT, env=env, capture_output=True,
                    text=True)
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(workdir / 'metrics.jsonl', encoding='utf-8') as f:
    evals = [json.loads(line) for line in f if '"eval"' in line]
  times = ('time', 'epoch_time_s', 'eval_time_s', 'train_images_per_sec', 'whole_run_seconds')
  return proc.stderr, {k: v for k, v in evals[-1].items() if k not in times}


def first_step(log):
  """(loaded, compiled) from the first-step line."""
  line = next(line for line in log.splitlines() if 'first step (compilation included)' in line)
  words = line.split('(')[-1].split()
  assert words[1] in ('program', 'programs') and words[2:6] == ['loaded', 'from', 'the', 'compilation'] \
      and words[-1] == 'compiled)', line
  return int(words[0]), int(words[-2])


def test_a_second_run_loads_the_first_runs_programs_and_ends_bit_for_bit_alike(tmp_path):
  """A run writes its programs into the folder it is given; a second run of the same config (a fresh workdir, as a
  study's next seed or a resume would) loads every program its first step needs from there, compiling none, and
  ends with the same numbers bit for bit. The second run reaches the folder through JAX_COMPILATION_CACHE_DIR with
  the default setting (auto). With '' no cache is used (no line counts any)."""
  folder = str(tmp_path / 'xla')
  log1, end1 = run(tmp_path, 'first', folder)
  assert f'compilation cache: {folder} (config.compilation_cache_dir; 0 MB)' in log1, log1[-3000:]
  loaded, compiled = first_step(log1)
  assert loaded == 0 and compiled > 0 and len(os.listdir(folder)) >= compiled, (loaded, compiled, os.listdir(folder))
  log2, end2 = run(tmp_path, 'second', 'auto', env_folder=folder)
  assert f'compilation cache: {folder} (JAX_COMPILATION_CACHE_DIR' in log2, log2[-3000:]
  assert first_step(log2) == (compiled, 0), log2[-3000:]
  assert end2 == end1
  log3, end3 = run(tmp_path, 'none', '', env_folder=folder)
  assert "compilation cache: none (config.compilation_cache_dir='')" in log3, log3[-3000:]
  line = next(line for line in log3.splitlines() if 'first step (compilation included)' in line)
  assert 'loaded' not in line and end3 == end1, line
