"""Data: sources -> uint8 arrays in memory, or JPEG files streamed per batch (imagenet); per-epoch order from
(seed, epoch); augmentation on the device (in memory) or on the host as JPEGs are decoded (streamed)."""
from jaxdecouple.data.checks import validate
from jaxdecouple.data.batches import Batch, Preprocess, TrainOrder, augment, normalize, preprocess_for, train_inputs
from jaxdecouple.data.text import TEXT_DATASETS
from jaxdecouple.data.detection import DETECTION_DATASETS
from jaxdecouple.data.datasets import DATASETS, SOURCES, STREAM_SOURCES, STREAMED, Dataset, DatasetInfo
from jaxdecouple.data.sources import load_dataset

__all__ = ['Batch', 'Preprocess', 'TrainOrder', 'augment', 'normalize', 'preprocess_for', 'train_inputs', 'DATASETS',
           'SOURCES', 'STREAM_SOURCES', 'STREAMED', 'TEXT_DATASETS', 'DETECTION_DATASETS', 'Dataset', 'DatasetInfo', 'load_dataset', 'validate']
