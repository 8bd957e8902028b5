"""YOLO-v2's loss and decoding (jaxdecouple/detection/yolo.py) against values worked out here: a case summed
term by term by hand, a darknet-shaped loop over predictors and truths in plain Python, the ignore threshold,
padding, a perfect prediction, and gradients under jit."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdecouple.detection import decode, yolo_v2_loss
from jaxdecouple.errors import DataError

# one compiled program per shape: op-by-op dispatch compiles each of the loss's ~100 operations separately
jit_loss = jax.jit(yolo_v2_loss, static_argnums=3)


def sigmoid(v):
  return 1 / (1 + math.exp(-v))


def corner_iou(a, b):
  iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
  ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
  union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - iw * ih
  return iw * ih / union


def padded(rows, m):
  out = np.zeros((m, 6), np.float32)
  out[:, 0] = -1
  out[:len(rows)] = np.asarray(rows, np.float32).reshape(-1, 6)
  return out


def test_one_box_summed_by_hand():
  """G=2, A=1 anchor (1, 1), C=2, all outputs 0: every predictor is its cell (0.5 x 0.5), objectness 0.5,
  classes 0.5 each. Truth class 1, corners (0.1, 0.1, 0.5, 0.3): centre (0.3, 0.2), w 0.4, h 0.2, in cell
  (row 0, col 0); IoU with that cell's box = 0.08 / 0.25 = 0.32; the three other cells do not overlap it."""
  predictions = jnp.zeros((1, 2, 2, 7))
  labels = padded([[1, 0.1, 0.1, 0.5, 0.3, 0]], 2)[None]
  noobject = 3 * 0.5 ** 2
  obj = 5 * (0.32 - 0.5) ** 2
  coord = (2 - 0.4 * 0.2) * ((0.5 - 0.6) ** 2 + (0.5 - 0.4) ** 2 + math.log(0.8) ** 2 + math.log(0.4) ** 2)
  cls = 0.5 ** 2 + 0.5 ** 2
  loss, mean_iou = jit_loss(predictions, labels, [[1.0, 1.0]], 2)
  assert float(loss) == pytest.approx(noobject + obj + coord + cls, rel=1e-5)
  assert float(mean_iou) == pytest.approx(0.32, rel=1e-5)


def darknet_image_loss(p, truths, anchors, num_classes, noobject=1.0, obj_scale=5.0, coord_scale=1.0,
                       class_scale=1.0, thresh=0.6):
  """forward_region_layer's structure for one image, in scalars: p [G, G, A, 5 + C]; truths rows (class,
  x0, y0, x1, y1). Returns (loss, list of IoUs of each truth with its responsible predictor's box)."""
  g, num_anchors = p.shape[0], p.shape[2]

  def box(i, j, a):
    cx, cy = (j + sigmoid(p[i, j, a, 0])) / g, (i + sigmoid(p[i, j, a, 1])) / g
    w, h = anchors[a][0] * math.exp(p[i, j, a, 2]) / g, anchors[a][1] * math.exp(p[i, j, a, 3]) / g
    return (cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2)

  responsible, ious = {}, []
  for t in truths:
    x, y, w, h = (t[1] + t[3]) / 2, (t[2] + t[4]) / 2, t[3] - t[1], t[4] - t[2]
    i, j = int(y * g), int(x * g)
    shape = [min(w * g, aw) * min(h * g, ah) / (w * g * h * g + aw * ah - min(w * g, aw) * min(h * g, ah))
             for aw, ah in anchors]
    a = shape.index(max(shape))
    responsible[(i, j, a)] = t  # a later truth overwrites
    ious.append(corner_iou(box(i, j, a), t[1:5]))
  total = 0.0
  for i in range(g):
    for j in range(g):
      for a in range(num_anchors):
        best = max([corner_iou(box(i, j, a), t[1:5]) for t in truths] + [0.0])
        if (i, j, a) not in responsible and best <= thresh:
          total += noobject * sigmoid(p[i, j, a, 4]) ** 2
  for (i, j, a), t in responsible.items():
    x, y, w, h = (t[1] + t[3]) / 2, (t[2] + t[4]) / 2, t[3] - t[1], t[4] - t[2]
    out = p[i, j, a]
    total += coord_scale * (2 - w * h) * ((sigmoid(out[0]) - (x * g - j)) ** 2 + (sigmoid(out[1]) - (y * g - i)) ** 2
                                          + (out[2] - math.log(w * g / anchors[a][0])) ** 2
                                          + (out[3] - math.log(h * g / anchors[a][1])) ** 2)
    total += obj_scale * (corner_iou(box(i, j, a), t[1:5]) - sigmoid(out[4])) ** 2
    exps = [math.exp(v) for v in out[5:]]
    total += class_scale * sum((e / sum(exps) - (c == t[0])) ** 2 for c, e in enumerate(exps))
  return total, ious


def test_matches_darknet_loop_two_anchors_two_images():
  """Two images, A=2, C=3, random outputs; the second image has two truths on the same predictor."""
  g, anchors, classes = 3, [(0.6, 0.6), (1.8, 1.2)], 3
  rng = np.random.default_rng(0)
  p = rng.normal(0, 0.7, size=(2, g, g, 2, 5 + classes)).astype(np.float32)
  truths = [[(0, 0.40, 0.05, 1.00, 0.45), (2, 0.05, 0.70, 0.25, 0.90)],
            [(1, 0.36, 0.36, 0.60, 0.58), (0, 0.38, 0.40, 0.62, 0.60), (2, 0.1, 0.1, 0.9, 0.9)]]
  expected, ious = 0.0, []
  for n in range(2):
    loss_n, ious_n = darknet_image_loss(p[n].astype(np.float64), truths[n], anchors, classes)
    expected += loss_n / 2
    ious += ious_n
  labels = np.stack([padded([(*t, 0) for t in rows], 4) for rows in truths])
  loss, mean_iou = jit_loss(jnp.asarray(p.reshape(2, g, g, -1)), labels, anchors, classes)
  assert float(loss) == pytest.approx(expected, rel=1e-5)
  assert float(mean_iou) == pytest.approx(np.mean(ious), rel=1e-5)


def test_ignore_threshold():
  """Two equal anchors (1, 1), G=2, all outputs 0, truth = cell (0, 0) exactly: anchor 0 is responsible; anchor
  1 of that cell decodes to the same box (IoU 1 > 0.6), so it adds no noobject term; no other predictor
  overlaps. Terms: 6 noobject 0.25 + object 5 (1 - 0.5)^2 + coordinates 0 + classes 0.5."""
  predictions = jnp.zeros((1, 2, 2, 2 * 7))
  labels = padded([[0, 0.0, 0.0, 0.5, 0.5, 0]], 1)[None]
  anchors = [(1.0, 1.0), (1.0, 1.0)]
  loss, _ = jit_loss(predictions, labels, anchors, 2)
  assert float(loss) == pytest.approx(6 * 0.25 + 1.25 + 0.5, rel=1e-6)
  loss_never_ignored, _ = jit_loss(predictions, labels, anchors, 2, ignore_iou=1.0)
  assert float(loss_never_ignored) == pytest.approx(7 * 0.25 + 1.25 + 0.5, rel=1e-6)


def test_padding_contributes_nothing():
  rng = np.random.default_rng(1)
  predictions = jnp.asarray(rng.normal(size=(1, 4, 4, 2 * 8)), jnp.float32)
  anchors = [(1.0, 1.5), (2.5, 2.0)]
  box = [[2, 0.2, 0.3, 0.6, 0.8, 0]]
  alone, iou_alone = jit_loss(predictions, padded(box, 1)[None], anchors, 3)
  rows = padded(box, 5)
  rows[2:, 1:] = rng.uniform(size=(3, 5))  # padding rows with junk coordinates: still padding (class -1)
  with_padding, iou_padding = jit_loss(predictions, rows[None], anchors, 3)
  assert float(with_padding) == pytest.approx(float(alone), rel=1e-6)
  assert float(iou_padding) == pytest.approx(float(iou_alone), rel=1e-6)
  empty, empty_iou = jit_loss(predictions, padded([], 3)[None], anchors, 3)
  assert float(empty) == pytest.approx(float(jnp.sum(jax.nn.sigmoid(predictions.reshape(4, 4, 2, 8)[..., 4]) ** 2)),
                                       rel=1e-6)
  assert float(empty_iou) == 0.0


def test_perfect_prediction():
  """Outputs that decode exactly to each truth with a confident right class: no coordinate or class loss (the
  objectness scales set to 0 leave just those), and IoU 1."""
  g, anchors = 4, [(1.0, 1.0), (2.0, 3.0)]
  truths = [(1, 0.32, 0.05, 0.72, 0.65), (0, 0.60, 0.70, 0.80, 0.90)]  # anchor 1, cell (1, 2); anchor 0, cell (3, 2)
  p = np.zeros((g, g, 2, 7), np.float32)
  for c, x0, y0, x1, y1 in truths:
    x, y, w, h = (x0 + x1) / 2, (y0 + y1) / 2, x1 - x0, y1 - y0
    i, j = int(y * g), int(x * g)
    a = 1 if h > 0.5 else 0
    logit = lambda v: math.log(v / (1 - v))
    p[i, j, a, :4] = [logit(x * g - j), logit(y * g - i), math.log(w * g / anchors[a][0]),
                      math.log(h * g / anchors[a][1])]
    p[i, j, a, 5:] = [30.0 if k == c else -30.0 for k in range(2)]
  labels = padded([(*t, 0) for t in truths], 3)[None]
  loss, mean_iou = jit_loss(jnp.asarray(p.reshape(1, g, g, -1)), labels, anchors, 2, noobject_scale=0.0,
                                object_scale=0.0)
  assert float(loss) < 1e-8
  assert float(mean_iou) == pytest.approx(1.0, abs=1e-5)


def test_decode_by_hand():
  g, anchors, classes = 2, [(0.5, 1.0), (3.0, 2.0)], 3
  rng = np.random.default_rng(2)
  p = rng.normal(size=(2, g, g, 2, 5 + classes)).astype(np.float32)
  boxes, scores = decode(jnp.asarray(p.reshape(2, g, g, -1)), anchors, classes)
  assert boxes.shape == (2, g * g * 2, 4) and scores.shape == (2, g * g * 2, classes)
  n, i, j, a = 1, 1, 0, 1  # predictor (i * G + j) * A + a = 5
  t = [float(v) for v in p[n, i, j, a]]
  cx, cy = (j + sigmoid(t[0])) / g, (i + sigmoid(t[1])) / g
  w, h = 3.0 * math.exp(t[2]) / g, 2.0 * math.exp(t[3]) / g
  expected = [min(max(v, 0.0), 1.0) for v in (cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2)]
  np.testing.assert_allclose(np.asarray(boxes[n, 5]), expected, rtol=1e-5, atol=1e-6)
  exps = [math.exp(v) for v in t[5:]]
  np.testing.assert_allclose(np.asarray(scores[n, 5]), [sigmoid(t[4]) * e / sum(exps) for e in exps], rtol=1e-5)
  assert float(boxes.min()) >= 0.0 and float(boxes.max()) <= 1.0


def test_gradient_finite_under_jit():
  rng = np.random.default_rng(3)
  predictions = jnp.asarray(rng.normal(size=(2, 3, 3, 2 * 7)), jnp.float32)
  labels = np.stack([padded([[0, 0.1, 0.2, 0.5, 0.7, 0], [1, 0.6, 0.6, 0.9, 0.95, 1]], 3),
                     padded([[1, 0.0, 0.0, 1.0, 1.0, 0]], 3)])
  anchors = [(1.0, 1.0), (2.0, 2.5)]
  loss_fn = lambda q: jit_loss(q, labels, anchors, 2)[0]
  grad = jax.jit(jax.grad(loss_fn))(predictions)
  assert np.all(np.isfinite(np.asarray(grad))) and float(jnp.abs(grad).sum()) > 0
  value, grad_again = jax.value_and_grad(loss_fn)(predictions)
  assert np.isfinite(float(value))
  np.testing.assert_allclose(np.asarray(grad_again), np.asarray(grad), rtol=1e-5, atol=1e-7)


def test_shape_mismatch_is_one_line():
  with pytest.raises(DataError, match='channels') as e:
    jit_loss(jnp.zeros((1, 2, 2, 10)), padded([], 1)[None], [(1.0, 1.0)], 2)
  assert '\n' not in str(e.value)
