"""Learning curves from runs' metrics.jsonl: test error and training loss per epoch, one line per run.

    from jaxdecouple.plots import plot_curves
    fig = plot_curves({'BP': 'workdirs/bp', 'FDG K=2': 'workdirs/fdg'}, path='curves.png')

    plot_diagnostics('workdirs/fdg', path='staleness.png')  # pipeline.diagnose_every_steps lines
    plot_wallclock({'BP': ['workdirs/bp'], 'FDG': ['workdirs/fdg']}, path='wallclock.png')  # against seconds
    plot_timeline('workdirs/1f1b', path='timeline.png')  # a pipeline's passes as they really ran (profile steps)
    plot_sweep(sweep_data(study, workdir), 'beta')  # a swept setting (jaxdecouple.study.sweep), as the papers draw it

Used by the quickstart notebook and by the reproduction report.
"""
from __future__ import annotations

import json
import math
import os
import statistics
from typing import Mapping, Sequence

from jaxdecouple.writers import read_metrics


def learning_curves(workdir: str) -> dict[str, list[float]]:
  """Per-epoch curves of one run: ``epoch``, ``test_error`` (%), ``train_loss``, ``train_error`` (%) and
  ``train_seconds`` (the training time up to that evaluation: compilation, evaluations and diagnostics not
  counted).

  A resumed run may log a step twice; the last record of each step wins. Training loss and error are the
  means of the training records logged during each epoch, matched to that epoch's evaluation (on augmented
  images, BatchNorm in training mode, the parameters moving: a training-time figure, not a second test).
  """
  records: dict[tuple[str, int], dict] = {}
  for r in read_metrics(workdir):
    records[(r['kind'], r['step'])] = r
  evals = sorted((r for (kind, _), r in records.items() if kind == 'eval'), key=lambda r: r['step'])
  train = sorted((r for (kind, _), r in records.items() if kind == 'train'), key=lambda r: r['step'])
  curves = {'epoch': [], 'test_error': [], 'test_loss': [], 'train_loss': [], 'train_error': [], 'train_seconds': []}
  mean = lambda values: sum(values) / len(values) if values else math.nan
  previous, seconds = 0, 0.0
  for e in evals:
    seconds += e.get('epoch_time_s', math.nan)
    curves['train_seconds'].append(seconds)
    epoch = [r for r in train if previous < r['step'] <= e['step']]
    number = lambda key: [r[key] for r in epoch if isinstance(r.get(key), (int, float))]
    curves['epoch'].append(e['epoch'])
    curves['test_error'].append(100.0 * (1.0 - e['test_accuracy']))
    curves['test_loss'].append(e.get('test_loss', math.nan))
    curves['train_loss'].append(mean(number('train_loss')))
    curves['train_error'].append(100.0 * (1.0 - mean(number('train_accuracy'))))
    previous = e['step']
  return curves


def median_curves(workdirs: Sequence[str]) -> dict[str, list[float]]:
  """Several runs of one setting (seeds) as one curve: at every epoch that all of them evaluated, the
  median of their test errors and training losses, with the lowest and highest beside them
  (``test_error_low``, ``test_error_high``, ``train_loss_low``, ``train_loss_high``)."""
  runs = [learning_curves(w) for w in workdirs]
  by_epoch = [{round(e, 4): i for i, e in enumerate(r['epoch'])} for r in runs]
  epochs = sorted(set.intersection(*(set(b) for b in by_epoch))) if runs else []
  out: dict[str, list[float]] = {'epoch': epochs}
  for key in ('test_error', 'train_loss'):
    values = [sorted(r[key][b[e]] for r, b in zip(runs, by_epoch)) for e in epochs]
    out[key] = [statistics.median(v) for v in values]
    out[f'{key}_low'], out[f'{key}_high'] = [v[0] for v in values], [v[-1] for v in values]
  return out


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


def diagnostics(workdir: str) -> dict[int, dict[str, list[float]]]:
  """A run's ``kind: "diagnose"`` lines per stage: {k: {'epoch', 'cosine', 'norm_ratio'}} (last record of a
  step wins, as for resumed runs)."""
  records = {r['step']: r for r in read_metrics(workdir) if r['kind'] == 'diagnose'}
  out: dict[int, dict[str, list[float]]] = {}
  for step in sorted(records):
    r = records[step]
    for key, value in r.items():
      if key.startswith('stage') and key.endswith('_cosine'):
        k = int(key[len('stage'):-len('_cosine')])
        d = out.setdefault(k, {'epoch': [], 'cosine': [], 'norm_ratio': []})
        d['epoch'].append(r.get('epoch', step))
        d['cosine'].append(value)
        d['norm_ratio'].append(r.get(f'stage{k}_norm_ratio', math.nan))
  return out


def _figure_backend(path):
  import matplotlib
  if path is not None and matplotlib.get_backend().lower() not in ('agg', 'module://matplotlib_inline.backend_inline'):
    matplotlib.use('Agg')  # files only: no display needed
  import matplotlib.pyplot as plt
  return plt


# Beside the figures of a folder: which matplotlib drew each (name -> version). The same records redraw a figure
# byte for byte only with the same matplotlib (another release moves a label by a pixel), which is what
# tests/test_study.py needs to know before it compares bytes.
DRAWN_WITH = 'drawn_with.json'


def _save(fig, path):
  if path is not None:
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches='tight', metadata={'Software': None})
    _note_drawn_with(folder, os.path.basename(path))
  return fig


def _note_drawn_with(folder: str, name: str) -> None:
  """Records ``name``'s matplotlib in the folder's DRAWN_WITH. Two studies may report into one folder at once:
  the read-modify-write holds a lock (fcntl where there is one), and the new file takes the old one's place
  whole (a temporary file of its own, then os.replace), so no entry is lost and no reader sees half a file."""
  import tempfile
  import matplotlib
  where = os.path.join(folder, DRAWN_WITH)
  with open(where + '.lock', 'a', encoding='utf-8') as lock:
    try:
      import fcntl
      fcntl.flock(lock, fcntl.LOCK_EX)
    except ImportError:  # not POSIX: one writer at a time is the user's to keep
      pass
    try:
      with open(where, encoding='utf-8') as f:
        drawn = json.load(f)
    except FileNotFoundError:
      drawn = {}
    if drawn.get(name) == matplotlib.__version__:
      return
    drawn[name] = matplotlib.__version__
    handle, temporary = tempfile.mkstemp(prefix=DRAWN_WITH, suffix='.tmp', dir=folder)
    try:
      with os.fdopen(handle, 'w', encoding='utf-8') as f:
        json.dump(dict(sorted(drawn.items())), f, indent=0)
        f.write('\n')
      os.replace(temporary, where)
    except BaseException:
      os.unlink(temporary)
      raise


def plot_diagnostics(runs: str | Mapping[str, str], path: str | None = None, title: str | None = None):
  """Draws, per stage over training, the cosine similarity and the norm ratio between the gradient each
  stage applied and back-propagation's (``pipeline.diagnose_every_steps``). ``runs``: a workdir, or
  {label: workdir} to draw several runs (colour per stage). One or two runs share one pair of panels (line
  style per run); with more, the first is the reference (e.g. plain FDG) and every other run gets its own
  pair of panels with the reference drawn dashed beside it, so that each is read against it and not in a
  crowd of lines."""
  plt = _figure_backend(path)
  runs = {'': runs} if isinstance(runs, str) else dict(runs)
  curves = {label: sorted(diagnostics(workdir).items()) for label, workdir in runs.items()}
  labels = list(curves)
  pairs = [labels] if len(labels) <= 2 else [[labels[0], other] for other in labels[1:]]
  fig, axes = plt.subplots(len(pairs), 2, figsize=(10, 3.8 if len(pairs) == 1 else 2.9 * len(pairs)),
                           squeeze=False, sharex=True)
  for (ax_cos, ax_ratio), shown in zip(axes, pairs):
    for i, label in enumerate(shown):
      for k, d in curves[label]:
        name = f'{label} stage {k}'.strip()
        width = 1.0 if len(pairs) > 1 and i == 0 else 1.5  # the reference, thinner beside each run
        ax_cos.plot(d['epoch'], d['cosine'], ['-', '--'][i] if len(pairs) == 1 else ['--', '-'][i],
                    color=f'C{k}', label=name, linewidth=width)
        ax_ratio.plot(d['epoch'], d['norm_ratio'], ['-', '--'][i] if len(pairs) == 1 else ['--', '-'][i],
                      color=f'C{k}', label=name, linewidth=width)
    ax_cos.set(ylabel='cosine to BP gradient')
    ax_ratio.set(ylabel='norm ratio to BP gradient')
    if len(pairs) > 1:
      ax_cos.set_title(f'{shown[1]} (solid) against {shown[0]} (dashed)', fontsize=9, loc='left')
    for ax in (ax_cos, ax_ratio):
      ax.grid(alpha=0.3)
    if len(pairs) > 1:
      ax_ratio.legend(*ax_cos.get_legend_handles_labels(), fontsize=7, loc='center left', bbox_to_anchor=(1.0, 0.5))
  for ax in axes[-1]:
    ax.set_xlabel('epoch')
  if len(pairs) == 1:
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc='center left', bbox_to_anchor=(1.0, 0.5))
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  return _save(fig, path)


def timelines(workdir: str) -> dict[int, list[dict]]:
  """The measured pipeline timelines of a run (``profile_every_steps``): {step: passes}, each pass a dict of
  stage, label (F3, B3, W3, 'update', 'iteration 7'), start and end in seconds."""
  return {r['step']: r['passes'] for r in read_metrics(workdir) if r['kind'] == 'timeline'}


def plot_timeline(workdir: str, path: str | None = None, step: int | None = None, title: str | None = None):
  """One measured iteration of a pipeline run (the last profiled one, or ``step``), one row per stage: each
  compiled call from when it really started to when its outputs were ready (jaxdecouple/pipeline/timeline.py),
  forwards blue, backwards orange, weight gradients green, updates grey; the gaps are the bubble."""
  plt = _figure_backend(path)
  found = timelines(workdir)
  if not found:
    raise ValueError(f'{workdir} has no measured timeline: run a pipeline method with profile_every_steps > 0')
  step = max(found) if step is None else step
  passes = found[step]
  colours = {'F': 'C0', 'B': 'C1', 'W': 'C2', 'u': '0.6', 'i': 'C4'}
  stages = 1 + max(p['stage'] for p in passes)
  begin = min(p['start'] for p in passes)
  fig, ax = plt.subplots(figsize=(10, 0.6 + 0.5 * stages))
  for p in passes:
    start, width = 1e3 * (p['start'] - begin), 1e3 * (p['end'] - p['start'])
    ax.barh(p['stage'], width, left=start, height=0.8, color=colours.get(p['label'][0], 'C5'), edgecolor='white')
    if p['label'][0] in 'FBW' and width > 0:
      ax.text(start + width / 2, p['stage'], p['label'], ha='center', va='center', fontsize=7, color='white')
  ax.set(xlabel='milliseconds (measured)', ylabel='stage', yticks=range(stages))
  ax.invert_yaxis()
  ax.set_title(title or f'{run_label(workdir)}: step {step}')
  fig.tight_layout()
  return _save(fig, path)


def time_to(workdir: str, error: float) -> float | None:
  """The training seconds a run took to reach ``error`` (%) or less at an evaluation (None: never)."""
  curves = learning_curves(workdir)
  return next((t for t, e in zip(curves['train_seconds'], curves['test_error']) if e <= error + 1e-6), None)


def loss_curves(workdir: str) -> dict[str, list[float]]:
  """One run's losses against steps and training seconds: the training loss of every logged training record
  (``step``, ``train_loss``, ``train_seconds``) and the held-out loss of every evaluation (``eval_step``,
  ``test_loss``, ``eval_seconds``); the last record of a step wins (a resumed run may log one twice).

  The seconds are the training clock's (``clock.py``: evaluation, diagnostics and the compiling first step not
  counted), summed: a training record's interval is its steps since the record before at the images (or
  sequences) per second it logged, the run's ``batch_size`` from its config.json; an evaluation stands at the
  summed ``epoch_time_s`` of the epochs up to it, as ``learning_curves``' ``train_seconds``. NaN where a record
  lacks its rate or the config its batch."""
  records: dict[tuple[str, int], dict] = {}
  for r in read_metrics(workdir):
    records[(r['kind'], r['step'])] = r
  ordered = [r for _, r in sorted(records.items(), key=lambda kv: kv[0][1])]
  try:
    with open(os.path.join(workdir, 'config.json'), encoding='utf-8') as f:
      batch = json.load(f).get('batch_size', math.nan)
  except (OSError, ValueError):
    batch = math.nan
  out = {'step': [], 'train_loss': [], 'train_seconds': [], 'eval_step': [], 'test_loss': [], 'eval_seconds': []}
  previous, seconds, epochs_seconds = 0, 0.0, 0.0
  for r in ordered:
    if r['kind'] == 'train':
      rate = r.get('images_per_sec')
      seconds += (r['step'] - previous) * batch / rate if isinstance(rate, (int, float)) and rate > 0 else math.nan
      previous = r['step']
      if isinstance(r.get('train_loss'), (int, float)):
        out['step'].append(r['step'])
        out['train_loss'].append(r['train_loss'])
        out['train_seconds'].append(seconds)
    elif r['kind'] == 'eval':
      epochs_seconds += r.get('epoch_time_s', math.nan)
      if isinstance(r.get('test_loss'), (int, float)):
        out['eval_step'].append(r['step'])
        out['test_loss'].append(r['test_loss'])
        out['eval_seconds'].append(epochs_seconds)
  return out


def plot_losses(runs: Mapping[str, Sequence[str]], path: str | None = None, title: str | None = None):
  """Training loss (a line through every logged step) and held-out loss (markers, at each evaluation):
  {label: [workdir, ...]}, a colour per label. Left, against steps: the median over the workdirs (seeds) at the
  steps all of them logged. Right, against training seconds: one line per workdir (seeds are not averaged: their
  clocks differ). For runs that evaluate rarely (the GPT study: after each of 2 epochs) the training loss shows
  the course between the evaluations."""
  plt = _figure_backend(path)
  fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(11.5, 3.8), sharey=True)
  for i, (label, workdirs) in enumerate(runs.items()):
    curves = [loss_curves(w) for w in workdirs]
    for steps_key, key, style in (('step', 'train_loss', '-'), ('eval_step', 'test_loss', 'o')):
      common = sorted(set.intersection(*(set(c[steps_key]) for c in curves))) if curves else []
      median = [statistics.median(c[key][c[steps_key].index(s)] for c in curves) for s in common]
      by_step.plot(common, median, style, color=f'C{i}', markersize=5, linewidth=1,
                   label=f'{label} ({"training" if key == "train_loss" else "held-out"})')
    for j, c in enumerate(curves):
      by_time.plot(c['train_seconds'], c['train_loss'], '-', color=f'C{i}', linewidth=1, alpha=0.8)
      by_time.plot(c['eval_seconds'], c['test_loss'], 'o', color=f'C{i}', markersize=5, alpha=0.8)
  by_step.set(xlabel='step', ylabel='loss (nats per target)')
  by_time.set(xlabel='training seconds (one line per seed)')
  for ax in (by_step, by_time):
    ax.grid(alpha=0.3)
  by_time.legend(*by_step.get_legend_handles_labels(), fontsize=6, loc='center left', bbox_to_anchor=(1.01, 0.5))
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  return _save(fig, path)


def plot_wallclock(runs: Mapping[str, Sequence[str]], path: str | None = None, title: str | None = None):
  """Test error (%) against training seconds: {label: [workdir, ...]}, one line per workdir (seed), a
  colour per label (seeds are not averaged: their clocks differ)."""
  plt = _figure_backend(path)
  fig, ax = plt.subplots(figsize=(6.5, 3.8))
  for i, (label, workdirs) in enumerate(runs.items()):
    for j, workdir in enumerate(workdirs):
      curves = learning_curves(workdir)
      ax.plot(curves['train_seconds'], curves['test_error'], marker='o', markersize=2, color=f'C{i}',
              alpha=0.8, label=label if j == 0 else None)
  ax.set(xlabel='training seconds', ylabel='test error (%)')
  ax.grid(alpha=0.3)
  ax.legend(loc='upper right')
  if title:
    ax.set_title(title)
  fig.tight_layout()
  return _save(fig, path)


def plot_curves(runs: Sequence[str] | Mapping[str, str | Sequence[str]], path: str | None = None,
                title: str | None = None):
  """Draws test error (%) and training loss per epoch for one or several workdirs.

  ``runs`` is a list of workdirs (labels come from their config.json) or a {label: workdir} dict; a
  dict's value may be a list of workdirs (one setting, several seeds): drawn as their median with
  their range as a band (``median_curves``). Saves a PNG when ``path`` is given; returns the matplotlib Figure (shown inline in notebooks).
  """
  plt = _figure_backend(path)
  import matplotlib.ticker

  if not isinstance(runs, Mapping):
    labels = [run_label(w) for w in runs]
    runs = {(f'{label} ({os.path.basename(os.path.normpath(w))})' if labels.count(label) > 1 else label): w
            for label, w in zip(labels, runs)}
  fig, (ax_err, ax_loss) = plt.subplots(1, 2, figsize=(10, 3.8))
  for label, workdir in runs.items():
    several = not isinstance(workdir, str)
    curves = median_curves(workdir) if several else learning_curves(workdir)
    for ax, key in ((ax_err, 'test_error'), (ax_loss, 'train_loss')):
      line, = ax.plot(curves['epoch'], curves[key], marker='o', markersize=3, label=label)
      if several and len(workdir) > 1:  # the seeds' range as a band in the line's colour
        ax.fill_between(curves['epoch'], curves[f'{key}_low'], curves[f'{key}_high'],
                        color=line.get_color(), alpha=0.15, linewidth=0)
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
  return _save(fig, path)


def plot_sweep(data: Mapping, label: str, log_x: bool = False, path: str | None = None, title: str | None = None):
  """A swept setting as the papers draw it (``jaxdecouple.study.sweep.sweep_data``'s numbers): left, each series'
  test error (%) against the setting, the median of the seeds with their range as bars, its baseline's median as
  a dashed line with its range as a band; right, the gap to that baseline paired by seed (ours, points) beside
  the paper's where it prints one (open squares): the shape over the setting, the papers' scale aside."""
  plt = _figure_backend(path)
  fig, (ax_err, ax_gap) = plt.subplots(1, 2, figsize=(10, 3.8))
  for i, (series, points) in enumerate(data['series'].items()):
    xs = [x for x, _ in points]
    medians = [statistics.median(e) for _, e in points]
    low = [m - min(e) for m, (_, e) in zip(medians, points)]
    high = [max(e) - m for m, (_, e) in zip(medians, points)]
    ax_err.errorbar(xs, medians, yerr=[low, high], marker='o', capsize=3, color=f'C{i}', label=series)
    if series in data['baselines'] and data['baselines'][series][1]:
      name, errors = data['baselines'][series]
      ax_err.axhline(statistics.median(errors), color=f'C{i}', linestyle='--', label=f'{name} (the baseline)')
      ax_err.axhspan(min(errors), max(errors), color=f'C{i}', alpha=0.1, linewidth=0)
    if data['gaps'].get(series):
      ax_gap.plot([x for x, *_ in data['gaps'][series]], [g for _, g, _ in data['gaps'][series]], marker='o',
                  color=f'C{i}', label=f'{series}: ours (median paired gap)')
    if data['paper_gaps'].get(series):
      ax_gap.plot([x for x, _ in data['paper_gaps'][series]], [g for _, g in data['paper_gaps'][series]],
                  marker='s', markerfacecolor='none', linestyle='none', markersize=8, color=f'C{i}',
                  label=f'{series}: the paper (its own network)')
  ax_gap.axhline(0.0, color='0.5', linewidth=0.8)
  ax_err.set(xlabel=label, ylabel='test error (%)')
  ax_gap.set(xlabel=label, ylabel='gap to the baseline (points)')
  for ax in (ax_err, ax_gap):
    ax.grid(alpha=0.3)
    if log_x:
      ax.set_xscale('log')
    ax.legend(fontsize='small')
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  return _save(fig, path)
