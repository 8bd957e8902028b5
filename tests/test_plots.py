"""The plotting helper: per-epoch curves from metrics.jsonl, labels from config.json, a PNG."""
import json
import math
import os

import pytest

from jaxdecouple.plots import learning_curves, median_curves, plot_curves, run_label


def fake_run(workdir, records, config):
  os.makedirs(workdir)
  with open(os.path.join(workdir, 'metrics.jsonl'), 'w') as f:
    f.writelines(json.dumps(r) + '\n' for r in records)
  with open(os.path.join(workdir, 'config.json'), 'w') as f:
    json.dump(config, f)


def test_curves_average_training_loss_per_epoch_and_dedupe_resumed_steps(tmp_path):
  wd = str(tmp_path / 'run')
  fake_run(wd, [
      {'kind': 'train', 'step': 5, 'train_loss': 2.0, 'train_accuracy': 0.4},
      {'kind': 'train', 'step': 10, 'train_loss': 1.0, 'train_accuracy': 0.6},
      {'kind': 'eval', 'step': 10, 'epoch': 1.0, 'test_accuracy': 0.6},
      {'kind': 'train', 'step': 15, 'train_loss': 0.9},  # killed here, resumed from step 10:
      {'kind': 'train', 'step': 15, 'train_loss': 0.8}, {'kind': 'train', 'step': 20, 'train_loss': 0.4},
      {'kind': 'eval', 'step': 20, 'epoch': 2.0, 'test_accuracy': 0.75},
  ], {'method': 'fdg', 'pipeline': {'num_stages': 2, 'beta': 0.5}})
  curves = learning_curves(wd)
  assert curves['epoch'] == [1.0, 2.0]
  assert curves['test_error'] == pytest.approx([40.0, 25.0])
  assert curves['train_loss'] == pytest.approx([1.5, 0.6])
  assert curves['train_error'][0] == pytest.approx(50.0) and math.isnan(curves['train_error'][1])  # not logged
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


def test_seeds_of_one_setting_are_drawn_as_their_median_with_their_range(tmp_path):
  runs = []
  for seed, (acc1, acc2, loss) in enumerate([(0.5, 0.8, 1.0), (0.6, 0.7, 3.0), (0.7, 0.9, 2.0)]):
    wd = str(tmp_path / f'seed{seed}')
    records = [{'kind': 'train', 'step': 1, 'train_loss': loss},
               {'kind': 'eval', 'step': 1, 'epoch': 1.0, 'test_accuracy': acc1}]
    if seed != 2:  # the third seed has not reached epoch 2 yet: epoch 2 is left out
      records += [{'kind': 'eval', 'step': 2, 'epoch': 2.0, 'test_accuracy': acc2}]
    fake_run(wd, records, {'method': 'bp'})
    runs.append(wd)
  curves = median_curves(runs)
  assert curves['epoch'] == [1.0]
  assert curves['test_error'] == pytest.approx([40.0]) and curves['train_loss'] == [2.0]
  assert curves['test_error_low'] == pytest.approx([30.0]) and curves['test_error_high'] == pytest.approx([50.0])
  assert (curves['train_loss_low'], curves['train_loss_high']) == ([1.0], [3.0])
  assert median_curves(runs[:2])['test_error'] == pytest.approx([45.0, 25.0])  # even count: the mean of two
  fig = plot_curves({'BP (median of 3 seeds)': runs, 'one seed': [runs[0]], 'a workdir': runs[1]})
  assert [line.get_label() for line in fig.axes[0].lines] == ['BP (median of 3 seeds)', 'one seed', 'a workdir']
  assert len(fig.axes[0].collections) == len(fig.axes[1].collections) == 1  # one band: the 3 seeds' range


def test_diagnostics_per_stage_and_their_plot(tmp_path):
  from jaxdecouple.plots import diagnostics, plot_diagnostics
  wd = str(tmp_path / 'fdg')
  fake_run(wd, [{'kind': 'diagnose', 'step': 4, 'epoch': 0.5, 'stage0_cosine': 0.9, 'stage0_norm_ratio': 0.8,
                 'stage1_cosine': 1.0, 'stage1_norm_ratio': 1.0},
                {'kind': 'diagnose', 'step': 8, 'epoch': 1.0, 'stage0_cosine': 0.7, 'stage0_norm_ratio': 0.6,
                 'stage1_cosine': 0.95, 'stage1_norm_ratio': 0.9}], {'method': 'fdg'})
  d = diagnostics(wd)
  assert d[0] == {'epoch': [0.5, 1.0], 'cosine': [0.9, 0.7], 'norm_ratio': [0.8, 0.6]}
  assert d[1]['cosine'] == [1.0, 0.95]
  png = str(tmp_path / 'staleness.png')
  fig = plot_diagnostics({'FDG': wd}, path=png)
  assert os.path.getsize(png) > 1000
  assert [line.get_label() for line in fig.axes[0].get_lines()] == ['FDG stage 0', 'FDG stage 1']
  # more than two runs: one pair of panels per run after the first, each with the first (the reference) beside it
  fig = plot_diagnostics({'FDG': wd, 'FDG predict': wd, 'FDG dc': wd}, path=png)
  assert len(fig.axes) == 4
  assert [line.get_label() for line in fig.axes[2].get_lines()] == ['FDG stage 0', 'FDG stage 1', 'FDG dc stage 0',
                                                                     'FDG dc stage 1']
  assert [line.get_linestyle() for line in fig.axes[2].get_lines()] == ['--', '--', '-', '-']


def test_training_seconds_and_time_to_an_error(tmp_path):
  from jaxdecouple.plots import plot_wallclock, time_to
  wd = str(tmp_path / 'run')
  fake_run(wd, [
      {'kind': 'eval', 'step': 10, 'epoch': 1.0, 'test_accuracy': 0.5, 'epoch_time_s': 30.0},
      {'kind': 'eval', 'step': 20, 'epoch': 2.0, 'test_accuracy': 0.7, 'epoch_time_s': 20.0},
      {'kind': 'eval', 'step': 30, 'epoch': 3.0, 'test_accuracy': 0.8, 'epoch_time_s': 25.0},
  ], {'method': 'bp'})
  assert learning_curves(wd)['train_seconds'] == pytest.approx([30.0, 50.0, 75.0])  # summed epochs
  assert time_to(wd, 30.0) == pytest.approx(50.0)  # first evaluation at or below 30% error
  assert time_to(wd, 20.0) == pytest.approx(75.0) and time_to(wd, 19.9) is None
  path = str(tmp_path / 'wall.png')
  plot_wallclock({'BP': [wd, wd]}, path=path)
  with open(path, 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'


def test_losses_against_steps_and_seconds_for_runs_that_evaluate_rarely(tmp_path):
  """Every logged training loss and every held-out loss, by step (a resumed run's repeated step: the last record)
  and by training seconds (each record's steps at its logged rate, batch 10; an evaluation at the summed epoch
  times); the figure draws the median over seeds at the steps all of them logged, and each seed against seconds."""
  from jaxdecouple.plots import loss_curves, plot_losses
  runs = []
  for seed, shift in enumerate((0.0, 0.2, 0.4)):
    wd = str(tmp_path / f's{seed}')
    fake_run(wd, [{'kind': 'train', 'step': 50, 'train_loss': 9.0, 'images_per_sec': 1.0},
                  {'kind': 'train', 'step': 50, 'train_loss': 5.0 + shift, 'images_per_sec': 25.0},  # resumed
                  {'kind': 'train', 'step': 100, 'train_loss': 4.0 + shift, 'images_per_sec': 50.0 / (1 + seed)},
                  {'kind': 'eval', 'step': 100, 'epoch': 1.0, 'test_loss': 4.5 + shift, 'test_accuracy': 0.3,
                   'epoch_time_s': 31.0}], {'batch_size': 10})
    runs.append(wd)
  assert loss_curves(runs[1]) == {'step': [50, 100], 'train_loss': [5.2, 4.2], 'train_seconds': [20.0, 40.0],
                                  'eval_step': [100], 'test_loss': [4.7], 'eval_seconds': [31.0]}
  fig = plot_losses({'GPT': runs}, path=str(tmp_path / 'loss.png'))
  train, held = fig.axes[0].get_lines()[:2]
  assert list(train.get_xdata()) == [50, 100] and list(train.get_ydata()) == pytest.approx([5.2, 4.2])  # medians
  assert list(held.get_xdata()) == [100] and list(held.get_ydata()) == pytest.approx([4.7])
  by_time = fig.axes[1].get_lines()  # per seed: its training line, then its held-out markers
  assert [list(line.get_xdata()) for line in by_time[::2]] == [[20.0, 30.0], [20.0, 40.0], [20.0, 50.0]]
  assert [list(line.get_xdata()) for line in by_time[1::2]] == [[31.0]] * 3
  assert os.path.getsize(tmp_path / 'loss.png') > 1000
