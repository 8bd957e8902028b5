"""What a study is: runs (a table cell's config and seed), claims the report checks, and where runs live."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
from typing import Callable, Mapping

from jaxdecouple.data.text import TEXT_DATASETS

@dataclasses.dataclass(frozen=True)
class Run:
  row: str                      # the table row, e.g. 'ResNet-20, K=2'
  column: str                   # the table column (method), e.g. 'FDG beta=0.5'
  seed: int
  build: Callable[[], object]   # returns the run's config (seed not yet set)
  also_rows: tuple[str, ...] = ()  # other rows its result is shown in (BP, which has no K)
  key: str = ''                 # its folder name when it is another study's run shown here again, or a run
  #                               whose column was renamed after it ran
  # Settings that come from other runs' results (a tuning row's best): ``choose(workdir)`` returns the config
  # fields to set, or None while the runs it reads have not finished (the runner passes the run over until
  # then, saying ``waits_for``). The values it chose are in the run's config.json, as every field is.
  choose: Callable[[str], dict | None] | None = None
  waits_for: str = ''

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
    if data_path and c.dataset not in TEXT_DATASETS:  # the study's image file; text runs read their corpus
      c.data.path = data_path
    return c


@dataclasses.dataclass(frozen=True)
class Claim:
  """A check the report makes from the finished runs: a target of ours or a finding of the paper.

  With one row: the column's gap to ``baseline`` in that row (test error points, median over the
  seeds both finished of the per-seed difference) is at most ``limit``; with ``either_side``, at most
  ``limit`` either way (a paper's "comparable": a column far better than its baseline does not bear it out
  either). With several rows: that gap grows from each row to the next (as DGL's does with K in the FDG
  paper). With a ``reference`` (one row): the column's median test error is within ``limit`` points of that
  figure, either side (another code's result on the same data, which has no seeds to pair with ours).
  ``factor`` (several rows): each row's gap is at most that fraction of the next row's (0.5: "at most half";
  1, the default: smaller).
  """
  text: str
  column: str
  rows: tuple[str, ...]
  limit: float | None = None
  baseline: str = 'BP'
  reference: float | None = None
  factor: float = 1.0
  baseline_row: str | None = None  # one row: the baseline's runs come from this row (the same method in another
  #                                  setting, e.g. ResIST at L = 200 against ResIST at L = 50), paired by seed
  either_side: bool = False  # one row, a limit: |gap| <= limit rather than gap <= limit

  def __post_init__(self):
    if (len(self.rows) == 1) != (self.limit is not None):
      raise ValueError(f'claim {self.text!r}: one row needs a limit, several rows compare gaps, not a limit')
    if self.reference is not None and len(self.rows) != 1:
      raise ValueError(f'claim {self.text!r}: a reference figure is checked in one row, with a limit')
    if self.baseline_row is not None and (len(self.rows) != 1 or self.reference is not None):
      raise ValueError(f'claim {self.text!r}: a baseline row is compared with one row, by a limit')
    if self.either_side and (self.limit is None or len(self.rows) != 1 or self.reference is not None):
      raise ValueError(f'claim {self.text!r}: either side bounds one row\'s gap by a limit')
    if self.factor != 1.0 and (len(self.rows) < 2 or not 0 < self.factor < 1):
      raise ValueError(f'claim {self.text!r}: a factor in (0, 1) compares the gaps of several rows')


@dataclasses.dataclass(frozen=True)
class Sweep:
  """A setting swept over cells, drawn as the paper draws it (FDG's Figure 4a: test error over beta; ResIST's
  Figure 7: over the local iterations): ``points`` maps a cell (row, column) to its series and its value of the
  swept setting; the figure has each series' test error against that value beside its gap to the row's baseline,
  the paper's gap where it prints one."""
  label: str  # the swept setting, the x axis ('beta', 'local iterations L')
  points: Mapping[tuple[str, str], tuple[str, float]]  # (row, column) -> (series, value)
  log_x: bool = False


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
  detection: bool = False  # detection runs: their test loss and mAP (the main table's error is 100 - mAP)
  paper_loss: dict = dataclasses.field(default_factory=dict)  # (row, column) -> the paper's best test loss
  paper_seconds: dict = dataclasses.field(default_factory=dict)  # (row, column) -> the paper's training seconds
  paper_speedup: dict = dataclasses.field(default_factory=dict)  # (row, column) -> the speed-up the paper prints
  budget: str = ''  # replica studies: benchmarks/resist_round.py's records of each setting's round, in the workdir
  # What the runs say, in words: paragraphs written by hand from the finished runs' tables, printed under
  # READING in the report; every figure they quote must stand in the section's tables (a test checks), so
  # a reading that new runs have made stale fails the tests instead of misleading.
  reading: tuple[str, ...] = ()
  sweep: Sweep | None = None  # a setting swept over cells: its figure (``Sweep``)

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


def read_record(workdir: str, run: Run, name: str, needs: tuple[str, ...] = ()) -> tuple[dict | None, str | None]:
  """A run's record ``name`` (finished.json, diverged.json): (record, None) when it is whole, (None, None)
  when it is absent, (None, what is wrong) when it is damaged (empty, cut short, not a JSON object, or
  without one of the numbers in ``needs``). Says nothing: the callers decide what a damaged one counts as."""
  path = os.path.join(run_dir(workdir, run), name)
  try:
    with open(path, encoding='utf-8') as f:
      text = f.read()
  except FileNotFoundError:
    return None, None
  except (OSError, ValueError) as e:  # unreadable, or not UTF-8
    return None, f'is unreadable ({getattr(e, "strerror", None) or type(e).__name__})'
  if not text.strip():
    return None, 'is damaged (empty)'
  try:
    record = json.loads(text)
  except ValueError as e:
    return None, f'is damaged ({damage(e)})'
  if not isinstance(record, dict):
    return None, f'is damaged (a JSON {type(record).__name__}, not an object)'
  missing = [k for k in needs if not isinstance(record.get(k), (int, float)) or isinstance(record.get(k), bool)]
  if missing:
    return None, f'is damaged (no {", ".join(missing)} in it)'
  return record, None


def damage(e: ValueError, one_line: bool = False) -> str:
  """What is wrong with a file of JSON, in a few words: 'Expecting value: line 1 column 1'; with ``one_line``
  (a line of a .jsonl file): 'Expecting value at column 1'."""
  if not isinstance(e, json.JSONDecodeError):
    return str(e)
  if one_line:
    return f'{e.msg}{"" if e.msg.endswith(" at") else " at"} column {e.colno}'
  return f'{e.msg}: line {e.lineno} column {e.colno}'


_WARNED: set[tuple] = set()  # the damaged files warned about, each in the state it was read in


def warn_once(workdir: str, run: Run, name: str, line: str, say: Callable[[str], None] | None = None,
              always: bool = False) -> bool:
  """Says ``warning: run RUN: NAME LINE`` (on stderr, or through ``say``) the first time this process meets
  the file ``name`` of the run in its present state (or ``always``; later calls are then silent), so that a
  report reading a record many times says it once; True when it said it."""
  path = os.path.join(run_dir(workdir, run), name)
  try:
    st = os.stat(path)
    key = (os.path.abspath(path), st.st_mtime_ns, st.st_size)
  except OSError:
    key = (os.path.abspath(path),)
  if key in _WARNED and not always:
    return False
  _WARNED.add(key)
  text = f'warning: run {run.name}: {name} {line}'
  if say is None:
    print(text, file=sys.stderr, flush=True)
  else:
    say(text)
  return True


FINISHED_NEEDS = ('test_accuracy',)  # what the report reads from every finished.json


_METRICS: dict[tuple, tuple[bool, str | None]] = {}  # metrics.jsonl in a given state -> usable, what is wrong


def _metrics_verdict(folder: str) -> tuple[bool, str | None]:
  """Whether a finished run's metrics.jsonl can give its learning curves (absent: not asked here), and what is
  wrong with it: damaged lines (skipped by ``read_metrics``), or no evaluation left at all."""
  from jaxdecouple.writers import read_metrics
  path = os.path.join(folder, 'metrics.jsonl')
  try:
    st = os.stat(path)
  except OSError:
    return True, None
  key = (os.path.abspath(path), st.st_mtime_ns, st.st_size)
  if key not in _METRICS:
    damaged: list = []
    try:
      evals = sum(r['kind'] == 'eval' for r in read_metrics(folder, damaged))
    except OSError as e:
      _METRICS[key] = False, f'is unreadable ({e.strerror or type(e).__name__}); counted as unfinished'
      return _METRICS[key]
    lines = ', '.join(str(n) for n, _ in damaged[:5]) + (f' and {len(damaged) - 5} more' if len(damaged) > 5 else '')
    wrong = (f'line {lines} is damaged ({damaged[0][1]})' if len(damaged) == 1 else
             f'lines {lines} are damaged (the first: {damaged[0][1]})') if damaged else ''
    if not evals:
      _METRICS[key] = False, f'{wrong + "; it " if wrong else ""}holds no evaluation; counted as unfinished'
    else:
      _METRICS[key] = True, (f'{wrong}; skipped' if wrong else None)
  return _METRICS[key]


def finished_record(workdir: str, run: Run) -> dict | None:
  """The run's finished.json, or None: not finished, or its records damaged (finished.json unreadable, or a
  metrics.jsonl without any evaluation left: counted as unfinished, with one warning line naming the run and
  the file). Damaged lines of metrics.jsonl are skipped, with one warning line."""
  record, wrong = read_record(workdir, run, 'finished.json', FINISHED_NEEDS)
  if wrong:
    warn_once(workdir, run, 'finished.json', f'{wrong}; counted as unfinished')
  if record is None:
    return None
  usable, wrong = _metrics_verdict(run_dir(workdir, run))
  if wrong:
    warn_once(workdir, run, 'metrics.jsonl', wrong)
  return record if usable else None


def is_finished(workdir: str, run: Run) -> bool:
  return finished_record(workdir, run) is not None


def diverged(workdir: str, run: Run) -> dict | None:
  """The record of a run that diverged (``diverged.json``: step and message), or None (a damaged record
  too, with one warning line)."""
  record, wrong = read_record(workdir, run, 'diverged.json')
  if wrong:
    warn_once(workdir, run, 'diverged.json', f'{wrong}; not counted as diverged')
  return record
