"""The suite cleans up after itself: a run leaves no compilation cache and no passed test's tmp_path folder
in the temporary folder (9 GB had piled up in /tmp on one machine before: docs/TESTING.md, "Disk")."""
import os
import sys

from conftest import run_within

HERE = os.path.dirname(os.path.abspath(__file__))


def test_a_run_leaves_nothing_in_the_temporary_folder_but_failed_tests_folders(tmp_path):
  scratch = tmp_path / 'tmp'
  scratch.mkdir()
  (tmp_path / 'test_inner.py').write_text(
      'def test_passes(tmp_path):\n  (tmp_path / "checkpoint").write_bytes(b"x" * 1000)\n\n'
      'def test_fails(tmp_path):\n  (tmp_path / "log").write_text("kept")\n  assert False\n')
  env = {k: v for k, v in os.environ.items() if k != 'JAXDECOUPLE_TEST_XLA_CACHE'}  # the inner run makes its own
  env['TMPDIR'] = str(scratch)
  # the inner run uses this suite's conftest (its compilation cache) and pyproject.toml (the retention policy)
  (tmp_path / 'conftest.py').write_text(
      'import importlib.util\n'
      f'spec = importlib.util.spec_from_file_location("suite_conftest", {os.path.join(HERE, "conftest.py")!r})\n'
      'spec.loader.exec_module(importlib.util.module_from_spec(spec))\n')
  out = run_within([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider',
                    '-c', os.path.join(os.path.dirname(HERE), 'pyproject.toml'), '--rootdir', str(tmp_path),
                    str(tmp_path / 'test_inner.py')], 300, 'the inner pytest run', env=env, cwd=str(tmp_path),
                   capture_output=True, text=True)
  assert '1 failed, 1 passed' in out.stdout, out.stdout[-2000:]
  left = sorted(str(p.relative_to(scratch)) for p in scratch.rglob('*'))
  assert not [p for p in left if 'jaxdecouple-tests-xla' in p], left
  # pytest's base folder keeps the failed test's folder, and only that
  assert any(p.endswith('test_fails0/log') for p in left) and not any('test_passes' in p for p in left), left


def test_the_cpu_log_counts_jaxs_phases_and_the_programs_built_again(tmp_path):
  """JAXDECOUPLE_TEST_CPU_LOG=FILE: one line per test with its CPU seconds, the seconds JAX traced, lowered and
  compiled, and how many programs were identical to one the process built before (docs/TESTING.md). Two tests
  each jit a closure of their own over the same arithmetic: the second builds the first's program again."""
  (tmp_path / 'test_inner.py').write_text(
      'import jax, jax.numpy as jnp\n\n'
      'def closure():\n  return jax.jit(lambda x: jnp.sin(x) * 3 + 1)\n\n'
      'def test_first():\n  closure()(jnp.ones(7)).block_until_ready()\n\n'
      'def test_again():\n  closure()(jnp.ones(7)).block_until_ready()\n')
  (tmp_path / 'conftest.py').write_text(  # the suite's conftest, its hooks this run's
      'import importlib.util\n'
      f'spec = importlib.util.spec_from_file_location("suite_conftest", {os.path.join(HERE, "conftest.py")!r})\n'
      'suite = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(suite)\n'
      'pytest_runtest_protocol = suite.pytest_runtest_protocol\n')
  log = tmp_path / 'cpu.jsonl'
  env = {**os.environ, 'JAXDECOUPLE_TEST_CPU_LOG': str(log)}
  out = run_within([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', '--rootdir', str(tmp_path),
                    str(tmp_path / 'test_inner.py')], 300, 'the inner pytest run', env=env, cwd=str(tmp_path),
                   capture_output=True, text=True)
  assert '2 passed' in out.stdout, out.stdout[-2000:]
  import json
  lines = {json.loads(line)['test'].split('::')[-1]: json.loads(line) for line in log.read_text().splitlines()}
  first, again = lines['test_first'], lines['test_again']
  assert first['cpu_s'] > 0 and first['trace_s'] + first['lower_s'] + first['compile_s'] > 0
  assert all(again[k] >= 0 for k in ('trace_s', 'lower_s', 'compile_s'))
  if 'rebuilt' in first:  # this JAX has the hook: the second test's program is the first one's, built again
    assert again['rebuilt'] >= 1, (first, again)
