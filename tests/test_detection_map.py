"""Pascal VOC scoring (jaxdecouple/detection/average_precision.py) against precision-recall curves and APs
worked out by hand here: 11-point and area AP, a difficult truth, a duplicate detection, an IoU of exactly 0.5,
a class without truths, non-maximum suppression, and the streaming accumulator."""
import numpy as np
import pytest

from jaxdecouple.detection import MapAccumulator, iou_matrix, mean_average_precision, non_max_suppression, voc_ap
from jaxdecouple.errors import DataError


def test_iou_matrix():
  a = [[0, 0, 0.5, 0.5], [0.5, 0.5, 1, 1]]
  b = [[0, 0, 0.5, 0.5], [0.25, 0, 0.75, 0.5], [0.6, 0, 0.9, 0.1]]
  # [0.25, 0, 0.75, 0.5] with the first: 0.125 / (0.25 + 0.25 - 0.125) = 1/3
  np.testing.assert_allclose(iou_matrix(a, b), [[1, 1 / 3, 0], [0, 0, 0]], atol=1e-12)


def test_voc_ap_by_hand():
  """recall 0.2, 0.4, 0.4, 0.6 with precision 1, 1, 2/3, 3/4. 11-point: t = 0..0.4 -> 1 (5 points), t = 0.5, 0.6
  -> 3/4, t >= 0.7 -> 0: 6.5 / 11. Area: the envelope is 1 up to recall 0.4, 3/4 up to 0.6, 0 after:
  0.4 + 0.2 * 0.75 = 0.55."""
  recall, precision = [0.2, 0.4, 0.4, 0.6], [1, 1, 2 / 3, 0.75]
  assert voc_ap(recall, precision) == pytest.approx(6.5 / 11)
  assert voc_ap(recall, precision, eleven_point=False) == pytest.approx(0.55)
  # VOCevaldet.m's t = 0:0.1:1 in MATLAB: its fourth point is 3 * 0.1 = 0.30000000000000004, so a recall of
  # exactly 3/10 reaches 0, 0.1 and 0.2 only (3 / 11); 0.6 and 0.7 are the doubles nearest 6/10 and 7/10 (counted
  # from the end: 1 - 4 * 0.1, 1 - 3 * 0.1), which recalls of exactly 6/10 and 7/10 reach (7 / 11, 8 / 11)
  assert voc_ap([3 / 10], [1.0]) == pytest.approx(3 / 11)
  assert voc_ap([6 / 10], [1.0]) == pytest.approx(7 / 11) and voc_ap([7 / 10], [1.0]) == pytest.approx(8 / 11)
  assert voc_ap([], []) == 0.0


def test_no_image_scores_nan_for_every_class():
  """An evaluation that added no image: every class without truths, so nan throughout (not a crash)."""
  value, per_class = MapAccumulator(3).result()
  assert np.isnan(value) and per_class.shape == (3,) and np.isnan(per_class).all()


def labels_of(rows_per_image, m=4):
  out = np.zeros((len(rows_per_image), m, 6), np.float32)
  out[:, :, 0] = -1
  for i, rows in enumerate(rows_per_image):
    out[i, :len(rows)] = rows
  return out


GA, GB = (0.1, 0.1, 0.4, 0.4), (0.6, 0.6, 0.9, 0.9)
GC, GD = (0.2, 0.2, 0.6, 0.6), (0.0, 0.0, 0.5, 0.5)
LABELS = labels_of([[(0, *GA, 0), (0, *GB, 1)], [(0, *GC, 0), (1, *GD, 0)]])
DETECTIONS = [
    np.array([(0, 0.9, *GA),                    # class 0: true positive
              (0, 0.8, 0.12, 0.1, 0.42, 0.4),   # IoU 0.084 / 0.096 with GA, already matched: duplicate, false pos.
              (0, 0.7, *GB),                    # the difficult truth: neither
              (0, 0.5, 0.7, 0.0, 0.9, 0.2)]),   # overlaps nothing: false positive
    np.array([(0, 0.6, *GC),                    # class 0: true positive
              (1, 0.4, 0.0, 0.0, 0.5, 0.15),    # IoU 0.075 / 0.25 = 0.3 with GD: false positive
              (1, 0.3, 0.0, 0.0, 0.25, 0.5),    # IoU 0.125 / 0.25 = 0.5 exactly: true positive
              (2, 0.95, 0.1, 0.1, 0.2, 0.2)]),  # class 2 has no truth
]


def test_mean_average_precision_by_hand():
  """Class 0 by score: TP, FP (duplicate), none (difficult), TP, FP; 2 non-difficult truths: recall .5 .5 .5 1 1,
  precision 1 .5 .5 2/3 .5. 11-point: t = 0..0.5 -> 1 (6 points), t = 0.6..1 -> 2/3 (5): (6 + 10/3) / 11; area:
  0.5 * 1 + 0.5 * 2/3. Class 1: FP then TP, 1 truth: recall 0, 1, precision 0, .5: AP 0.5 both ways.
  Class 2: no truth, AP nan, left out of the mean."""
  mean_ap, per_class = mean_average_precision(DETECTIONS, LABELS, 3)
  class0 = (6 + 10 / 3) / 11
  np.testing.assert_allclose(per_class[:2], [class0, 0.5])
  assert np.isnan(per_class[2])
  assert mean_ap == pytest.approx((class0 + 0.5) / 2)
  mean_area, per_class_area = mean_average_precision(DETECTIONS, LABELS, 3, eleven_point=False)
  np.testing.assert_allclose(per_class_area[:2], [0.5 + 0.5 * 2 / 3, 0.5])
  assert mean_area == pytest.approx((0.5 + 1 / 3 + 0.5) / 2)


def test_mean_average_precision_edges():
  # no detections at all: every class with truths scores 0
  mean_ap, per_class = mean_average_precision([np.zeros((0, 6)), np.zeros((0, 6))], LABELS, 3)
  assert mean_ap == 0.0 and np.isnan(per_class[2])
  # a stricter threshold turns the IoU-0.5 match of class 1 into a false positive
  _, strict = mean_average_precision(DETECTIONS, LABELS, 3, iou_threshold=0.51)
  assert strict[1] == 0.0
  with pytest.raises(DataError, match='one detection array'):
    mean_average_precision(DETECTIONS[:1], LABELS, 3)


def test_non_max_suppression_by_hand():
  boxes = np.array([[0, 0, 0.5, 0.5], [0.05, 0, 0.55, 0.5], [0.6, 0.6, 1, 1], [0.25, 0, 0.75, 0.5]], np.float32)
  scores = np.array([[0.9, 0.2], [0.8, 0.001], [0.3, 0.004], [0.7, 0.1]], np.float32)
  # class 0: box 1 overlaps box 0 with IoU 0.225 / 0.275 = 0.82 > 0.45: suppressed; box 3's IoU with box 0 is
  # 1/3: kept. class 1: boxes 1 and 2 score below 0.005; boxes 0 and 3 kept.
  expected = [(0, 0.9, *boxes[0]), (0, 0.7, *boxes[3]), (0, 0.3, *boxes[2]), (1, 0.2, *boxes[0]),
              (1, 0.1, *boxes[3])]
  np.testing.assert_allclose(non_max_suppression(boxes, scores), expected, rtol=1e-6)
  np.testing.assert_allclose(non_max_suppression(boxes, scores, max_detections=2), expected[:2], rtol=1e-6)
  # at IoU 0.3 box 3 (IoU 1/3 with box 0) goes too, in both classes
  np.testing.assert_allclose(non_max_suppression(boxes, scores, iou_threshold=0.3),
                             [expected[0], expected[2], expected[3]], rtol=1e-6)
  assert non_max_suppression(boxes, scores * 0.001).shape == (0, 6)


def test_accumulator_equals_mean_average_precision():
  rng = np.random.default_rng(0)
  num_images, predictors, classes = 7, 12, 3
  corner = rng.uniform(0, 0.6, size=(num_images, predictors, 2))
  boxes = np.concatenate([corner, corner + rng.uniform(0.1, 0.4, size=corner.shape)], axis=-1).astype(np.float32)
  scores = rng.uniform(0, 1, size=(num_images, predictors, classes)).astype(np.float32)
  truth = []
  for i in range(num_images):
    picks = rng.choice(predictors, size=3, replace=False)  # truths near some predicted boxes
    truth.append([(rng.integers(classes), *(boxes[i, k] + rng.normal(0, 0.03, 4)), float(rng.uniform() < 0.2))
                  for k in picks])
  labels = labels_of(truth, m=5)
  accumulator = MapAccumulator(classes)
  accumulator.add(boxes[:4], scores[:4], labels[:4])
  padded = lambda a: np.concatenate([a[4:], np.zeros_like(a[:2])])  # a last batch padded with 2 fake images
  accumulator.add(padded(boxes), padded(scores), padded(labels), count=3)
  detections = [non_max_suppression(boxes[i], scores[i]) for i in range(num_images)]
  expected = mean_average_precision(detections, labels, classes)
  got = accumulator.result()
  assert got[0] == pytest.approx(expected[0])
  np.testing.assert_allclose(got[1], expected[1])
  assert 0 < got[0] < 1
