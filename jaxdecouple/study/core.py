"""What a study is: runs (a table cell's config and seed), claims the report checks, and where runs live."""
from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Callable

@dataclasses.dataclass(frozen=True)
class Run:
  row: str                      # the table row, e.g. 'ResNet-20, K=2'
  column: str                   # the table column (method), e.g. 'FDG beta=0.5'
  seed: int
  build: Callable[[], object]   # returns the run's config (seed not yet set)
  also_rows: tuple[str, ...] = ()  # other rows its result is shown in (BP, which has no K)
  key: str = ''                 # its folder name when it is another study's run, shown here again

  def in_row(self, row: str) -> bool:
    return row == self.row or row in self.also_rows

  @property
  def name(self) -> str:
    if self.key:
      return self.key
    slug = lambda s: re.sub(r'[^a-z0-9.]+', '-', s.lower()).strip('-')
    return f'{slug(self.row)}__{slug(self.column)}__seed{self.seed}'

  def shown_as(self, row: str, column: str | None = None, also_rows: tuple[str, ...] = ()) -> 'Run':
    """This run (the same config, the same folder) placed in another study's table."""
    return dataclasses.replace(self, row=row, column=column or self.column, also_rows=also_rows, key=self.name)

  def config(self, data_path: str = ''):
    c = self.build()
    c.seed = self.seed
    if data_path:
      c.data.path = data_path
    return c


@dataclasses.dataclass(frozen=True)
class Claim:
  """A check the report makes from the finished runs: a target of ours or a finding of the paper.

  With one row: the column's gap to ``baseline`` in that row (test error points, median over the
  seeds both finished of the per-seed difference) is at most ``limit``. With several rows: that gap
  grows from each row to the next (as DGL's does with K in the FDG paper).
  """
  text: str
  column: str
  rows: tuple[str, ...]
  limit: float | None = None
  baseline: str = 'BP'

  def __post_init__(self):
    if (len(self.rows) == 1) != (self.limit is not None):
      raise ValueError(f'claim {self.text!r}: one row needs a limit, several rows compare gaps, not a limit')


@dataclasses.dataclass(frozen=True)
class Study:
  name: str
  title: str
  data: str                     # what data, said beside every figure
  recipe: str
  runs: tuple[Run, ...]
  paper: dict = dataclasses.field(default_factory=dict)  # (row, column) -> the paper's test error %
  needs: str = ''               # what the study needs (a GPU, a data file)
  claims: tuple[Claim, ...] = ()
  baselines: tuple[str, ...] = ('BP', 'local SGD')  # each row's gaps are to the first of these it has
  column_order: tuple[str, ...] = ()  # the table's columns; default: in the order the runs first name them
  best_accuracy: bool = False  # also each run's best test accuracy, mean and std over seeds (ResIST's way)
  train_error: bool = False  # also the last epoch's training error beside the test error (underfit or not)
  # What the runs say, in words: paragraphs written by hand from the finished runs' tables, printed under
  # READING in the report; every figure they quote must stand in the section's tables (a test checks), so
  # a reading that new runs have made stale fails the tests instead of misleading.
  reading: tuple[str, ...] = ()

  @property
  def needs_data_path(self) -> bool:
    return '--data_path' in self.needs

  @property
  def rows(self) -> list[str]:
    return list(dict.fromkeys(row for r in self.runs for row in (r.row, *r.also_rows)))

  @property
  def columns(self) -> list[str]:
    named = list(dict.fromkeys(r.column for r in self.runs))
    if self.column_order and sorted(self.column_order) != sorted(named):
      raise ValueError(f'study {self.name}: column_order {self.column_order} is not the columns {named}')
    return list(self.column_order) or named



SEEDS = (0, 1, 2)
READING = 'What the runs say (written by hand from the tables above; every figure it quotes is in them):'


def run_dir(workdir: str, run: Run) -> str:
  return os.path.join(workdir, 'runs', run.name)


def is_finished(workdir: str, run: Run) -> bool:
  return os.path.exists(os.path.join(run_dir(workdir, run), 'finished.json'))


def diverged(workdir: str, run: Run) -> dict | None:
  """The record of a run that diverged (``diverged.json``: step and message), or None."""
  path = os.path.join(run_dir(workdir, run), 'diverged.json')
  if not os.path.exists(path):
    return None
  with open(path, encoding='utf-8') as f:
    return json.load(f)
