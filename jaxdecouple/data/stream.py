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
threads decodes the images of a batch in parallel (Pillow releases the GIL while it decodes and resizes).
Normalisation runs on the device. An image that cannot be decoded mid-epoch is replaced by the next
readable one of its split, with a warning, and counted (``StreamImages.skipped``).
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import io
import math
import os
import threading
from typing import Callable, Sequence

import numpy as np
from absl import logging

from jaxdecouple.errors import DataError

JPEG_EXTENSIONS = ('.jpeg', '.jpg')
EVAL_RESIZE = 256 / 224  # the evaluation transform's resize before the centre crop (256 -> 224)
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


# --- transforms ---------------------------------------------------------------------------------

def random_resized_box(rng: np.random.Generator, w: int, h: int, scale=(0.08, 1.0),
                       ratio=(3 / 4, 4 / 3)) -> tuple[float, float, float, float]:
  """(left, top, width, height) of an Inception-style crop: 10 tries at a random area and aspect, else
  the centre crop of the image clamped to the aspect range (as torchvision's RandomResizedCrop)."""
  area = w * h
  log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
  for _ in range(10):
    target = area * rng.uniform(*scale)
    aspect = math.exp(rng.uniform(*log_ratio))
    cw, ch = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
    if 0 < cw <= w and 0 < ch <= h:
      return float(rng.integers(0, w - cw + 1)), float(rng.integers(0, h - ch + 1)), float(cw), float(ch)
  aspect = w / h
  if aspect < ratio[0]:
    cw, ch = w, int(round(w / ratio[0]))
  elif aspect > ratio[1]:
    cw, ch = int(round(h * ratio[1])), h
  else:
    cw, ch = w, h
  return (w - cw) / 2, (h - ch) / 2, float(cw), float(ch)


def center_box(w: int, h: int) -> tuple[float, float, float, float]:
  """The evaluation crop in the original image: resize the shorter side to 256, centre 224 (scaled)."""
  side = min(w, h) / EVAL_RESIZE
  return (w - side) / 2, (h - side) / 2, side, side


def transform(data: bytes, size: int, rng: np.random.Generator | None, flip: bool = True) -> np.ndarray:
  """Decodes one JPEG and returns the uint8 [size, size, 3] crop: random-resized crop and flip when
  ``rng`` is given (training), else the evaluation centre crop. Raises on undecodable bytes."""
  from PIL import Image  # pillow is a dependency; only the streaming path imports it
  image = Image.open(io.BytesIO(data))
  w, h = image.size
  box = random_resized_box(rng, w, h) if rng is not None else center_box(w, h)
  # decode at the smallest DCT scale that still gives the crop at least `size` pixels a side
  shrink = max(1.0, min(box[2], box[3]) / size)
  image.draft('RGB', (max(1, int(math.ceil(w / shrink))), max(1, int(math.ceil(h / shrink)))))
  sx, sy = image.size[0] / w, image.size[1] / h
  image = image.convert('RGB')
  box = (box[0] * sx, box[1] * sy, (box[0] + box[2]) * sx, (box[1] + box[3]) * sy)
  image = image.resize((size, size), Image.BILINEAR, box=box)
  if rng is not None and flip and rng.random() < 0.5:
    image = image.transpose(Image.FLIP_LEFT_RIGHT)
  return np.asarray(image, np.uint8)


# --- a split decoded on demand ------------------------------------------------------------------

_POOLS: dict[int, concurrent.futures.ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


def decode_pool(workers: int) -> concurrent.futures.ThreadPoolExecutor:
  """One shared pool of decoding threads per size (0: one per core)."""
  workers = workers or os.cpu_count() or 1
  with _POOLS_LOCK:
    if workers not in _POOLS:
      _POOLS[workers] = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix='decode')
    return _POOLS[workers]


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

  def _one(self, index: int, key: tuple[int, ...] | None, position: int) -> tuple[np.ndarray, int]:
    for attempt in range(MAX_CONSECUTIVE_DAMAGED):
      i = (int(index) + attempt) % len(self.files)
      rng = np.random.default_rng([*key, position]) if key is not None and self.train else None
      try:
        data, label = self.files.read(i)
        return transform(data, self.size, rng, self.flip), label
      except Exception as e:  # damaged or unreadable: skip it, say so once per file, count every use
        with self._lock:
          self.skipped += 1
          first = i not in self.damaged
          self.damaged.add(i)
        if first:
          logging.warning('skipping image %s of %s: it cannot be read or decoded (%s: %s); the next image '
                          'of the split takes its place (%d damaged so far)', self.files.name(i),
                          self.files.where, type(e).__name__, e, len(self.damaged))
    raise DataError(f'{MAX_CONSECUTIVE_DAMAGED} consecutive images of {self.files.where} from index {index} '
                    'cannot be decoded: the data is damaged or not JPEG images; check or re-create it')

  def take(self, indices: Sequence[int], key: tuple[int, ...] | None = None) -> tuple[np.ndarray, np.ndarray]:
    indices = np.asarray(indices).reshape(-1)
    if self.train and key is None:
      raise ValueError('training images need a key (seed, stream, step)')
    parts = list(decode_pool(self.workers).map(lambda a: self._one(a[1], key, a[0]), enumerate(indices)))
    if not parts:
      return np.zeros((0, self.size, self.size, 3), np.uint8), np.zeros(0, np.int32)
    return np.stack([p[0] for p in parts]), np.asarray([p[1] for p in parts], np.int32)


class Prefetcher:
  """Computes ``batch_of(step)`` for the next ``depth`` steps in a background thread, in order."""

  def __init__(self, batch_of: Callable[[int], object], start: int, stop: int, depth: int):
    self._batch_of, self._next, self._stop, self._depth = batch_of, start, stop, max(depth, 1)
    self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix='prefetch')
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
