"""The report: a study's finished runs as the paper's table, gaps paired by seed, checks and curves."""
from __future__ import annotations

import json
import os
import re
import statistics
from typing import Sequence

from jaxdecouple.study.core import READING, Claim, Run, Study, diverged, is_finished, run_dir


_ARCHITECTURES = {'x86_64', 'amd64', 'aarch64', 'arm64', 'i386', 'i686', ''}


def _unnamed(m: dict) -> bool:
  """Whether a machine record's CPU is only an architecture name (what ``platform`` gives where the CPU's
  model name was not read)."""
  return m['cpu'].lower() in _ARCHITECTURES


def _but_cpu(m: dict) -> str:
  return json.dumps({k: v for k, v in m.items() if k != 'cpu'}, sort_keys=True)


def same_machines_once(machines: list[dict]) -> list[dict]:
  """Drops a record whose CPU is unnamed when a record alike in everything else names the CPU."""
  named = {_but_cpu(m) for m in machines if not _unnamed(m)}
  return [m for m in machines if not _unnamed(m) or _but_cpu(m) not in named]


def _same_machine(record: dict, machine: dict) -> bool:
  """Whether ``record`` is ``machine``, or its twin whose CPU is unnamed."""
  return record == machine or (_unnamed(record) and _but_cpu(record) == _but_cpu(machine))


def _cells_named(study: Study, cells: set[tuple[str, str]]) -> str:
  """'ROW; ROW: COLUMN, COLUMN': a row alone when the cells hold every column the row has runs in."""
  named = []
  for row in study.rows:
    columns = [c for c in study.columns if (row, c) in cells]
    if columns:
      whole = {r.column for r in study.runs if r.row == row}
      named.append(row if set(columns) == whole else f"{row}: {', '.join(columns)}")
  return '; '.join(named)


def _final_error(workdir: str, run: Run) -> float | None:
  if not is_finished(workdir, run):
    return None
  with open(os.path.join(run_dir(workdir, run), 'finished.json'), encoding='utf-8') as f:
    return 100.0 * (1.0 - json.load(f)['test_accuracy'])


def _cell(errors: Sequence[float]) -> str:
  if not errors:
    return '-'
  median = statistics.median(errors)
  spread = f' ({min(errors):.2f}-{max(errors):.2f})' if len(errors) > 1 else ''
  return f'{median:.2f}{spread}, n={len(errors)}'


def _errors_by_seed(study: Study, workdir: str, row: str, column: str) -> dict[int, float]:
  return {r.seed: e for r in study.runs if r.in_row(row) and r.column == column
          if (e := _final_error(workdir, r)) is not None}


def gap(study: Study, workdir: str, row: str, column: str, baseline: str) -> tuple[float, int] | None:
  """The column's test error minus the baseline's in a row, in points: the median over the seeds both
  finished of the per-seed difference (paired, so a seed's easy or hard draw cancels), and that count."""
  ours, base = (_errors_by_seed(study, workdir, row, c) for c in (column, baseline))
  seeds = sorted(ours.keys() & base.keys())
  if not seeds:
    return None
  return statistics.median(ours[s] - base[s] for s in seeds), len(seeds)


def _row_baseline(study: Study, row: str) -> str | None:
  return next((b for b in study.baselines if any(r.in_row(row) and r.column == b for r in study.runs)), None)


def _gap_text(g: tuple[float, int] | None) -> str:
  return '-' if g is None else f'{g[0]:+.2f}, n={g[1]}'


def check(study: Study, workdir: str, claim: Claim) -> str:
  """One line of the report's checks: the claim, met or not, and the gaps it was decided on."""
  gaps = [(row, gap(study, workdir, row, claim.column, claim.baseline)) for row in claim.rows]
  shown = '; '.join(f'{row}: {_gap_text(g)}' for row, g in gaps)
  if any(g is None for _, g in gaps):
    return f'- {claim.text}: waiting for runs ({shown})'
  values = [round(g[0], 2) for _, g in gaps]  # decided on the figures shown
  if claim.limit is not None:
    verdict = 'met' if values[0] <= claim.limit else 'missed'
  else:
    verdict = 'yes' if all(a < b for a, b in zip(values, values[1:])) else 'no'
  return f'- {claim.text}: **{verdict}** ({shown})'


def _gaps_and_checks(study: Study, workdir: str) -> list[str]:
  baselines = {row: _row_baseline(study, row) for row in study.rows}
  columns = [c for c in study.columns if c not in study.baselines]
  used = list(dict.fromkeys(b for b in baselines.values() if b))
  with_paper = lambda col: any((row, col) in study.paper and (row, baselines[row]) in study.paper
                               for row in study.rows)
  header = ['row'] + [c for col in columns for c in (col, 'paper') if c != 'paper' or with_paper(col)]
  lines = [f"Gap to the row's baseline ({' or '.join(used)}), in points of test error: the median over the "
           'seeds both finished of the per-seed difference (+ is worse than the baseline).', '',
           '| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
  for row in study.rows:
    cells = [row]
    for col in columns:
      has = baselines[row] and any(r.in_row(row) and r.column == col for r in study.runs)
      cells.append(_gap_text(gap(study, workdir, row, col, baselines[row])) if has else '-')
      if with_paper(col):
        paper = (study.paper.get((row, col)), study.paper.get((row, baselines[row])))
        cells.append('-' if None in paper else f'{paper[0] - paper[1]:+.2f}')
    lines.append('| ' + ' | '.join(cells) + ' |')
  if study.claims:
    lines += ['', 'Checks, decided from the gaps above:', '']
    lines += [check(study, workdir, c) for c in study.claims]
  return lines + ['']


def _finished_by_column(study: Study, workdir: str, row: str) -> dict[str, list[Run]]:
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
    finished, line = _finished_by_column(study, workdir, row), [row]
    for col in study.columns:
      line += cells(row, col, [learning_curves(run_dir(workdir, r)) for r in finished.get(col, [])])
    lines.append('| ' + ' | '.join(line) + ' |')
  return lines + ['']


def _best_accuracy(study: Study, workdir: str) -> list[str]:
  """The ResIST paper's way: each run's best test accuracy over its evaluations, mean and standard
  deviation over the seeds."""
  def cells(row, col, curves):
    best = [100 - min(c['test_error']) for c in curves]
    return ['-' if not best else f'{statistics.mean(best):.2f}'
            + (f' ± {statistics.stdev(best):.2f}' if len(best) > 1 else '') + f', n={len(best)}',
            f'{100 - study.paper[(row, col)]:.2f}' if (row, col) in study.paper else '-']
  return _curves_table(study, workdir, "Best test accuracy (%) over each run's evaluations, mean ± standard deviation "
                       "over the finished seeds (the ResIST paper's way), the paper's accuracy beside it:",
                       ('', 'paper'), cells)


def _other_accuracies(study: Study, workdir: str) -> list[str]:
  """Top-5 and further test sets (ImageNet-V2: v2mf, v2t07, v2ti), when the runs evaluated them: the error
  (%) at the last epoch, median over the finished seeds, one table per measure."""
  finished = {}
  for r in study.runs:
    if is_finished(workdir, r):
      with open(os.path.join(run_dir(workdir, r), 'finished.json'), encoding='utf-8') as f:
        finished[r] = json.load(f)
  keys = sorted({k for record in finished.values() for k in record
                 if k.endswith('_accuracy') and k != 'test_accuracy'})
  if not keys:
    return []
  names = {'test_top5_accuracy': 'top-5 test error', 'v2mf': 'ImageNet-V2 matched frequency',
           'v2t07': 'ImageNet-V2 threshold 0.7', 'v2ti': 'ImageNet-V2 top images'}
  lines = []
  for key in keys:
    prefix, top5 = key.split('_')[0], '_top5_' in key
    title = names.get(key) or f'{names.get(prefix, prefix)} {"top-5" if top5 else "top-1"} error'
    lines += [f'{title[0].upper()}{title[1:]} (%), last epoch, median over the finished seeds:', '',
              '| row | ' + ' | '.join(study.columns) + ' |', '|' + '---|' * (1 + len(study.columns))]
    for row in study.rows:
      cells = [row]
      for col in study.columns:
        errors = [100.0 * (1.0 - record[key]) for r, record in finished.items()
                  if r.in_row(row) and r.column == col and key in record]
        cells.append(_cell(errors))
      lines.append('| ' + ' | '.join(cells) + ' |')
    lines.append('')
  return lines


def _levelling(study: Study, workdir: str) -> list[str]:
  """Whether training ran its course: each column's test error at the end minus at 80% of the epochs."""
  def cells(row, col, curves):
    changes = []
    for c in curves:
      at = next(i for i, e in enumerate(c['epoch']) if e >= 0.8 * c['epoch'][-1] - 1e-9)
      changes.append(c['test_error'][-1] - c['test_error'][at])
    return [f'{statistics.median(changes):+.2f}' if changes else '-']
  return _curves_table(study, workdir, 'Levelled off? The test error at the last epoch minus the one at 80% of the '
                       'epochs (points; median over the finished seeds): near zero when the last 20% of the schedule '
                       'no longer changes it.', ('',), cells)


def _train_error(study: Study, workdir: str) -> list[str]:
  """The last epoch's training error beside its test error: a network whose two errors are close underfits,
  and there a method that optimises less well shows its loss in the test error too."""
  def cells(row, col, curves):
    if not curves:
      return ['-', '-']
    return [f"{statistics.median(c['train_error'][-1] for c in curves):.2f}",
            f"{statistics.median(c['test_error'][-1] - c['train_error'][-1] for c in curves):+.2f}"]
  return _curves_table(study, workdir, 'Training error (%) in the last epoch (the mean of the training records logged '
                       'in it: augmented images, BatchNorm in training mode, the parameters moving), then the test error '
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
    with open(os.path.join(folder, 'log.txt'), encoding='utf-8') as f:
      resumes = [int(m) for m in re.findall(r'resumed from the checkpoint at step (\d+)', f.read())]
  except OSError:
    return []
  from jaxdecouple.writers import read_metrics
  known = {r['step'] for r in read_metrics(folder) if r['kind'] in ('eval', 'checkpoint')}
  return [step for step in resumes if step not in known]


def _time_to_target(study: Study, workdir: str) -> list[str]:
  """Per row, the training seconds each column took to reach the row's target error: the highest of the
  columns' median final errors, which every column reaches."""
  from jaxdecouple.plots import learning_curves, time_to
  lines = ['Accuracy against wall-clock: training seconds (the sum of the evaluated epochs\' training time; '
           'compilation, evaluation and diagnostics not counted) to reach the row\'s target, the highest of its '
           'columns\' median final test errors, so that every column reaches it; median over the finished seeds '
           '(min-max). Measured on the machines above (which runs ran where: their lines), where runs started with '
           '--jobs share the cores: compare runs of one machine, not with the papers\' GPUs.', '',
           '| row | target error (%) | ' + ' | '.join(study.columns) + ' |', '|' + '---|' * (2 + len(study.columns))]
  for row in study.rows:
    finished = _finished_by_column(study, workdir, row)
    finals = [statistics.median(learning_curves(run_dir(workdir, r))['test_error'][-1] for r in rs)
              for rs in finished.values()]
    if not finals:
      continue
    target, cells = max(finals), [row]
    cells.append(f'{target:.2f}')
    for col in study.columns:
      times = [time_to(run_dir(workdir, r), target) for r in finished.get(col, [])]
      reached = sorted(t for t in times if t is not None)
      cells.append('-' if not times else f'{statistics.median(reached):.0f} ({reached[0]:.0f}-{reached[-1]:.0f})'
                   + ('' if len(reached) == len(times) else f', {len(times) - len(reached)} never') if reached
                   else f'never (n={len(times)})')
    lines.append('| ' + ' | '.join(cells) + ' |')
  short = [f'{r.row}, {r.column}, seed {r.seed} (step{"s" * (len(steps) > 1)} {", ".join(map(str, steps))})' for r in study.runs
           if is_finished(workdir, r) for steps in [uncounted_resumes(run_dir(workdir, r))] if steps]
  if short:
    lines += ['', 'Uncounted: runs resumed mid-epoch from checkpoints written before they carried the epoch\'s '
              'training time lack, in that epoch, the steps trained before the stop (less than one epoch\'s time '
              'per resume): ' + '; '.join(short) + '.']
  return lines + ['']


def _figures(study: Study, workdir: str, results_path: str, figures_dir: str) -> list[str]:
  """Per row: learning curves; test error against training seconds; and, where pipeline runs recorded
  staleness diagnostics, each stage's gradient against BP's (the first finished seed of each column)."""
  import matplotlib.pyplot as plt
  from jaxdecouple.plots import diagnostics, plot_curves, plot_diagnostics, plot_wallclock
  os.makedirs(figures_dir, exist_ok=True)
  lines = []
  for row in study.rows:
    finished = _finished_by_column(study, workdir, row)
    if not finished:
      continue
    slug = re.sub(r'[^a-z0-9]+', '_', f'{study.name}_{row}'.lower()).strip('_')
    rel = lambda png: os.path.relpath(png, os.path.dirname(os.path.abspath(results_path)))
    png = os.path.join(figures_dir, f'{slug}.png')
    label = lambda c, rs: f'{c} (seed {rs[0].seed})' if len(rs) == 1 else f'{c} (median of {len(rs)} seeds)'
    plt.close(plot_curves({label(c, rs): [run_dir(workdir, r) for r in rs] for c, rs in finished.items()},
                          path=png, title=row))  # written: a report of many rows keeps no figure open
    lines += [f'![{row}: test error and training loss per epoch]({rel(png)})', '']
    png = os.path.join(figures_dir, f'{slug}_wallclock.png')
    plt.close(plot_wallclock({c: [run_dir(workdir, r) for r in rs] for c, rs in finished.items()}, path=png,
                             title=row))
    lines += [f'![{row}: test error against training seconds, one line per seed]({rel(png)})', '']
    diagnosed = {f'{c} (seed {r.seed})': run_dir(workdir, r) for c, rs in finished.items()
                 for r in rs[:1] if diagnostics(run_dir(workdir, r))}
    if diagnosed:
      png = os.path.join(figures_dir, f'{slug}_staleness.png')
      plt.close(plot_diagnostics(diagnosed, path=png, title=f'{row}: each stage\'s applied gradient against BP\'s'))
      lines += [f'![{row}: cosine and norm ratio of each stage\'s applied gradient to back-propagation\'s]'
                f'({rel(png)})', '']
  return lines


def report(study: Study, workdir: str, results_path: str, figures_dir: str, command: str) -> str:
  """Writes the study's section of the results page and its figures; returns the markdown. Made from the
  run records alone (no date of its own), so the committed records regenerate it byte for byte."""
  lines = [f'## {study.title}', '',
           f'Generated by `{command}` from the run records in {workdir}.', '',
           f'- Data: {study.data.rstrip(".")}.', f'- Recipe: {study.recipe.rstrip(".")}.',
           f'- Seeds: {", ".join(map(str, sorted({r.seed for r in study.runs})))}; cells are the test error (%) at '
           'the last epoch: median over the finished seeds (min-max), n = seeds finished; the curves show the '
           'median per epoch over the finished seeds, their range shaded.']
  machines, dates = {}, []  # machine (json) -> the cells (row, column) of the runs that ran on it
  for run in study.runs:
    path = os.path.join(run_dir(workdir, run), 'machines.jsonl')
    if is_finished(workdir, run) and os.path.exists(path):
      with open(path, encoding='utf-8') as f:
        for line in f:
          m = json.loads(line)
          dates.append(m.pop('date')[:10])
          machines.setdefault(json.dumps(m, sort_keys=True), set()).add((run.row, run.column))
  kept = same_machines_once([json.loads(m) for m in sorted(machines)])
  cells = [set() for _ in kept]  # with several machines, which cells ran where: a record without the CPU's
  for k, c in machines.items():  # name counts as its named twin if it has one only
    twins = [i for i, m in enumerate(kept) if _same_machine(json.loads(k), m)]
    if len(twins) == 1:
      cells[twins[0]] |= c
  for m, ran in zip(kept, cells):
    where = f' (runs of {_cells_named(study, ran)})' if len(kept) > 1 else ''
    lines.append(f"- Machine: {m['devices']} x {m['device']} ({m['platform']}), host CPU {m['cpu']} with "
                 f"{m['cpu_count']} cores, jax {m['jax']}, Python {m['python']}{where}.")
  if dates:
    lines.append(f'- Run dates: {min(dates)} to {max(dates)}.')
  done = sum(is_finished(workdir, r) for r in study.runs)
  gone = [r.name for r in study.runs if diverged(workdir, r) is not None]
  lines += [f'- Finished runs: {done} of {len(study.runs)}' + (f'; diverged (stopped, not in the tables): '
            f'{", ".join(gone)}' if gone else '') + '.', '']
  header = ['row'] + [c for col in study.columns for c in (col, 'paper')
                      if c != 'paper' or any((row, col) in study.paper for row in study.rows)]
  lines += ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
  for row in study.rows:
    cells = [row]
    for col in study.columns:
      errors = [e for r in study.runs if r.in_row(row) and r.column == col
                if (e := _final_error(workdir, r)) is not None]
      cells.append(_cell(errors))
      if any((rw, col) in study.paper for rw in study.rows):
        cells.append(f'{study.paper[(row, col)]:.2f}' if (row, col) in study.paper else '-')
    lines.append('| ' + ' | '.join(cells) + ' |')
  lines.append('')
  if any(_row_baseline(study, row) for row in study.rows):
    lines += _gaps_and_checks(study, workdir)
  if study.best_accuracy and done:
    lines += _best_accuracy(study, workdir)
  lines += _other_accuracies(study, workdir)
  if done:
    lines += _levelling(study, workdir) + (_train_error(study, workdir) if study.train_error else []) \
        + _time_to_target(study, workdir)
    if study.reading:
      lines += [READING, ''] + [f'- {paragraph}' for paragraph in study.reading] + ['']
  return '\n'.join(lines + _figures(study, workdir, results_path, figures_dir))


_FROM_RECORDS = 'from the run records in'  # what a section made from committed records says


def write_results(sections: dict[str, str], results_path: str) -> None:
  """docs/RESULTS.md holds one generated section per study; this replaces the given ones."""
  existing: dict[str, str] = {}
  if os.path.exists(results_path):
    with open(results_path, encoding='utf-8') as f:
      text = f.read()
    for part in re.split(r'\n(?=<!-- study: )', text):
      m = re.match(r'<!-- study: (\S+) -->\n', part)
      if m:
        existing[m.group(1)] = part[m.end():].rstrip() + '\n'
  existing.update(sections)
  kept = [n for n, t in sorted(existing.items()) if _FROM_RECORDS in t]
  lost = [n for n, t in sorted(existing.items()) if _FROM_RECORDS not in t]
  head = ['# Results', '',
          'Every section below is generated by `python -m jaxdecouple.study --study=NAME --workdir=DIR '
          '--report`; the only words typed by hand are a study\'s reading of its runs, marked as such, whose '
          'figures a test finds in the tables above it. Test error in %.', '']
  if kept:
    head += [f'Run records in the repository (under studies/; `--report` regenerates these sections and their '
             f'figures from a fresh clone): {", ".join(kept)}.', '']
  if lost:
    head += [f'Run records not in the repository: {", ".join(lost)}. These studies ran while studies/ was not '
             'tracked, and their records stayed on the machines that ran them; their sections stay as they were '
             'generated then and cannot be regenerated.', '']
  body = [f'<!-- study: {name} -->\n{text.rstrip()}\n' for name, text in sorted(existing.items())]
  os.makedirs(os.path.dirname(os.path.abspath(results_path)), exist_ok=True)
  with open(results_path, 'w', encoding='utf-8') as f:
    f.write('\n'.join(head) + '\n' + '\n'.join(body))
