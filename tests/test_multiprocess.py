"""The replica engine over 2 processes with 2 CPU devices each (jax.distributed on loopback, gloo
collectives) gives the parameters of 4 devices in one process. The run is ResIST with DiLoCo's outer
optimizer: everything plain averaging moves (blocks between processes, the shared layers' all-reduce, the
checkpoint's shards) plus the outer state, whose momentum travels with the blocks; the one-process run
it is compared with is itself checked against the sequential reference (test_outer.py)."""
import os
import socket
import sys

import jax
import numpy as np


HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from conftest import FAST_COMPILE_XLA_FLAGS, communicate_within, logged_output, start_logged  # noqa: E402


def free_port() -> int:
  """A coordinator port P with P + 1 and P + 2 free too: the processes' transfer ports (2 processes)."""
  for _ in range(100):
    with socket.socket() as s:
      s.bind(('127.0.0.1', 0))
      port = s.getsockname()[1]
    if port + 2 < 65536 and all(_free(port + k) for k in (1, 2)):
      return port
  raise RuntimeError('no three consecutive free ports on 127.0.0.1')


def _free(port: int) -> bool:
  with socket.socket() as s:
    try:
      s.bind(('127.0.0.1', port))
    except OSError:
      return False
  return True


def test_two_processes_match_one_process_with_four_devices(tmp_path, resist_outer_run):
  port, workdir = free_port(), str(tmp_path / 'mp')
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu', 'XLA_FLAGS': FAST_COMPILE_XLA_FLAGS,  # the three runs in each
         'JAX_COMPILATION_CACHE_DIR': str(tmp_path / 'xla'), 'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS': '0',
         'JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES': '0'}  # process compile the same programs: compiled once
  procs = [start_logged([sys.executable, os.path.join(HERE, 'multiprocess_worker.py'), str(i), str(port),
                         workdir, str(tmp_path / f'p{i}.npz'), 'outer'], str(tmp_path / f'p{i}.log'), env=env)
           for i in range(2)]
  try:
    logs = [communicate_within(p, 300, f'waiting for process {i} to end')[0] for i, p in enumerate(procs)]
  except BaseException as e:  # a process past its limit: every process's output, to see where each one was
    for p in procs:
      p.kill()
    raise AssertionError(f'{e}\n' + '\n'.join(f'--- process {i}:\n{(logged_output(p)[0] or "")[-4000:]}'
                                                for i, p in enumerate(procs))) from e
  finally:
    for p in procs:
      p.kill()
  assert [p.returncode for p in procs] == [0, 0], '\n'.join(log[-3000:] for log in logs)
  single = resist_outer_run  # replica_run_config(outer=True) on the 4 devices of this process
  want = {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(single.variables)[0]}
  for i in range(2):
    got = np.load(tmp_path / f'p{i}.npz')
    assert got['__devices__'].tolist() == [4, 2, 2]
    assert got['__resumed__'].tolist() == [7, 0]  # resumed to step 7, no checkpoint found damaged
    # process 1's part of step 7 unreadable: both skipped it, redid steps 5 to 7 alike (bit for bit), and the
    # step was set aside once, with each process's checksums
    assert got['__redone__'].tolist() == [7, 0], got['__redone__']
    assert got['__moved__'].tolist() == ['7.damaged'], got['__moved__']
    for key, value in want.items():  # gloo's reductions round differently: see test_resist's note
      err = float(np.max(np.abs(got[key] - value))) / max(float(np.max(np.abs(value))), 0.1)
      assert err <= 2e-4, f'{key}: relative error {err:.3g}'
    assert abs(float(got['__accuracy__']) - single.last_eval['test_accuracy']) <= 1 / 64  # one image
  assert os.path.exists(os.path.join(workdir, 'metrics.jsonl'))  # written once, by process 0
  assert 'checkpoint at step 7 is damaged in process 1' in logs[0], logs[0][-3000:]  # process 0's own part intact
  assert 'checkpoint at step 7 is damaged or incomplete' in logs[1], logs[1][-3000:]
