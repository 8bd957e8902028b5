"""The numbers a study is judged by: each run's final test error, each method's gap to its row's baseline
paired by seed, and the study's checks (its targets and the papers' findings) decided on those gaps.

Apart from the rest of the report because a test reads the hand-written reading of a study against
these numbers, and the claims name rows whose baseline must exist (``row_baseline``).
"""
from __future__ import annotations

import statistics
from typing import Sequence

from jaxdecouple.study.core import Claim, Run, Study, finished_record


def final_error(workdir: str, run: Run) -> float | None:
  record = finished_record(workdir, run)
  return None if record is None else 100.0 * (1.0 - record['test_accuracy'])


def error_cell(errors: Sequence[float]) -> str:
  if not errors:
    return '-'
  median = statistics.median(errors)
  spread = f' ({min(errors):.2f}-{max(errors):.2f})' if len(errors) > 1 else ''
  return f'{median:.2f}{spread}, n={len(errors)}'


def _errors_by_seed(study: Study, workdir: str, row: str, column: str) -> dict[int, float]:
  return {r.seed: e for r in study.runs if r.in_row(row) and r.column == column
          if (e := final_error(workdir, r)) is not None}


def gap(study: Study, workdir: str, row: str, column: str, baseline: str,
        baseline_row: str | None = None) -> tuple[float, int] | None:
  """The column's test error minus the baseline's in a row (or the baseline's in ``baseline_row``), in points:
  the median over the seeds both finished of the per-seed difference (paired, so a seed's easy or hard draw
  cancels), and that count."""
  ours = _errors_by_seed(study, workdir, row, column)
  base = _errors_by_seed(study, workdir, baseline_row or row, baseline)
  seeds = sorted(ours.keys() & base.keys())
  if not seeds:
    return None
  return statistics.median(ours[s] - base[s] for s in seeds), len(seeds)


def row_baseline(study: Study, row: str) -> str | None:
  return next((b for b in study.baselines if any(r.in_row(row) and r.column == b for r in study.runs)), None)


def _gap_text(g: tuple[float, int] | None) -> str:
  return '-' if g is None else f'{g[0]:+.2f}, n={g[1]}'


def _planned_seeds(study: Study, row: str, column: str) -> int:
  return len({r.seed for r in study.runs if r.in_row(row) and r.column == column})


def _provisional(study: Study, counts: Sequence[tuple[str, str, int]]) -> str:
  """' (provisional: ...)' when a verdict stands on fewer seeds than the study runs for its cells: it can
  still turn as the rest land."""
  short = [f'{row}, {column}: {n} of {planned}' for row, column, n in counts
           if n < (planned := _planned_seeds(study, row, column))]
  return f" (provisional, fewer seeds than planned: {'; '.join(short)})" if short else ''


def check(study: Study, workdir: str, claim: Claim) -> str:
  """One line of the report's checks: the claim, met or not, and the gaps it was decided on; provisional
  while it stands on fewer seeds than the study plans."""
  if claim.reference is not None:
    row, = claim.rows
    errors = list(_errors_by_seed(study, workdir, row, claim.column).values())
    if not errors:
      return f'- {claim.text}: waiting for runs ({row}: -)'
    median = round(statistics.median(errors), 2)  # decided on the figure shown
    verdict = 'met' if abs(median - claim.reference) <= claim.limit else 'missed'
    return (f'- {claim.text}: **{verdict}** ({row}: {error_cell(errors)}, '
            f'{median - claim.reference:+.2f} from {claim.reference:.2f})'
            + _provisional(study, [(row, claim.column, len(errors))]))
  gaps = [(row, gap(study, workdir, row, claim.column, claim.baseline, claim.baseline_row)) for row in claim.rows]
  shown = '; '.join(f'{row}: {_gap_text(g)}' for row, g in gaps)
  if any(g is None for _, g in gaps):
    return f'- {claim.text}: waiting for runs ({shown})'
  values = [round(g[0], 2) for _, g in gaps]  # decided on the figures shown
  if claim.limit is not None:
    verdict = 'met' if (abs(values[0]) if claim.either_side else values[0]) <= claim.limit else 'missed'
  elif claim.factor != 1.0:
    verdict = 'yes' if all(a <= claim.factor * b for a, b in zip(values, values[1:])) else 'no'
  else:
    verdict = 'yes' if all(a < b for a, b in zip(values, values[1:])) else 'no'
  # provisional where a cell the gaps pair, the column's or its baseline's, has fewer seeds than planned
  cells = dict.fromkeys(cell for row in claim.rows for cell in ((row, claim.column),
                                                                (claim.baseline_row or row, claim.baseline)))
  return (f'- {claim.text}: **{verdict}** ({shown})'
          + _provisional(study, [(r, c, len(_errors_by_seed(study, workdir, r, c))) for r, c in cells]))


def gaps_and_checks(study: Study, workdir: str) -> list[str]:
  baselines = {row: row_baseline(study, row) for row in study.rows}
  used = list(dict.fromkeys(b for b in baselines.values() if b))
  # every column but the baselines the rows use: a study with BP and local SGD measures local SGD against BP too
  columns = [c for c in study.columns if c not in used]
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
    figures = 'errors and gaps' if any(c.reference is not None for c in study.claims) else 'gaps'
    lines += ['', f'Checks, decided from the {figures} above:', '']
    lines += [check(study, workdir, c) for c in study.claims]
  return lines + ['']
