"""The report's tables read from each run's learning curves (its metrics.jsonl): the best accuracy over the
evaluations, whether training levelled off, the training error beside the test error, and the training
seconds to reach a row's target error (with the resumes whose epoch time is incomplete).

Apart from the final-error tables (``gaps.py``) because they read every evaluation of a run, not its
finished record, through ``jaxdecouple.plots``.
"""
from __future__ import annotations

import math
import os
import re
import statistics
from typing import Sequence

from jaxdecouple.study.core import Run, Study, is_finished, run_dir
from jaxdecouple.study.gaps import row_baseline


def finished_by_column(study: Study, workdir: str, row: str) -> dict[str, list[Run]]:
  """The row's finished runs per column, in the study's (seed) order."""
  finished: dict[str, list[Run]] = {}
  for r in study.runs:
    if r.in_row(row) and is_finished(workdir, r):
      finished.setdefault(r.column, []).append(r)
  return finished


def _curves_table(study: Study, workdir: str, intro: str, headers: Sequence[str], cells) -> list[str]:
  """A table of one line per row of the study and, per column, ``len(headers)`` cells (headers[0] is the
  column's name, the rest are appended to it) made by ``cells(row, column, curves)`` from the learning curves
  of that cell's finished runs (empty when none finished)."""
  from jaxdecouple.plots import learning_curves
  lines = [intro, '', '| row | ' + ' | '.join(' | '.join([c, *headers[1:]]) for c in study.columns) + ' |',
           '|' + '---|' * (1 + len(headers) * len(study.columns))]
  for row in study.rows:
    finished, line = finished_by_column(study, workdir, row), [row]
    for col in study.columns:
      line += cells(row, col, [learning_curves(run_dir(workdir, r)) for r in finished.get(col, [])])
    lines.append('| ' + ' | '.join(line) + ' |')
  return lines + ['']


def best_accuracy_table(study: Study, workdir: str) -> list[str]:
  """The ResIST paper's way: each run's best test accuracy over its evaluations, mean and standard
  deviation over the seeds."""
  def cells(row, col, curves):
    best = [100 - min(c['test_error']) for c in curves]
    return ['-' if not best else f'{statistics.mean(best):.2f}'
            + (f' ± {statistics.stdev(best):.2f}' if len(best) > 1 else '') + f', n={len(best)}',
            f'{100 - study.paper[(row, col)]:.2f}' if (row, col) in study.paper else '-']
  return _curves_table(study, workdir, "Best test accuracy (%) over each run's evaluations, mean ± sample standard "
                       "deviation (n - 1) over the finished seeds (the ResIST paper's way), the paper's accuracy beside it:",
                       ('', 'paper'), cells)


def detection_table(study: Study, workdir: str) -> list[str]:
  """Detection studies (the ResIST paper's Table 6 way): each run's best test loss over its evaluations, mean ±
  standard deviation over the seeds, the paper's beside it when it has one; and the mAP (VOC 2007, IoU 0.5) at
  the last evaluation, median over the seeds."""
  if not study.detection:
    return []

  def cells(row, col, curves):
    best = [min((v for v in c['test_loss'] if math.isfinite(v)), default=math.nan) for c in curves]
    maps = [100 - c['test_error'][-1] for c in curves]
    paper = study.paper_loss.get((row, col))
    return ['-' if not best else f'{statistics.mean(best):.3f}' + (f' ± {statistics.stdev(best):.3f}' if len(best) > 1
                                                                 else '') + f', n={len(best)}',
            '-' if paper is None else f'{paper:.2f}', f'{statistics.median(maps):.2f}' if maps else '-']
  return _curves_table(study, workdir, "Best test loss (the YOLO-v2 loss per image) over each run's evaluations, mean ± "
                       "sample standard deviation (n - 1) over the finished seeds (the ResIST paper's Table 6 way), the paper's beside "
                       'it; and the mAP (%, VOC 2007, IoU 0.5) at the last evaluation, median over the seeds:',
                       ('', 'paper', 'mAP'), cells)


def detection_seconds_table(study: Study, workdir: str) -> list[str]:
  """Detection studies, Table 6's other half: each run's training seconds (compilation and evaluation not
  counted), mean ± standard deviation over the seeds, the paper's beside them, and each column's speed-up over
  the row's baseline (its mean seconds over the column's), the paper's beside it."""
  if not study.detection or not study.paper_seconds:
    return []
  from jaxdecouple.plots import learning_curves
  seconds = lambda row, col: [learning_curves(run_dir(workdir, r))['train_seconds'][-1]
                              for r in finished_by_column(study, workdir, row).get(col, [])]
  mean = lambda xs: f'{statistics.mean(xs):.0f}' + (f' ± {statistics.stdev(xs):.0f}' if len(xs) > 1 else '') + \
      f', n={len(xs)}' if xs else '-'

  def cells(row, col, curves):
    ours, base_col = seconds(row, col), row_baseline(study, row)
    base = seconds(row, base_col) if base_col and base_col != col else []
    paper, paper_base = study.paper_seconds.get((row, col)), study.paper_seconds.get((row, base_col))
    speed = f'{statistics.mean(base) / statistics.mean(ours):.2f}' if ours and base else '-'
    printed = study.paper_speedup.get((row, col))  # the paper's own figure where it prints one (its seconds are rounded)
    paper_speed = (f'{printed:.2f}' if printed is not None else
                   f'{paper_base / paper:.2f}' if paper and paper_base and base_col != col else '-')
    return [mean(ours), '-' if paper is None else f'{paper:.0f}', speed, paper_speed]
  return _curves_table(study, workdir, "Training seconds (compilation and evaluation not counted), mean ± sample "
                       "standard deviation (n - 1) over the finished seeds, Table 6's beside them; the speed-up is the row's baseline's "
                       "mean seconds over the column's. Ours ran on one CPU device shared by the workers (and with "
                       '--jobs, by another run): a ResIST worker computes its smaller sub-network, but no exchange '
                       "crosses a device, so these seconds hold none of the communication that Table 6's "
                       "machines paid: compare the paper's speed-up with care:", ('', 'paper', 'speed-up', 'paper'),
                       cells)


def levelling_table(study: Study, workdir: str) -> list[str]:
  """Whether training ran its course: each column's test error at the end minus at the last evaluation at or
  before 80% of the epochs. Not the first one at or after 80%: with few evaluations (2 epochs evaluated after
  each, or 4) that one is the last evaluation itself, and the table read +0.00, "levelled off", for runs still
  falling fast. A run with no evaluation that early shows '-'."""
  def cells(row, col, curves):
    changes = []
    for c in curves:
      at = [i for i, e in enumerate(c['epoch'][:-1]) if e <= 0.8 * c['epoch'][-1] + 1e-9]
      if at:
        changes.append(c['test_error'][-1] - c['test_error'][at[-1]])
    return [f'{statistics.median(changes):+.2f}' if changes else '-']
  return _curves_table(study, workdir, 'Levelled off? The test error at the last epoch minus the one at the last '
                       'evaluation at or before 80% of the epochs (points; median over the finished seeds): near zero '
                       'when the last 20% of the schedule no longer changes it.', ('',), cells)


def train_error_table(study: Study, workdir: str) -> list[str]:
  """The last epoch's training error beside its test error: a network whose two errors are close underfits,
  and there a method that optimises less well shows its loss in the test error too."""
  def cells(row, col, curves):
    if not curves:
      return ['-', '-']
    return [f"{statistics.median(c['train_error'][-1] for c in curves):.2f}",
            f"{statistics.median(c['test_error'][-1] - c['train_error'][-1] for c in curves):+.2f}"]
  return _curves_table(study, workdir, 'Training error (%) in the last epoch (the mean of the training records logged '
                       'in it: the training batches as trained, augmented and with BatchNorm in training mode where the '
                       'network has them, the parameters moving), then the test error '
                       'minus it (points); medians over the finished seeds. A network whose two errors are close '
                       'underfits: there a method that optimises less well loses test accuracy too.'
                       + (' For ResIST and local SGD the training error is the mean over the workers of each one\'s '
                          'own network on its own batches: for ResIST its sub-network, not the whole network that '
                          'is tested.' if any(_is_replica(r) for r in study.runs) else ''),
                       ('', 'test - train'), cells)


_REPLICA = ('resist', 'localsgd', 'ensemble')


def _is_replica(run) -> bool:
  """Whether the run trains one network per worker (its training error is a worker's own network's)."""
  return run.build is not None and run.build().method in _REPLICA


def uncounted_resumes(folder: str) -> list[int]:
  """The steps at which a run resumed in the middle of an epoch from a checkpoint written without the epoch's
  clock (``checkpoint`` records came later): that epoch's training before the stop is missing from its
  ``epoch_time_s``. Read from the run's log.txt (the resumes) and metrics.jsonl (evaluations, clocks)."""
  try:
    with open(os.path.join(folder, 'log.txt'), encoding='utf-8', errors='replace') as f:
      resumes = [int(m) for m in re.findall(r'resumed from the checkpoint at step (\d+)', f.read())]
  except OSError:
    return []
  from jaxdecouple.writers import read_metrics
  known = {r['step'] for r in read_metrics(folder) if r['kind'] in ('eval', 'checkpoint')}
  return [step for step in resumes if step not in known]


def time_to_target_table(study: Study, workdir: str) -> list[str]:
  """Per row, the training seconds each column took to reach the row's target error: the highest of the
  columns' median final errors, which every column's median run reaches; a seed that never reaches it counts as
  the slowest (the median of [never, 1173, 863] is 1173, of [never, 1716] never)."""
  from jaxdecouple.plots import learning_curves, time_to
  lines = ['Accuracy against wall-clock: training seconds (the sum of the evaluated epochs\' training time; '
           'compilation, evaluation and diagnostics not counted) to reach the row\'s target, the highest of its '
           'columns\' median final test errors, which every column\'s median run reaches; median over the finished '
           'seeds, a seed that never reaches the target counting as the slowest (min-max of those that do). Measured on the machines above (which runs ran where: their lines), where runs started with '
           '--jobs share the cores: compare runs of one machine, not with the papers\' GPUs.', '',
           '| row | target error (%) | ' + ' | '.join(study.columns) + ' |', '|' + '---|' * (2 + len(study.columns))]
  for row in study.rows:
    finished = finished_by_column(study, workdir, row)
    finals = [statistics.median(learning_curves(run_dir(workdir, r))['test_error'][-1] for r in rs)
              for rs in finished.values()]
    if not finals:
      continue
    target, cells = max(finals), [row]
    cells.append(f'{target:.2f}')
    for col in study.columns:
      times = [time_to(run_dir(workdir, r), target) for r in finished.get(col, [])]
      reached = sorted(t for t in times if t is not None)
      median = statistics.median([math.inf if t is None else t for t in times]) if times else None
      if median is None:
        cells.append('-')
      elif math.isinf(median):
        cells.append(f'never (n={len(times)}' + (f'; {len(reached)} reached it' if reached else '') + ')')
      else:
        cells.append(f'{median:.0f} ({reached[0]:.0f}-{reached[-1]:.0f})'
                     + ('' if len(reached) == len(times) else f', {len(times) - len(reached)} never'))
    lines.append('| ' + ' | '.join(cells) + ' |')
  short = [f'{r.row}, {r.column}, seed {r.seed} (step{"s" * (len(steps) > 1)} {", ".join(map(str, steps))})' for r in study.runs
           if is_finished(workdir, r) for steps in [uncounted_resumes(run_dir(workdir, r))] if steps]
  if short:
    lines += ['', 'Uncounted: runs resumed mid-epoch from checkpoints written before they carried the epoch\'s '
              'training time lack, in that epoch, the steps trained before the stop (less than one epoch\'s time '
              'per resume): ' + '; '.join(short) + '.']
  return lines + ['']
