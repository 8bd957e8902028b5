"""YOLO-v2's detection head maths: the region layer's loss and the decoding of its outputs into boxes.

The ResIST paper's Pascal VOC experiment trains a ResNet with a 1x1 convolution on top whose output is read as
YOLO-v2's (Redmon & Farhadi, "YOLO9000: Better, Faster, Stronger", CVPR 2017, arXiv:1612.08242, section 2
"Direct location prediction"); the loss is the one darknet's region layer trains it with (pjreddie/darknet
src/region_layer.c, forward_region_layer, delta_region_box, delta_region_class; cfg/yolo-voc.cfg), written as
a jittable function of fixed shapes so any engine can differentiate it.

Conventions (shared with jaxdecouple/data/shapes.py and voc.py):

- ``predictions`` [N, G, G, A * (5 + C)]: cell (row i = y, column j = x), anchor a, channels
  ``a * (5 + C) + [tx, ty, tw, th, to, class logits (C)]``;
- ``labels`` [N, M, 6] rows (class, x_min, y_min, x_max, y_max, difficult), coordinates in [0, 1] of the image,
  padding rows class -1;
- ``anchors`` [A, 2] (width, height) in grid cells.

Decoding (YOLO9000 eq. for b_x..b_h, darknet get_region_box with ``absolute=1``)::

  bx = (j + sigmoid(tx)) / G    by = (i + sigmoid(ty)) / G    bw = pw exp(tw) / G    bh = ph exp(th) / G
  objectness = sigmoid(to)      class probabilities = softmax(logits)

(tw, th are clipped at 10 inside box decoding only, so a wild prediction gives a huge box, never inf - inf.)
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxdecouple.errors import DataError

# darknet cfg/yolo-voc.cfg (= yolov2-voc.cfg) [region] anchors, (w, h) in cells of the 13 x 13 grid of a 416 x 416
# input: YOLO9000 section 2 "Dimension Clusters", k-means (k = 5, distance 1 - IoU) over VOC 2007+2012 boxes.
# For a grid of G cells scale them by G / VOC_GRID (they are fractions of the image times 13).
VOC_GRID = 13
VOC_ANCHORS = ((1.3221, 1.73145), (3.19275, 4.00944), (5.05587, 8.09892), (9.47112, 4.84053), (11.2364, 10.0071))
# The shapes data set (jaxdecouple/data/shapes.py) on an 8 x 8 grid: the same k-means (k = 3, distance 1 - IoU of
# centre-aligned boxes, mean centroids) over the 12,566 training boxes of shapes_detection(5000, 0, seed=0)
# (widths 1/6 to 1/2 of the image = 1.3 to 4 cells; squares and circles square, triangles 3/4 to 4/3 as tall as
# wide), rounded to 0.05 cells; a box's best anchor overlaps it with IoU 0.82 on average.
SHAPES_GRID = 8
SHAPES_ANCHORS = ((1.75, 1.75), (2.6, 2.6), (3.55, 3.65))
BOX_LOG_CLIP = 10.0  # tw, th above this decode as exp(10) anchors: far beyond the image, and finite
MIN_BOX_SIDE = 1e-6  # a truth's width and height are at least this (fraction of the image): log(w G / pw) finite


def _split(predictions, anchors, num_classes: int):
  """[N, G, G, A, 5 + C] float32 predictions and [A, 2] anchors, after checking the shapes agree."""
  anchors = jnp.asarray(anchors, jnp.float32)
  if predictions.ndim != 4 or predictions.shape[1] != predictions.shape[2]:
    raise DataError(f'predictions have shape {predictions.shape}, expected [N, G, G, A * (5 + C)]: the detection '
                    'layer must output a square grid')
  if anchors.ndim != 2 or anchors.shape[1] != 2:
    raise DataError(f'anchors have shape {anchors.shape}, expected [A, 2] (width, height) in grid cells')
  per_anchor = 5 + num_classes
  if predictions.shape[3] != anchors.shape[0] * per_anchor:
    raise DataError(f'predictions have {predictions.shape[3]} channels, expected A * (5 + C) = {anchors.shape[0]} * '
                    f'{per_anchor}: the detection layer\'s width must match the anchors and classes')
  n, g = predictions.shape[0], predictions.shape[1]
  return predictions.astype(jnp.float32).reshape(n, g, g, anchors.shape[0], per_anchor), anchors


def _boxes(p, anchors):
  """Decoded corners [N, G, G, A, 4] (x_min, y_min, x_max, y_max), normalised, not clipped."""
  g = p.shape[1]
  cols = jnp.arange(g, dtype=jnp.float32)[None, None, :, None]
  rows = jnp.arange(g, dtype=jnp.float32)[None, :, None, None]
  cx = (cols + jax.nn.sigmoid(p[..., 0])) / g
  cy = (rows + jax.nn.sigmoid(p[..., 1])) / g
  w = anchors[:, 0] * jnp.exp(jnp.minimum(p[..., 2], BOX_LOG_CLIP)) / g
  h = anchors[:, 1] * jnp.exp(jnp.minimum(p[..., 3], BOX_LOG_CLIP)) / g
  return jnp.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=-1)


def _iou(a, b):
  """IoU of corner boxes broadcast over leading axes ([..., 4] each); 0 where the union is empty."""
  iw = jnp.maximum(jnp.minimum(a[..., 2], b[..., 2]) - jnp.maximum(a[..., 0], b[..., 0]), 0.0)
  ih = jnp.maximum(jnp.minimum(a[..., 3], b[..., 3]) - jnp.maximum(a[..., 1], b[..., 1]), 0.0)
  inter = iw * ih
  union = ((a[..., 2] - a[..., 0]) * (a[..., 3] - a[..., 1]) + (b[..., 2] - b[..., 0]) * (b[..., 3] - b[..., 1])
           - inter)
  return jnp.where(union > 0, inter / jnp.where(union > 0, union, 1.0), 0.0)


def decode(predictions, anchors, num_classes: int) -> tuple[jax.Array, jax.Array]:
  """Boxes [N, G*G*A, 4] (x_min, y_min, x_max, y_max), normalised and clipped to [0, 1], and scores
  [N, G*G*A, C] = sigmoid(to) * softmax(logits)_c (darknet get_region_boxes: objectness times the class
  probability). Predictor k is cell (i, j), anchor a with k = (i * G + j) * A + a."""
  p, anchors = _split(jnp.asarray(predictions), anchors, num_classes)
  n = p.shape[0]
  boxes = jnp.clip(_boxes(p, anchors), 0.0, 1.0).reshape(n, -1, 4)
  scores = jax.nn.sigmoid(p[..., 4:5]) * jax.nn.softmax(p[..., 5:], axis=-1)
  return boxes, scores.reshape(n, -1, num_classes)


def yolo_v2_loss(predictions, labels, anchors, num_classes: int, *, noobject_scale: float = 1.0,
                 object_scale: float = 5.0, coord_scale: float = 1.0, class_scale: float = 1.0,
                 ignore_iou: float = 0.6) -> tuple[jax.Array, jax.Array]:
  """(loss, mean_iou) of darknet's region layer (defaults: cfg/yolo-voc.cfg's scales and ``thresh = .6``).

  loss: each image's SUM of the terms below, averaged over the N images of the batch. mean_iou: the mean,
  over the real (class >= 0) truth boxes, of IoU(decoded box of its responsible predictor, truth), a training
  metric (darknet prints it as "Region Avg IOU").

  A truth (x, y, w, h: centre and size, normalised) is predicted by the predictor in the cell holding its
  centre, j = floor(x G), i = floor(y G) (clipped to the grid), and the anchor a of best shape IoU with it,
  centres aligned: IoU((0, 0, w G, h G), (0, 0, pw, ph)), first anchor on ties (darknet ``bias_match=1``).
  When two truths of an image pick the same predictor the later one (higher row of ``labels``) wins, as in
  darknet, which overwrites that predictor's deltas truth by truth; both still count in mean_iou.
  Its terms (darknet delta_region_box, ``rescore=1``, delta_region_class):

    coordinates  coord_scale (2 - w h) [(sigmoid(tx) - (x G - j))^2 + (sigmoid(ty) - (y G - i))^2
                                        + (tw - log(w G / pw))^2 + (th - log(h G / ph))^2]
    object       object_scale (IoU(decoded box, truth) - sigmoid(to))^2, the IoU a constant target
    classes      class_scale sum_c (softmax(logits)_c - onehot(class)_c)^2

  Every other predictor adds noobject_scale sigmoid(to)^2 unless its decoded box overlaps some truth of its
  image with IoU > ignore_iou (darknet: ``if (best_iou > l.thresh) l.delta[obj_index] = 0``).

  Darknet differences, on purpose: its cost is the sum of squared deltas where each delta is
  scale * (target - output), so its gradients are those of scale/2 times the squares above (ours are twice
  that, absorbed by the learning rate), and it hands the class deltas straight to the logits (the gradient of
  a cross entropy) where we differentiate the squared error through the softmax; its early prior-matching term
  (every predictor pulled to its anchor's box with scale .01 during the first 12800 images) is omitted.
  Difficult boxes are ordinary boxes here (the loader decides whether training labels keep them); padding rows
  contribute nothing; a real truth's w and h count as at least MIN_BOX_SIDE (a zero-width box stays finite).
  """
  p, anchors = _split(jnp.asarray(predictions), anchors, num_classes)
  labels = jnp.asarray(labels, jnp.float32)
  n, g, num_anchors = p.shape[0], p.shape[1], anchors.shape[0]
  if labels.ndim != 3 or labels.shape[0] != n or labels.shape[2] != 6:
    raise DataError(f'labels have shape {labels.shape}, expected [{n}, MAX_BOXES, 6] rows (class, x_min, y_min, '
                    f'x_max, y_max, difficult) for a batch of {n} predictions')
  num_predictors = g * g * num_anchors
  flat = p.reshape(n, num_predictors, 5 + num_classes)
  boxes = _boxes(p, anchors).reshape(n, num_predictors, 4)

  real = labels[..., 0] >= 0  # [N, M]
  truth = jnp.where(real[..., None], labels[..., 1:5], 0.0)
  w = jnp.where(real, jnp.maximum(truth[..., 2] - truth[..., 0], MIN_BOX_SIDE), 1.0)
  h = jnp.where(real, jnp.maximum(truth[..., 3] - truth[..., 1], MIN_BOX_SIDE), 1.0)
  x, y = (truth[..., 0] + truth[..., 2]) / 2, (truth[..., 1] + truth[..., 3]) / 2
  col = jnp.clip(jnp.floor(x * g), 0, g - 1).astype(jnp.int32)
  row = jnp.clip(jnp.floor(y * g), 0, g - 1).astype(jnp.int32)
  shape_inter = (jnp.minimum(w[..., None] * g, anchors[:, 0]) * jnp.minimum(h[..., None] * g, anchors[:, 1]))
  shape_iou = shape_inter / (w[..., None] * h[..., None] * g * g + anchors[:, 0] * anchors[:, 1] - shape_inter)
  anchor = jnp.argmax(shape_iou, axis=-1).astype(jnp.int32)  # [N, M], first of equals
  index = (row * g + col) * num_anchors + anchor  # [N, M] responsible predictor

  m = labels.shape[1]
  later = jnp.arange(m)[None, :] > jnp.arange(m)[:, None]  # later[t, u]: row u comes after row t
  taken_later = (index[:, :, None] == index[:, None, :]) & real[:, None, :] & later[None]
  wins = real & ~jnp.any(taken_later, axis=2)  # [N, M]

  out = jnp.take_along_axis(flat, index[..., None], axis=1)  # [N, M, 5 + C] the responsible predictors
  pred_box = jnp.take_along_axis(boxes, index[..., None], axis=1)
  iou = _iou(pred_box, truth)  # [N, M]
  pw, ph = anchors[anchor, 0], anchors[anchor, 1]
  coord = coord_scale * (2 - w * h) * (
      (jax.nn.sigmoid(out[..., 0]) - (x * g - col)) ** 2 + (jax.nn.sigmoid(out[..., 1]) - (y * g - row)) ** 2
      + (out[..., 2] - jnp.log(w * g / pw)) ** 2 + (out[..., 3] - jnp.log(h * g / ph)) ** 2)
  obj = object_scale * (jax.lax.stop_gradient(iou) - jax.nn.sigmoid(out[..., 4])) ** 2
  onehot = jax.nn.one_hot(jnp.where(real, labels[..., 0], 0).astype(jnp.int32), num_classes)
  cls = class_scale * jnp.sum((jax.nn.softmax(out[..., 5:], axis=-1) - onehot) ** 2, axis=-1)
  truth_terms = jnp.sum(jnp.where(wins, coord + obj + cls, 0.0))

  overlap = _iou(boxes[:, :, None, :], truth[:, None, :, :])  # [N, P, M]
  best = jnp.max(jnp.where(real[:, None, :], overlap, 0.0), axis=2)  # [N, P]
  responsible = jnp.any((index[:, :, None] == jnp.arange(num_predictors)) & wins[..., None], axis=1)  # [N, P]
  penalised = ~responsible & (best <= ignore_iou)
  noobj = noobject_scale * jnp.sum(jnp.where(penalised, jax.nn.sigmoid(flat[..., 4]) ** 2, 0.0))

  mean_iou = jnp.sum(jnp.where(real, iou, 0.0)) / jnp.maximum(jnp.sum(real), 1)
  return (truth_terms + noobj) / n, jax.lax.stop_gradient(mean_iou)

