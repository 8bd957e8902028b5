"""Runs ``main.py`` on many command lines quickly: imports it (and JAX) once, then runs each case in a
forked child, as a fresh ``python main.py ARGS`` would, with its own stdout/stderr files and exit status.

    python tests/bad_input_driver.py CASES.json RESULTS.json

CASES.json: a list of {"id", "argv", "cwd", "timeout"}. RESULTS.json: per id, {"rc", "output", "seconds"};
rc is None when the case ran past its timeout (it was killed: a hang).
"""
import json
import os
import signal
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import jax  # noqa: E402,F401  (imported, not started: each child starts its own backend)
from absl import app  # noqa: E402

import main  # noqa: E402
import jaxdecouple.train  # noqa: E402,F401


def run_case(case: dict, out_path: str) -> int | None:
  pid = os.fork()
  if pid == 0:  # the child: main.py as a command line would run it
    code = 1
    try:
      os.chdir(case.get('cwd') or ROOT)
      fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
      os.dup2(fd, 1)
      os.dup2(fd, 2)
      sys.argv = ['main.py', *case['argv']]
      app.run(main.main, flags_parser=main.parse_flags)
      code = 0
    except SystemExit as e:
      code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001  an uncaught exception: what Python prints, status 1
      import traceback
      traceback.print_exc()
    finally:
      sys.stdout.flush()
      sys.stderr.flush()
      os._exit(code)
  deadline = time.monotonic() + case.get('timeout', 60)
  while time.monotonic() < deadline:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
      return os.waitstatus_to_exitcode(status)
    time.sleep(0.02)
  os.kill(pid, signal.SIGKILL)
  os.waitpid(pid, 0)
  return None


def main_(cases_path: str, results_path: str) -> None:
  with open(cases_path, encoding='utf-8') as f:
    cases = json.load(f)
  results = {}
  for case in cases:
    out_path = f'{results_path}.{len(results)}.out'
    start = time.monotonic()
    rc = run_case(case, out_path)
    with open(out_path, encoding='utf-8', errors='replace') as f:
      results[case['id']] = {'rc': rc, 'output': f.read(), 'seconds': round(time.monotonic() - start, 2)}
  with open(results_path, 'w', encoding='utf-8') as f:
    json.dump(results, f, indent=1)


if __name__ == '__main__':
  main_(*sys.argv[1:])
