"""CIFAR-10 and CIFAR-100 as one ``.npz`` file, made from the archives their authors publish.

The studies and the CIFAR configs read a data set held in memory from ``--config.data.path`` (or a study's
``--data_path``): an ``.npz`` with ``x_train, y_train, x_test, y_test``. Where tensorflow-datasets is not
installed or cannot download, the quickest way to that file is the "python version" archive from
https://www.cs.toronto.edu/~kriz/cifar.html, converted once:

  python -m jaxdecouple.data.cifar_archive cifar-10-python.tar.gz data/cifar10.npz
  python -m jaxdecouple.data.cifar_archive cifar-100-python.tar.gz data/cifar100.npz   # fine labels (100)

The archive holds pickled batches: ``data`` a [10000, 3072] uint8 array per batch (each row the red, then
green, then blue 32 x 32 plane) and ``labels`` (CIFAR-10) or ``fine_labels`` (CIFAR-100). Which data set an
archive is comes from its member names (``cifar-10-batches-py/`` or ``cifar-100-python/``). The pickles are
read by an unpickler that builds only plain containers and numpy arrays, so a damaged or hostile archive
fails with one line instead of running code.
"""
from __future__ import annotations

import argparse
import io
import os
import pickle
import sys
import tarfile

import numpy as np

# member names inside each archive, in the order the authors' own loaders read them
CIFAR10_TRAIN = tuple(f'cifar-10-batches-py/data_batch_{i}' for i in range(1, 6))
CIFAR10_TEST = ('cifar-10-batches-py/test_batch',)
CIFAR100_TRAIN = ('cifar-100-python/train',)
CIFAR100_TEST = ('cifar-100-python/test',)
IMAGE_SHAPE = (3, 32, 32)  # how a row of ``data`` is laid out: channel planes, then rows, then columns
# what a CIFAR pickle may build: numpy arrays and their dtypes, and the bytes inside them (a protocol-2 pickle
# written by Python 3 spells bytes as _codecs.encode(text, 'latin1')); dicts and lists need no global
_ALLOWED = {('numpy.core.multiarray', '_reconstruct'), ('numpy._core.multiarray', '_reconstruct'),
            ('numpy', 'ndarray'), ('numpy', 'dtype'), ('_codecs', 'encode')}


class _ArraysOnly(pickle.Unpickler):
  def find_class(self, module, name):
    if (module, name) in _ALLOWED:
      return super().find_class(module, name)
    raise pickle.UnpicklingError(f'a CIFAR batch holds only arrays and lists; this one asks for {module}.{name}')


def _read_batch(archive: tarfile.TarFile, member: str, label_key: str) -> tuple[np.ndarray, np.ndarray]:
  f = archive.extractfile(member)
  if f is None:
    raise ValueError(f'{member} in the archive is not a file')
  batch = _ArraysOnly(io.BytesIO(f.read()), encoding='bytes').load()
  batch = {k.decode() if isinstance(k, bytes) else k: v for k, v in batch.items()}
  if 'data' not in batch or label_key not in batch:
    raise ValueError(f'{member} has no "data" and "{label_key}" (it has {sorted(batch)})')
  data = np.asarray(batch['data'], dtype=np.uint8)
  if data.ndim != 2 or data.shape[1] != int(np.prod(IMAGE_SHAPE)):
    raise ValueError(f'{member}: "data" is {data.shape}, not [N, 3072]')
  images = data.reshape((-1, *IMAGE_SHAPE)).transpose(0, 2, 3, 1)  # -> [N, 32, 32, 3], as the npz source reads
  labels = np.asarray(batch[label_key], dtype=np.int64)
  if labels.shape != (len(images),):
    raise ValueError(f'{member}: {len(labels)} labels for {len(images)} images')
  return np.ascontiguousarray(images), labels


def convert(archive_path: str) -> dict[str, np.ndarray]:
  """The archive's train and test splits as ``x_train, y_train, x_test, y_test`` (uint8 NHWC, int64)."""
  with tarfile.open(archive_path) as archive:
    names = set(archive.getnames())
    if set(CIFAR10_TRAIN + CIFAR10_TEST) <= names:
      train, test, key = CIFAR10_TRAIN, CIFAR10_TEST, 'labels'
    elif set(CIFAR100_TRAIN + CIFAR100_TEST) <= names:
      train, test, key = CIFAR100_TRAIN, CIFAR100_TEST, 'fine_labels'
    else:
      raise ValueError(f'{archive_path} is neither CIFAR-10 nor CIFAR-100 "python version" (expected '
                       f'{CIFAR10_TRAIN[0]} or {CIFAR100_TRAIN[0]} inside)')
    out = {}
    for split, members in (('train', train), ('test', test)):
      parts = [_read_batch(archive, m, key) for m in members]
      out[f'x_{split}'] = np.concatenate([p[0] for p in parts])
      out[f'y_{split}'] = np.concatenate([p[1] for p in parts])
  return out


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
  p.add_argument('archive', help='cifar-10-python.tar.gz or cifar-100-python.tar.gz')
  p.add_argument('out', help='the .npz to write (e.g. data/cifar10.npz)')
  args = p.parse_args(argv)
  if not os.path.isfile(args.archive):
    p.error(f'{args.archive}: no such file (the "python version" archive from https://www.cs.toronto.edu/~kriz/cifar.html)')
  try:
    arrays = convert(args.archive)
  except (tarfile.TarError, pickle.UnpicklingError, ValueError, EOFError) as e:
    print(f'error: {args.archive} could not be read as a CIFAR archive: {e}', file=sys.stderr)
    return 2
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  np.savez(args.out, **arrays)
  print(f'wrote {args.out}: ' + ', '.join(f'{k} {v.shape}' for k, v in arrays.items()) +
        f'; {len(np.unique(arrays["y_train"]))} classes')
  return 0


if __name__ == '__main__':
  sys.exit(main())
