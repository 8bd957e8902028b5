"""The report's figures, per row: learning curves, test error against training seconds and, where pipeline
runs recorded staleness diagnostics, each stage's gradient against BP's; and a swept setting's figure
(``Study.sweep``). Apart from the tables because it
writes image files (through matplotlib, imported only here) and the markdown lines that show them.
"""
from __future__ import annotations

import json
import os
import re

from jaxdecouple.study.core import Study, run_dir
from jaxdecouple.study.curves import finished_by_column
from jaxdecouple.study.sweep import sweep_data


def figure_lines(study: Study, workdir: str, results_path: str, figures_dir: str) -> list[str]:
  """Per row: learning curves; test error against training seconds; for text, the losses against steps and
  training seconds; and, where pipeline runs recorded staleness diagnostics, each stage's gradient against
  BP's (the first finished seed of each column)."""
  import matplotlib.pyplot as plt
  from jaxdecouple.data import TEXT_DATASETS
  from jaxdecouple.plots import diagnostics, plot_curves, plot_diagnostics, plot_losses, plot_wallclock
  os.makedirs(figures_dir, exist_ok=True)
  lines = []
  rel = lambda png: os.path.relpath(png, os.path.dirname(os.path.abspath(results_path)))
  for row in study.rows:
    finished = finished_by_column(study, workdir, row)
    if not finished:
      continue
    slug = re.sub(r'[^a-z0-9]+', '_', f'{study.name}_{row}'.lower()).strip('_')
    png = os.path.join(figures_dir, f'{slug}.png')
    label = lambda c, rs: f'{c} (seed {rs[0].seed})' if len(rs) == 1 else f'{c} (median of {len(rs)} seeds)'
    plt.close(plot_curves({label(c, rs): [run_dir(workdir, r) for r in rs] for c, rs in finished.items()},
                          path=png, title=row))  # written: a report of many rows keeps no figure open
    lines += [f'![{row}: test error and training loss per epoch]({rel(png)})', '']
    png = os.path.join(figures_dir, f'{slug}_wallclock.png')
    plt.close(plot_wallclock({c: [run_dir(workdir, r) for r in rs] for c, rs in finished.items()}, path=png,
                             title=row))
    lines += [f'![{row}: test error against training seconds, one line per seed]({rel(png)})', '']
    if _dataset(run_dir(workdir, next(iter(finished.values()))[0])) in TEXT_DATASETS:  # few evaluations: every step
      png = os.path.join(figures_dir, f'{slug}_losses.png')
      plt.close(plot_losses({c: [run_dir(workdir, r) for r in rs] for c, rs in finished.items()}, path=png,
                            title=row))
      lines += [f'![{row}: training loss at every logged step and held-out loss at each evaluation, against steps '
                f'(median over seeds) and against training seconds (one line per seed)]({rel(png)})', '']
    diagnosed = {f'{c} (seed {r.seed})': run_dir(workdir, r) for c, rs in finished.items()
                 for r in rs[:1] if diagnostics(run_dir(workdir, r))}
    if diagnosed:
      png = os.path.join(figures_dir, f'{slug}_staleness.png')
      plt.close(plot_diagnostics(diagnosed, path=png, title=f'{row}: each stage\'s applied gradient against BP\'s'))
      lines += [f'![{row}: cosine and norm ratio of each stage\'s applied gradient to back-propagation\'s]'
                f'({rel(png)})', '']
  if study.sweep is not None and (data := sweep_data(study, workdir))['series']:
    from jaxdecouple.plots import plot_sweep
    png = os.path.join(figures_dir, f'{study.name}_sweep.png')
    plt.close(plot_sweep(data, study.sweep.label, study.sweep.log_x, path=png, title=study.title))
    lines += [f'![test error and gap to the baseline against {study.sweep.label} (the median of the seeds, their '
              f'range as bars; the paper\'s gap where it prints one)]({rel(png)})', '']
  return lines


def _dataset(folder: str) -> str:
  """The data set a finished run trained on, from its own config.json ('' when it has none)."""
  try:
    with open(os.path.join(folder, 'config.json'), encoding='utf-8') as f:
      return json.load(f).get('dataset', '')
  except (OSError, ValueError):
    return ''
