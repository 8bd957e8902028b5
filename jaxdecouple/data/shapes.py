"""A generated detection data set, "shapes on backgrounds": a detection task that trains in minutes on a CPU.

Pascal VOC takes GPU-days; the detection code (jaxdecouple/detection) and an engine's detection recipe need a
task small enough for tests and quick studies, yet a real one: several objects of three classes per image, of
varied size, colour and position, on a background that is not flat. Everything is a function of the seed.

Each image: a two-colour linear gradient in a random direction plus Gaussian noise (sd 3 grey levels); 1-4
filled shapes (square, circle, upward or downward isosceles triangle), widths uniform in [S/6, S/2] pixels
(triangles 3/4 to 4/3 as tall as wide), drawn largest first so small shapes stay whole; a shape is placed
only where its box has IoU < 0.3 with every box already placed (at most 30 tries, else it is left out); its
colour differs by at least 70 grey levels in some channel from every colour of the background gradient and
from every shape already drawn (best of 50 tries otherwise). The label box is the tight box of the shape's
drawn pixels, in [0, 1] image fractions: (x_min, y_min, x_max, y_max) = (first column, first row, last column
+ 1, last row + 1) / S. Nothing is difficult.
"""
from __future__ import annotations

import numpy as np

from jaxdecouple.errors import DataError

SHAPES_CLASSES = ('square', 'circle', 'triangle')
MAX_BOXES = 8  # rows of a label array; images hold at most MAX_SHAPES of them, the rest padding (class -1)
MAX_SHAPES = 4
MIN_SIDE, MAX_SIDE = 1 / 6, 1 / 2  # shape width, fraction of the image side
TRIANGLE_ASPECT = (0.75, 4 / 3)  # height / width
MAX_BOX_IOU = 0.3
PLACEMENT_TRIES = 30
COLOUR_TRIES = 50
MIN_CONTRAST = 70  # grey levels, largest channel difference
NOISE_SD = 3.0
GRADIENT_SAMPLES = np.linspace(0.0, 1.0, 21)  # points of the background's colour segment checked for contrast


def _box_iou(box, boxes) -> np.ndarray:
  """IoU of one pixel box (x0, y0, x1, y1) with each of ``boxes`` [k, 4]."""
  if not len(boxes):
    return np.zeros(0)
  boxes = np.asarray(boxes, np.float64)
  iw = np.clip(np.minimum(box[2], boxes[:, 2]) - np.maximum(box[0], boxes[:, 0]), 0, None)
  ih = np.clip(np.minimum(box[3], boxes[:, 3]) - np.maximum(box[1], boxes[:, 1]), 0, None)
  inter = iw * ih
  return inter / ((box[2] - box[0]) * (box[3] - box[1]) + (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
                  - inter)


def shape_mask(kind: int, width: int, height: int, flip: bool) -> np.ndarray:
  """Boolean [height, width] mask of a shape filling a width x height box; a pixel is in when its centre is.
  kind indexes SHAPES_CLASSES; flip turns a triangle's apex from the top row to the bottom one."""
  ys = (np.arange(height) + 0.5)[:, None]
  xs = (np.arange(width) + 0.5)[None, :]
  if kind == 0:
    return np.ones((height, width), bool)
  if kind == 1:
    r = width / 2
    return (xs - r) ** 2 + (ys - r) ** 2 <= r * r
  depth = (height - ys) / height if flip else ys / height  # 0 at the apex, 1 at the base
  return np.abs(xs - width / 2) <= (width / 2) * depth


def _contrast(colour, avoid) -> float:
  return float(np.min(np.max(np.abs(avoid - colour), axis=1)))


def _image(rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
  """One image (uint8 [size, size, 3]) and its label rows [k, 5] (class, x_min, y_min, x_max, y_max)."""
  ends = rng.integers(0, 256, size=(2, 3)).astype(np.float64)
  angle = rng.uniform(0, 2 * np.pi)
  u = np.cos(angle) * np.arange(size)[None, :] + np.sin(angle) * np.arange(size)[:, None]
  t = ((u - u.min()) / (u.max() - u.min()))[..., None].astype(np.float32)
  pixels = (ends[0] * (1 - t) + ends[1] * t).astype(np.float32)
  pixels += NOISE_SD * rng.standard_normal((size, size, 3), dtype=np.float32)
  avoid = ends[0] + GRADIENT_SAMPLES[:, None] * (ends[1] - ends[0])  # colours a shape must stand out from

  count = int(rng.integers(1, MAX_SHAPES + 1))
  kinds = rng.integers(0, len(SHAPES_CLASSES), size=count)
  widths = np.sort(rng.integers(round(size * MIN_SIDE), round(size * MAX_SIDE) + 1, size=count))[::-1]
  placed, rows = [], []
  for kind, width in zip(kinds, widths):
    height = width if kind != 2 else int(np.clip(round(width * rng.uniform(*TRIANGLE_ASPECT)), 2, size))
    mask = shape_mask(int(kind), width, height, bool(rng.integers(0, 2)))
    ys, xs = np.nonzero(mask)
    tight = np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1])  # the drawn pixels' box, from (x0, y0)
    for _ in range(PLACEMENT_TRIES):
      x0, y0 = int(rng.integers(0, size - width + 1)), int(rng.integers(0, size - height + 1))
      box = tight + (x0, y0, x0, y0)
      if np.all(_box_iou(box, placed) < MAX_BOX_IOU):
        break
    else:
      continue
    placed.append(box)
    best, best_contrast = None, -1.0
    for _ in range(COLOUR_TRIES):
      colour = rng.integers(0, 256, size=3).astype(np.float64)
      contrast = _contrast(colour, avoid)
      if contrast > best_contrast:
        best, best_contrast = colour, contrast
      if contrast >= MIN_CONTRAST:
        break
    avoid = np.concatenate([avoid, best[None]])
    pixels[y0:y0 + height, x0:x0 + width][mask] = best
    rows.append((kind, *box))
  rows = np.asarray(rows, np.float64).reshape(-1, 5)
  rows[:, 1:] /= size
  return np.clip(np.rint(pixels), 0, 255).astype(np.uint8), rows


def _split(rng: np.random.Generator, count: int, size: int) -> tuple[np.ndarray, np.ndarray]:
  images = np.empty((count, size, size, 3), np.uint8)
  labels = np.zeros((count, MAX_BOXES, 6), np.float32)
  labels[:, :, 0] = -1
  for i in range(count):
    images[i], rows = _image(rng, size)
    labels[i, :len(rows), :5] = rows
  return images, labels


def shapes_detection(num_train: int, num_test: int, image_size: int = 64,
                     seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """(x_train uint8 [N, S, S, 3], y_train float32 [N, MAX_BOXES, 6], x_test, y_test); label rows (class,
  x_min, y_min, x_max, y_max, difficult = 0), padding rows class -1. The same seed gives the same arrays; the
  training and test images come from independent streams of it (numpy SeedSequence.spawn)."""
  if image_size < 12:
    raise DataError(f'shapes_detection: image_size={image_size} is too small to draw shapes; use 12 or more '
                    'pixels (64 is the default)')
  if num_train < 0 or num_test < 0:
    raise DataError(f'shapes_detection: num_train={num_train} and num_test={num_test} must be >= 0')
  train_seed, test_seed = np.random.SeedSequence(seed).spawn(2)
  x_train, y_train = _split(np.random.default_rng(train_seed), num_train, image_size)
  x_test, y_test = _split(np.random.default_rng(test_seed), num_test, image_size)
  return x_train, y_train, x_test, y_test
