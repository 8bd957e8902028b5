"""JPEG decoding and the ImageNet transforms, on the host (numpy and Pillow only, so the decoding processes
of :mod:`jaxdecouple.data.stream` start without importing JAX)."""
from __future__ import annotations

import io
import math

import numpy as np

EVAL_RESIZE = 256 / 224  # the evaluation transform's resize before the centre crop (256 -> 224)


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


def decode_many(jobs: list) -> list:
  """In a decoding process: [(bytes, size, rng key or None, flip)] -> [uint8 image, or the error's text]."""
  out = []
  for data, size, key, flip in jobs:
    try:
      out.append(transform(data, size, np.random.default_rng(key) if key is not None else None, flip))
    except Exception as e:  # damaged: the parent replaces it
      out.append(f'{type(e).__name__}: {e}')
  return out
