"""Learning curves from runs' metrics.jsonl: test error and training loss per epoch, one line per run.

    from jaxdecouple.plots import plot_curves
    fig = plot_curves({'BP': 'workdirs/bp', 'FDG K=2': 'workdirs/fdg'}, path='curves.png')

Used by the quickstart notebook and by the reproduction report.
"""
from __future__ import annotations

import json
import math
import os
from typing import Mapping, Sequence

from jaxdecouple.writers import read_metrics


def learning_curves(workdir: str) -> dict[str, list[float]]:
  """Per-epoch curves of one run: ``epoch``, ``test_error`` (%) and ``train_loss``.

  A resumed run may log a step twice; the last record of each step wins. Training loss is the mean
  of the training records logged during each epoch, matched to that epoch's evaluation.
  """
  records: dict[tuple[str, int], dict] = {}
  for r in read_metrics(workdir):
    records[(r['kind'], r['step'])] = r
  evals = sorted((r for (kind, _), r in records.items() if kind == 'eval'), key=lambda r: r['step'])
  train = sorted((r for (kind, _), r in records.items() if kind == 'train'), key=lambda r: r['step'])
  curves = {'epoch': [], 'test_error': [], 'train_loss': []}
  previous = 0
  for e in evals:
    losses = [r['train_loss'] for r in train if previous < r['step'] <= e['step']
              and isinstance(r.get('train_loss'), (int, float))]
    curves['epoch'].append(e['epoch'])
    curves['test_error'].append(100.0 * (1.0 - e['test_accuracy']))
    curves['train_loss'].append(sum(losses) / len(losses) if losses else math.nan)
    previous = e['step']
  return curves


def run_label(workdir: str) -> str:
  """A short label from the run's config.json: method, K and beta for pipelines."""
  try:
    with open(os.path.join(workdir, 'config.json'), encoding='utf-8') as f:
      c = json.load(f)
  except (OSError, ValueError):
    return os.path.basename(os.path.normpath(workdir))
  label = c.get('method', '?').upper()
  pipeline = c.get('pipeline', {})
  if c.get('method') not in ('bp', 'dp') and pipeline:
    label += f" K={pipeline.get('num_stages')}"
    if pipeline.get('beta', 1.0) != 1.0:
      label += f" beta={pipeline.get('beta')}"
  return label


def plot_curves(runs: Sequence[str] | Mapping[str, str], path: str | None = None, title: str | None = None):
  """Draws test error (%) and training loss per epoch for one or several workdirs.

  ``runs`` is a list of workdirs (labels come from their config.json) or a {label: workdir} dict.
  Saves a PNG when ``path`` is given; returns the matplotlib Figure (shown inline in notebooks).
  """
  import matplotlib
  if path is not None and matplotlib.get_backend().lower() not in ('agg', 'module://matplotlib_inline.backend_inline'):
    matplotlib.use('Agg')  # files only: no display needed
  import matplotlib.pyplot as plt
  import matplotlib.ticker

  if not isinstance(runs, Mapping):
    labels = [run_label(w) for w in runs]
    runs = {(f'{label} ({os.path.basename(os.path.normpath(w))})' if labels.count(label) > 1 else label): w
            for label, w in zip(labels, runs)}
  fig, (ax_err, ax_loss) = plt.subplots(1, 2, figsize=(10, 3.8))
  for label, workdir in runs.items():
    curves = learning_curves(workdir)
    ax_err.plot(curves['epoch'], curves['test_error'], marker='o', markersize=3, label=label)
    ax_loss.plot(curves['epoch'], curves['train_loss'], marker='o', markersize=3, label=label)
  ax_err.set(xlabel='epoch', ylabel='test error (%)')
  ax_loss.set(xlabel='epoch', ylabel='training loss')
  for ax in (ax_err, ax_loss):
    ax.grid(alpha=0.3)
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))  # whole epochs
  # One legend, right of both panels, so it never covers a curve.
  fig.legend(*ax_err.get_legend_handles_labels(), loc='center left', bbox_to_anchor=(1.0, 0.5))
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  if path is not None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches='tight')
  return fig
