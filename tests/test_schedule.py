"""The pipeline schedule against tables written by hand from the papers, and the driver's check that
the exchange delivers what the schedule says.

A table has one line per stage and one cell per iteration t = 0, 1, ...: 'F<m>' the stage forwards
micro-batch m, 'B<m>' it back-propagates the (delayed) gradient of micro-batch m, '*' it takes an
optimizer step, '.' nothing. A stage that learns from a loss of its own back-propagates what it
forwards in the same iteration (no 'B').
"""
import dataclasses
import re

import pytest

from conftest import tiny_config
from jaxdecouple.pipeline import Schedule
from jaxdecouple.train import train_and_evaluate

# FDG, Algorithm I: at iteration t stage k back-propagates micro-batch t-2K+2+k, updates, then
# forwards micro-batch t-k; the last stage trains on micro-batch t-K+1.
FDG = {
    1: """F0* F1* F2* F3*""",
    2: """F0  F1  F2B0* F3B1* F4B2* F5B3*
          .   F0* F1*   F2*   F3*   F4*""",
    3: """F0  F1  F2    F3    F4B0* F5B1* F6B2*
          .   F0  F1    F2B0* F3B1* F4B2* F5B3*
          .   .   F0*   F1*   F2*   F3*   F4*""",
    4: """F0  F1  F2    F3    F4    F5    F6B0* F7B1* F8B2*
          .   F0  F1    F2    F3    F4B0* F5B1* F6B2* F7B3*
          .   .   F0    F1    F2B0* F3B1* F4B2* F5B3* F6B4*
          .   .   .     F0*   F1*   F2*   F3*   F4*   F5*""",
}
# DDG (and FR): micro-batch t goes through every stage in iteration t; stage k back-propagates the
# gradient of micro-batch t-(K-1-k), sent by stage k+1 the iteration before.
DDG = {
    1: """F0* F1* F2*""",
    2: """F0  F1B0* F2B1* F3B2*
          F0* F1*   F2*   F3*""",
    3: """F0  F1    F2B0* F3B1* F4B2*
          F0  F1B0* F2B1* F3B2* F4B3*
          F0* F1*   F2*   F3*   F4*""",
    4: """F0  F1    F2    F3B0* F4B1*
          F0  F1    F2B0* F3B1* F4B2*
          F0  F1B0* F2B1* F3B2* F4B3*
          F0* F1*   F2*   F3*   F4*""",
}
# DGL: stage k trains micro-batch t-k on its own head's loss, nothing delayed.
DGL = {
    1: """F0* F1* F2*""",
    2: """F0* F1* F2*
          .   F0* F1*""",
    3: """F0* F1* F2* F3*
          .   F0* F1* F2*
          .   .   F0* F1*""",
    4: """F0* F1* F2* F3* F4*
          .   F0* F1* F2* F3*
          .   .   F0* F1* F2*
          .   .   .   F0* F1*""",
}
# ADL, M = 2: FDG's forwards and backwards; a stage steps on every second gradient, counting from its own
# first (the last stage from its first input).
ADL = {
    1: """F0  F1* F2  F3*""",
    2: """F0  F1  F2B0  F3B1* F4B2  F5B3* F6B4  F7B5*
          .   F0  F1*   F2    F3*   F4    F5*   F6""",
    3: """F0  F1  F2    F3    F4B0  F5B1* F6B2  F7B3*
          .   F0  F1    F2B0  F3B1* F4B2  F5B3* F6B4
          .   .   F0    F1*   F2    F3*   F4    F5*""",
    4: """F0  F1  F2    F3    F4    F5    F6B0  F7B1* F8B2  F9B3*
          .   F0  F1    F2    F3    F4B0  F5B1* F6B2  F7B3* F8B4
          .   .   F0    F1    F2B0  F3B1* F4B2  F5B3* F6B4  F7B5*
          .   .   .     F0    F1*   F2    F3*   F4    F5*   F6""",
}

# ADL mode A, M = 1: FDG's table, but the last stage steps only once stage K-2 has received its first gradient
# (SPEC; the ADL code's receive_grad): its first step, at iteration K, sums its backwards of K-1 and K.
ADL_A_M1 = {
    1: FDG[1],
    2: """F0  F1  F2B0* F3B1* F4B2* F5B3*
          .   F0  F1*   F2*   F3*   F4*""",
    3: """F0  F1  F2    F3    F4B0* F5B1* F6B2*
          .   F0  F1    F2B0* F3B1* F4B2* F5B3*
          .   .   F0    F1*   F2*   F3*   F4*""",
    4: """F0  F1  F2    F3    F4    F5    F6B0* F7B1* F8B2*
          .   F0  F1    F2    F3    F4B0* F5B1* F6B2* F7B3*
          .   .   F0    F1    F2B0* F3B1* F4B2* F5B3* F6B4*
          .   .   .     F0    F1*   F2*   F3*   F4*   F5*""",
}


def parse(table: str):
  rows = []
  for line in table.strip().splitlines():
    cells = []
    for cell in line.split():
      f, b = re.search(r'F(\d+)', cell), re.search(r'B(\d+)', cell)
      cells.append((int(f.group(1)) if f else None, int(b.group(1)) if b else None, cell.endswith('*')))
    rows.append(cells)
  return rows


def check(schedule: Schedule, table: str):
  rows = parse(table)
  assert len(rows) == schedule.num_stages
  for k, cells in enumerate(rows):
    for t, (forward, backward, step) in enumerate(cells):
      delayed = schedule.delay(k) > 0
      got = (schedule.forward_batch(k, t), schedule.backward_batch(k, t) if delayed else None,
             schedule.updates_at(k, t))
      assert got == (forward, backward, step), f'stage {k}, iteration {t}: {got} != {(forward, backward, step)}'


@pytest.mark.parametrize('k', [1, 2, 3, 4])
def test_schedules_follow_the_papers(k):
  check(Schedule(k), FDG[k])
  check(Schedule(k, forward_locked=True), DDG[k])
  check(Schedule(k, local_heads=True), DGL[k])
  check(Schedule(k, accumulation=2), ADL[k])
  check(Schedule(k, accumulation=2, forward_first=True), ADL[k])  # mode A: the same order of work
  check(Schedule(k, accumulation=1, forward_first=True), ADL_A_M1[k])  # mode A, M = 1: the last stage waits
  check(Schedule(k, accumulation=1), FDG[k])  # mode B, M = 1: FDG (its wait never binds)
  assert [Schedule(k, forward_first=True).accumulates(j) for j in range(k)] == [j == k - 1 > 0 for j in range(k)]
  assert [Schedule(k).delay(j) for j in range(k)] == [2 * (k - 1 - j) for j in range(k)]
  assert [Schedule(k, forward_locked=True).delay(j) for j in range(k)] == [k - 1 - j for j in range(k)]


def test_delays_and_staleness_in_updates():
  # Optimizer steps between a stage's forward of a micro-batch and the step its gradient enters.
  assert [Schedule(3).staleness(k) for k in range(3)] == [3, 1, 0]
  assert [Schedule(3, forward_locked=True).staleness(k) for k in range(3)] == [2, 1, 0]
  assert [Schedule(3, accumulation=2).staleness(k) for k in range(3)] == [1.5, 0.5, 0]
  assert [Schedule(3, accumulation=2, forward_first=True).staleness(k) for k in range(3)] == [2, 1, 0]
  assert [Schedule(3, accumulation=2).first_update(k) for k in range(3)] == [5, 4, 3]
  assert [Schedule(4, local_heads=True).staleness(k) for k in range(4)] == [0, 0, 0, 0]


def test_the_table_shows_the_schedule():
  text = Schedule(2).table(4)
  assert text.splitlines()[1].split() == ['stage', '0', 'F0', 'F1', 'F2B0*', 'F3B1*']
  assert text.splitlines()[2].split() == ['stage', '1', '.', 'F0*', 'F1*', 'F2*']


@dataclasses.dataclass(frozen=True)
class OneLate(Schedule):
  """A wrong schedule: stage 0 believes its gradients arrive one iteration later than they do."""
  def delay(self, k):
    return super().delay(k) + (k == 0)


def test_the_driver_stops_when_schedule_and_exchange_disagree(workdir, monkeypatch):
  from jaxdecouple.methods.fdg import FDG
  monkeypatch.setattr(FDG, 'schedule', lambda self, k: OneLate(k))
  with pytest.raises(RuntimeError, match='stage 0 backward at iteration 3 should meet micro-batch 0, the '
                                         'exchange brought 1'):
    train_and_evaluate(tiny_config(method='fdg', max_steps=6), workdir)
