"""Before any work, the processes of a run compare what must match: their configs (``agree_on_config``) and,
once loaded, their data sets (``agree_on_data``). Any difference stops every process with one line naming the
field, the processes and their values."""
from __future__ import annotations

import json
import time

import jax

from jaxdecouple.errors import ConfigError, InterruptedWhileWaiting, ProcessError
from jaxdecouple.processes import INTERRUPTED, leave_together, left_together_with, reason_of, stop_together
from jaxdecouple.workdir import flat

# Fields each process may set its own way: who it is, where it listens, where its host keeps the data and where it
# looks for compiled programs (JAX writes them from process 0 only).
PER_PROCESS = ('distributed.process_id', 'distributed.transfer_address', 'compilation_cache_dir', 'data.path',
               'data.idx_dir',
               'data.tfds_data_dir', 'data.tfds_manual_dir', 'data.imagenet_v2_dir', 'data.workers',
               'data.prefetch')
TIMEOUT_FIELDS = {'config': 'distributed.startup_timeout_s', 'data': 'distributed.data_timeout_s'}  # per kind
_AGREEMENTS: dict[str, int] = {}  # per kind (config, data): how many runs this process has started


def agree_on_config(config, timeout_s: float) -> None:
  """Before any work, every process puts its config in the coordinator's key-value store and reads every
  other's (waiting at most ``timeout_s``); a field that differs (other than ``PER_PROCESS``) stops every
  process with one line naming the field, the processes and their values. A run whose processes trained
  different configs would end with a hybrid model, or deadlock when their layouts differ."""
  if jax.process_count() == 1:
    return
  me = jax.process_index()
  mine = {k: v for k, v in flat(json.loads(config.to_json_best_effort())).items() if k not in PER_PROCESS}
  for p, theirs in _others('config', mine, timeout_s):
    for field in sorted(set(mine) | set(theirs)):
      if mine.get(field) != theirs.get(field):
        leave_together()  # every process finds the difference: each compares with every other
        raise ConfigError(
            f'config.{field}: process {me} has {json.dumps(mine.get(field))}, process {p} has '
            f'{json.dumps(theirs.get(field))}; every process needs the same config (only '
            f'{", ".join(PER_PROCESS)} may differ)')


def agree_on_data(dataset, timeout_s: float) -> None:
  """After loading, every process compares what its data set looks like (its sizes, an example's shape and
  type, its classes). ``data.path`` may differ between hosts, its contents may not: processes that read
  different data would feed the stages and workers batches that do not match, or deadlock. A difference stops
  every process with one line naming the processes and their values."""
  if jax.process_count() == 1:
    return
  me = jax.process_index()
  shapes = {'training examples': len(dataset.x_train), 'test examples': len(dataset.x_test),
            'example shape': list(dataset.x_train.shape[1:]), 'example dtype': str(dataset.x_train.dtype),
            'classes': dataset.num_classes}
  for p, theirs in _others('data', shapes, timeout_s):
    for field in sorted(set(shapes) | set(theirs)):
      if shapes.get(field) != theirs.get(field):
        leave_together()
        raise ConfigError(
            f'config.data.path: the processes read different data ({field}: process {me} has '
            f'{json.dumps(shapes.get(field))}, process {p} has {json.dumps(theirs.get(field))}); give every '
            'process the same data set')


def _others(kind: str, mine: dict, timeout_s: float) -> list[tuple[int, dict]]:
  """Publishes ``mine`` in the coordinator's key-value store and returns every other process's (process, its
  dict), waiting at most ``timeout_s`` for each. One key per run and kind: a process may train several runs,
  and every process starts them in the same order."""
  from jax._src import distributed
  client, me = distributed.global_state.client, jax.process_index()
  key = f'jaxdecouple/{kind}/{_AGREEMENTS.get(kind, 0)}'
  _AGREEMENTS[kind] = _AGREEMENTS.get(kind, 0) + 1
  client.key_value_set(f'{key}/{me}', json.dumps(mine, sort_keys=True))
  out, deadline = [], time.monotonic() + timeout_s
  field = TIMEOUT_FIELDS[kind]
  try:
    for p in range(jax.process_count()):
      if p == me:
        continue
      while True:  # a second at a time: a peer that stopped on an error of its own has published why
        try:
          out.append((p, json.loads(client.blocking_key_value_get(f'{key}/{p}', 1000))))
          break
        except Exception as e:  # noqa: BLE001  the coordination service's own error: a deadline, a lost peer
          if (why := reason_of(p)) is not None:
            left_together_with(p)  # a process that stopped before any work waits for the others to leave
            raise ProcessError(f'another process stopped (process {p}: {why}); fix that and restart every process '
                               'with the same --workdir') from None
          if INTERRUPTED.is_set():  # Ctrl-C once the run's handler is in (waiting for the data): the others
            # read why and leave with this process (they may still be loading theirs: it waits for them)
            line = f'interrupted while waiting for the other processes to show their {kind}'
            stop_together(line)
            raise InterruptedWhileWaiting(line)
          if time.monotonic() >= deadline:
            raise ConfigError(f'config.{field}: process {p} did not show its {kind} within {timeout_s:g} s '
                              f'({type(e).__name__}); start every process, or raise config.{field}') from None
  except KeyboardInterrupt:  # Ctrl-C while waiting (the wait is a second at a time): one line, not a traceback
    line = f'interrupted while waiting for the other processes to show their {kind}'
    stop_together(line)
    raise InterruptedWhileWaiting(line) from None
  return out
