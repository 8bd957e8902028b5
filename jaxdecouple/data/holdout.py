"""A hold-out validation split of the training set, for tuning hyper-parameters without the test set.

The ResIST paper tuned its hyper-parameters on held-out data; a study that tunes on the test set reports an
optimistic error. ``data.holdout = f`` takes a fixed fraction f of the training set (a permutation drawn from
a constant seed, so every run, method and seed of a study tunes on the same split), trains on the rest and
evaluates on the held-out part in place of the test set. In-memory data sets only.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from jaxdecouple.data.datasets import Dataset

HOLDOUT_SEED = 0x401D  # constant: the split never depends on the run's seed


def hold_out(dataset: Dataset, fraction: float) -> Dataset:
  """``dataset`` with ``fraction`` of its training images as its test set (and no longer trained on)."""
  if not fraction:
    return dataset
  n = len(dataset.x_train)
  held = max(1, int(round(fraction * n)))
  order = np.random.default_rng(HOLDOUT_SEED).permutation(n)
  test, train = np.sort(order[:held]), np.sort(order[held:])
  return dataclasses.replace(dataset, x_train=dataset.x_train[train], y_train=dataset.y_train[train],
                             x_test=dataset.x_train[test], y_test=dataset.y_train[test],
                             source=f'{dataset.source}, {held} training images held out as the test set')
