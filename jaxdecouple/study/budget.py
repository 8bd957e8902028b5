"""Accuracy against the communication budget (the ResIST paper's Figure 8): each replica column's test error beside
the bytes a round of its settings moves, measured by ``benchmarks/resist_round.py`` on the same network.

The study runs train on one CPU device, where nothing crosses a device, so their own byte counts are zero. The
bytes come instead from a file of the benchmark's JSON records in the study's workdir (``Study.budget``: one
round per setting, one worker per CPU device, written with ``--json_out``), matched to each column by what
changes the bytes: model, S, method and the wire settings (bits, fraction kept, what is compressed, the outer
step). A column without a matching record shows '-'.
"""
from __future__ import annotations

import json
import os
import statistics

from jaxdecouple.replica.traffic import wire_settings
from jaxdecouple.study.core import Study, run_dir
from jaxdecouple.study.gaps import final_error


def _key(model: str, workers: int, method: str, wire: dict) -> str:
  return json.dumps([model, workers, method, wire], sort_keys=True)


def read_budget(path: str) -> dict[str, dict]:
  """resist_round.py's records by (model, S, method, wire settings); the last record of a key wins."""
  out = {}
  with open(path, encoding='utf-8') as f:
    for line in f:
      r = json.loads(line)
      if 'moved_mb' in r:
        wire = {k: r[k] for k in ('quantize_bits', 'sparsify', 'compress', 'update_exchange', 'outer') if k in r}
        out[_key(r['model'], r['workers'], r['method'], wire)] = r
  return out


def _config(workdir: str, runs):
  """The cell's settings: a finished run's own config.json where one exists (settings chosen from other runs
  land there), else the study's config, or None while a chosen setting is still to be chosen."""
  from jaxdecouple.config import get_default_config

  def merge(into, saved):  # a record of an earlier version lacks later fields: they keep their defaults
    for key, value in saved.items():
      if key in into:
        merge(into[key], value) if isinstance(value, dict) else setattr(into, key, value)
  for run in runs:
    path = os.path.join(run_dir(workdir, run), 'config.json')
    if os.path.exists(path):
      with open(path, encoding='utf-8') as f:
        config = get_default_config()
        merge(config, json.load(f))
        return config
  return None if runs[0].choose is not None else runs[0].config('x.npz')


def budget_table(study: Study, workdir: str) -> list[str]:
  """One line per replica cell with a measured round: MB each device moves per round (blocks sent plus what it
  puts into the shared layers' collective, as resist_round.py's 'moved'), that against the same method's
  float32 round, MB arriving from the collective, and the cell's median test error."""
  path = os.path.join(workdir, study.budget) if study.budget else ''
  if not path or not os.path.exists(path):
    return []
  records, lines = read_budget(path), []
  for row in study.rows:
    for col in study.columns:
      runs = [r for r in study.runs if r.in_row(row) and r.column == col]
      if not runs:
        continue
      c = _config(workdir, runs)
      if c is None:  # settings chosen from other runs' results, not yet chosen
        continue
      record = records.get(_key(c.model, c.replica.num_workers, c.method, wire_settings(c.replica)))
      plain = records.get(_key(c.model, c.replica.num_workers, c.method, {}))
      if record is None:
        continue
      errors = [e for r in runs if (e := final_error(workdir, r)) is not None]
      lines.append(f"| {row} | {col} | {record['moved_mb']:.3f} | "
                   + (f"{record['moved_mb'] / plain['moved_mb']:.2f}" if plain else '-')
                   + f" | {record['collective_received_mb']:.3f} | "
                   + (f'{statistics.median(errors):.2f}, n={len(errors)}' if errors else '-') + ' |')
  if not lines:
    return []
  return ["Accuracy against the communication budget (the ResIST paper's Figure 8): MB each device moves per round "
          "(blocks sent plus what it puts into the shared layers' collective) and MB arriving from that "
          'collective, measured by benchmarks/resist_round.py on this network, one worker per CPU device '
          f'({study.budget} in the workdir: the runs themselves train on one device, where nothing crosses one); '
          "the same method's float32 round is 1.00; the test error is the cell's median:", '',
          '| row | column | MB moved per device | vs float32 | MB arriving from the collective | test error (%) |',
          '|---|---|---|---|---|---|', *lines, '']
