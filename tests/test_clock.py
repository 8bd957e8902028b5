"""The training loop's clock and periodic actions: what is paused is not counted, a resumed epoch carries on."""
import time

from jaxdecouple.clock import Clock, itstime


def test_itstime_fires_every_n_steps_and_at_the_end_when_asked():
  assert [d for d in range(1, 11) if itstime(d, 4)] == [4, 8]
  assert [d for d in range(1, 11) if itstime(d, 4, total=10, last=True)] == [4, 8, 10]
  assert [d for d in range(1, 11) if itstime(d, 0)] == []  # 0: never
  assert [d for d in range(1, 11) if itstime(d, 0, total=10, last=True)] == [10]


def test_paused_time_counts_in_neither_clock():
  clock = Clock()
  clock.start()
  time.sleep(0.05)
  clock.tick()
  with clock.paused():
    time.sleep(0.3)
  clock.tick()
  seconds, steps = clock.epoch()
  # at least the 0.05 s run, less than it plus the 0.3 s paused (room for a loaded host's scheduling delays)
  assert steps == 2 and 0.05 <= seconds < 0.35
  interval, steps = clock.take_interval()
  assert steps == 2 and 0.05 <= interval < 0.35
  assert clock.take_interval()[1] == 0  # the interval clock starts again; the epoch clock does not
  assert clock.epoch()[1] == 2


def test_a_resumed_epoch_starts_from_what_it_had_trained():
  clock = Clock()
  clock.start(carried=(10.0, 3))
  clock.tick()
  seconds, steps = clock.epoch()
  assert steps == 4 and 10.0 <= seconds < 10.2
  clock.next_epoch()
  assert clock.epoch()[1] == 0 and clock.epoch()[0] < 0.1


def test_a_metrics_file_a_killed_process_cut_or_spoilt_is_read_and_written_on(tmp_path):
  """A line cut short by a killed process: the next run's first record starts a line of its own (it was glued
  to the cut one, then skipped with it); bytes that are not UTF-8 spoil their own line, not the resume's clock."""
  import json
  from jaxdecouple.clock import epoch_clock_at
  from jaxdecouple.writers import MetricWriter, read_metrics
  path = tmp_path / 'metrics.jsonl'
  path.write_bytes(json.dumps({'kind': 'checkpoint', 'step': 4, 'epoch_time_s': 2.5, 'epoch_steps': 4}).encode()
                   + b'\n{"kind": "train", "st\xff\xfe')
  assert epoch_clock_at(str(tmp_path), 4) == (2.5, 4)
  writer = MetricWriter(str(tmp_path), tensorboard=False)
  writer.write('train', 5, train_loss=1.0)
  writer.close()
  damaged = []
  records = read_metrics(str(tmp_path), damaged)
  assert [(r['kind'], r['step']) for r in records] == [('checkpoint', 4), ('train', 5)] and len(damaged) == 1
