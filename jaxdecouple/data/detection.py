"""Detection data sets, in memory: what each is (classes, image size, anchors) and where it comes from.

- ``shapes``: squares, circles and triangles on smooth backgrounds, generated deterministically by the project
  (data/shapes.py), so the detection path trains for real on any machine: 64 x 64 images, 3 classes.
- ``voc``: Pascal VOC, as ResIST's section 5 trains it (VOC 2007 + 2012 trainval, tested on VOC 2007 test),
  resized to ``data.image_size`` a side: the extracted VOCdevkit folder (``data.source=folder``,
  ``data.path=.../VOCdevkit``) or tensorflow-datasets' ``voc`` prepared offline (``data.source=tfds``,
  read without TensorFlow). 16,551 training images at 416 x 416 take 8.6 GB of memory.

Labels: float32 [N, MAX_BOXES, 6] rows (class, x_min, y_min, x_max, y_max, difficult), the box as fractions of
the image, padding rows of class -1 (data/shapes.py and data/voc.py). Detection trains without augmentation
(the paper's "no data augmentation techniques are used"; crops and flips would move objects, not their boxes).
"""
from __future__ import annotations

import numpy as np

from jaxdecouple.data.datasets import DATASETS, Dataset, DatasetInfo
from jaxdecouple.data.shapes import SHAPES_CLASSES, shapes_detection
from jaxdecouple.data.voc import VOC_CLASSES, load_voc_folder, load_voc_tfds
from jaxdecouple.detection.yolo import SHAPES_ANCHORS, SHAPES_GRID, VOC_ANCHORS, VOC_GRID
from jaxdecouple.errors import DataError

IMAGENET_MEAN, IMAGENET_STD = DATASETS['imagenet'].mean, DATASETS['imagenet'].std
DETECTION_DATASETS = {
    # the shapes' backgrounds and colours are uniform over 0..255: mean 0.5, std about 0.29 per channel
    'shapes': DatasetInfo(len(SHAPES_CLASSES), (64, 64, 3), (0.5, 0.5, 0.5), (0.29, 0.29, 0.29), ''),
    'voc': DatasetInfo(len(VOC_CLASSES), (416, 416, 3), IMAGENET_MEAN, IMAGENET_STD, 'voc'),
}
CLASS_NAMES = {'shapes': SHAPES_CLASSES, 'voc': VOC_CLASSES}
# anchors as (width, height) fractions of the image: YOLO-v2's are in cells of its grid
ANCHORS = {'shapes': tuple((w / SHAPES_GRID, h / SHAPES_GRID) for w, h in SHAPES_ANCHORS),
           'voc': tuple((w / VOC_GRID, h / VOC_GRID) for w, h in VOC_ANCHORS)}
DETECTION_SOURCES = {'shapes': ('auto', 'synthetic'), 'voc': ('auto', 'folder', 'tfds')}


def load_detection(data_config, name: str) -> Dataset:
  """``name``'s arrays from the configured source ('auto': shapes generated; voc from data.path's VOCdevkit
  when given, else tensorflow-datasets' prepared ``voc`` in data.tfds_data_dir)."""
  info, source = DETECTION_DATASETS[name], data_config.source
  if source not in DETECTION_SOURCES[name]:
    raise DataError(f'data.source={source!r} cannot provide {name}: use one of {", ".join(DETECTION_SOURCES[name])}')
  if name == 'shapes':
    arrays = shapes_detection(data_config.detection_train_size, data_config.detection_test_size,
                              image_size=info.image_shape[0], seed=data_config.detection_seed)
    where = f'generated (data/shapes.py), seed {data_config.detection_seed}'  # the sizes: the start-up line's
  elif source == 'folder' or (source == 'auto' and data_config.path):
    if not data_config.path:
      raise DataError('data.path is required with data.source=folder for voc: the extracted VOCdevkit folder '
                      '(holding VOC2007/ and VOC2012/)')
    *arrays, where = load_voc_folder(data_config.path, data_config.image_size)
  else:
    if not data_config.tfds_data_dir:
      raise DataError('voc needs data.path (the extracted VOCdevkit folder) or data.tfds_data_dir (tensorflow-'
                      "datasets' voc prepared there): nothing is downloaded at run time")
    *arrays, where = load_voc_tfds(data_config.tfds_data_dir, data_config.image_size)
  x_train, y_train, x_test, y_test = (np.ascontiguousarray(a) for a in arrays)
  return Dataset(name, x_train, y_train.astype(np.float32), x_test, y_test.astype(np.float32),
                 num_classes=info.num_classes, mean=info.mean, std=info.std, source=where, anchors=ANCHORS[name])
