"""The run's folder: checked before any compute, held by one run at a time, and on resume held to the
config its checkpoints were made with.

``open_workdir(config, workdir, process)`` does all three and returns the lock (release it at the end):

- the folder must be a writable directory (it is created if missing);
- ``WORKDIR/lock`` (``lock.process_P`` in multi-process runs) is locked with ``flock`` while the run
  lives and names its holder (host, pid); a second run on the folder stops with one line naming the
  holder. The kernel drops the lock when its process dies, so the lock of a killed run is taken over,
  with a warning naming the dead holder;
- when the folder already has checkpoints, every config field that changes what is computed must equal
  the one in its ``config.json``; the fields in :data:`MAY_CHANGE_ON_RESUME` may differ.
"""
from __future__ import annotations

import datetime
import fcntl
import json
import os
import socket

from absl import logging

from jaxdecouple.errors import CheckpointError, WorkdirError, WorkdirInUseError

# Fields that may differ between a run and its resume: how long it runs, what it logs and keeps, where
# the data and the other processes are, how the work is placed on devices (placement does not change
# the numbers). A longer num_epochs continues with the new config's learning-rate schedule.
MAY_CHANGE_ON_RESUME = (
    'num_epochs', 'max_steps', 'eval_every_epochs', 'eval_batch_size', 'log_every_steps',
    'checkpoint_every_steps', 'keep_checkpoints', 'profile_every_steps', 'pipeline.diagnose_every_steps',
    'cpu_devices', 'compilation_cache_dir', 'split_backward', 'dp.num_devices', 'pipeline.num_devices', 'replica.num_devices',
    'replica.skip', 'replica.worker_speeds', 'data.path', 'data.idx_dir', 'data.tfds_data_dir', 'data.tfds_download',
    'data.tfds_manual_dir', 'data.workers', 'data.prefetch', 'data.imagenet_v2', 'data.imagenet_v2_dir',
    'distributed.coordinator', 'distributed.transfer_address', 'distributed.process_id', 'resume_changes',
    'distributed.startup_timeout_s', 'distributed.data_timeout_s', 'distributed.heartbeat_timeout_s',
    'distributed.stall_timeout_s',
)


def flat(tree: dict, prefix: str = '') -> dict:
  """A nested config dict as {'a.b.c': value} (the workdir's resume check, the processes' agreement)."""
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      out.update(flat(value, f'{prefix}{key}.'))
    else:
      out[prefix + key] = value
  return out


def checkpoint_steps(workdir: str) -> set[int]:
  """The steps WORKDIR/checkpoints holds (orbax's STEP folders or per-process STEP.npz files), by their names:
  what a resume could start from, not checked (a damaged one is found on restoring)."""
  root = os.path.join(workdir, 'checkpoints')
  if not os.path.isdir(root):
    return set()
  steps = set()
  for name in os.listdir(root):
    if name.isdigit():
      steps.add(int(name))
    sub = os.path.join(root, name)
    if name.startswith('process_') and os.path.isdir(sub):
      steps.update(int(f[:-4]) for f in os.listdir(sub) if f.endswith('.npz') and f[:-4].isdigit())
  return steps


def has_checkpoints(workdir: str) -> bool:
  """Whether WORKDIR/checkpoints holds a step."""
  return bool(checkpoint_steps(workdir))


def config_differences(saved: dict, config) -> list[str]:
  """'field saved -> now' for every field that changes what is computed and differs from ``saved``
  (a config.json). Fields that one side lacks (another version of jaxdecouple) are not compared."""
  now = flat(json.loads(config.to_json_best_effort()))
  saved = flat(saved)
  out = []
  for field in sorted(set(now) & set(saved)):
    if field in MAY_CHANGE_ON_RESUME:
      continue
    a, b = saved[field], now[field]
    if isinstance(a, list) and isinstance(b, list):
      a, b = tuple(a), tuple(b)
    if a != b and not (isinstance(a, (int, float)) and isinstance(b, (int, float)) and float(a) == float(b)):
      out.append(f'{field} {json.dumps(saved[field])} -> {json.dumps(now[field])}')
  return out


def check_resume(config, workdir: str) -> None:
  """Refuses (CheckpointError, one line) to resume checkpoints made with a config that computes
  something else; reads only, so a refused resume leaves the folder as it was."""
  path = os.path.join(workdir, 'config.json')
  if not has_checkpoints(workdir):
    return
  if not os.path.exists(path):
    logging.warning('%s has checkpoints but no config.json: only the arrays\' shapes can be checked on resume',
                    workdir)
    return
  try:
    with open(path, encoding='utf-8') as f:
      saved = json.load(f)
  except (OSError, ValueError) as e:
    raise CheckpointError(f'{path} cannot be read ({type(e).__name__}: {e}), so resuming its checkpoints cannot '
                          'be checked; restore that file, or use another --workdir') from e
  differ = config_differences(saved, config)
  allowed = {f.strip() for f in config.resume_changes.split(',')}
  changed = [d for d in differ if d.split(' ', 1)[0] in allowed]
  differ = [d for d in differ if d not in changed]
  if differ:
    fields = ','.join(d.split(' ', 1)[0] for d in differ)
    raise CheckpointError(
        f'the checkpoints in {workdir} were made with another config: {"; ".join(differ)}. These fields change '
        f'what is computed: resume with the values in {path}, use another --workdir, or, to change them on '
        f'purpose, add --config.resume_changes={fields}')
  if changed:
    logging.warning('resuming with changed fields (config.resume_changes): %s', '; '.join(changed))


def write_config(config, workdir: str) -> None:
  """config.json, written whole or not at all (processes sharing a workdir may write it at once)."""
  path = os.path.join(workdir, 'config.json')
  with open(f'{path}.{os.getpid()}.tmp', 'w', encoding='utf-8') as f:
    f.write(config.to_json_best_effort(indent=2))
  os.replace(f'{path}.{os.getpid()}.tmp', path)


def _probe(folder: str, what: str) -> None:
  """Creates ``folder`` if needed and writes a file in it, or stops with one line saying why not."""
  if os.path.exists(folder) and not os.path.isdir(folder):
    raise WorkdirError(f'{what} {folder} is a file, not a folder: move it away, or use another --workdir')
  try:
    os.makedirs(folder, exist_ok=True)
    probe = os.path.join(folder, f'.write-test-{socket.gethostname()}-{os.getpid()}')
    with open(probe, 'w', encoding='utf-8') as f:
      f.write('ok')
    os.remove(probe)
  except OSError as e:
    raise WorkdirError(f'cannot write in {what} {folder} ({e.strerror or type(e).__name__}): make it writable, '
                       'or use another --workdir') from e


class WorkdirLock:
  """One run per folder: an ``flock``-ed file naming its holder while the run lives."""

  def __init__(self, workdir: str, process: int | None = None):
    self.path = os.path.join(workdir, 'lock' if process is None else f'lock.process_{process}')
    self._fd = None

  def acquire(self) -> 'WorkdirLock':
    fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
      holder = os.read(fd, 1000).decode('utf-8', 'replace').strip() or 'another process'
      os.close(fd)
      raise WorkdirInUseError(f'{os.path.dirname(self.path)} is in use by another run ({holder}): wait for it to end, '
                         'or give this run another --workdir') from None
    previous = os.read(fd, 1000).decode('utf-8', 'replace').strip()
    if previous:  # a holder that never released it: killed (the kernel dropped its lock)
      logging.warning('took over %s from a run that is no longer running (%s)', self.path, previous)
    os.ftruncate(fd, 0)
    os.pwrite(fd, (f'host {socket.gethostname()}, pid {os.getpid()}, since '
                   f'{datetime.datetime.now().isoformat(timespec="seconds")}\n').encode(), 0)
    self._fd = fd
    return self

  def release(self) -> None:
    if self._fd is not None:
      os.ftruncate(self._fd, 0)  # empty: released cleanly (a name left in it means its holder died)
      fcntl.flock(self._fd, fcntl.LOCK_UN)
      os.close(self._fd)
      self._fd = None


def open_workdir(config, workdir: str, process: int | None = None) -> WorkdirLock:
  """Checks, creates and locks the run's folder; refuses a resume that would compute something else.
  ``process``: this process's index in a multi-process run (each process locks its own file)."""
  if not workdir.strip():
    raise WorkdirError('the workdir is empty: give a folder')
  check_resume(config, workdir)
  _probe(workdir, 'the workdir')
  lock = WorkdirLock(workdir, process).acquire()
  try:
    check_resume(config, workdir)  # again, now that no other run can change it
    _probe(os.path.join(workdir, 'checkpoints'), 'the checkpoint folder')
  except Exception:
    lock.release()
    raise
  return lock
