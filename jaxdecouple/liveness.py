"""Across processes, a peer that stops answering (stopped with SIGSTOP, its host frozen or cut off) or dies
while the others wait somewhere no error reaches them stops the others with one line, within
``distributed.heartbeat_timeout_s``; a process whose main thread makes no progress for
``distributed.stall_timeout_s`` (a deadlock in its own code, or a wait that never ends) while its threads still
run stops every process with one line naming where that thread is.

JAX's coordination service notices a silent process by its missed heartbeats, but then terminates every other
process from inside the runtime (exit -6, a C++ stack trace, no word of which process or which checkpoint;
measured: FDG over 2 processes, process 1 stopped with SIGSTOP, process 0 aborted 22 s later). Its callback
for that moment cannot be used from Python (jaxlib 0.10: the status it passes has no Python type, and the
call aborts). So each process beats on its own: a thread writes a counter into the coordinator's key-value
store every second and reads the others'; a second thread, which never waits on anything, judges. A peer
whose counter stands still for the timeout, or a store that stops answering (it lives in process 0), stops
this process with one line naming the process, the reason it published if it stopped on an error of its own
(``processes.tell_the_others``) and the newest checkpoint every process wrote, exit 2, before JAX's own
heartbeat (set longer, ``process_start``) would abort it. A process that ends its run normally says so, so a
peer still evaluating or saving never mistakes it for a hung one.

A process whose main thread is stuck while the process lives (a deadlock: its beating thread goes on) is
caught by progress instead: the training loop marks each step, evaluation batch and checkpoint
(``mark_progress``), and a judge that finds its own main thread without a mark for ``distributed.stall_timeout_s``
stops the run. Its peers stall too, waiting for it: the first process to claim the stall in the store (an
atomic set; a main thread waiting for the others claims a few seconds later, so one stuck in code of its own
is named) publishes its line, naming where its main thread is (``sys._current_frames``), and stops; the others
read the claim with their beats and stop with its line.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import traceback

import jax
from absl import logging

from jaxdecouple.processes import (STOPPING, leave_together, newest_saved_by_all, reason_of, resume_advice,
                                   tell_the_others)

ALIVE_KEY = 'jaxdecouple/alive/{}/{}'  # per run and process: a beat counter, or DONE once the run ended normally
DONE = 'done'
BEAT_S = 1.0  # how often a process beats and reads the others'
_RUNS = [0]  # runs this process has watched: every process starts its runs in the same order
STALL_KEY = 'jaxdecouple/stalled/{}'  # per run: the first process to claim a stall, and its line
_PROGRESS = [time.monotonic()]  # when the main thread last marked progress (``mark_progress``)
WAITING_GRACE_S = 3 * BEAT_S  # a main thread stalled waiting for the others (``main_thread_at``) claims this much later


def mark_progress() -> None:
  """The main thread got on (a step, an evaluation batch, a checkpoint): the stall judge counts from now."""
  _PROGRESS[0] = time.monotonic()


WAITS_FOR_PEERS = ('processes.py', 'agreement.py')  # jaxdecouple's modules whose waits are on the other processes


def main_thread_at() -> tuple[str, bool]:
  """Where the main thread is (its innermost frame, and the innermost one of jaxdecouple's if that differs),
  and whether it waits for the others: inside JAX (the runtime: a transfer, a collective) or in one of
  jaxdecouple's waits on the coordinator (``WAITS_FOR_PEERS``), rather than in code of its own."""
  frame = sys._current_frames().get(threading.main_thread().ident)  # noqa: SLF001  the documented way to look
  if frame is None:
    return 'an unknown place', False
  stack = traceback.extract_stack(frame)
  where = lambda f: f'{os.path.basename(f.filename)}:{f.lineno} in {f.name}'
  ours = [f for f in stack if f'{os.sep}jaxdecouple{os.sep}' in f.filename]
  last = stack[-1].filename
  waiting = (any(f'{os.sep}{name}{os.sep}' in last for name in ('jax', 'jaxlib')) or
             last.endswith(tuple(f'{os.sep}jaxdecouple{os.sep}{name}' for name in WAITS_FOR_PEERS)))
  return where(stack[-1]) + (f' (from {where(ours[-1])})' if ours and ours[-1] is not stack[-1] else ''), waiting


def stall_line(stalled_s: float, timeout_s: float, at: str, saved: int | None) -> str:
  """The one line a process whose main thread is stuck stops every process with."""
  return (f'process {jax.process_index()}\'s main thread has made no progress for {stalled_s:.0f} s '
          f'(distributed.stall_timeout_s is {timeout_s:g}; a deadlock, or a wait that never ends), at {at}; '
          f'{resume_advice(saved)}')


def stop_line(process: int, silent_s: float, timeout_s: float, reason: str | None, saved: int | None) -> str:
  """The one line a survivor stops with."""
  who = 'process 0 (it runs the coordination service)' if process == 0 else f'process {process}'
  if reason:
    return (f'another process stopped ({who}: {reason}); fix that and restart every process with the same '
            '--workdir')
  return (f'{who} stopped answering: no sign of life for {silent_s:.0f} s (distributed.heartbeat_timeout_s is '
          f'{timeout_s:g}): it hangs, was stopped or died; {resume_advice(saved)}')


class Liveness:
  """The beating and judging threads of one run (``watch``)."""

  def __init__(self, timeout_s: float, run: int, stall_timeout_s: float = 0.0):
    from jax._src import distributed
    self.client, self.timeout_s, self.run = distributed.global_state.client, timeout_s, run
    self.stall_timeout_s = stall_timeout_s  # 0: not judged
    self.me, self.count = jax.process_index(), jax.process_count()
    now = time.monotonic()
    self.seen = {p: (None, now) for p in range(self.count) if p != self.me}  # last value read, when it changed
    self.claim: str | None = None  # 'PROCESS<TAB>LINE': the process that claimed the stall, and its line
    self.done: set[int] = set()
    self.round_ended = now  # when the beating thread last finished a round with the store
    self.quit = threading.Event()
    self.beats = 0

  def beat_once(self) -> None:
    """Publishes this process's counter, reads the others', and reads the stall claim (``judge_stall``) while
    the store still answers."""
    self.beats += 1
    self.client.key_value_set(ALIVE_KEY.format(self.run, self.me), str(self.beats), allow_overwrite=True)
    now = time.monotonic()
    for p, (value, since) in self.seen.items():
      try:
        read = self.client.key_value_try_get(ALIVE_KEY.format(self.run, p))
      except Exception:  # noqa: BLE001  not published yet: counted from the start
        continue
      if read == DONE:
        self.done.add(p)
      elif read != value:
        self.seen[p] = (read, now)
    if self.stall_timeout_s and self.claim is None:
      with contextlib.suppress(Exception):  # the key is absent until a process claims a stall
        self.claim = self.client.key_value_try_get(STALL_KEY.format(self.run))
    self.round_ended = time.monotonic()

  def beating(self) -> None:
    while not self.quit.wait(BEAT_S):
      try:
        self.beat_once()
      except Exception:  # noqa: BLE001  the store went away (its process ended): the judge decides
        pass

  def silent(self) -> tuple[int, float] | None:
    """The first peer whose counter had stood still for longer than the timeout when this process last read
    it (silence counted between this process's own reads, so a pause of this process, or of the whole job,
    accuses no one); the store's host (process 0) when the store itself stopped answering."""
    now = time.monotonic()
    if now - self.round_ended > self.timeout_s and self.me != 0 and 0 not in self.done:
      return 0, now - self.round_ended
    for p, (_, since) in self.seen.items():
      if p not in self.done and self.round_ended - since > self.timeout_s:
        return p, self.round_ended - since
    return None

  def pardon(self) -> None:
    """This process itself did not run for a while (stopped, the machine suspended): nothing was read
    meanwhile, so every peer's silence and the store's count from now."""
    now = time.monotonic()
    self.round_ended = now
    self.seen = {p: (value, now) for p, (value, _) in self.seen.items()}
    mark_progress()  # nor did its main thread

  def judging(self) -> None:
    last = time.monotonic()
    while not self.quit.wait(BEAT_S):
      now = time.monotonic()
      if now - last > 5 * BEAT_S:  # this thread did not run for a while: this process was paused
        self.pardon()
      last = now
      if self.stall_timeout_s:
        self.judge_stall()
      found = self.silent()
      if found is None:
        continue
      process, silent_s = found
      asked = {}  # the store may be the silent one: ask it from a thread, at most 3 s

      def ask():
        asked['reason'] = reason_of(process)
        asked['saved'] = newest_saved_by_all()
      helper = threading.Thread(target=ask, daemon=True)
      helper.start()
      helper.join(3.0)
      if self.quit.is_set():  # the run ended meanwhile (or this process's own stop began: it has its own line)
        return
      if self.silent() is None:  # it answered meanwhile
        continue
      self.stop(stop_line(process, silent_s, self.timeout_s, asked.get('reason'), asked.get('saved')))

  def judge_stall(self) -> None:
    """Stops the run when a main thread has made no progress for the stall timeout. Every process stalls once
    one is stuck (the others wait for it), so the first to claim the stall in the store (an atomic set) names
    itself and where its main thread is, and the others stop with its line. A main thread that waits for the
    others (inside JAX, or in one of jaxdecouple's waits on the coordinator) claims ``WAITING_GRACE_S`` later,
    so that one stuck in code of its own is named, though the judges' ticks (a second apart) may see it a
    moment later."""
    if self.claim is not None:
      process, _, line = self.claim.partition('\t')
      if int(process) != self.me:
        self.stop(stop_line(int(process), 0.0, self.timeout_s, line, None), together=True)
      return
    stalled_s = time.monotonic() - _PROGRESS[0]
    if stalled_s <= self.stall_timeout_s:
      return
    at, waiting = main_thread_at()
    if waiting and stalled_s <= self.stall_timeout_s + WAITING_GRACE_S:
      return
    line = stall_line(stalled_s, self.stall_timeout_s, at, newest_saved_by_all())
    try:
      self.client.key_value_set(STALL_KEY.format(self.run), f'{self.me}\t{line}')  # fails if one claimed first
    except Exception:  # noqa: BLE001  another process claimed it first: the next beat reads its line
      return
    self.claim = f'{self.me}\t{line}'
    tell_the_others(line)
    self.stop(line, together=True)

  def stop(self, line: str, together: bool = False) -> None:
    """Prints the line and exits 2 at once (``os._exit``: the main thread is stuck, or blocked in the runtime
    waiting for a peer). ``together``: every process is stopping on a stall claim, which the others read
    from the store process 0 hosts, so each first leaves the coordination service with them (its shutdown
    barrier, which the others join once they have read the claim): process 0 exiting alone would abort the
    others (-6) and a peer exiting alone would break the transfers another's main thread waits in."""
    if self.quit.is_set():  # the run ended meanwhile (or this process's own stop began: it has its own line)
      return
    STOPPING.set()
    logging.flush()
    print(f'error: {line}', file=sys.stderr, flush=True)
    sys.stdout.flush()
    if together:
      leave_together()
    os._exit(2)

  def end(self, finished: bool, beating: threading.Thread) -> None:
    self.quit.set()
    beating.join(5 * BEAT_S)  # its last counter must not land after DONE
    if finished:  # a peer still at work must not take this process's silence for a hang
      try:
        self.client.key_value_set(ALIVE_KEY.format(self.run, self.me), DONE, allow_overwrite=True)
      except Exception:  # noqa: BLE001  best effort
        logging.warning('could not tell the other processes that this one finished')


@contextlib.contextmanager
def watch(timeout_s: float, stall_timeout_s: float = 0.0):
  """Beats and judges for the body's duration, across processes (nothing with one process); a main thread
  without progress for ``stall_timeout_s`` (0: not judged) stops the run."""
  if jax.process_count() == 1:
    yield
    return
  mark_progress()
  live = Liveness(timeout_s, _RUNS[0], stall_timeout_s)
  _RUNS[0] += 1
  threads = [threading.Thread(target=live.beating, name='liveness-beat', daemon=True),
             threading.Thread(target=live.judging, name='liveness-judge', daemon=True)]
  for t in threads:
    t.start()
  finished = False
  try:
    yield
    finished = True
  finally:
    live.end(finished, threads[0])
