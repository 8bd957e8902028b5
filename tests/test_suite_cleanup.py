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
