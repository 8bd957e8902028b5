"""The ``data`` section's checks: which sources, paths and fields go with which data set, before any compute."""
from __future__ import annotations

from jaxdecouple.data.datasets import STREAM_SOURCES, STREAMED
from jaxdecouple.data.detection import DETECTION_DATASETS, DETECTION_SOURCES
from jaxdecouple.errors import fail


def validate(config) -> None:
  """The data section's own checks (the data set's kind decides which sources and fields apply)."""
  streamed = config.dataset in STREAMED
  if streamed and config.data.source not in STREAM_SOURCES:
    fail('data.source', f'{config.data.source!r} holds data in memory; {config.dataset} is streamed from JPEG files: '
         f'use {", ".join(STREAM_SOURCES)}')
  if config.dataset in DETECTION_DATASETS:
    if config.data.source not in DETECTION_SOURCES[config.dataset]:
      fail('data.source', f'{config.data.source!r} cannot provide {config.dataset}: use one of '
           f'{", ".join(DETECTION_SOURCES[config.dataset])}')
    if config.data.augment:
      fail('data.augment', f'{config.dataset} is a detection data set: random crops and flips would move its objects '
           'but not their boxes; set it False (the ResIST paper trains detection without augmentation)')
  elif not streamed and config.data.source == 'folder':
    fail('data.source', f"'folder' streams JPEG files (dataset=imagenet); {config.dataset} is read into memory: "
         "use auto, idx, npz or tfds")
  if config.data.source == 'folder' and not config.data.path:
    fail('data.path', "is required when data.source='folder' (imagenet: a folder with train/CLASS/*.JPEG and "
         "val/CLASS/*.JPEG; voc: the extracted VOCdevkit folder)")
  if config.data.image_size > 1024:
    fail('data.image_size', f'{config.data.image_size} pixels is more than 1024; ImageNet models train at 224')
  if config.data.workers > 256:
    fail('data.workers', f'{config.data.workers} decoding processes is more than 256; 0 uses one per core')
  variants = [v.strip() for v in config.data.imagenet_v2.split(',') if v.strip()]
  if variants:
    if not streamed:
      fail('data.imagenet_v2', f'the ImageNet-V2 test sets go with dataset=imagenet, not {config.dataset}')
    allowed = ('matched-frequency', 'threshold-0.7', 'topimages')
    wrong = [v for v in variants if v not in allowed] if variants != ['all'] else []
    if wrong:
      fail('data.imagenet_v2', f"{wrong[0]!r} is not an ImageNet-V2 test set: give 'all' or some of "
           f"{', '.join(allowed)}")
  if not 0 <= config.data.holdout < 1:
    fail('data.holdout', f'must be in [0, 1) (the fraction of the training set held out), got {config.data.holdout}')
  if config.data.holdout and streamed:
    fail('data.holdout', f'holds out part of an in-memory training set; {config.dataset} is streamed: leave it at 0')
  if config.data.source == 'npz' and not config.data.path:
    fail('data.path', "is required when data.source='npz' (a .npz with x_train, y_train, x_test, y_test)")
