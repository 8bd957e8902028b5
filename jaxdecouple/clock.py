"""The training loop's clocks and periodic actions (as big_vision's ``u.chrono`` and ``u.itstime``).

Two clocks run over training only: the *interval* clock (images per second between two log lines) and
the *epoch* clock (``epoch_time_s``, what accuracy against wall-clock adds up). Work that is not training
(evaluation, diagnostics, the compiling first step) runs inside ``paused()``, so neither clock counts it;
a resumed run starts its epoch clock where its checkpoint left it (``start(carried)``).
"""
from __future__ import annotations

import contextlib
import json
import os
import time


def itstime(done: int, every: int, total: int = 0, last: bool = False) -> bool:
  """Whether a periodic action is due after ``done`` steps: every ``every`` steps (0: never), and with
  ``last`` also at the run's last step ``total``."""
  return bool(every and done % every == 0) or (last and done == total)


class Clock:
  """Seconds and steps of training since the last log line (interval) and in the epoch under way."""

  def __init__(self):
    now = time.perf_counter()
    self.interval_start, self.interval_steps = now, 0
    self.epoch_start, self.epoch_steps = now, 0

  def tick(self) -> None:
    """One step trained."""
    self.interval_steps += 1
    self.epoch_steps += 1

  def start(self, carried: tuple[float, int] = (0.0, 0)) -> None:
    """Both clocks from now (after the compiling first step, which is not timed); the epoch clock with the
    ``carried`` (seconds, steps) an interrupted epoch had trained before a resume."""
    now = time.perf_counter()
    self.interval_start, self.interval_steps = now, 0
    self.epoch_start, self.epoch_steps = now - carried[0], carried[1]

  @contextlib.contextmanager
  def paused(self):
    """Neither clock counts the time spent inside."""
    began = time.perf_counter()
    try:
      yield
    finally:
      spent = time.perf_counter() - began
      self.interval_start += spent
      self.epoch_start += spent

  def take_interval(self) -> tuple[float, int]:
    """(seconds, steps) since the last call (or ``start``); the interval clock starts again."""
    now = time.perf_counter()
    out = (now - self.interval_start, self.interval_steps)
    self.interval_start, self.interval_steps = now, 0
    return out

  def epoch(self) -> tuple[float, int]:
    """(seconds, steps) of the epoch under way so far."""
    return time.perf_counter() - self.epoch_start, self.epoch_steps

  def next_epoch(self) -> None:
    self.epoch_start, self.epoch_steps = time.perf_counter(), 0


def epoch_clock_at(workdir: str, step: int) -> tuple[float, int]:
  """The training seconds and timed steps of the epoch that was under way at the checkpoint of ``step``, from
  the ``checkpoint`` record written with it, so that a resumed run's epoch time counts the steps trained
  before the stop; (0.0, 0) where there is none (a checkpoint at an evaluation, a record of an earlier
  version, a process that writes no metrics)."""
  clock = (0.0, 0)
  try:
    with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8', errors='replace') as f:
      lines = f.readlines()  # (bytes a crash left that are not UTF-8 spoil their line only)
  except OSError:  # none here (a process other than the first, on another host)
    return clock
  for line in lines:
    try:
      r = json.loads(line)
      if r.get('kind') == 'checkpoint' and r.get('step') == step:
        clock = (float(r['epoch_time_s']), int(r['epoch_steps']))  # the last one: a step may be saved twice
    except (ValueError, KeyError, TypeError, AttributeError):  # a line cut short by a killed process
      continue
  return clock
