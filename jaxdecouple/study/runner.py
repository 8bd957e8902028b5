"""Running a study: one process or several sharing a workdir (claims, core pinning), each run's own log."""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import re
import shutil
import socket
import statistics
import time
from typing import Callable, NamedTuple

from jaxdecouple.study.core import FINISHED_NEEDS, Study, is_finished, read_record, run_dir, warn_once
from jaxdecouple.study.left import BASIS_WORDS, run_estimates


def _alive(pid) -> bool:
  try:
    os.kill(int(pid), 0)
  except (OSError, TypeError, ValueError):
    return False
  return True


def _boot() -> str:
  """This boot of this machine (Linux), '' elsewhere: cloud machines share host names ('vm'), and a claim left by
  a machine stopped with its disk kept must not be taken for a live process whose pid happens to match."""
  try:
    with open('/proc/sys/kernel/random/boot_id', encoding='ascii') as f:
      return f.read().strip()
  except OSError:
    return ''


def _this_process() -> dict:
  return {'host': socket.gethostname(), 'pid': os.getpid(), **({'boot': b} if (b := _boot()) else {})}


def _live_other(other, me: dict) -> bool:
  """Whether a claim read from a run's folder is another process's, on this host, still alive: the one kind
  of claim a process must leave alone (a claim from another host is a stopped machine's)."""
  return (isinstance(other, dict) and other != me and other.get('host') == me['host']
          and other.get('boot', me.get('boot')) == me.get('boot') and _alive(other.get('pid')))


def claim(where: str) -> dict | None:
  """Claims the run in ``where`` for this process; returns the claim of the live process on this
  host that already holds it (then this one must pass over it), else None. A claim whose process is
  gone, or from another host (a machine that stopped), is taken over."""
  path = os.path.join(where, 'running.json')
  me = _this_process()
  for _ in range(2):
    # The claim appears whole or not at all: written to a file of this process's own, then linked to its
    # name (which fails if the name exists). A claim created empty and written after would let a second
    # process read it half-made, take it for a dead one's and claim the run too.
    mine = f'{path}.{me["host"]}.{me["pid"]}'
    with open(mine, 'w', encoding='utf-8') as f:
      json.dump(me, f)
    try:
      os.link(mine, path)
    except FileExistsError:
      try:
        with open(path, encoding='utf-8') as f:
          other = json.load(f)
      except (OSError, ValueError):
        other = {}
      if other == me:
        return None
      if _live_other(other, me):
        return other
      with contextlib.suppress(FileNotFoundError):  # another process may have removed it first
        os.remove(path)
      continue
    finally:
      os.remove(mine)
    return None
  return {'host': '?', 'pid': '?'}  # lost a race for it twice: leave it to the other process


def held_elsewhere(where: str) -> dict | None:
  """The claim of another live process on this host that holds the run in ``where``, else None; reads only
  (``claim`` takes a run, and settles a race for it)."""
  try:
    with open(os.path.join(where, 'running.json'), encoding='utf-8') as f:
      other = json.load(f)
  except (OSError, ValueError):
    return None
  return other if _live_other(other, _this_process()) else None


# A run teaches this machine's pace only if this call ran at least this share of its steps: a resumed run's
# start-up (restoring, compiling: a minute or so) counts in its measured time, and would swamp a short remainder.
PACE_MIN_SHARE = 0.25


def _pace_here(paced: list[float]) -> float:
  """This machine's pace against the records' machines: the median, over the runs this call ran (whole, or
  resumed for at least ``PACE_MIN_SHARE`` of their steps), of the seconds measured here over the seconds their
  cells' other seeds took for the same steps (a model from what it measured)."""
  return statistics.median(paced)


def _pace_words(paced: list[float]) -> str:
  if not paced:
    return ''
  return (f'; estimates from other runs\' records scaled by {_pace_here(paced):.3g}, this machine\'s time over the '
          f'records\' for the same work ({"the median of " if len(paced) > 1 else ""}{len(paced)} '
          f'run{"s" if len(paced) > 1 else ""} this call ran, against {"their" if len(paced) > 1 else "its"} '
          f'cell\'s other seeds)')


def release(where: str) -> None:
  with contextlib.suppress(FileNotFoundError):
    os.remove(os.path.join(where, 'running.json'))


def pin(job: int, jobs: int) -> None:
  """Restricts this process to the ``job``-th of ``jobs`` equal shares of the CPU cores it may use
  (nothing where the platform cannot, or with fewer cores than jobs)."""
  if not hasattr(os, 'sched_setaffinity'):
    return
  cpus = sorted(os.sched_getaffinity(0))
  if jobs > len(cpus):
    return
  os.sched_setaffinity(0, cpus[job * len(cpus) // jobs:(job + 1) * len(cpus) // jobs])


def machine() -> dict:
  import jax
  d = jax.devices()[0]
  cpu = platform.processor() or platform.machine()
  try:
    with open('/proc/cpuinfo', encoding='utf-8') as f:
      cpu = next(line.split(':', 1)[1].strip() for line in f if line.startswith('model name'))
  except (OSError, StopIteration):
    pass
  return {'platform': d.platform, 'device': d.device_kind, 'devices': jax.device_count(),
          'cpu': cpu, 'cpu_count': os.cpu_count(),
          'jax': jax.__version__, 'python': platform.python_version()}


@contextlib.contextmanager
def _progress_to(path: str, console: bool = True):
  """Writes the run's progress lines (start-up, loss, images/s, ETA, evaluations) into its own log file
  (appended: an interrupted run's pieces follow one another) and, unless ``console`` is False (a --jobs
  helper, whose lines would interleave with the first process's), also wherever logging goes."""
  import logging as logging_std
  from absl import logging
  from jaxdecouple.writers import quiet_library_logs
  handler = logging_std.FileHandler(path, encoding='utf-8')
  handler.setFormatter(logging_std.Formatter('%(asctime)s %(message)s', '%Y-%m-%d %H:%M:%S'))
  quiet_library_logs(handler)
  logger, verbosity = logging.get_absl_logger(), logging.get_verbosity()
  propagate = logger.propagate
  logger.addHandler(handler)
  logger.propagate = propagate and console
  logging.set_verbosity(max(verbosity, logging.INFO))
  try:
    yield
  finally:
    logging.set_verbosity(verbosity)
    logger.propagate = propagate
    logger.removeHandler(handler)
    handler.close()


def whole_run_seconds(study: Study, workdir: str) -> list[float]:
  """The wall times of the study's finished runs that ran from start to end in one call."""
  seconds = []
  for run in study.runs:
    record, _ = read_record(workdir, run, 'finished.json', FINISHED_NEEDS)  # a damaged one: said by run_study
    if record is not None and isinstance(s := record.get('whole_run_seconds'), (int, float)) and s:
      seconds.append(s)
  return seconds


def _write_record(where: str, name: str, record: dict) -> None:
  """A run's record (finished.json, diverged.json) written whole or not at all: a process killed while
  writing it leaves no empty or cut record behind."""
  path = os.path.join(where, name)
  with open(f'{path}.{os.getpid()}.tmp', 'w', encoding='utf-8') as f:
    json.dump(record, f)
    f.flush()
    os.fsync(f.fileno())  # on the disk before the run's checkpoints are deleted: a machine's hard stop just after
  os.replace(f'{path}.{os.getpid()}.tmp', path)  # must not leave an empty record and no checkpoint
  with contextlib.suppress(OSError):  # the folder's entry too (where a folder can be opened: not Windows)
    folder = os.open(where, os.O_RDONLY)
    try:
      os.fsync(folder)
    finally:
      os.close(folder)


class _Outcome(NamedTuple):
  """What the runner needs of a run's RunResult: holding the RunResult itself would keep the run's state (a
  pipeline's in-flight activations and stashed backward inputs: 7-11 GB for the GPT of cpu_gpt_async at K = 4)
  alive through the next run, which then met two runs' memory (a runner was killed for it on a 24 GB host)."""
  finished: bool
  step: int
  last_eval: dict | None
  stop_requested: bool
  start_step: int
  total_steps: int


def _outcome(result) -> _Outcome:
  # finished with its figures: a run resumed at its end and stopped as it started up has not evaluated yet, so it
  # is left as stopped (its checkpoints kept, the next call evaluates it), never recorded without them
  done = result.finished and all(k in (result.last_eval or {}) for k in FINISHED_NEEDS)
  return _Outcome(done, result.step, result.last_eval, result.stop_requested, result.start_step, result.total_steps)


def _free_memory() -> None:
  """Between runs: drop what the last run left for the garbage collector and JAX's caches of compiled programs
  (a run's jitted functions are its own; the next run compiles its own)."""
  import gc
  import jax
  gc.collect()
  jax.clear_caches()


def run_study(study: Study, workdir: str, data_path: str = '', max_runs: int = 0,
              time_limit_s: float = 0.0, log: Callable[[str], None] = print,
              keep_checkpoints: bool = False, console: bool = True, finish_by_s: float = 0.0,
              estimate_from: Study | None = None) -> dict:
  """Runs the study's unfinished runs in order; returns counts of finished, run and left runs.

  ``time_limit_s``: start no run after that many seconds. ``finish_by_s``: start no run that would not
  end within that many seconds of the call's start, going by its own estimate (``left.run_estimates``: a run
  under way at its own pace, else the median of the finished runs of its table cell, row, column or study, on
  whatever machines ran them; of ``estimate_from``'s runs, the whole study where ``study`` is a part of it chosen
  by ``--runs``); a run that would not fit is passed over and a later, shorter one may start, so a session of a
  few hours finishes what it can instead of starting a run it would lose. A run with nothing to go by (no run
  finished or under way) starts while the time is not up. For machines that stop at a fixed time, or are
  replaced between sessions, where a run cut short loses its checkpoints. Those records come from whatever
  machines ran them, a replaced one two or three times faster or slower than this one: once this call has run
  a run whose cell's other seeds finished (the same work, on the records' machines), its measured time over
  their median, for the share of the run's steps this call ran (whole, or resumed for at least
  ``PACE_MIN_SHARE``: a session that starts by finishing the runs the last one left learns from them), scales
  the records' estimates for the runs after it (the median over such runs, ``_pace_here``; a row's other methods
  did other work, and teach nothing). A run's own pace is not scaled (it is a machine's already), and a run
  with no estimate in the records goes by them as they are then (this machine's runs). When a pass over the runs
  has learnt a pace by which a run it passed over for its time would now fit, those runs (only they) are judged
  again by the scaled estimates, pass after pass while each teaches more; the closing line names the shortest run
  left out at the pace the call ended with.
  A finished run's checkpoints are deleted unless ``keep_checkpoints`` (the report needs only its
  metrics; a pipeline method's checkpoint holds the in-flight activations: 200-430 MB for ResNet-20).
  A run that cannot go on (its config.json or all its checkpoints damaged: a CheckpointError or WorkdirError)
  or whose finished.json or diverged.json is damaged is passed over with one line naming it; the study goes
  on. Any other error (data not found, a bad config, a full disk) stops the study: every run would meet it."""
  from jaxdecouple.errors import (CheckpointError, CheckpointWriteError, DivergenceError, WorkdirError,
                                  WorkdirInUseError)
  from jaxdecouple.config import set_fields
  from jaxdecouple.train import train_and_evaluate
  start, ran = time.time(), 0
  # (ran when estimated, the estimates); the runs passed over for finish_by_s: name -> (seconds, basis, and
  # whether this machine's pace scales that estimate), as last judged
  estimated, too_long = (-1, {}), {}
  # this machine's pace: measured / estimated seconds of the runs this call ran, each against its estimate from
  # the finished runs' records this call found (``found``: a later estimate would mix in this machine's own runs)
  found, paced, before = None, [], None
  passes = 0
  while True:  # passes: once this machine's pace is learnt, the runs passed over by the records' estimates are
    # judged again by the scaled ones (a run that did not fit at the records' pace may fit at this machine's)
    learnt, stop, again = len(paced), False, set(too_long) if passes else None
    passes += 1
    for i, run in enumerate(study.runs):
      if again is not None and run.name not in again:  # a later pass: only the runs passed over for their time
        continue
      judged = too_long.pop(run.name, None)  # judged again here (or finished, or passed over for another reason)
      finished, wrong = read_record(workdir, run, 'finished.json', FINISHED_NEEDS)
      if finished is not None:
        continue
      if wrong:  # its training ended (a finished run's checkpoints are gone): a rerun would start it afresh
        warn_once(workdir, run, 'finished.json', f'{wrong}; passed over (remove that file to run it again)', log,
                  always=True)
        continue
      record, wrong = read_record(workdir, run, 'diverged.json')
      if wrong:
        warn_once(workdir, run, 'diverged.json', f'{wrong}; passed over (remove that file to run it again)', log,
                  always=True)
        continue
      if record is not None:  # deterministic: running it again diverges again
        log(f'[{i + 1}/{len(study.runs)}] {run.name} diverged at step {record.get("step")}; passed over (remove its '
            'diverged.json to run it again)')
        continue
      if (max_runs and ran >= max_runs) or (time_limit_s and time.time() - start > time_limit_s):
        if judged:  # not judged again after all: as the last pass judged it
          too_long[run.name] = judged
        stop = True
        break
      chosen = run.choose(workdir) if run.choose is not None else {}
      if chosen is None:
        log(f'[{i + 1}/{len(study.runs)}] {run.name}: its settings come from {run.waits_for or "other runs"}, not all '
            'finished yet; passed over')
        continue
      where = run_dir(workdir, run)
      if finish_by_s:
        if holder := held_elsewhere(where):  # under way in another process: not this one's to judge or start
          log(f'[{i + 1}/{len(study.runs)}] {run.name}: being run by process {holder["pid"]}, passed over')
          continue
        if estimated[0] != ran:  # a run finished (or diverged) since: one more to go by
          estimated = (ran, run_estimates(estimate_from or study, workdir))
          found = run_estimates(estimate_from or study, workdir, under_way=False) if found is None else found
        guess = estimated[1].get(run.name) or (0.0, None)  # nothing to go by: it starts while there is time
        before = found.get(run.name)  # the records' estimate of the whole run, which this machine's pace scales
        if paced and before and guess[1] != 'by_itself':  # a run's own pace is not scaled
          guess = (before[0] * _pace_here(paced), before[1])
        if time.time() - start + guess[0] > finish_by_s:
          too_long[run.name] = (*guess, bool(before and before[0] > 0 and guess[1] != 'by_itself'))
          continue
      os.makedirs(where, exist_ok=True)
      holder = claim(where)
      if holder:
        log(f'[{i + 1}/{len(study.runs)}] {run.name}: being run by process {holder["pid"]}, passed over')
        continue
      try:
        if os.path.exists(os.path.join(where, 'finished.json')):  # finished by another process since the check above
          continue
        with open(os.path.join(where, 'machines.jsonl'), 'a', encoding='utf-8') as f:
          f.write(json.dumps({'date': datetime.datetime.now().isoformat(timespec='seconds'), **machine()}) + '\n')
        log(f'[{i + 1}/{len(study.runs)}] {run.name} (progress: {os.path.join(where, "log.txt")})')
        whole, began = not os.path.isdir(os.path.join(where, 'checkpoints')), time.time()
        try:
          with _progress_to(os.path.join(where, 'log.txt'), console):
            result = _outcome(train_and_evaluate(set_fields(run.config(data_path), chosen), where))
        except WorkdirInUseError:  # a process on another host, or one that took over a dead claim as we did
          log(f'[{i + 1}/{len(study.runs)}] {run.name}: its folder is locked by another live run, passed over')
          continue
        except DivergenceError as e:  # recorded, and the study goes on with its next run
          step = int(m.group(1)) if (m := re.search(r'at step (\d+)', str(e))) else None
          _write_record(where, 'diverged.json', {'step': step, 'message': str(e)})
          log(f'{run.name} diverged: {e}')
          ran += 1
          continue
        except CheckpointWriteError:  # the disk full or not writable: every run after it would meet it too
          raise
        except (CheckpointError, WorkdirError) as e:  # this run cannot go on (a damaged config.json, no checkpoint
          # restores); the others can. (Errors every run would meet, such as missing data, stop the study.)
          log(f'[{i + 1}/{len(study.runs)}] {run.name} failed: {" ".join(str(e).split())}; passed over, the study '
              'goes on with its next run')
          continue
        ran += 1
        if not result.finished:  # stopped by SIGTERM: leave it to the next call
          log(f'{run.name} stopped at step {result.step}; run the same command again to continue')
          stop = True
          break
        _write_record(where, 'finished.json', {'step': result.step, **(result.last_eval or {}),
                                               **({'whole_run_seconds': round(time.time() - began, 1)} if whole else {})})
        share = (result.step - result.start_step) / result.total_steps if result.total_steps else 0.0
        if finish_by_s and before and before[1] == 'by_cell' and before[0] > 0 and share >= PACE_MIN_SHARE:
          paced.append((time.time() - began) / (before[0] * share))
        if not keep_checkpoints:
          shutil.rmtree(os.path.join(where, 'checkpoints'), ignore_errors=True)
        if result.stop_requested:  # the signal came as the run's last checkpoint was written: it is done, and
          # the machine is going away (a preemption, a command's time limit), so start nothing that would be cut
          log(f'{run.name} finished as a stop was asked for (SIGTERM or Ctrl-C); no further run started: run the '
              'same command again to go on')
          stop = True
          break
      finally:
        release(where)
        _free_memory()
    if stop or len(paced) == learnt or (max_runs and ran >= max_runs) or (
        time_limit_s and time.time() - start > time_limit_s) or not any(
        scaled and time.time() - start + found[name][0] * _pace_here(paced) <= finish_by_s
        for name, (_, _, scaled) in too_long.items()):  # nothing passed over would fit at the pace learnt since
      break
    log(f'--finish_by_min: judging the {len(too_long)} run{"s" if len(too_long) > 1 else ""} passed over again, by '
        f'this machine\'s pace{_pace_words(paced)}')
  if too_long:
    # named at the pace the call ended with (a run judged before it was learnt, by the records as they are)
    at_pace = {name: (found[name][0] * _pace_here(paced) if scaled and paced else seconds, basis)
               for name, (seconds, basis, scaled) in too_long.items()}
    name, (seconds, basis) = min(at_pace.items(), key=lambda t: t[1][0])
    shortest = (f'the shortest, {name}, takes about {seconds / 60:.1f} min going by {BASIS_WORDS[basis]}' if basis
                else f'{name} has nothing to go by')
    log(f'{len(too_long)} run{"s" if len(too_long) > 1 else ""} not started: each would end after --finish_by_min '
        f'({max(finish_by_s - time.time() + start, 0.0) / 60:.1f} of the {finish_by_s / 60:g} min are left; '
        f'{shortest}{_pace_words(paced)})')
  elif paced:
    log(f'--finish_by_min: {_pace_words(paced)[2:]}')
  done = sum(is_finished(workdir, r) for r in study.runs)
  return {'finished': done, 'ran': ran, 'left': len(study.runs) - done}
