"""Streaming image data: JPEG files read, decoded and augmented on the host as each batch needs them.

For data sets that do not fit in memory (ImageNet). A split is a list of encoded images with their
labels (:class:`Files`: a folder of class folders, a tensorflow-datasets data source, ...) and
:class:`StreamImages` turns indices into a uint8 batch ``[B, S, S, 3]``:

- training: Inception-style random-resized crop (scale 0.08-1, aspect 3/4-4/3) to S pixels and a random
  horizontal flip, each image's draw keyed by (seed, stream, step, position in the batch);
- evaluation: resize the shorter side to S * 256/224 and take the centre S x S.

So the batch of a step is a pure function of (seed, stream, step), like the in-memory path's: the
loader's position is the checkpointed step, and a run killed mid-epoch resumes exactly. JPEGs are
decoded at reduced size where the crop allows (libjpeg's DCT scaling, ``Image.draft``), and a pool of
processes decodes the images of a batch in parallel (threads read the bytes).
Normalisation runs on the device. An image that cannot be decoded mid-epoch is replaced by the next
readable one of its split, with a warning, and counted (``StreamImages.skipped``).
"""
from __future__ import annotations

import concurrent.futures
import concurrent.futures.process
import dataclasses
import atexit
import math
import os
import signal
import threading
import time
from typing import Callable, Sequence

import numpy as np
from absl import logging

from jaxdecouple.errors import DataError
from jaxdecouple.jpeg import center_box, decode_many, random_resized_box, transform  # noqa: F401

JPEG_EXTENSIONS = ('.jpeg', '.jpg')
MAX_CONSECUTIVE_DAMAGED = 64


@dataclasses.dataclass
class Files:
  """One split's encoded images: ``read(i) -> (bytes, label)``; ``name(i)`` for messages."""
  where: str
  size: int
  read: Callable[[int], tuple[bytes, int]]
  name: Callable[[int], str]
  num_classes: int

  def __len__(self) -> int:
    return self.size


# --- a split decoded on demand ------------------------------------------------------------------

_POOLS: dict = {}
_POOLS_LOCK = threading.Lock()


def decode_pool(workers: int) -> concurrent.futures.ProcessPoolExecutor:
  """One shared pool of decoding processes per size (0: one per core), started once and reused.

  Processes, not threads: Pillow holds the GIL for much of a decode (a thread pool gave 1.4x on 2 cores,
  processes 1.8x; docs/PERFORMANCE.md). 'spawn' children: the parent has JAX's threads, which fork
  would copy in an unknown state. Each decoder runs in a process group of its own (``_decoder_start``), so
  that a terminal's Ctrl-C or a scheduler's group SIGTERM reaches the training process alone, which saves a
  checkpoint and stops; the pools are shut down when the process exits, and a decoder whose parent died
  (kill -9) exits within a second instead of staying orphaned."""
  import multiprocessing  # noqa: PLC0415
  workers = workers or os.cpu_count() or 1
  with _POOLS_LOCK:
    if not _POOLS:
      atexit.register(shutdown_pools)
    if workers not in _POOLS:
      _POOLS[workers] = concurrent.futures.ProcessPoolExecutor(
          workers, mp_context=multiprocessing.get_context('spawn'), initializer=_decoder_start,
          initargs=(os.getpid(),))
    return _POOLS[workers]


def _decoder_start(parent: int) -> None:
  """In each decoding process, first: a process group of its own, Ctrl-C ignored (the parent stops the
  pool), and a watcher that ends the process once its parent is gone (its parent id changes)."""
  os.setpgrp()
  signal.signal(signal.SIGINT, signal.SIG_IGN)

  def watch():
    while os.getppid() == parent:
      time.sleep(0.5)
    os._exit(0)
  threading.Thread(target=watch, daemon=True, name='parent-watch').start()


def shutdown_pools() -> None:
  """Stops every decoding process now (at exit, on every path: an error line, a signal's stop, the end)."""
  with _POOLS_LOCK:
    pools = [p for key, p in _POOLS.items() if key != 'read']
    for key in [k for k in _POOLS if k != 'read']:
      del _POOLS[key]
  for pool in pools:
    for proc in list(getattr(pool, '_processes', {}).values()):  # their own group: nothing else stops them
      proc.terminate()
    pool.shutdown(wait=False, cancel_futures=True)


def _read_pool() -> concurrent.futures.ThreadPoolExecutor:
  """Threads that read the encoded bytes (files, records): I/O, which releases the GIL."""
  with _POOLS_LOCK:
    if 'read' not in _POOLS:
      _POOLS['read'] = concurrent.futures.ThreadPoolExecutor(8, thread_name_prefix='read')
    return _POOLS['read']


class StreamImages:
  """A split read on demand. ``len``, ``shape`` and ``dtype`` as an image array's; ``take(indices, key)``
  returns (images uint8 [B, S, S, 3], labels int32 [B]), training transforms keyed by ``key``
  = (seed, stream, step), the evaluation transform when ``train`` is False."""

  def __init__(self, files: Files, size: int, train: bool, workers: int = 0, flip: bool = True):
    self.files = files
    self.size = size
    self.train = train
    self.flip = flip
    self.workers = workers
    self.skipped = 0  # images replaced because they could not be decoded (counted at every use)
    self.damaged: set[int] = set()
    self._lock = threading.Lock()

  def __len__(self) -> int:
    return len(self.files)

  @property
  def shape(self) -> tuple[int, int, int, int]:
    return (len(self.files), self.size, self.size, 3)

  dtype = np.dtype(np.uint8)
  num_classes = property(lambda self: self.files.num_classes)

  def _read(self, i: int):
    try:
      return self.files.read(i)
    except Exception as e:  # unreadable: replaced like an undecodable image
      return f'{type(e).__name__}: {e}'

  def _damaged(self, i: int, error: str) -> None:
    with self._lock:
      self.skipped += 1
      first = i not in self.damaged
      self.damaged.add(i)
    if first:
      logging.warning('skipping image %s of %s: it cannot be read or decoded (%s); the next image of the split '
                      'takes its place (%d damaged so far)', self.files.name(i), self.files.where, error,
                      len(self.damaged))

  def _replacement(self, index: int, key, position: int) -> tuple[np.ndarray, int]:
    """The first readable image after a damaged one (decoded here: rare)."""
    for attempt in range(1, MAX_CONSECUTIVE_DAMAGED):
      i = (int(index) + attempt) % len(self.files)
      got = self._read(i)
      if not isinstance(got, str):
        try:
          rng = np.random.default_rng([*key, position]) if key is not None else None
          return transform(got[0], self.size, rng, self.flip), got[1]
        except Exception as e:  # noqa: BLE001
          got = f'{type(e).__name__}: {e}'
      self._damaged(i, got)
    raise DataError(f'{MAX_CONSECUTIVE_DAMAGED} consecutive images of {self.files.where} from index {index} '
                    'cannot be decoded: the data is damaged or not JPEG images; check or re-create it')

  def take(self, indices: Sequence[int], key: tuple[int, ...] | None = None) -> tuple[np.ndarray, np.ndarray]:
    indices = [int(i) for i in np.asarray(indices).reshape(-1)]
    if self.train and key is None:
      raise ValueError('training images need a key (seed, stream, step)')
    key = tuple(int(k) for k in key) if self.train else None
    if not indices:
      return np.zeros((0, self.size, self.size, 3), np.uint8), np.zeros(0, np.int32)
    read = list(_read_pool().map(self._read, indices))
    jobs = [(r[0] if not isinstance(r, str) else b'', self.size, None if key is None else [*key, p], self.flip)
            for p, r in enumerate(read)]
    workers = self.workers or os.cpu_count() or 1
    chunk = max(1, math.ceil(len(jobs) / (workers * 2)))
    try:
      decoded = [x for part in decode_pool(workers).map(decode_many, [jobs[a:a + chunk]
                                                                     for a in range(0, len(jobs), chunk)])
                 for x in part]
    except concurrent.futures.process.BrokenProcessPool as e:
      with _POOLS_LOCK:
        _POOLS.pop(workers, None)  # a later run starts a fresh pool
      raise DataError(f'a JPEG decoding process died while decoding {self.files.where} ({e}); most often the '
                      'machine ran out of memory: lower data.workers or data.prefetch, then resume') from e
    images, labels = [], []
    for p, (i, r, x) in enumerate(zip(indices, read, decoded)):
      if isinstance(r, str) or isinstance(x, str):
        self._damaged(i, r if isinstance(r, str) else x)
        x, label = self._replacement(i, key, p)
      else:
        label = r[1]
      images.append(x)
      labels.append(label)
    return np.stack(images), np.asarray(labels, np.int32)


class BlankImages:
  """Stands in for a :class:`StreamImages` split where only a batch's shapes matter (a model's
  initialisation): ``take`` returns zeros, reading and decoding nothing."""

  def __init__(self, images: StreamImages):
    self.shape, self.dtype, self.num_classes, self._len = images.shape, images.dtype, images.num_classes, len(images)

  def __len__(self) -> int:
    return self._len

  def take(self, indices: Sequence[int], key: tuple[int, ...] | None = None) -> tuple[np.ndarray, np.ndarray]:
    n = np.asarray(indices).size
    return np.zeros((n, *self.shape[1:]), self.dtype), np.zeros(n, np.int32)


class Prefetcher:
  """Computes ``batch_of(step)`` for the next ``depth`` steps in ``depth`` background threads (so one batch's
  reading and collecting overlaps another's decoding) and returns them in order. ``batch_of`` must be a
  pure function of the step, safe to call from several threads."""

  def __init__(self, batch_of: Callable[[int], object], start: int, stop: int, depth: int):
    self._batch_of, self._next, self._stop, self._depth = batch_of, start, stop, max(depth, 1)
    self._pool = concurrent.futures.ThreadPoolExecutor(self._depth, thread_name_prefix='prefetch')
    self._pending: dict[int, concurrent.futures.Future] = {}

  def __call__(self, step: int):
    while self._next < min(step + 1 + self._depth, self._stop):
      self._pending[self._next] = self._pool.submit(self._batch_of, self._next)
      self._next += 1
    future = self._pending.pop(step, None)
    return future.result() if future is not None else self._batch_of(step)

  def close(self) -> None:
    for f in self._pending.values():
      f.cancel()
    self._pool.shutdown(wait=True)
