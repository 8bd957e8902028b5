"""Where data sets come from: IDX files, a local .npz, tensorflow-datasets, or synthetic arrays.

Every source returns a :class:`Dataset` of uint8 images ``[N, H, W, C]`` and int32 labels held in
host memory (text, data/text.py: uint8 bytes ``[N, T]`` and the int32 next bytes ``[N, T]``). ``load_dataset`` tries the sources in a clear order and, when none has the data, raises
one :class:`DataError` that lists what was tried and how to provide it.
"""
from __future__ import annotations

import gzip
import io
import os
import struct
import zipfile

from absl import logging
import numpy as np

from jaxdecouple.data.datasets import ADL_CIFAR10_STD, DATASETS, STREAMED, Dataset
from jaxdecouple.data.detection import DETECTION_DATASETS, load_detection
from jaxdecouple.data.text import TEXT_DATASETS, VOCAB, load_text
from jaxdecouple.errors import DataError

DEFAULT_IDX_DIR = '/usr/share/datasets/fashion-mnist'


def _check_arrays(name: str, where: str, x_train, y_train, x_test, y_test) -> tuple[np.ndarray, ...]:
  """Validates shapes, dtypes and label range against the data set's definition."""
  classes, shape = DATASETS[name].num_classes, DATASETS[name].image_shape
  out = []
  for split, x, y in (('train', x_train, y_train), ('test', x_test, y_test)):
    x, y = np.asarray(x), np.asarray(y).reshape(-1)
    if x.ndim == 3:
      x = x[..., None]
    if x.ndim != 4 or tuple(x.shape[1:]) != shape:
      raise DataError(f'{where}: x_{split} has shape {x.shape}, expected [N, {", ".join(map(str, shape))}] '
                      f'for {name}; check that the file holds {name}')
    if x.dtype != np.uint8:
      raise DataError(f'{where}: x_{split} has dtype {x.dtype}, expected uint8 pixels 0..255')
    if len(x) != len(y) or len(x) == 0:
      raise DataError(f'{where}: x_{split} has {len(x)} images but y_{split} has {len(y)} labels')
    if not np.issubdtype(y.dtype, np.integer) or y.min() < 0 or y.max() >= classes:
      raise DataError(f'{where}: y_{split} must hold integer labels in 0..{classes - 1}, '
                      f'found range {y.min()}..{y.max()} ({y.dtype})')
    present = len(np.unique(y))
    if split == 'train' and present < classes and len(y) >= 10 * classes:  # enough images that all should appear
      logging.warning('%s: y_train holds %d of %s\'s %d classes (labels %d..%d): is this file %s? (a CIFAR-10 file '
                      'given to a CIFAR-100 config trains on 10 of its 100 classes)', where, present, name, classes,
                      y.min(), y.max(), name)
    out += [np.ascontiguousarray(x), y.astype(np.int32)]
  return tuple(out)


def _dataset(name: str, source: str, arrays, normalization: str = 'default') -> Dataset:
  info = DATASETS[name]
  std = ADL_CIFAR10_STD if normalization == 'adl' and name == 'cifar10' else info.std
  return Dataset(name, *arrays, num_classes=info.num_classes, mean=info.mean, std=std, source=source)


def _read_idx(path: str) -> np.ndarray:
  with gzip.open(path, 'rb') if path.endswith('.gz') else open(path, 'rb') as f:
    data = f.read()
  if len(data) < 4:
    raise DataError(f'{path} is empty or truncated; reinstall it (apt-get install --reinstall '
                    'dataset-fashion-mnist)')
  zero, dtype_code, ndim = struct.unpack('>HBB', data[:4])
  if zero != 0 or dtype_code != 0x08:
    raise DataError(f'{path} is not an IDX file of unsigned bytes')
  dims = struct.unpack(f'>{ndim}I', data[4:4 + 4 * ndim])
  body = np.frombuffer(data, np.uint8, offset=4 + 4 * ndim)
  if body.size != int(np.prod(dims)):
    raise DataError(f'{path} is truncated: {body.size} bytes of data for shape {dims}; reinstall it')
  return body.reshape(dims)


def load_idx(name: str, directory: str) -> tuple[np.ndarray, ...]:
  """Fashion-MNIST's four IDX files, as the Debian package dataset-fashion-mnist installs them."""
  if name != 'fashion_mnist':
    raise FileNotFoundError(f'IDX files exist only for fashion_mnist, not {name}')
  files = ['train-images-idx3-ubyte', 'train-labels-idx1-ubyte', 't10k-images-idx3-ubyte',
           't10k-labels-idx1-ubyte']
  paths = []
  for f in files:
    for candidate in (os.path.join(directory, f + '.gz'), os.path.join(directory, f)):
      if os.path.exists(candidate):
        paths.append(candidate)
        break
    else:
      raise FileNotFoundError(f'{os.path.join(directory, f)}.gz not found')
  x_train, y_train, x_test, y_test = (_read_idx(p) for p in paths)
  return _check_arrays(name, directory, x_train, y_train, x_test, y_test)


def _decode_jpegs(blob: np.ndarray, offsets: np.ndarray) -> np.ndarray:
  from PIL import Image  # pillow is a dependency; imported here because only this path needs it
  raw = blob.tobytes()
  return np.stack([np.asarray(Image.open(io.BytesIO(raw[a:b])).convert('RGB'))
                   for a, b in zip(offsets[:-1], offsets[1:])])


def load_npz(name: str, path: str) -> tuple[np.ndarray, ...]:
  """A local .npz with x_train, y_train, x_test, y_test (uint8 images, integer labels).

  The JPEG-compressed CIFAR-10 copy (train_jpeg, train_offsets, train_labels, ...) is decoded
  directly, so it can be used without converting it first.
  """
  if not path:
    raise FileNotFoundError('no path given (set data.path)')
  if not os.path.exists(path):
    raise DataError(f'data.path={path} does not exist: give an .npz file of {name} (docs/DATA.md says how to make one; '
                    'CIFAR: python -m jaxdecouple.data.cifar_archive ARCHIVE.tar.gz OUT.npz)')
  if os.path.isdir(path):
    raise DataError(f'data.path={path} is a folder; give the .npz file in it')
  if not zipfile.is_zipfile(path):
    raise DataError(f'data.path={path} is not an .npz file (not a zip archive): save the arrays with numpy.savez')
  try:
    with np.load(path, allow_pickle=False) as z:
      keys = set(z.files)
      if {'train_jpeg', 'train_offsets', 'train_labels', 'test_jpeg', 'test_offsets',
          'test_labels'} <= keys:
        arrays = (_decode_jpegs(z['train_jpeg'], z['train_offsets']), z['train_labels'],
                  _decode_jpegs(z['test_jpeg'], z['test_offsets']), z['test_labels'])
      else:
        missing = {'x_train', 'y_train', 'x_test', 'y_test'} - keys
        if missing:
          raise DataError(f'{path} lacks arrays {sorted(missing)} (it has {sorted(keys)}); '
                          'it needs x_train, y_train, x_test, y_test')
        arrays = (z['x_train'], z['y_train'], z['x_test'], z['y_test'])
  except DataError:
    raise
  except Exception as e:  # zipfile.BadZipFile, ValueError, OSError, ... from a damaged file
    raise DataError(f'{path} cannot be read as .npz ({type(e).__name__}: {e}); '
                    're-create or re-download it') from e
  return _check_arrays(name, path, *arrays)


def load_tfds(name: str, data_dir: str | None, download: bool) -> tuple[np.ndarray, ...]:
  """tensorflow-datasets: prepared data in data_dir, or downloaded and prepared when allowed."""
  import tensorflow_datasets as tfds  # optional: only this source needs it
  tfds_name = DATASETS[name].tfds_name
  builder = tfds.builder(tfds_name, data_dir=data_dir or None)
  if download:
    if not builder.is_prepared():  # tfds retries an unreachable server for minutes: say what is under way
      logging.info('tensorflow-datasets: %s is not prepared in %s; downloading and preparing it (needs internet; '
                   'offline: --config.data.path=FILE.npz, or --config.data.tfds_data_dir=DIR with it prepared there)',
                   tfds_name, builder.data_dir)
    builder.download_and_prepare()
  arrays = []
  for split in ('train', 'test'):
    try:  # random-access data source: needs no TensorFlow (array_record files)
      source = builder.as_data_source(split=split)
      images = np.stack([source[i]['image'] for i in range(len(source))])
      labels = np.asarray([source[i]['label'] for i in range(len(source))])
    except Exception:  # tfrecord files: read them whole through TensorFlow
      whole = tfds.as_numpy(builder.as_dataset(split=split, batch_size=-1))
      images, labels = whole['image'], whole['label']
    arrays += [images, labels]
  return _check_arrays(name, f'tfds:{tfds_name}', *arrays)


def synthetic(name: str, num_train: int, num_test: int, seed: int = 0) -> tuple[np.ndarray, ...]:
  """Learnable random data of the data set's shape, for tests only: each class has its own colour
  (so crops and flips keep it recognisable) and every pixel is that colour plus noise."""
  classes, shape = DATASETS[name].num_classes, DATASETS[name].image_shape
  rng = np.random.default_rng(seed)
  prototypes = np.broadcast_to(rng.integers(40, 216, size=(classes, 1, 1, shape[-1])), (classes, *shape))
  out = []
  for n in (num_train, num_test):
    y = rng.integers(0, classes, size=n)
    x = np.clip(prototypes[y] + rng.normal(0, 40, size=(n, *shape)), 0, 255).astype(np.uint8)
    out += [x, y.astype(np.int32)]
  return tuple(out)


def load_dataset(data_config, name: str) -> Dataset:
  """Loads ``name`` from the configured source, or tries them in order when source is 'auto'.

  'auto': the .npz at data.path when one is given (only it), else the IDX files in data.idx_dir when
  that is given (only them), else the installed IDX files (fashion_mnist only), then tensorflow-datasets.
  Synthetic data is used only when asked for explicitly.
  """
  if name in TEXT_DATASETS:
    arrays, where = load_text(data_config, name)
    return Dataset(name, *arrays, num_classes=VOCAB, mean=(), std=(), source=where, tokens=True)
  if name in DETECTION_DATASETS:
    return load_detection(data_config, name)
  if name not in DATASETS:
    raise DataError(f'unknown dataset {name!r}; allowed: {", ".join((*DATASETS, *TEXT_DATASETS, *DETECTION_DATASETS))}')
  if name in STREAMED:
    from jaxdecouple.data.imagenet import load_streamed  # noqa: PLC0415  (only streamed data sets need it)
    return load_streamed(data_config, name)
  source = data_config.source
  norm = data_config.normalization
  if source == 'synthetic':
    arrays = synthetic(name, data_config.synthetic_train_size, data_config.synthetic_test_size)
    return _dataset(name, 'synthetic', arrays, norm)

  idx_dir = data_config.idx_dir or DEFAULT_IDX_DIR
  attempts = {
      'idx': lambda: load_idx(name, idx_dir),
      'npz': lambda: load_npz(name, data_config.path),
      'tfds': lambda: load_tfds(name, data_config.tfds_data_dir, data_config.tfds_download),
  }
  if source == 'auto':
    if data_config.path:  # a file named explicitly is what the user wants, whatever else is installed
      order = ['npz']
    elif data_config.idx_dir:
      order = ['idx']
    else:
      order = (['idx'] if name == 'fashion_mnist' else []) + ['tfds']
  else:
    order = [source]
  tried = []
  for s in order:
    try:
      return _dataset(name, s, attempts[s](), norm)
    except DataError:
      raise  # the data was found but is malformed: say so rather than silently trying elsewhere
    except Exception as e:  # not found / not installed / no network: try the next source
      tried.append(f'{s}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ""}'.rstrip(': '))
  raise DataError(f'no source could provide {name} (tried {"; ".join(tried)}). ' + _how_to_provide(name))


def _how_to_provide(name: str) -> str:
  npz = ('or save x_train, y_train, x_test, y_test (uint8 images, integer labels) in an .npz and pass '
         '--config.data.path=FILE.npz')
  if name == 'fashion_mnist':
    return ('Install the IDX files with `apt-get install dataset-fashion-mnist` (or point '
            '--config.data.idx_dir at a folder holding them), ' + npz + ', or let tensorflow-datasets '
            'download it (needs internet).')
  return ('Pass --config.data.path=FILE.npz (x_train, y_train, x_test, y_test, or the JPEG-compressed '
          'CIFAR-10 copy), or prepare it with tensorflow-datasets (online: it downloads; offline: set '
          '--config.data.tfds_data_dir to prepared data).')
