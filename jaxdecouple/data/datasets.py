"""What each data set is, before any is loaded: its classes, its inputs' shape and normalisation, where
tensorflow-datasets keeps it, and the in-memory :class:`Dataset` every source returns (data first: the sources,
the streamed path and the text path all build on these)."""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

class DatasetInfo(NamedTuple):
  """What the code knows of a data set before loading it: its labels, its images' shape, the per-channel
  mean and std its inputs are normalized with, and its name in tensorflow-datasets."""
  num_classes: int
  image_shape: tuple[int, int, int]
  mean: tuple[float, ...]
  std: tuple[float, ...]
  tfds_name: str


DATASETS = {
    'cifar10': DatasetInfo(10, (32, 32, 3), (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010), 'cifar10'),
    'cifar100': DatasetInfo(100, (32, 32, 3), (0.507, 0.487, 0.441), (0.267, 0.256, 0.276), 'cifar100'),
    'fashion_mnist': DatasetInfo(10, (28, 28, 1), (0.2860,), (0.3530,), 'fashion_mnist'),
    # streamed from JPEG files (jaxdecouple.data.stream); the image size is data.image_size, the class
    # count the source's
    'imagenet': DatasetInfo(1000, (224, 224, 3), (0.485, 0.456, 0.406), (0.229, 0.224, 0.225), 'imagenet2012'),
}
STREAMED = ('imagenet',)  # too large for memory: read, decoded and augmented on the host per batch
# The ADL code's CIFAR-10 std, selectable with data.normalization='adl'.
ADL_CIFAR10_STD = (0.2470, 0.2435, 0.2616)
SOURCES = ('auto', 'idx', 'npz', 'tfds', 'folder', 'synthetic')
STREAM_SOURCES = ('auto', 'folder', 'tfds')


@dataclasses.dataclass(frozen=True)
class Dataset:
  name: str
  x_train: np.ndarray
  y_train: np.ndarray
  x_test: np.ndarray
  y_test: np.ndarray
  num_classes: int
  mean: tuple[float, ...]
  std: tuple[float, ...]
  source: str
  # streamed data sets: further test sets (e.g. ImageNet-V2), evaluated beside x_test; metric prefix -> images
  extra_tests: dict = dataclasses.field(default_factory=dict)
  tokens: bool = False  # byte-level text (data/text.py): x holds [N, T] bytes, y the [N, T] next bytes
  # detection (data/detection.py): y holds [N, MAX_BOXES, 6] boxes; the anchors, (width, height) fractions of the
  # image, that its networks predict boxes from
  anchors: tuple = ()

  @property
  def detection(self) -> bool:
    return bool(self.anchors)


  @property
  def image_shape(self) -> tuple[int, int, int]:
    return tuple(self.x_train.shape[1:])

  @property
  def streamed(self) -> bool:
    """Whether the images are read and decoded per batch (x_* are StreamImages, y_* are None)."""
    return self.y_train is None
