"""Data: sources -> uint8 arrays in memory; per-epoch order from (seed, epoch); on-device augmentation."""
from jaxdecouple.data.batches import Batch, Preprocess, TrainOrder, augment, normalize, train_inputs
from jaxdecouple.data.sources import DATASETS, SOURCES, Dataset, load_dataset

__all__ = ['Batch', 'Preprocess', 'TrainOrder', 'augment', 'normalize', 'train_inputs', 'DATASETS',
           'SOURCES', 'Dataset', 'load_dataset']
