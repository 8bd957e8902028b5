"""Checkpoints of any method's state with orbax-checkpoint.

A state is saved as the flat list of its leaves; it is restored into the structure and the device
placement of a freshly initialised state (the template), so pipeline stages come back on their own
devices. The latest checkpoint that restores wins: a damaged, half-written or corrupted one is moved
aside with a warning in favour of the one before. Corruption is found with checksums: a CRC-32 of every
array's bytes, taken from the state being saved, is written beside each step (``checksums/STEP.json``)
(``STEP.process_P.json`` per process where processes share the folder) and compared with the restored
arrays. A checkpoint whose arrays do not match the config (another
model, K or method) stops the run with a message rather than being silently ignored. A checkpoint that
cannot be written (no space, no permission) stops the run with one line.

In one process the leaves are written packed: one array per dtype (the leaves' bytes end to end, in leaf
order) and each leaf's shape and dtype in the step's metadata (``LAYOUT_KEY``). orbax's cost is per array: a
ResNet-8 state of 120 small arrays took 0.34 s to write one array each and 0.04 s packed (AMD EPYC core,
2026-11-26), and a tiny run that checkpoints every few steps spent more time in orbax than in training. Over
processes the leaves stay one global array each (each process writes its own shards). Checkpoints of either
layout restore.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import zlib
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

from jaxdecouple.checkpoint_files import ProcessFiles
from jaxdecouple.errors import CheckpointError, CheckpointWriteError
from jaxdecouple.processes import leave_together, note_saved


LAYOUT_KEY = 'jaxdecouple_packed_layout'  # in a packed step's custom metadata: [[shape, dtype], ...] per leaf


def pack(host: list[np.ndarray]) -> tuple[dict[str, np.ndarray], list]:
  """The leaves as one 1-D array per dtype (their bytes end to end, in leaf order) and their layout."""
  groups: dict[str, list[np.ndarray]] = {}
  for x in host:
    groups.setdefault(x.dtype.name, []).append(x.reshape(-1))
  return {name: np.concatenate(parts) for name, parts in groups.items()}, [[list(x.shape), x.dtype.name] for x in host]


def _out_of_memory(e: BaseException) -> bool:
  """Whether a failed restore ran out of host or device memory (MemoryError, XLA's RESOURCE_EXHAUSTED) rather
  than met damaged files."""
  return isinstance(e, MemoryError) or 'RESOURCE_EXHAUSTED' in str(e) or 'out of memory' in str(e).lower()


def unpack(packed: dict[str, np.ndarray], layout: list) -> list[np.ndarray]:
  """``pack``'s inverse: the leaves, in order. Raises ValueError where the arrays do not hold the layout."""
  offsets, out = dict.fromkeys(packed, 0), []
  for shape, dtype in layout:
    n, start = int(np.prod(shape, dtype=np.int64)), offsets.get(dtype)
    if start is None or start + n > packed[dtype].size:
      raise ValueError(f'the packed arrays are shorter than their layout ({dtype})')
    out.append(packed[dtype][start:start + n].reshape(shape))
    offsets[dtype] = start + n
  if any(offsets[k] != v.size for k, v in packed.items()):
    raise ValueError('the packed arrays are longer than their layout')
  return out


class Checkpointer:
  """``per_process``: a multi-process pipeline, whose stages live each on one process's device: every
  process writes the arrays it holds (its stages, their rings and inboxes) to a folder of its own,
  ``process_P``, and on resume the processes agree on the newest step all of them have."""

  def __init__(self, directory: str, keep: int, per_process: bool = False):
    self.per_process = per_process and jax.process_count() > 1
    self.root = os.path.abspath(directory)  # the same in every process
    self._refuse_the_other_layout()
    if self.per_process:
      directory = os.path.join(directory, f'process_{jax.process_index()}')
    self.directory = os.path.abspath(directory)
    self.checksums = os.path.join(self.directory, 'checksums')
    try:
      os.makedirs(self.checksums, exist_ok=True)
    except OSError as e:
      raise CheckpointError(f'cannot create {self.checksums} ({e.strerror or type(e).__name__}): make the checkpoint '
                            'folder writable, or use another --workdir') from e
    self._pending: int | None = None  # the step whose asynchronous write may still be under way
    if self.per_process:  # orbax writes only global arrays across processes: this process's own files
      self._manager = ProcessFiles(self.directory, keep)
    else:
      self._manager = ocp.CheckpointManager(
          self.directory, item_handlers=ocp.StandardCheckpointHandler(),
          options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True))
    if not self.all_steps() and self._moved_aside():
      raise CheckpointError(
          f'every checkpoint in {self.directory} was found damaged by an earlier run and moved aside '
          f'({", ".join(self._moved_aside()[:3])}), so this run cannot resume, and starting afresh would '
          'silently restart from step 0: remove that folder to start afresh on purpose, or use another --workdir')

  def _refuse_the_other_layout(self) -> None:
    """Checkpoints written per process (a pipeline over processes: ``process_P/STEP.npz``) are invisible to a run
    that keeps one folder, and a one-folder run's ``STEP/`` to a pipeline over processes: either would silently
    start again from step 0. Stops with one line, before anything is written."""
    names = os.listdir(self.root) if os.path.isdir(self.root) else []
    per_process = sorted(n for n in names if n.startswith('process_') and os.path.isdir(os.path.join(self.root, n))
                         and any(f.endswith('.npz') and f[:-4].isdigit() for f in os.listdir(os.path.join(self.root, n))))
    one_folder = sorted(int(n) for n in names if n.isdigit())
    processes = jax.process_count()
    if per_process and not self.per_process:
      raise CheckpointError(
          f'the checkpoints in {self.root} were written per process ({", ".join(per_process)}: a pipeline over '
          f'{len(per_process)} processes), which a run {"in one process" if processes == 1 else "of this method"} '
          f'cannot read; resume them with the same method over {len(per_process)} processes '
          '(distributed.num_processes), or use another --workdir')
    if one_folder and self.per_process:
      raise CheckpointError(
          f'the checkpoints in {self.root} (steps {", ".join(map(str, one_folder[-3:]))}) were written into one '
          f'folder (a run in one process, or a replica method over processes), which a pipeline over {processes} '
          'processes, keeping one folder per process, cannot read; resume them as they were made, or use another '
          '--workdir')

  def all_steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def _mine(self, leaves: list) -> list:
    """The leaves this process writes: all of them, or, per process, those on its devices."""
    return [x for x in leaves if not self.per_process or x.is_fully_addressable]

  def save(self, step: int, state: Any) -> None:
    """Writes the checksums, then starts an asynchronous save; training continues while it is written.
    Raises CheckpointError (one line) when the disk lacks the space or the write fails."""
    leaves = jax.tree.leaves(state)
    mine = self._mine(leaves)
    need = sum(x.nbytes for x in mine if x.is_fully_addressable) + sum(
        s.data.nbytes for x in mine if not x.is_fully_addressable for s in x.addressable_shards)
    try:
      free = shutil.disk_usage(self.directory).free
    except OSError:
      free = None
    if free is not None and free < need * 1.1 + 16 * 2**20:
      raise CheckpointWriteError(
          f'not enough disk space for the checkpoint at step {step} in {self.directory}: {free / 2**20:.0f} MiB free, '
          f'about {need / 2**20:.0f} MiB needed; free some space and run again with the same --workdir to resume '
          f'from step {max(self.all_steps(), default=0)}')
    self.wait()  # the previous asynchronous save: its failure is reported as its own
    with self._writing(step):
      self._forget_checksums()
      host = [np.asarray(x) for x in leaves] if self._packs() else None
      sums = [_crc(h) for h in host] if host is not None else checksums(mine)
      tmp = self._checksum_path(step) + '.tmp'
      with open(tmp, 'w', encoding='utf-8') as f:
        json.dump(sums, f)
      os.replace(tmp, self._checksum_path(step))
      if self.per_process:
        self._manager.save(step, [np.asarray(x) for x in mine])
        note_saved(step)  # written: the others may count on it
        return
      if host is not None:
        packed, layout = pack(host)
        self._manager.save(step, args=ocp.args.StandardSave({'packed': packed}), custom_metadata={LAYOUT_KEY: layout},
                           force=True)
      else:
        self._manager.save(step, args=ocp.args.StandardSave({'leaves': leaves}), force=True)
    self._pending = step

  def _packs(self) -> bool:
    """Whether this run writes its steps packed (one process: every array is whole here)."""
    return not self.per_process and jax.process_count() == 1

  def _layout(self, step: int) -> list | None:
    """A packed step's layout ([shape, dtype] per leaf), None for a step of one array per leaf. Raises where the
    step's metadata cannot be read."""
    if self.per_process:
      return None
    custom = self._manager.metadata(step).custom_metadata or {}
    return custom.get(LAYOUT_KEY)

  @contextlib.contextmanager
  def _writing(self, step: int | None):
    """Any failure to write ``step`` as one line (ours; orbax's own error records are dropped from the
    console, see writers.quiet_library_logs)."""
    try:
      yield
    except CheckpointError:
      raise
    except Exception as e:  # OSError, and what orbax wraps it in
      text = ' '.join(str(e).split())
      cause = _os_reason(e) or f'{type(e).__name__}: ' + (  # tensorstore's text: the OS's reason comes last
          text if len(text) <= 160 else '...' + text[-160:])
      where = f'at step {step} ' if step is not None else ''
      raise CheckpointWriteError(
          f'writing the checkpoint {where}in {self.directory} failed ({cause}); check that the '
          'disk has space and the folder is writable, then run again with the same --workdir to resume from the '
          f'last checkpoint written') from e

  def _checksum_path(self, step: int) -> str:
    """Each process's own file where processes share the folder (orbax's global arrays: each checksums
    the shards it holds)."""
    mine = '' if self.per_process or jax.process_count() == 1 else f'.process_{jax.process_index()}'
    return os.path.join(self.checksums, f'{step}{mine}.json')

  def _forget_checksums(self) -> None:
    """Removes the checksums of steps that rotation deleted (older than the newest step, and gone)."""
    steps = self.all_steps()
    for name in os.listdir(self.checksums):
      if name.endswith('.json') and name.split('.')[0].isdigit():
        s = int(name.split('.')[0])
        if steps and s < steps[-1] and s not in steps:
          try:
            os.remove(os.path.join(self.checksums, name))
          except FileNotFoundError:  # another process of this run removed it first
            pass

  def _verify(self, step: int, restored: list, now: list | None = None) -> None:
    """Raises ValueError when the restored arrays' checksums (``now``, else computed) differ from those written
    with the step."""
    path = self._checksum_path(step)
    if not os.path.exists(path):
      logging.warning('checkpoint at step %d has no checksums (written by an earlier version): not verified', step)
      return
    with open(path, encoding='utf-8') as f:
      saved = json.load(f)
    now = now if now is not None else checksums(restored)
    bad = [i for i, (a, b) in enumerate(zip(saved, now)) if a != b]
    if len(saved) != len(now) or bad:
      raise ValueError(f'the content of {len(bad) or "some"} of its {len(now)} arrays differs from its checksums '
                       f'(first: array {bad[0] if bad else "?"})')

  def _common_steps(self, steps: list[int]) -> list[int]:
    """Per process: the steps every process has a checkpoint of (the processes resume together). The
    processes meet under a key of what they share, this run (one per coordinator) and the round of the
    agreement, never a path: each host may keep its workdir where it likes. Where some process holds
    checkpoints and they share none (one process's folder deleted or replaced), the run stops with one line
    rather than restart every process from step 0. (Where processes share the folder, orbax's global arrays,
    each still compares what it sees: a folder that is not really shared shows up here, not as a hang.)"""
    if jax.process_count() == 1:
      return steps
    held = [json.loads(v) for v in self._exchange(json.dumps(steps))]
    common = sorted(set.intersection(*map(set, held)))
    if not common and any(held):
      holders = '; '.join(f'process {p}: {", ".join(map(str, s)) or "none"}' for p, s in enumerate(held))
      leave_together()  # every process finds it: the first to exit (the service's host) must not abort the others
      raise CheckpointError(f'the processes share no checkpoint step to resume from ({holders}); put back the '
                            'missing checkpoints, or remove every process\'s checkpoints folder to start afresh')
    return common

  def _exchange(self, mine: str) -> list[str]:
    """Every process's ``mine``, in process order, through the coordinator's key-value store (each call is a
    round of its own; every process makes the same calls)."""
    from jax._src import distributed
    client = distributed.global_state.client
    key = f'jaxdecouple/checkpoints/{Checkpointer._round}'
    Checkpointer._round += 1
    client.key_value_set(f'{key}/{jax.process_index()}', mine)
    return [client.blocking_key_value_get(f'{key}/{p}', 600_000) for p in range(jax.process_count())]

  def _all_restored(self, step: int, ok: bool) -> bool:
    """Per process: whether every process restored ``step`` intact (each after its own checks). A step damaged
    in one process only is skipped by all of them, so that they resume together from an earlier one. Where the
    processes share the folder (orbax's global arrays: each process reads and checks its own shards), a part
    damaged in one process would otherwise let the others go on from a step that process cannot."""
    if jax.process_count() == 1:
      return ok
    answers = self._exchange('1' if ok else '0')
    bad = [p for p, a in enumerate(answers) if a != '1']
    if bad and ok:
      logging.warning('checkpoint at step %d is damaged in process %s: every process resumes from an earlier one',
                      step, ', '.join(map(str, bad)))
    return not bad

  _round = 0

  def restore_latest(self, template: Any) -> tuple[int, Any] | None:
    """(step, state) from the newest checkpoint that restores, or None when there is none. ``template``:
    a state of the saved structure, or a function of the step giving one."""
    steps = self._common_steps(self.all_steps())
    for step in reversed(steps):
      leaves, treedef = jax.tree.flatten(template(step) if callable(template) else template)
      mine = self._mine(leaves)
      abstract = {'leaves': [jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=None if self.per_process else x.sharding)
                             for x in mine]}
      self._check_matches(step, mine)
      try:
        layout = self._layout(step)
        if layout is not None:  # one array per dtype (pack): unpacked here, checked, then onto the template's devices
          packed = self._manager.restore(step, args=ocp.args.StandardRestore(
              {'packed': {k: np.empty(v.shape, v.dtype) for k, v in self._manager.item_metadata(step).tree['packed'].items()}}))
          host = unpack(packed['packed'], layout)
          self._verify(step, host, [_crc(h) for h in host])
          host = [h if h.dtype == x.dtype else h.astype(x.dtype) for h, x in zip(host, leaves)]  # as orbax restores
          restored = {'leaves': jax.device_put(host, [x.sharding for x in leaves])}
        elif self.per_process:  # back onto the devices of the template's arrays; the others stay placeholders
          arrays = [jax.device_put(x, t.sharding) for x, t in zip(self._manager.restore(step), mine)]
          self._verify(step, arrays)
          arrays = iter(arrays)
          restored = {'leaves': [next(arrays) if t.is_fully_addressable else t for t in leaves]}
        elif self._shared():  # orbax's restore ends in a barrier of every process, which a process whose read
          # failed never reaches: the handler alone reads this process's shards, and the agreement below is the
          # only meeting point (else a part unreadable in one process held the others in that barrier)
          restored = ocp.StandardCheckpointHandler().restore(
              self._manager.directory / str(step) / 'default', args=ocp.args.StandardRestore(abstract))
          self._verify(step, restored['leaves'])
        else:
          restored = self._manager.restore(step, args=ocp.args.StandardRestore(abstract))
          self._verify(step, restored['leaves'])
      except Exception as e:  # damaged files: missing, truncated, unreadable metadata, corrupted content
        if _out_of_memory(e):  # the machine's trouble, not the files': the checkpoint stays where it is
          raise CheckpointError(
              f'restoring the checkpoint at step {step} in {self.directory} ran out of memory ({type(e).__name__}: '
              f'{str(e).splitlines()[0][:120] if str(e) else "no message"}); it is kept: free memory or use a machine '
              'with more, then run again with the same --workdir') from e
        logging.warning('checkpoint at step %d is damaged or incomplete (%s: %s); trying an earlier one', step,
                        type(e).__name__, str(e).splitlines()[0][:160])
        self._all_restored(step, False)
        logging.warning('checkpoint at step %d moved to %s', step, self._move_aside(step))
        continue
      if not self._all_restored(step, True):  # intact here, damaged in another process
        if self._shared():  # one step folder for all: set aside by all, once
          self._move_aside(step)
        continue
      return step, jax.tree.unflatten(treedef, restored['leaves'])
    if steps:
      raise CheckpointError(f'none of the checkpoints in {self.directory} (steps {steps}) could be '
                            'restored; remove that folder to start afresh or use another --workdir')
    return None

  def _moved_aside(self) -> list[str]:
    return sorted(f for f in os.listdir(self.directory) if '.damaged' in f)

  def _shared(self) -> bool:
    """Whether the processes write one folder together (orbax's global arrays over processes)."""
    return not self.per_process and jax.process_count() > 1

  def _move_aside(self, step: int) -> str:
    """Renames a damaged checkpoint (and its checksums) so that the step can be written again, keeping
    the files. In a folder the processes share, process 0 renames the step and each process its own
    checksums; every process then waits for the others (a round of the key-value store) and reloads."""
    source = os.path.join(self.directory, str(step) + ('.npz' if self.per_process else ''))
    target, n = f'{source}.damaged', 1
    while os.path.exists(target):
      n += 1
      target = f'{source}.damaged{n}'
    try:
      if not self._shared() or jax.process_index() == 0:
        os.rename(source, target)
      if os.path.exists(self._checksum_path(step)):
        os.replace(self._checksum_path(step), self._checksum_path(step) + '.damaged')
      failed = ''
    except OSError as e:  # said once every process has met, so that none is left waiting for this one
      failed = f'{e.strerror or type(e).__name__}: {e.filename}'
    if self._shared():
      answers = self._exchange(failed and f'!{failed}' or target)  # process 0's name for it, once it is there
      failed = failed or next((a[1:] for a in answers if a.startswith('!')), '')
      target = answers[0]
    if failed:
      raise CheckpointError(f'the damaged checkpoint at step {step} in {self.directory} could not be moved aside '
                            f'({failed}); make the folder writable, then run again with the same --workdir')
    self._manager.reload()
    return target

  def _check_matches(self, step: int, leaves) -> None:
    try:
      layout = self._layout(step)
      if self.per_process:
        saved = [tuple(a.shape) for a in self._manager.shapes(step)]
      elif layout is not None:
        saved = [tuple(shape) for shape, _ in layout]
      else:
        saved = [tuple(m.shape) for m in self._manager.item_metadata(step).tree['leaves']]
    except Exception:  # unreadable metadata: restore will fail and fall back to an earlier one
      return
    if len(saved) != len(leaves):
      why = f'its state has {len(saved)} arrays, this config makes {len(leaves)}'
    else:
      differ = [(i, s, x) for i, (s, x) in enumerate(zip(saved, leaves)) if s != tuple(x.shape)]
      if not differ:
        return
      i, s, x = differ[0]
      why = (f'{len(differ)} of its {len(saved)} arrays have other shapes, the first (array {i}) '
             f'{s} where this config makes {tuple(x.shape)}')
    raise CheckpointError(
        f'the checkpoint at step {step} in {self.directory} was written by a different config, or by a version of '
        f'jaxdecouple that keeps another state for it ({why}); resume with the config and version it was made '
        'with, or use another --workdir')

  def wait(self) -> None:
    with self._writing(self._pending):
      self._manager.wait_until_finished()
    if self._pending is not None:
      note_saved(self._pending)  # written: the others may count on it
    self._pending = None

  def close(self) -> None:
    self.wait()
    self._manager.close()
    self._forget_checksums()


def _os_reason(e: BaseException) -> str:
  """The OS's reason and file of an OSError in ``e``'s chain ('File too large: .../d/1e25...'), or of an error
  code in tensorstore's text (``[os_error_code='27']``), else ''. Python's own text puts the path last, which a
  long workdir would push out of a line cut to its end."""
  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    if isinstance(e, OSError) and e.strerror:
      name = str(e.filename or '')
      return f'{type(e).__name__}: {e.strerror}' + (f': ...{name[-80:]}' if len(name) > 80 else f': {name}' if name else '')
    if code := re.search(r"os_error_code='?(\d+)", str(e)):
      return f'{type(e).__name__}: {os.strerror(int(code.group(1)))} (os_error_code {code.group(1)})'
    e = e.__cause__ or e.__context__
  return ''


def checksums(arrays: list) -> list:
  """CRC-32 of each array's bytes: of the whole value when this process holds all of it, else of each
  shard it holds a first copy of (keyed by the shard's index), so every process checks its own part."""
  out = []
  for x in arrays:
    if not isinstance(x, jax.Array) or x.is_fully_addressable:
      out.append(_crc(np.asarray(x)))
    else:
      out.append({str(s.index): _crc(np.asarray(s.data)) for s in x.addressable_shards if s.replica_id == 0})
  return out


def _crc(a: np.ndarray) -> int:
  return zlib.crc32(np.ascontiguousarray(a).reshape(-1).view(np.uint8))
