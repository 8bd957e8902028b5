"""Evaluation of the whole network on a test set: loss, top-1 and (100 classes or more) top-5 accuracy; for
byte-level text the loss and accuracy per byte and the bits per byte; for detection the YOLO-v2 loss per image
(ResIST's Table 6 metric) and the VOC 2007 mean average precision at IoU 0.5 (reported as ``test_map`` and, so
that every report reads one figure, as ``test_accuracy``)."""
from __future__ import annotations

import concurrent.futures
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxdecouple.data import Preprocess, normalize
from jaxdecouple.detection import MapAccumulator


@functools.partial(jax.jit, static_argnames=('predict', 'preprocess', 'detector'))
def _sums(variables, images, labels, mask, *, predict, preprocess: Preprocess, detector):
  """One batch's sums (loss, top-1, top-5 correct; a detector's loss and its decoded boxes), padding masked out."""
  logits = predict(variables, normalize(images, preprocess)).astype(jnp.float32)
  if detector is not None:  # the loss of each image, and the boxes and scores the mAP ranks
    return jnp.sum(detector.per_image(logits, labels) * mask), detector.decode(logits)
  losses = -jnp.take_along_axis(jax.nn.log_softmax(logits), labels[..., None], axis=-1)[..., 0]
  correct = jnp.argmax(logits, -1) == labels
  if logits.shape[-1] >= 5:
    correct5 = jnp.any(jax.lax.top_k(logits, 5)[1] == labels[..., None], axis=-1)
  else:
    correct5 = jnp.zeros_like(correct)
  per_example = lambda a: a.reshape(a.shape[0], -1).mean(axis=1)  # text: the mean over an example's bytes
  return tuple(jnp.sum(per_example(a) * mask) for a in (losses, correct, correct5))


class Evaluator:
  """Test loss, top-1 (and, with 100 classes or more, top-5) accuracy of the whole network, batch by batch,
  on one device; for a detector (``detector``) the loss per image and the VOC 2007 mAP at IoU 0.5.

  ``predict(variables, images) -> logits`` is the method's (Method.predict_fn). The last, partial
  batch is padded to the batch size (one compiled shape) unless ``exact_batches``: predictions that
  use the batch's own BatchNorm statistics would change with padding, so it then runs at its size,
  and the examples go in a fixed shuffled order, because test sets stored by class (the CIFAR-10 JPEG
  copy) would otherwise give batches of one class, whose statistics are not the data's. A streamed test
  set (``y`` None) is decoded batch by batch, the next batch while the device works on this one.
  """

  TOP5_FROM_CLASSES = 100

  def __init__(self, predict, preprocess: Preprocess, batch_size: int, device: jax.Device,
               exact_batches: bool = False, num_classes: int = 0, detector=None):
    self.batch_size = batch_size
    self.device = device
    self.exact_batches = exact_batches
    self.num_classes = num_classes
    self.tokens = preprocess.tokens
    self.detector = detector  # models.detection.Detector of a detection network, else None

    # the program is a module-level function keyed on hashable values (``predict``: a models.core.Predict for the
    # methods' own networks), so runs of one network and data in a process build it once
    self._sums = functools.partial(_sums, predict=predict, preprocess=preprocess, detector=detector)

  def _batches(self, x, y):
    """(images, labels) of each evaluation batch, in memory or decoded from a stream."""
    order = np.random.default_rng(0).permutation(len(x)) if self.exact_batches else None
    if y is not None:
      if order is not None:
        x, y = x[order], y[order]
      for start in range(0, len(x), self.batch_size):
        yield x[start:start + self.batch_size], y[start:start + self.batch_size]
      return
    order = np.arange(len(x)) if order is None else order
    chunks = [order[a:a + self.batch_size] for a in range(0, len(x), self.batch_size)]
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix='eval-prefetch') as ahead:
      next_batch = ahead.submit(x.take, chunks[0])
      for i in range(len(chunks)):
        batch = next_batch.result()
        if i + 1 < len(chunks):
          next_batch = ahead.submit(x.take, chunks[i + 1])
        yield batch

  def __call__(self, variables, x, y: np.ndarray | None, prefix: str = 'test') -> dict[str, float]:
    variables = jax.device_put(variables, self.device)
    b = self.batch_size
    parts = []
    boxes = MapAccumulator(self.num_classes) if self.detector is not None else None
    for xb, yb in self._batches(x, y):
      mask = np.ones(len(xb), np.float32)
      if len(xb) < b and not self.exact_batches:  # pad the last batch: one compiled shape
        pad = b - len(xb)
        xb = np.concatenate([xb, np.zeros((pad, *xb.shape[1:]), xb.dtype)])
        # detection: padding rows of class -1 (no boxes), as the labels' own padding
        yb = np.concatenate([yb, np.full((pad, *yb.shape[1:]), -1 if self.detector is not None else 0, yb.dtype)])
        mask = np.concatenate([mask, np.zeros(pad, np.float32)])
      out = self._sums(variables, *jax.device_put((xb, yb, mask), self.device))
      if boxes is not None:
        real = int(mask.sum())
        found, scores = (np.asarray(a)[:real] for a in jax.device_get(out[1]))
        boxes.add(found, scores, np.asarray(yb)[:real])
        out = (out[0],)
      parts.append(out)
    if boxes is not None:
      mean_ap = boxes.result()[0]
      loss = float(np.sum(np.asarray(jax.device_get(parts), np.float64)) / len(x))
      return {f'{prefix}_loss': loss, f'{prefix}_map': float(mean_ap), f'{prefix}_accuracy': float(mean_ap)}
    totals = np.sum(np.asarray(jax.device_get(parts), np.float64), axis=0)
    out = {f'{prefix}_loss': totals[0] / len(x), f'{prefix}_accuracy': totals[1] / len(x)}
    if self.tokens:  # every example has the same number of bytes: the mean loss per byte, in bits
      out[f'{prefix}_bits_per_byte'] = totals[0] / len(x) / np.log(2)
    elif self.num_classes >= self.TOP5_FROM_CLASSES:
      out[f'{prefix}_top5_accuracy'] = totals[2] / len(x)
    return {k: float(v) for k, v in out.items()}
