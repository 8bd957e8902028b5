"""Where metrics go: WORKDIR/metrics.jsonl (always), the console, and TensorBoard when a writer
library (tensorboardX, or TensorFlow's tf.summary) is installed."""
from __future__ import annotations

import json
import logging as logging_std
import math
import os
import sys
import time
from typing import Any

from absl import logging


# Records from this package's files and the checkout's main.py beside it (by their path: absl names every record
# 'absl'); a path that merely contains the word, as a library's in a virtual environment under ~/jaxdecouple/.venv
# does, is not ours, nor is another library's main.py.
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_MAIN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'main.py')


class _QuietLibraries(logging_std.Filter):
  """Drops INFO and DEBUG records of other libraries (orbax logs every file it writes), and orbax's
  errors: a failed checkpoint write is reported once, by jaxdecouple.checkpoint, with its cause."""

  def filter(self, record: logging_std.LogRecord) -> bool:
    path = os.path.abspath(record.pathname)
    if path.startswith(_PACKAGE_DIR) or path == _MAIN:
      return True
    if f'{os.sep}orbax{os.sep}' in record.pathname and record.levelno == logging_std.ERROR:
      return False
    return record.levelno >= logging_std.WARNING


def quiet_library_logs(*handlers: logging_std.Handler) -> None:
  """Keeps the console (and the ``handlers`` given) to our progress lines plus everyone's warnings."""
  for handler in (logging.get_absl_handler(), *logging_std.getLogger().handlers, *handlers):
    if not any(isinstance(f, _QuietLibraries) for f in handler.filters):
      handler.addFilter(_QuietLibraries())
  if sys.unraisablehook is not _quiet_unraisable:
    _quiet_unraisable.previous = sys.unraisablehook
    sys.unraisablehook = _quiet_unraisable


def _quiet_unraisable(unraisable) -> None:
  """After a checkpoint write fails, tensorstore's callbacks find orbax's event loops closed, dozens of
  times; the failure itself is reported once (jaxdecouple.checkpoint). Everything else as before."""
  if isinstance(unraisable.exc_value, RuntimeError) and str(unraisable.exc_value) == 'Event loop is closed':
    return
  _quiet_unraisable.previous(unraisable)


def _tensorboard_writer(logdir: str):
  try:
    from tensorboardX import SummaryWriter  # optional
    writer = SummaryWriter(logdir)
    return lambda tag, value, step: writer.add_scalar(tag, value, step), writer.flush, writer.close
  except ImportError:
    pass
  try:
    import tensorflow as tf  # optional, and heavy: only when tensorboardX is absent
    writer = tf.summary.create_file_writer(logdir)

    def scalar(tag, value, step):
      with writer.as_default():
        tf.summary.scalar(tag, value, step=step)
    return scalar, writer.flush, writer.close
  except ImportError:
    return None


def _clean(value: Any) -> Any:
  if hasattr(value, 'item'):
    value = value.item()
  if isinstance(value, float) and not math.isfinite(value):
    return str(value)  # keep the line valid JSON
  return value


def set_aside_earlier_metrics(workdir: str) -> str | None:
  """Moves WORKDIR/metrics.jsonl of an earlier start to metrics.before-restart-N.jsonl (the first free N) and
  returns that path, for a run that starts again from step 0 (no checkpoint to resume from: it died before its
  first one, or they went with a machine): its lines would otherwise stay among the new run's, the ones past
  the new run's progress, or at steps it no longer evaluates (the config changed), never superseded."""
  path = os.path.join(workdir, 'metrics.jsonl')
  if not os.path.exists(path) or not os.path.getsize(path):
    return None
  n = 1
  while os.path.exists(aside := os.path.join(workdir, f'metrics.before-restart-{n}.jsonl')):
    n += 1
  os.replace(path, aside)
  return aside


def _ends_a_line(path: str) -> bool:
  with open(path, 'rb') as f:
    f.seek(-1, os.SEEK_END)
    return f.read(1) == b'\n'


class MetricWriter:
  """Appends one JSON object per line; also scalars to TensorBoard when available."""

  def __init__(self, workdir: str, tensorboard: bool = True, enabled: bool = True):
    """``enabled=False`` (processes other than the first of a multi-process run): records are
    built and returned but nothing is written."""
    os.makedirs(workdir, exist_ok=True)
    self.path = os.path.join(workdir, 'metrics.jsonl')
    self._file = open(self.path, 'a', encoding='utf-8') if enabled else None
    if self._file is not None and self._file.tell() and not _ends_a_line(self.path):
      self._file.write('\n')  # a line cut by a killed process ends here, not glued to this run's first record
    self._tb = _tensorboard_writer(os.path.join(workdir, 'tensorboard')) if tensorboard and enabled else None
    if tensorboard and enabled and self._tb is None:
      logging.info('metrics go to %s (TensorBoard files too once tensorboardX or tensorflow is installed: '
                   'optional)', self.path)

  def write(self, kind: str, step: int, **values) -> dict:
    record = {'kind': kind, 'step': int(step), 'time': round(time.time(), 3),
              **{k: _clean(v) for k, v in values.items()}}
    if self._file is None:
      return record
    self._file.write(json.dumps(record) + '\n')
    self._file.flush()
    if self._tb is not None:
      for k, v in record.items():
        if k not in ('kind', 'step', 'time') and isinstance(v, (int, float)) and not isinstance(v, bool):
          self._tb[0](f'{kind}/{k}', v, int(step))
      self._tb[1]()
    return record

  def close(self) -> None:
    if self._file is not None:
      self._file.close()
    if self._tb is not None:
      self._tb[2]()


def read_jsonl(path: str, is_record, damaged: list | None = None) -> list[dict]:
  """The records of a JSON-lines file for which ``is_record(record)`` holds. A damaged line (cut short by a
  killed process or a full disk, or not such a record) is skipped; given a list as ``damaged``, each such
  line is added to it as (line number, what is wrong)."""
  records = []
  with open(path, encoding='utf-8', errors='replace') as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except ValueError as e:  # 'Expecting value at column 1'
        wrong = (f'{e.msg}{"" if e.msg.endswith(" at") else " at"} column {e.colno}'
                 if isinstance(e, json.JSONDecodeError) else str(e))
      else:
        if isinstance(record, dict) and is_record(record):
          records.append(record)
          continue
        wrong = 'not a record of this file'
      if damaged is not None:
        damaged.append((number, wrong))
  return records


def read_metrics(workdir: str, damaged: list | None = None) -> list[dict]:
  """All records of a run's metrics.jsonl (a resumed run appends to the same file), damaged lines skipped
  (``read_jsonl``)."""
  return read_jsonl(os.path.join(workdir, 'metrics.jsonl'),
                    lambda r: isinstance(r.get('kind'), str) and isinstance(r.get('step'), int), damaged)


def format_duration(seconds: float) -> str:
  seconds = int(max(seconds, 0))
  h, rest = divmod(seconds, 3600)
  m, s = divmod(rest, 60)
  return f'{h}h{m:02d}m{s:02d}s' if h else f'{m}m{s:02d}s'
