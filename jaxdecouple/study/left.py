"""How much of a study is left, in runs and in hours, going by how long its finished runs took.

Studies here run for days on a few cores, across machines that are replaced between sessions: whoever
continues one wants to know, before starting, whether what is left is an afternoon or a week. The estimate
is a model, labelled so where it is printed: a run under way (stopped or running, with an evaluation
recorded) is assumed to go on at its own pace, here; every other unfinished run to take what the finished runs
of the same table cell took on other seeds (a run under way counting as a whole run at its pace), else of the
same row (the network, its split and recipe: what decides a run's cost more than its method does; an S = 8 run
is not an S = 2 run's length), else of the same column, else of the whole study, on the machines that ran them.
"""
from __future__ import annotations

import json
import os
import statistics

from jaxdecouple.study.core import Study, finished_record, is_finished, read_record, run_dir
from jaxdecouple.writers import read_metrics
from jaxdecouple.workdir import checkpoint_steps


def run_seconds(workdir: str, run) -> float | None:
  """How long a finished run took: its wall time when it ran whole in one call (finished.json), else the sum of
  its epochs' training and evaluation seconds (the evaluations' records in metrics.jsonl), which leaves out a
  resumed run's gaps and its compilations; None for a run not finished or with neither."""
  record = finished_record(workdir, run)
  if record is None:
    return None
  if isinstance(whole := record.get('whole_run_seconds'), (int, float)) and whole > 0:
    return float(whole)
  evals = {r['step']: r for r in read_metrics(run_dir(workdir, run)) if r['kind'] == 'eval'}  # a resumed run may
  # log an evaluation twice: the last record of each step counts, as in the learning curves
  total = sum(r.get(key) for r in evals.values() for key in ('epoch_time_s', 'eval_time_s')
              if isinstance(r.get(key), (int, float)))
  return total or None


def own_pace(workdir: str, run) -> tuple[float, float, float] | None:
  """A run's pace so far: (the median of its epochs' training and evaluation seconds, the epoch it will resume
  from, the epochs its config.json plans), from metrics.jsonl and its checkpoints; None for a run with no
  evaluation yet, no readable config.json, or a step limit (``max_steps``) rather than epochs. The epoch it
  resumes from is its newest checkpoint's, not its last evaluation's: a killed run redoes the epochs it evaluated
  after its last checkpoint, and a run whose checkpoints went with a machine (its records committed) starts
  again from 0."""
  folder = run_dir(workdir, run)
  try:
    with open(os.path.join(folder, 'config.json'), encoding='utf-8') as f:
      config = json.load(f)
  except (OSError, ValueError):
    return None
  total = config.get('num_epochs') if isinstance(config, dict) else None
  if not isinstance(total, (int, float)) or config.get('max_steps'):
    return None
  evals = {r['step']: r for r in read_metrics(folder) if r['kind'] == 'eval'}
  epochs = [r['epoch_time_s'] + (r.get('eval_time_s') or 0.0) for r in evals.values()
            if isinstance(r.get('epoch_time_s'), (int, float))]
  per_epoch = [r['step'] / r['epoch'] for r in evals.values() if isinstance(r.get('epoch'), (int, float)) and r['epoch']]
  if not epochs or not per_epoch:
    return None
  steps = checkpoint_steps(folder)
  return statistics.median(epochs), max(steps) / per_epoch[0] if steps else 0.0, float(total)



BASES = ('by_itself', 'by_cell', 'by_row', 'by_column', 'by_study')  # an estimate's basis, closest first
BASIS_WORDS = {'by_itself': 'itself (under way: its epochs left at its own pace)', 'by_cell': 'the same cell (other seeds)',
               'by_row': 'the same row (other methods)', 'by_column': 'the same column',
               'by_study': 'the whole study (the roughest)'}


def run_estimates(study: Study, workdir: str, under_way: bool = True) -> dict[str, tuple[float, str] | None]:
  """Each unfinished run's estimated seconds to its end and the estimate's basis (one of ``BASES``), by name;
  None for a run with nothing to go by (no finished run, none under way). A model: the median of finished runs'
  times on the machines that ran them, or a run's own pace so far. ``under_way=False``: the finished runs' records
  alone, a run under way estimated as a whole run as if it had not started (what the study runner measures this
  machine's pace against: the same work, on the machines that ran it)."""
  took = {run.name: run_seconds(workdir, run) for run in study.runs}
  done = [run for run in study.runs if took[run.name] is not None]
  # a finished run with no times is not left, nor a diverged one (the runner passes it over: it would diverge
  # again; so it does with a damaged diverged.json), nor one with any finished.json, which the runner passes over
  # too (damaged, or whose metrics.jsonl lost its evaluations: unfinished in the report, but never run again)
  left = [run for run in study.runs if not is_finished(workdir, run)
          and read_record(workdir, run, 'finished.json') == (None, None)
          and read_record(workdir, run, 'diverged.json') == (None, None)]
  paces = {run.name: own_pace(workdir, run) if under_way else None for run in left}
  for run in left:  # a run under way stands for its cell's other seeds too: a whole run at its pace
    if (pace := paces[run.name]) is not None:
      took[run.name] = pace[0] * pace[2]
      done.append(run)
  estimates: dict[str, tuple[float, str] | None] = {}
  for run in left:
    estimates[run.name] = None
    if (pace := paces[run.name]) is not None:  # its epochs left at its seconds an epoch
      per_epoch, epochs_done, epochs = pace
      estimates[run.name] = (max(epochs - epochs_done, 0.0) * per_epoch, 'by_itself')
      continue
    for kind, alike in (('by_cell', lambda r: r.row == run.row and r.column == run.column),
                        ('by_row', lambda r: r.row == run.row), ('by_column', lambda r: r.column == run.column),
                        ('by_study', lambda r: True)):
      if seconds := [took[r.name] for r in done if alike(r)]:
        estimates[run.name] = (statistics.median(seconds), kind)
        break
  return estimates


def time_left(study: Study, workdir: str) -> dict:
  """The unfinished runs and the estimated seconds they need one after another: ``runs`` left, ``seconds``,
  and how many were estimated at their own pace (``by_itself``: under way), from the same cell (``by_cell``), row
  (``by_row``), column (``by_column``) or the whole study (``by_study``); ``unknown`` with no finished run to go by."""
  counts = {'runs': 0, 'seconds': 0.0, **{kind: 0 for kind in BASES}, 'unknown': 0}
  for estimate in run_estimates(study, workdir).values():
    counts['runs'] += 1
    if estimate is None:
      counts['unknown'] += 1
    else:
      counts['seconds'] += estimate[0]
      counts[estimate[1]] += 1
  return counts


def left_line(study: Study, workdir: str) -> str:
  """One line for the console: what is left of the study and about how long it takes one process."""
  c = time_left(study, workdir)
  if not c['runs']:
    return f'study {study.name}: every run has finished'
  if c['unknown'] == c['runs']:
    return f'study {study.name}: {c["runs"]} of {len(study.runs)} runs left (no finished run yet to estimate their time)'
  how = '; '.join(f'{c[k]} from {BASIS_WORDS[k]}' for k in BASES if c[k])
  unknown = f'; {c["unknown"]} with nothing to go by' if c['unknown'] else ''
  return (f'study {study.name}: {c["runs"]} of {len(study.runs)} runs left, about {c["seconds"] / 3600:.1f} h one '
          f'after another, each estimated by the median time of finished runs, on the machines that ran them, or '
          f'its own pace: {how}{unknown}; --jobs divides it by the processes the cores can carry')
