"""Across processes, a peer that stops answering (stopped with SIGSTOP, its host frozen or cut off) or dies
while the others wait somewhere no error reaches them stops the others with one line, within
``distributed.heartbeat_timeout_s``. (A peer whose main thread deadlocks while its process still runs keeps
beating and is not caught here; the waits of ``processes.meet`` and the agreements have their own bounds.)

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
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

import jax
from absl import logging

ALIVE_KEY = 'jaxdecouple/alive/{}/{}'  # per run and process: a beat counter, or DONE once the run ended normally
DONE = 'done'
BEAT_S = 1.0  # how often a process beats and reads the others'
_RUNS = [0]  # runs this process has watched: every process starts its runs in the same order


def stop_line(process: int, silent_s: float, timeout_s: float, reason: str | None, saved: int | None) -> str:
  """The one line a survivor stops with."""
  who = 'process 0 (it runs the coordination service)' if process == 0 else f'process {process}'
  if reason:
    return (f'another process stopped ({who}: {reason}); fix that and restart every process with the same '
            '--workdir')
  resume = (f'the newest checkpoint every process wrote is step {saved}: restart every process with the same '
            '--workdir to resume from it' if saved is not None else
            'restart every process with the same --workdir to resume from the last checkpoint')
  return (f'{who} stopped answering: no sign of life for {silent_s:.0f} s (distributed.heartbeat_timeout_s is '
          f'{timeout_s:g}): it hangs, was stopped or died; {resume}')


class Liveness:
  """The beating and judging threads of one run (``watch``)."""

  def __init__(self, timeout_s: float, run: int):
    from jax._src import distributed
    self.client, self.timeout_s, self.run = distributed.global_state.client, timeout_s, run
    self.me, self.count = jax.process_index(), jax.process_count()
    now = time.monotonic()
    self.seen = {p: (None, now) for p in range(self.count) if p != self.me}  # last value read, when it changed
    self.done: set[int] = set()
    self.round_ended = now  # when the beating thread last finished a round with the store
    self.quit = threading.Event()
    self.beats = 0

  def beat_once(self) -> None:
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

  def judging(self) -> None:
    last = time.monotonic()
    while not self.quit.wait(BEAT_S):
      now = time.monotonic()
      if now - last > 5 * BEAT_S:  # this thread did not run for a while: this process was paused
        self.pardon()
      last = now
      found = self.silent()
      if found is None:
        continue
      process, silent_s = found
      from jaxdecouple.processes import newest_saved_by_all, reason_of
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
      line = stop_line(process, silent_s, self.timeout_s, asked.get('reason'), asked.get('saved'))
      logging.flush()
      print(f'error: {line}', file=sys.stderr, flush=True)
      sys.stdout.flush()
      os._exit(2)  # the main thread may be blocked in the runtime, waiting for the silent peer, for ever

  def end(self, finished: bool, beating: threading.Thread) -> None:
    self.quit.set()
    beating.join(5 * BEAT_S)  # its last counter must not land after DONE
    if finished:  # a peer still at work must not take this process's silence for a hang
      try:
        self.client.key_value_set(ALIVE_KEY.format(self.run, self.me), DONE, allow_overwrite=True)
      except Exception:  # noqa: BLE001  best effort
        logging.warning('could not tell the other processes that this one finished')


@contextlib.contextmanager
def watch(timeout_s: float):
  """Beats and judges for the body's duration, across processes (nothing with one process)."""
  if jax.process_count() == 1:
    yield
    return
  live = Liveness(timeout_s, _RUNS[0])
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
