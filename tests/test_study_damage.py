"""The study runner and its report meet damaged run records (a cut line of metrics.jsonl, an empty or cut
finished.json or diverged.json, a damaged config.json, checkpoints none of which restores): each is one line
naming the run and the file, and the other runs are still reported or trained (issue 43, item 4)."""
import json
import os

from jaxdecouple import study as study_lib
from jaxdecouple.train import train_and_evaluate

MACHINE = {'date': '2026-11-23T10:00:00', 'platform': 'cpu', 'device': 'cpu', 'devices': 4, 'cpu': 'Test CPU',
           'cpu_count': 2, 'jax': '0.0', 'python': '3.11.0'}


def _finished_records(workdir, study):
  """Records as the runner leaves them for every run of the tiny study (2 epochs of 4 steps), written here:
  no training, so that each test damages one file of them in a second."""
  for i, run in enumerate(study.runs):
    folder = study_lib.run_dir(workdir, run)
    os.makedirs(folder)
    accuracy = (0.5 + 0.05 * i, 0.6 + 0.05 * i)
    records = []
    for epoch in (1, 2):
      records += [{'kind': 'train', 'step': 4 * epoch - 2, 'time': 1.0, 'train_loss': 2.0 / epoch,
                   'train_accuracy': 0.3 * epoch},
                  {'kind': 'train', 'step': 4 * epoch, 'time': 2.0, 'train_loss': 1.5 / epoch,
                   'train_accuracy': 0.35 * epoch},
                  {'kind': 'eval', 'step': 4 * epoch, 'time': 3.0, 'epoch': float(epoch),
                   'test_accuracy': accuracy[epoch - 1], 'epoch_time_s': 1.5}]
    with open(os.path.join(folder, 'metrics.jsonl'), 'w') as f:
      f.writelines(json.dumps(r) + '\n' for r in records)
    with open(os.path.join(folder, 'finished.json'), 'w') as f:
      json.dump({'step': 8, 'test_accuracy': accuracy[1], 'whole_run_seconds': 5.0}, f)
    with open(os.path.join(folder, 'machines.jsonl'), 'w') as f:
      f.write(json.dumps(MACHINE) + '\n')


def _report(tmp_path, workdir, capsys):
  """``--report`` on the command line: (its stdout, its stderr, the results page)."""
  results = str(tmp_path / 'RESULTS.md')
  assert study_lib.main(['--study=tiny', f'--workdir={workdir}', '--report', f'--results={results}',
                         f'--figures={tmp_path / "figures"}']) == 0
  out, err = capsys.readouterr()
  return out, err, open(results, encoding='utf-8').read()


def _warnings(text):
  return [line for line in text.splitlines() if 'warning' in line.lower()]


def _cut(path, keep):
  """The file cut short after ``keep`` bytes (a process killed while writing it, a full disk)."""
  with open(path, 'rb') as f:
    data = f.read()
  with open(path, 'wb') as f:
    f.write(data[:keep])


def test_a_cut_metrics_line_is_skipped_with_one_line_and_every_run_reported(tmp_path, capsys):
  study = study_lib.STUDIES['tiny']()
  workdir = str(tmp_path / 'study')
  _finished_records(workdir, study)
  damaged = study.runs[1]
  path = os.path.join(study_lib.run_dir(workdir, damaged), 'metrics.jsonl')
  lines = open(path).read().splitlines(keepends=True)
  lines[1] = lines[1][:len(lines[1]) // 2] + '\n'  # a train record cut in the middle, a later piece appended
  open(path, 'w').writelines(lines)
  _, err, text = _report(tmp_path, workdir, capsys)
  warned = _warnings(err)
  assert len(warned) == 1, err
  assert warned[0].startswith(f'warning: run {damaged.name}: metrics.jsonl line 2 is damaged (')
  assert warned[0].endswith('); skipped')
  assert 'Finished runs: 4 of 4.' in text  # the run is still reported, its other lines read
  assert '| ResNet-8, K=2 | 35.00 (30.00-40.00), n=2 | 50.00 | 30.00 (25.00-35.00), n=2 |' in text


def test_an_empty_finished_record_counts_the_run_as_unfinished_with_one_line(tmp_path, capsys):
  study = study_lib.STUDIES['tiny']()
  workdir = str(tmp_path / 'study')
  _finished_records(workdir, study)
  damaged = study.runs[0]
  open(os.path.join(study_lib.run_dir(workdir, damaged), 'finished.json'), 'w').close()
  _, err, text = _report(tmp_path, workdir, capsys)
  assert _warnings(err) == [f'warning: run {damaged.name}: finished.json is damaged (empty); counted as unfinished']
  assert 'Finished runs: 3 of 4.' in text
  # BP is left with seed 1 alone, FDG with both seeds
  assert '| ResNet-8, K=2 | 30.00, n=1 | 50.00 | 30.00 (25.00-35.00), n=2 |' in text


def test_a_cut_finished_record_counts_the_run_as_unfinished_with_one_line(tmp_path, capsys):
  study = study_lib.STUDIES['tiny']()
  workdir = str(tmp_path / 'study')
  _finished_records(workdir, study)
  damaged = study.runs[3]
  _cut(os.path.join(study_lib.run_dir(workdir, damaged), 'finished.json'), 20)
  _, err, text = _report(tmp_path, workdir, capsys)
  warned = _warnings(err)
  assert len(warned) == 1, err
  assert warned[0].startswith(f'warning: run {damaged.name}: finished.json is damaged (')
  assert warned[0].endswith('); counted as unfinished')
  assert 'Finished runs: 3 of 4.' in text
  assert '| ResNet-8, K=2 | 35.00 (30.00-40.00), n=2 | 50.00 | 35.00, n=1 |' in text


def test_a_cut_diverged_record_is_one_line_and_the_other_runs_are_reported(tmp_path, capsys):
  study = study_lib.STUDIES['tiny']()
  workdir = str(tmp_path / 'study')
  _finished_records(workdir, study)
  damaged = study.runs[2]
  folder = study_lib.run_dir(workdir, damaged)
  os.remove(os.path.join(folder, 'finished.json'))
  with open(os.path.join(folder, 'diverged.json'), 'w') as f:
    json.dump({'step': 6, 'message': 'training diverged at step 6: the loss is nan'}, f)
  _cut(os.path.join(folder, 'diverged.json'), 15)
  _, err, text = _report(tmp_path, workdir, capsys)
  warned = _warnings(err)
  assert len(warned) == 1, err
  assert warned[0].startswith(f'warning: run {damaged.name}: diverged.json is damaged (')
  assert warned[0].endswith('); not counted as diverged')
  assert 'Finished runs: 3 of 4.' in text and 'diverged (stopped' not in text
  assert '| ResNet-8, K=2 | 40.00, n=1 | 50.00 | 30.00 (25.00-35.00), n=2 |' in text  # BP's seed 1 is out


def test_run_mode_passes_over_damaged_finished_and_diverged_records_with_one_line_each(tmp_path):
  study = study_lib.STUDIES['tiny']()
  workdir = str(tmp_path / 'study')
  _finished_records(workdir, study)
  open(os.path.join(study_lib.run_dir(workdir, study.runs[0]), 'finished.json'), 'w').close()
  folder = study_lib.run_dir(workdir, study.runs[1])
  os.remove(os.path.join(folder, 'finished.json'))
  with open(os.path.join(folder, 'diverged.json'), 'w') as f:
    f.write('{"step": 6, "mess')
  said = []
  assert study_lib.run_study(study, workdir, log=said.append) == {'finished': 2, 'ran': 0, 'left': 2}
  assert said == [f'warning: run {study.runs[0].name}: finished.json is damaged (empty); passed over (remove that '
                  'file to run it again)',
                  f'warning: run {study.runs[1].name}: diverged.json is damaged (Unterminated string starting at: '
                  'line 1 column 13); passed over (remove that file to run it again)']


def _interrupted(workdir, run):
  """The run stopped at step 2 of 8, its checkpoint there."""
  partial = run.config()
  partial.max_steps = 2
  train_and_evaluate(partial, study_lib.run_dir(workdir, run))
  assert os.path.isdir(os.path.join(study_lib.run_dir(workdir, run), 'checkpoints', '2'))


def test_run_mode_goes_on_past_a_run_whose_config_record_is_damaged(tmp_path):
  study = study_lib.STUDIES['tiny']()
  workdir = str(tmp_path / 'study')
  damaged = study.runs[0]
  _interrupted(workdir, damaged)
  _cut(os.path.join(study_lib.run_dir(workdir, damaged), 'config.json'), 30)
  said = []
  assert study_lib.run_study(study, workdir, max_runs=1, log=said.append) == {'finished': 1, 'ran': 1, 'left': 3}
  failed = [line for line in said if 'failed' in line]
  assert len(failed) == 1, said
  assert failed[0].startswith(f'[1/4] {damaged.name} failed: ')
  assert os.path.join(damaged.name, 'config.json') in failed[0] and 'cannot be read' in failed[0]
  assert failed[0].endswith('passed over, the study goes on with its next run')
  assert not study_lib.is_finished(workdir, damaged) and study_lib.is_finished(workdir, study.runs[1])


def test_run_mode_goes_on_past_a_run_none_of_whose_checkpoints_restores(tmp_path):
  study = study_lib.STUDIES['tiny']()
  workdir = str(tmp_path / 'study')
  damaged = study.runs[0]
  _interrupted(workdir, damaged)
  for root, _, files in os.walk(os.path.join(study_lib.run_dir(workdir, damaged), 'checkpoints', '2')):
    for name in files:
      _cut(os.path.join(root, name), 8)
  said = []
  status = study_lib.run_study(study, workdir, max_runs=1, log=said.append)
  assert status == {'finished': 1, 'ran': 1, 'left': 3}
  failed = [line for line in said if 'failed' in line]
  assert len(failed) == 1, said
  assert failed[0].startswith(f'[1/4] {damaged.name} failed: none of the checkpoints in ')
  assert os.path.join(damaged.name, 'checkpoints') in failed[0]
  assert failed[0].endswith('passed over, the study goes on with its next run')
  assert [study_lib.is_finished(workdir, r) for r in study.runs] == [False, True, False, False]


def test_run_mode_stops_on_an_error_every_run_would_meet(tmp_path):
  """Data that is not where the study was told (a wrong --data_path) is no damaged run to pass over: every run
  would meet it, so the study stops with that error instead of logging one failure per run."""
  import dataclasses
  import pytest
  from jaxdecouple.errors import DataError

  def missing_data(run):
    def build():
      c = run.build()
      c.data.source, c.data.path = 'npz', str(tmp_path / 'no-such.npz')
      return c
    return dataclasses.replace(run, build=build)
  tiny = study_lib.STUDIES['tiny']()
  study = dataclasses.replace(tiny, runs=tuple(missing_data(r) for r in tiny.runs))
  said = []
  with pytest.raises(DataError, match='no-such.npz'):
    study_lib.run_study(study, str(tmp_path / 'study'), log=said.append)
  assert not [line for line in said if 'passed over' in line], said


def _fake_training(monkeypatch, outcome):
  """``train_and_evaluate`` replaced by ``outcome(config, workdir)``: what the runner does with a run's result,
  without training."""
  from jaxdecouple import train
  monkeypatch.setattr(train, 'train_and_evaluate', outcome)


def test_a_run_resumed_at_its_end_and_stopped_before_its_figures_is_left_as_stopped(tmp_path, monkeypatch):
  """A run killed after its last checkpoint, then stopped as it started up again: its result says finished but
  has no figures. The runner must not record it (a finished.json without test_accuracy, read as damaged ever
  after) nor delete its checkpoints: the next call evaluates it."""
  from types import SimpleNamespace
  study = study_lib.STUDIES['tiny']()
  workdir, said = str(tmp_path / 'study'), []
  checkpoints = os.path.join(study_lib.run_dir(workdir, study.runs[0]), 'checkpoints', '8')
  os.makedirs(checkpoints)
  _fake_training(monkeypatch, lambda config, where: SimpleNamespace(
      finished=True, step=8, last_eval=None, stop_requested=True, start_step=8, total_steps=8))
  assert study_lib.run_study(study, workdir, log=said.append, console=False)['ran'] == 1
  assert not os.path.exists(os.path.join(study_lib.run_dir(workdir, study.runs[0]), 'finished.json'))
  assert os.path.isdir(checkpoints) and said[-1].startswith(f'{study.runs[0].name} stopped at step 8'), said


def test_a_checkpoint_that_cannot_be_written_stops_the_study(tmp_path, monkeypatch):
  """The disk full (or the folder not writable) is met by every run after this one: the study stops with that
  line instead of training each remaining run up to its first checkpoint. A damaged checkpoint of one run
  (CheckpointError) still only passes that run over."""
  import pytest
  from jaxdecouple.errors import CheckpointError, CheckpointWriteError
  study = study_lib.STUDIES['tiny']()
  met = []

  def full(config, where):
    met.append(where)
    raise CheckpointWriteError('not enough disk space for the checkpoint at step 4 in X: 3 MiB free, about 9 MiB needed')
  _fake_training(monkeypatch, full)
  with pytest.raises(CheckpointWriteError, match='not enough disk space'):
    study_lib.run_study(study, str(tmp_path / 'full'), log=lambda _: None, console=False)
  assert len(met) == 1

  def damaged(config, where):
    met.append(where)
    raise CheckpointError('no checkpoint restores')
  met.clear()
  _fake_training(monkeypatch, damaged)
  assert study_lib.run_study(study, str(tmp_path / 'damaged'), log=lambda _: None, console=False)['ran'] == 0
  assert len(met) == 4  # each run passed over in turn


def test_a_claim_from_another_boot_of_this_host_is_taken_over(tmp_path, monkeypatch):
  """Cloud machines share host names and a replaced machine may keep the disk: a claim left by an earlier boot
  names a pid that may now be any live process; it is a dead claim all the same (the boot: Linux's boot_id)."""
  import socket
  import subprocess
  import sys
  from jaxdecouple.study import runner
  monkeypatch.setattr(runner, '_boot', lambda: 'this boot')
  where = str(tmp_path / 'run')
  os.makedirs(where)
  other = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])
  try:
    for boot, held in (('this boot', True), ('an earlier boot', False)):
      claim = {'host': socket.gethostname(), 'pid': other.pid, 'boot': boot}
      with open(os.path.join(where, 'running.json'), 'w') as f:
        json.dump(claim, f)
      assert (runner.held_elsewhere(where) == claim) is held
      assert (study_lib.claim(where) == claim) is held
  finally:
    other.kill()
    other.wait()
