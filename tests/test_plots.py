"""The plotting helper: per-epoch curves from metrics.jsonl, labels from config.json, a PNG."""
import json
import os

import pytest

from jaxdecouple.plots import learning_curves, plot_curves, run_label


def fake_run(workdir, records, config):
  os.makedirs(workdir)
  with open(os.path.join(workdir, 'metrics.jsonl'), 'w') as f:
    f.writelines(json.dumps(r) + '\n' for r in records)
  with open(os.path.join(workdir, 'config.json'), 'w') as f:
    json.dump(config, f)


def test_curves_average_training_loss_per_epoch_and_dedupe_resumed_steps(tmp_path):
  wd = str(tmp_path / 'run')
  fake_run(wd, [
      {'kind': 'train', 'step': 5, 'train_loss': 2.0}, {'kind': 'train', 'step': 10, 'train_loss': 1.0},
      {'kind': 'eval', 'step': 10, 'epoch': 1.0, 'test_accuracy': 0.6},
      {'kind': 'train', 'step': 15, 'train_loss': 0.9},  # killed here, resumed from step 10:
      {'kind': 'train', 'step': 15, 'train_loss': 0.8}, {'kind': 'train', 'step': 20, 'train_loss': 0.4},
      {'kind': 'eval', 'step': 20, 'epoch': 2.0, 'test_accuracy': 0.75},
  ], {'method': 'fdg', 'pipeline': {'num_stages': 2, 'beta': 0.5}})
  curves = learning_curves(wd)
  assert curves['epoch'] == [1.0, 2.0]
  assert curves['test_error'] == pytest.approx([40.0, 25.0])
  assert curves['train_loss'] == pytest.approx([1.5, 0.6])
  assert run_label(wd) == 'FDG K=2 beta=0.5'


def test_plot_writes_a_png(tmp_path):
  runs = []
  for i, method in enumerate(['bp', 'fdg']):
    wd = str(tmp_path / method)
    fake_run(wd, [{'kind': 'train', 'step': 1, 'train_loss': 1.0 + i},
                  {'kind': 'eval', 'step': 1, 'epoch': 1.0, 'test_accuracy': 0.5}],
             {'method': method, 'pipeline': {'num_stages': 2, 'beta': 1.0}})
    runs.append(wd)
  fig = plot_curves(runs, path=str(tmp_path / 'out' / 'curves.png'), title='t')
  assert (tmp_path / 'out' / 'curves.png').stat().st_size > 1000
  assert [line.get_label() for line in fig.axes[0].lines] == ['BP', 'FDG K=2']


def test_runs_with_the_same_label_are_all_drawn(tmp_path):
  runs = []
  for name in ('a', 'b'):
    wd = str(tmp_path / name)
    fake_run(wd, [{'kind': 'eval', 'step': 1, 'epoch': 1.0, 'test_accuracy': 0.5}], {'method': 'bp'})
    runs.append(wd)
  fig = plot_curves(runs)
  assert [line.get_label() for line in fig.axes[0].lines] == ['BP (a)', 'BP (b)']
