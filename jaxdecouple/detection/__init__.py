"""Object detection's engine-independent parts: YOLO-v2's loss and decoding (yolo.py, jittable) and Pascal VOC
scoring (average_precision.py, numpy on the host), so any engine can train and evaluate a detector."""
from jaxdecouple.detection.average_precision import (MapAccumulator, iou_matrix, mean_average_precision,
                                                     non_max_suppression, voc_ap)
from jaxdecouple.detection.yolo import (SHAPES_ANCHORS, SHAPES_GRID, VOC_ANCHORS, VOC_GRID, decode,
                                        yolo_v2_loss)

__all__ = ['MapAccumulator', 'iou_matrix', 'mean_average_precision', 'non_max_suppression', 'voc_ap',
           'SHAPES_ANCHORS', 'SHAPES_GRID', 'VOC_ANCHORS', 'VOC_GRID', 'decode', 'yolo_v2_loss']
