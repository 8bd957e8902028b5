"""The machines a study's runs ran on, as the report names them.

Apart from the tables because it reads other records (each run's machines.jsonl) and has rules of its own:
a record whose CPU is only an architecture name counts as its twin that names the CPU, so one machine is
not listed twice when the CPU's model name was read on some runs and not on others.
"""
from __future__ import annotations

import json
import os

from jaxdecouple.study.core import Study, is_finished, run_dir, warn_once
from jaxdecouple.writers import read_jsonl


_KEYS = {'cpu', 'device', 'devices', 'platform', 'cpu_count', 'jax', 'python'}  # what the report's line names
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


def machine_lines(study: Study, workdir: str) -> list[str]:
  """Where and when the finished runs ran: a line per machine (with several, the cells that ran on each)
  and the run dates, from each run's machines.jsonl."""
  lines = []
  machines, dates = {}, []  # machine (json) -> the cells (row, column) of the runs that ran on it
  for run in study.runs:
    path = os.path.join(run_dir(workdir, run), 'machines.jsonl')
    if is_finished(workdir, run) and os.path.exists(path):
      damaged = []
      for m in read_jsonl(path, lambda m: isinstance(m.get('date'), str) and _KEYS <= set(m), damaged):
        dates.append(m.pop('date')[:10])
        machines.setdefault(json.dumps(m, sort_keys=True), set()).add((run.row, run.column))
      if damaged:
        warn_once(workdir, run, 'machines.jsonl', f'line{"s" * (len(damaged) > 1)} '
                  f'{", ".join(str(n) for n, _ in damaged)} {"are" if len(damaged) > 1 else "is"} damaged '
                  f'({damaged[0][1]}); skipped')
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
  return lines
