"""A swept setting's numbers (``Sweep``): per series and value of the setting, the finished seeds' test errors,
the gap to the row's baseline paired by seed, and the paper's gap where it prints both figures. Apart from the
figure that draws them (figures.py, plots.py) so that a test reads the numbers, not pixels."""
from __future__ import annotations

from jaxdecouple.study.core import Study
from jaxdecouple.study.gaps import final_error, gap, row_baseline


def sweep_data(study: Study, workdir: str) -> dict:
  """``{'series': {name: [(value, [test errors of the finished seeds]), ...]}, 'gaps': {name: [(value, median
  paired gap, seeds), ...]}, 'paper_gaps': {name: [(value, gap), ...]}, 'baselines': {name: (the baseline
  column, its errors)}}``, each list in the order of the values; cells with no finished seed are left out. A
  series swept over the columns of one row has its baseline's errors (drawn as a line); one swept over rows
  (ResIST's L) compares with each row's own baseline, so only its gaps say it; the baseline's own cells have no
  gap."""
  sweep = study.sweep
  cells = {(r.row, r.column) for r in study.runs} | {(row, r.column) for r in study.runs for row in r.also_rows}
  unknown = sorted(set(sweep.points) - cells)
  if unknown:
    raise ValueError(f'study {study.name}: its sweep names cells it has no runs for: {unknown}')
  rows = {}  # each series' rows: its baseline is drawn as a line only where it is one row's (a swept column)
  for (row, _), (series, _) in sweep.points.items():
    rows.setdefault(series, set()).add(row)
  data = {'series': {}, 'gaps': {}, 'paper_gaps': {}, 'baselines': {}}
  for (row, column), (series, value) in sorted(sweep.points.items(), key=lambda kv: kv[1]):
    errors = [e for r in study.runs if r.in_row(row) and r.column == column
              if (e := final_error(workdir, r)) is not None]
    if not errors:
      continue
    data['series'].setdefault(series, []).append((value, errors))
    baseline = row_baseline(study, row)
    if baseline is None or baseline == column:  # the baseline itself: no gap to draw
      continue
    if len(rows[series]) == 1 and series not in data['baselines']:
      data['baselines'][series] = (baseline, [e for r in study.runs if r.in_row(row) and r.column == baseline
                                              if (e := final_error(workdir, r)) is not None])
    if (g := gap(study, workdir, row, column, baseline)) is not None:
      data['gaps'].setdefault(series, []).append((value, *g))
    if (row, column) in study.paper and (row, baseline) in study.paper:
      data['paper_gaps'].setdefault(series, []).append((value, study.paper[(row, column)] -
                                                        study.paper[(row, baseline)]))
  return data
