"""Pascal VOC detection scoring: per-class non-maximum suppression and mean average precision, on the host.

Reproducing a VOC 2007 test number means scoring exactly as the VOC devkit does (VOCdevkit VOCevaldet.m,
VOCap.m; the VOC 2007 devkit's 11-point AP), so this follows it rule by rule:

- per class, detections of all images sorted by decreasing score (a stable sort: equal scores keep image order);
- each detection is matched to the ground truth of its image and class with the largest IoU (the first of
  equals); IoU >= iou_threshold (0.5) with a non-difficult truth not yet matched: true positive; with one
  already matched: false positive (a duplicate); with a difficult truth: neither; below the threshold: false
  positive;
- recall = TP / (number of non-difficult truths), precision = TP / (TP + FP), cumulated in that order;
- AP (VOC 2007, ``eleven_point=True``) = mean over t in {0, 0.1, ..., 1} of max(precision where recall >= t),
  0 where no recall reaches t; the t are MATLAB's ``0:0.1:1`` as VOCevaldet.m loops over them (the colon
  operator counts from both ends: k * 0.1 for k <= 5, 1 - (10 - k) * 0.1 above), so the 0.3 point is
  3 * 0.1 = 0.30000000000000004 and a recall of exactly 3/10 does not reach it (py-faster-rcnn's
  ``np.arange(0., 1.1, 0.1)`` agrees there and differs at 0.6 and 0.7);
  AP (VOC 2010+, ``eleven_point=False``) = area under the precision envelope: with mrec = [0, recall, 1],
  mpre = [0, precision, 0], mpre[i] = max(mpre[i:]), AP = sum over recall changes of
  (mrec[i] - mrec[i-1]) mpre[i];
- mAP = mean AP over the classes with at least one non-difficult truth (others: AP nan).

One difference: boxes here are normalised to [0, 1], so IoU is of continuous boxes, where the devkit counts
pixels inclusively (width = x_max - x_min + 1); for small boxes the devkit's IoU is slightly larger.

Detections come from darknet's validation recipe (examples/detector.c validate_detector: ``thresh = .005``,
``nms = .45``; do_nms_sort): per class, scores > score_threshold, greedy suppression of boxes with
IoU > iou_threshold with a higher-scoring kept box; we then keep the image's max_detections best.
"""
from __future__ import annotations

import numpy as np

from jaxdecouple.errors import DataError

# MATLAB's 0:0.1:1, element by element (the devkit's loop): from the start up to the middle, from the end after it
ELEVEN_RECALLS = np.array([k * 0.1 if k <= 5 else 1 - (10 - k) * 0.1 for k in range(11)])


def iou_matrix(a, b) -> np.ndarray:
  """IoU [n, m] of corner boxes a [n, 4] and b [m, 4] (x_min, y_min, x_max, y_max); 0 where the union is empty."""
  return _pairwise_iou(np.asarray(a, np.float64).reshape(-1, 4), np.asarray(b, np.float64).reshape(-1, 4))


def _pairwise_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """iou_matrix in the boxes' own dtype (NMS's 845 x 845 matrices twice as fast in float32)."""
  iw = np.clip(np.minimum(a[:, None, 2], b[None, :, 2]) - np.maximum(a[:, None, 0], b[None, :, 0]), 0, None)
  ih = np.clip(np.minimum(a[:, None, 3], b[None, :, 3]) - np.maximum(a[:, None, 1], b[None, :, 1]), 0, None)
  inter = iw * ih
  area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
  area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
  union = area_a[:, None] + area_b[None, :] - inter
  return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def non_max_suppression(boxes, scores, iou_threshold: float = 0.45, score_threshold: float = 0.005,
                        max_detections: int = 100, pre_nms_top: int = 1000) -> np.ndarray:
  """One image's detections [k, 6] rows (class, score, x_min, y_min, x_max, y_max), best first.

  boxes [P, 4] and scores [P, C] (decode()'s outputs for one image). Per class c: the boxes with score >
  score_threshold, visited by decreasing score, each kept unless its IoU with a kept box of class c is >
  iou_threshold. Of all classes' kept boxes the max_detections best are returned. Only the pre_nms_top boxes of
  the best scores enter (as Detectron's pre-NMS top-k): a grid of many predictors early in training, when nearly
  every score passes the threshold, would otherwise cost an overlap matrix of all of them (13,520 predictors on a
  52 x 52 grid: 0.7 GB and seconds per image); YOLO-v2's 845 never reach it."""
  boxes, scores = np.asarray(boxes, np.float32), np.asarray(scores, np.float32)
  if boxes.ndim != 2 or boxes.shape[1] != 4 or scores.ndim != 2 or len(scores) != len(boxes):
    raise DataError(f'non_max_suppression takes boxes [P, 4] and scores [P, C] of one image, got '
                    f'{boxes.shape} and {scores.shape}')
  above = scores > score_threshold
  used = np.flatnonzero(above.any(1))  # boxes some class may keep: their overlaps, computed once for all classes
  if len(used) > pre_nms_top:
    used = used[np.argsort(-scores[used].max(1), kind='stable')[:pre_nms_top]]
  boxes, scores, above = boxes[used], scores[used], above[used]
  overlapping = _pairwise_iou(boxes, boxes) > iou_threshold
  rows = []
  for c in range(scores.shape[1]):
    candidates = np.flatnonzero(above[:, c])
    candidates = candidates[np.argsort(-scores[candidates, c], kind='stable')]
    kept = []
    while candidates.size and len(kept) < max_detections:  # later kept boxes of c cannot make the best
      best, candidates = candidates[0], candidates[1:]
      kept.append(best)
      candidates = candidates[~overlapping[best, candidates]]
    kept = np.asarray(kept, np.int64)
    rows.append(np.concatenate([np.full((len(kept), 1), c, np.float32), scores[kept, c, None], boxes[kept]], 1))
  out = np.concatenate(rows) if rows else np.zeros((0, 6), np.float32)
  return out[np.argsort(-out[:, 1], kind='stable')[:max_detections]]


def voc_ap(recall, precision, eleven_point: bool = True) -> float:
  """Average precision of one class from its cumulative recall and precision (see the module docstring)."""
  recall, precision = np.asarray(recall, np.float64), np.asarray(precision, np.float64)
  if eleven_point:
    return float(np.mean([precision[recall >= t].max() if np.any(recall >= t) else 0.0 for t in ELEVEN_RECALLS]))
  mrec = np.concatenate([[0.0], recall, [1.0]])
  mpre = np.concatenate([[0.0], precision, [0.0]])
  mpre = np.maximum.accumulate(mpre[::-1])[::-1]
  changed = np.flatnonzero(mrec[1:] != mrec[:-1]) + 1
  return float(np.sum((mrec[changed] - mrec[changed - 1]) * mpre[changed]))


def _check_labels(labels) -> np.ndarray:
  labels = np.asarray(labels, np.float64)
  if labels.ndim != 3 or labels.shape[2] != 6:
    raise DataError(f'labels have shape {labels.shape}, expected [num_images, MAX_BOXES, 6] rows (class, x_min, '
                    'y_min, x_max, y_max, difficult), padding rows class -1')
  return labels


def mean_average_precision(detections, labels, num_classes: int, iou_threshold: float = 0.5,
                           eleven_point: bool = True) -> tuple[float, np.ndarray]:
  """(mAP, per-class AP [num_classes]) by the VOC devkit's rules (module docstring).

  detections: one array [k, 6] (class, score, x_min, y_min, x_max, y_max) per image; labels
  [num_images, MAX_BOXES, 6] (class, x_min, y_min, x_max, y_max, difficult), padding rows class -1. The AP of
  a class without non-difficult truths is nan and the mAP leaves it out (nan when every class is so)."""
  labels = _check_labels(labels)
  if len(detections) != len(labels):
    raise DataError(f'{len(detections)} images of detections but {len(labels)} of labels: give one detection '
                    'array (possibly empty) per labelled image')
  if not len(labels):  # no image: no class has a truth
    return float('nan'), np.full(num_classes, np.nan)
  det_class, det_score, det_best, det_overlap = [], [], [], []
  gt_class, gt_difficult, offset = [], [], 0
  for image, (found, truth) in enumerate(zip(detections, labels)):
    found = np.asarray(found, np.float64).reshape(-1, 6)
    truth = truth[truth[:, 0] >= 0]
    overlap = iou_matrix(found[:, 2:6], truth[:, 1:5])
    overlap[found[:, 0, None] != truth[None, :, 0]] = -1.0  # only truths of the detection's class
    best = np.argmax(overlap, axis=1) if len(truth) else np.zeros(len(found), np.int64)
    det_overlap.append(overlap[np.arange(len(found)), best] if len(truth) else np.full(len(found), -1.0))
    det_best.append(best + offset)
    det_class.append(found[:, 0])
    det_score.append(found[:, 1])
    gt_class.append(truth[:, 0])
    gt_difficult.append(truth[:, 5] > 0)
    offset += len(truth)
  det_class, det_score = np.concatenate(det_class), np.concatenate(det_score)
  det_best, det_overlap = np.concatenate(det_best), np.concatenate(det_overlap)
  gt_class, gt_difficult = np.concatenate(gt_class), np.concatenate(gt_difficult)

  per_class = np.full(num_classes, np.nan)
  for c in range(num_classes):
    positives = int(np.sum((gt_class == c) & ~gt_difficult))
    if positives == 0:
      continue
    mine = np.flatnonzero(det_class == c)
    mine = mine[np.argsort(-det_score[mine], kind='stable')]
    tp, fp = np.zeros(len(mine)), np.zeros(len(mine))
    matched = np.zeros(len(gt_class), bool)
    for k, d in enumerate(mine):
      if det_overlap[d] >= iou_threshold:
        g = det_best[d]
        if gt_difficult[g]:
          continue  # neither true nor false positive
        if matched[g]:
          fp[k] = 1
        else:
          tp[k], matched[g] = 1, True
      else:
        fp[k] = 1
    tp, fp = np.cumsum(tp), np.cumsum(fp)
    per_class[c] = voc_ap(tp / positives, tp / np.maximum(tp + fp, np.finfo(np.float64).eps), eleven_point)
  scored = per_class[~np.isnan(per_class)]
  return (float(scored.mean()) if scored.size else float('nan')), per_class


class MapAccumulator:
  """Streams an evaluation: ``add`` each batch's decode() outputs and labels (NMS runs per image), then
  ``result()`` gives mean_average_precision over everything added."""

  def __init__(self, num_classes: int, iou_threshold: float = 0.5, eleven_point: bool = True,
               nms_iou_threshold: float = 0.45, score_threshold: float = 0.005, max_detections: int = 100):
    self.num_classes, self.iou_threshold, self.eleven_point = num_classes, iou_threshold, eleven_point
    self.nms = dict(iou_threshold=nms_iou_threshold, score_threshold=score_threshold, max_detections=max_detections)
    self.detections: list[np.ndarray] = []
    self.labels: list[np.ndarray] = []

  def add(self, boxes, scores, labels, count: int | None = None) -> None:
    """boxes [B, P, 4], scores [B, P, C] (numpy or jax arrays), labels [B, MAX_BOXES, 6]; only the first
    ``count`` images are real when a batch was padded."""
    boxes, scores, labels = np.asarray(boxes), np.asarray(scores), _check_labels(labels)
    count = len(labels) if count is None else count
    if len(boxes) < count or len(scores) < count or len(labels) < count:
      raise DataError(f'a batch of {len(boxes)} boxes, {len(scores)} scores and {len(labels)} labels cannot hold '
                      f'{count} images: pass decode()\'s outputs with the same batch\'s labels')
    for i in range(count):
      self.detections.append(non_max_suppression(boxes[i], scores[i], **self.nms))
      self.labels.append(labels[i])

  def result(self) -> tuple[float, np.ndarray]:
    """(mAP, per-class AP) of the images added so far."""
    width = max((len(t) for t in self.labels), default=1)  # batches may pad to different MAX_BOXES
    labels = np.full((len(self.labels), width, 6), -1.0)
    for i, t in enumerate(self.labels):
      labels[i, :len(t)] = t
    return mean_average_precision(self.detections, labels, self.num_classes, self.iou_threshold, self.eleven_point)
