"""Several processes in one run: agreeing before any work, and stopping all of them together.

Joining the run is ``process_start.py``, comparing the processes' configs and data before any work is
``agreement.py``; here ``agree_on_failure`` and ``meet`` bring every process to one verdict or point,
``StopSignal`` turns SIGTERM or Ctrl-C into one agreed stop with a checkpoint; ``peers_watched`` turns a collective or transfer that failed because
a peer died into one line naming the process.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time

import jax
from absl import logging

from jaxdecouple.errors import JaxDecoupleError, ProcessError

def leave_together() -> None:
  """Every process that stops at an agreed point leaves the coordination service before it exits, so that
  the first to exit (the service's host) does not abort the others (measured: -6 without it). A failure
  here changes nothing: the stop's own line says what matters."""
  try:
    jax.distributed.shutdown()
  except Exception:  # noqa: BLE001
    return


_VERDICTS = [0]  # verdicts this process has taken part in: every process asks at the same steps


def agree_on_failure(what: str | None, timeout_s: float = 120.0) -> str | None:
  """Every process's verdict at this point (None: fine; else why it must stop), shared through the
  coordinator's key-value store: the first process's reason, or None when every process is fine. Every
  process calls it at the same steps (the loop's log and checkpoint steps), so a failure that only one of
  them can see (a pipeline's loss lives on the process that writes the metrics; a stage's parameters on
  the process that holds it) stops all of them with the same line, never one with the others left
  waiting for it. One process: ``what`` itself."""
  if jax.process_count() == 1:
    return what
  from jax._src import distributed
  client, me = distributed.global_state.client, jax.process_index()
  key = f'jaxdecouple/verdict/{_VERDICTS[0]}'
  _VERDICTS[0] += 1
  client.key_value_set(f'{key}/{me}', json.dumps(what))
  verdicts = []
  for p in range(jax.process_count()):
    try:
      verdicts.append(json.loads(client.blocking_key_value_get(f'{key}/{p}', int(timeout_s * 1000))))
    except Exception as e:  # noqa: BLE001  the coordination service's own error: a deadline, a lost peer
      raise ProcessError(f'process {p} did not answer within {timeout_s:g} s ({type(e).__name__}): it died or '
                         'hangs; restart every process with the same --workdir to resume from the last '
                         'checkpoint all of them hold') from None
  found = next((v for v in verdicts if v), None)
  if found:  # every process stops here
    leave_together()
  return found


_MEETINGS = [0]  # meetings this process has taken part in: every process meets at the same points


def meet(what: str, timeout_s: float = 600.0) -> None:
  """Waits until every process has reached this point (the coordinator's key-value store, not a device
  program: this process's devices stay free meanwhile), at most ``timeout_s``; past it, one line naming the
  process that did not come. Every process calls it at the same points. Used after cross-process transfers:
  a process that went on to its next program while its peer still waited for one of its sends deadlocked
  (ResIST over 2 processes, seen once in the suite: the sender blocked in its next step, the receiver in
  ``block_until_ready``)."""
  if jax.process_count() == 1:
    return
  from jax._src import distributed
  client, me = distributed.global_state.client, jax.process_index()
  key = f'jaxdecouple/meet/{_MEETINGS[0]}'
  _MEETINGS[0] += 1
  client.key_value_set(f'{key}/{me}', what)
  for p in range(jax.process_count()):
    if p == me:
      continue
    try:
      client.blocking_key_value_get(f'{key}/{p}', int(timeout_s * 1000))
    except Exception as e:  # noqa: BLE001  the coordination service's own error: a deadline, a lost peer
      raise ProcessError(f'process {p} did not finish {what} within {timeout_s:g} s ({type(e).__name__}): it '
                         'died or hangs; restart every process with the same --workdir to resume from the last '
                         'checkpoint all of them hold') from None


# Words of the runtime's errors when a peer went away (gloo's sockets, the coordination service). Which one a
# survivor meets depends on where its transfer was when the peer died: a fetch of a value whose transfer had
# begun fails in recv() with ENOTCONN ('Transport endpoint is not connected', seen on an AMD EPYC host).
PEER_LOST = ('connection reset', 'connection closed', 'connection refused', 'broken pipe', 'socket closed',
             'not connected', 'recv() failed', 'send() failed', 'heartbeat', 'unavailable')


def missing_processes(wait_s: float) -> list[int] | None:
  """The processes the coordination service no longer counts as alive, asked once a second for at most
  ``wait_s`` seconds (it notices a dead one within its heartbeat timeout): [] if every one still is; None
  if the service itself cannot be reached (it lives in process 0)."""
  from jax._src import distributed
  client, everyone = distributed.global_state.client, list(range(jax.process_count()))
  deadline = time.monotonic() + wait_s
  while True:
    try:
      live = client.get_live_nodes(everyone)
    except Exception:  # noqa: BLE001  the service is gone with its process
      return None
    missing = [p for p in everyone if p not in live]
    if missing or time.monotonic() >= deadline:
      return missing
    time.sleep(1.0)


_RUN = [0]  # runs this process has begun (``begin_run``): every process begins its runs in the same order, so
# the keys below, one set per run, never carry a reason or a step over from an earlier run of the same processes


def begin_run() -> None:
  """Called once at the start of each run (``train_and_evaluate``)."""
  _RUN[0] += 1


SAVED_KEY = 'jaxdecouple/run{}/saved/{}'  # a process's newest finished checkpoint step, in the coordinator's store


def note_saved(step: int) -> None:
  """Publishes that this process has finished writing its checkpoint of ``step`` (in the coordinator's
  key-value store), so that the survivors of a lost peer can name the newest step every process wrote."""
  if jax.process_count() == 1:
    return
  from jax._src import distributed
  try:
    distributed.global_state.client.key_value_set(SAVED_KEY.format(_RUN[0], jax.process_index()), str(step),
                                                  allow_overwrite=True)
  except Exception as e:  # noqa: BLE001  best effort: only the stop's line would lack the step
    logging.warning('could not publish the checkpoint step %d to the other processes (%s)', step, type(e).__name__)


def newest_saved_by_all() -> int | None:
  """The newest checkpoint step every process has finished writing (the least of what each published with
  ``note_saved``: every process saves at the same steps); None if one published none yet, or the store is
  gone with process 0."""
  from jax._src import distributed
  steps = []
  for p in range(jax.process_count()):
    try:
      steps.append(int(distributed.global_state.client.key_value_try_get(SAVED_KEY.format(_RUN[0], p))))
    except Exception:  # noqa: BLE001  nothing published, or the service is gone
      return None
  return min(steps)


def resume_advice(saved: int | None) -> str:
  """How to go on after a multi-process run stopped: from ``saved``, the newest step every process wrote."""
  if saved is None:
    return 'restart every process with the same --workdir to resume from the last checkpoint'
  return (f'the newest checkpoint every process wrote is step {saved}: restart every process with the same '
          '--workdir to resume from it')


def reason_of(process: int) -> str | None:
  """What ``process`` published before it stopped (``tell_the_others``), if anything."""
  from jax._src import distributed
  try:
    return distributed.global_state.client.key_value_try_get(STOPPED_KEY.format(_RUN[0], process))
  except Exception:  # noqa: BLE001  nothing published, or the service is gone
    return None


STOPPED_KEY = 'jaxdecouple/run{}/stopped/{}'  # a process's one error line (``tell_the_others``)
TOGETHER_KEY = 'jaxdecouple/run{}/together/{}'  # set by a process that stops before any work and leaves with the others


def stop_together(line: str) -> None:
  """For a process that stops before any work (its config fails its checks, Ctrl-C while it waits for the
  others' data) while the others are, or will be, waiting for it in an agreement: publishes its line, marked
  as leaving together, and leaves the coordination service with them (its shutdown barrier, which each
  reader joins once it has read the line: ``left_together_with``). Process 0 hosts the service, so leaving
  alone at once would take the line away, and then abort the others (-6). Several processes stopping so at
  once all meet in the same barrier."""
  if jax.process_count() == 1:
    return
  from jax._src import distributed
  try:
    distributed.global_state.client.key_value_set(TOGETHER_KEY.format(_RUN[0], jax.process_index()), '1')
  except Exception:  # noqa: BLE001  the store is gone: nothing to leave together
    return
  tell_the_others(line)
  leave_together()


def left_together_with(process: int) -> bool:
  """Whether ``process`` stopped with ``stop_together``; if so this process, having read its line, leaves
  the coordination service with it."""
  from jax._src import distributed
  try:
    distributed.global_state.client.key_value_try_get(TOGETHER_KEY.format(_RUN[0], process))
  except Exception:  # noqa: BLE001  not marked (it stopped mid-run: it is gone already), or the store is gone
    return False
  leave_together()
  return True


def tell_the_others(line: str) -> None:
  """Publishes why this process stops (its one error line) in the coordinator's key-value store, so that a
  peer left waiting for it can say why instead of only that it went away."""
  if jax.process_count() == 1 or not jax.distributed.is_initialized():  # not joined, or left already
    return
  from jax._src import distributed
  try:
    distributed.global_state.client.key_value_set(STOPPED_KEY.format(_RUN[0], jax.process_index()), line)
  except Exception as e:  # noqa: BLE001  best effort: the stop goes on
    logging.warning('could not tell the other processes why this one stops (%s)', type(e).__name__)


@contextlib.contextmanager
def peers_watched(heartbeat_s: float):
  """Across processes, a collective or transfer whose peer died fails in the runtime (gloo: 'connection
  reset by peer'); that becomes a ProcessError naming the dead process, with the reason it published if it
  stopped on an error of its own (``tell_the_others``), so that every survivor stops with one line well
  within a minute, its last checkpoint untouched, naming the newest step every process wrote
  (``note_saved``). A survivor waiting elsewhere (or for a peer that hangs) is stopped by its watch
  (``liveness.py``) at ``distributed.heartbeat_timeout_s``. This process's own error is published for the
  others. Other runtime errors pass through unchanged. Once the watch has printed this process's line and is
  leaving with the others (``STOPPING``), any error the main thread meets says nothing: the watch ends the
  process."""
  try:
    yield
  except Exception as e:
    if STOPPING.is_set():  # the watch printed this process's line and leaves with the others: it exits the
      time.sleep(STOPPING_WAIT_S)  # process (os._exit) well within this, and nothing more is said here
    if isinstance(e, JaxDecoupleError):  # this process stops with one line: the others learn why
      tell_the_others(str(e))
    if not isinstance(e, jax.errors.JaxRuntimeError):
      raise
    text = str(e)
    if jax.process_count() == 1 or not any(w in text.lower() for w in PEER_LOST):
      raise
    # Named at once: the coordination service learns of a dead process only at its heartbeat timeout, and
    # then aborts every survivor (JAX's fatal error), so waiting for it would race our own line. With two
    # processes the missing one is the other; with more, the service is asked briefly.
    others = [p for p in range(jax.process_count()) if p != jax.process_index()]
    missing = others if len(others) == 1 else missing_processes(min(5.0, heartbeat_s / 3))
    why = [f'process {p}: {r}' for p in range(jax.process_count()) if p != jax.process_index()
           if (r := reason_of(p))]
    if why:
      raise ProcessError(f'another process stopped ({"; ".join(why)}); fix that and restart every process with '
                         'the same --workdir') from None
    who = ('process 0 (it runs the coordination service)' if missing is None else
           f'process {", ".join(map(str, missing))}' if missing else 'another process')
    first = text.strip().splitlines()[0][:160]
    raise ProcessError(f'{who} stopped answering during a collective or transfer ({first}): it died or was '
                       f'killed; {resume_advice(newest_saved_by_all())}') from None


STOPPING = threading.Event()  # across processes: the watch (liveness.py) has printed this process's one line and
# is leaving with the others; whatever fails meanwhile in the main thread says nothing (a transfer whose peer left
# first; a wait on the coordinator's store, an agreement or a meeting, that the leaving shut down: seen in CI, a
# second line "process 0 did not answer" after the stall's)
STOPPING_WAIT_S = 30.0  # at most this long: the watch exits the process well within it
INTERRUPTED = threading.Event()  # across processes: a Ctrl-C came during this run (``StopSignal``); a process
# still waiting for the others' data (``agreement``) stops at once rather than at the first step


class StopSignal:
  """Turns SIGTERM (preemption) and Ctrl-C (SIGINT) into a clean stop after the current step, with a
  checkpoint. Across processes, JAX's preemption service catches SIGTERM in whichever process receives it and
  the processes agree on the step at which all of them stop (``poll``), so none is left waiting on a
  transfer or collective from one that stopped; a Ctrl-C to any of them is handed to that service as the
  process's own SIGTERM (stopping that process alone would leave the others waiting for it)."""

  def __init__(self, processes: bool = False):
    self.requested = False
    self._previous = None
    self._processes = processes
    self._forwarded = False  # across processes: a Ctrl-C already handed to the preemption service

  def poll(self, step: int) -> None:
    """Call after every step with the number of steps done, in every process."""
    if self._processes and not self.requested:
      from jax.experimental import multihost_utils
      if multihost_utils.reached_preemption_sync_point(step):
        logging.warning('a process received SIGTERM: every process saves a checkpoint at step %d and stops', step)
        self.requested = True

  def __enter__(self):
    """Installed for the whole run and removed only after the last checkpoint is written, so any number
    of SIGTERMs (or Ctrl-Cs) saves once and stops once."""
    self._previous = {}
    INTERRUPTED.clear()
    for sig in (signal.SIGINT,) if self._processes else (signal.SIGTERM, signal.SIGINT):
      try:  # across processes JAX's preemption notifier has SIGTERM; a Python handler would take it away
        self._previous[sig] = signal.signal(sig, self._handler)
      except ValueError:  # not in the main thread (e.g. some notebook kernels): no handler
        pass
    return self

  def _handler(self, signum, frame):
    if self._processes:  # the agreed stop: JAX's preemption notifier holds SIGTERM (``poll`` sees it)
      INTERRUPTED.set()
      if not self._forwarded:
        logging.warning('%s received: every process saves a checkpoint at an agreed step and stops',
                        signal.Signals(signum).name)
        self._forwarded = True
        os.kill(os.getpid(), signal.SIGTERM)
      return
    if not self.requested:
      logging.warning('%s received: saving a checkpoint and stopping after this step',
                      signal.Signals(signum).name)
    self.requested = True

  def __exit__(self, *exc):
    for sig, previous in self._previous.items():
      signal.signal(sig, previous)
