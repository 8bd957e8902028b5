"""Data: sources (IDX, npz, JPEG npz, tfds glue, synthetic), failure messages, order, augmentation."""
import gzip
import io
import os
import struct
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from conftest import tiny_config
from jaxdecouple.data import Preprocess, TrainOrder, augment, load_dataset, normalize
from jaxdecouple.data import sources
from jaxdecouple.data.sources import DEFAULT_IDX_DIR, load_idx
from jaxdecouple.errors import DataError


def data_config(**kw):
  c = tiny_config().data
  for k, v in kw.items():
    c[k] = v
  return c


def write_idx(path, array):
  header = struct.pack('>HBB', 0, 0x08, array.ndim) + struct.pack(f'>{array.ndim}I', *array.shape)
  with gzip.open(path, 'wb') as f:
    f.write(header + array.astype(np.uint8).tobytes())


def fake_fashion(directory, n=20):
  rng = np.random.default_rng(0)
  for prefix, count in (('train', n), ('t10k', n // 2)):
    write_idx(os.path.join(directory, f'{prefix}-images-idx3-ubyte.gz'),
              rng.integers(0, 256, (count, 28, 28)))
    write_idx(os.path.join(directory, f'{prefix}-labels-idx1-ubyte.gz'), rng.integers(0, 10, count))


def test_debian_fashion_mnist_is_read_whole():
  x_train, y_train, x_test, y_test = load_idx('fashion_mnist', DEFAULT_IDX_DIR)
  assert x_train.shape == (60000, 28, 28, 1) and x_test.shape == (10000, 28, 28, 1)
  assert x_train.dtype == np.uint8 and np.bincount(y_train).tolist() == [6000] * 10
  np.testing.assert_allclose(x_train.mean() / 255, 0.2860, atol=1e-3)  # the SPEC's mean


def test_idx_from_a_given_folder(tmp_path):
  fake_fashion(tmp_path)
  ds = load_dataset(data_config(source='idx', idx_dir=str(tmp_path)), 'fashion_mnist')
  assert ds.x_train.shape == (20, 28, 28, 1) and ds.source == 'idx' and ds.std == (0.3530,)


def test_truncated_idx_is_a_clear_error(tmp_path):
  fake_fashion(tmp_path)
  path = tmp_path / 'train-images-idx3-ubyte.gz'
  with gzip.open(path, 'rb') as f:
    data = f.read()
  with gzip.open(path, 'wb') as f:
    f.write(data[:-100])
  with pytest.raises(DataError, match='truncated'):
    load_dataset(data_config(source='idx', idx_dir=str(tmp_path)), 'fashion_mnist')


def test_npz_round_trip_and_validation(tmp_path):
  rng = np.random.default_rng(0)
  good = dict(x_train=rng.integers(0, 256, (10, 32, 32, 3), dtype=np.uint8), y_train=np.arange(10) % 10,
              x_test=rng.integers(0, 256, (4, 32, 32, 3), dtype=np.uint8), y_test=np.arange(4))
  np.savez(tmp_path / 'ok.npz', **good)
  ds = load_dataset(data_config(source='npz', path=str(tmp_path / 'ok.npz')), 'cifar10')
  np.testing.assert_array_equal(ds.x_train, good['x_train'])
  assert ds.y_train.dtype == np.int32 and ds.mean == (0.4914, 0.4822, 0.4465)

  np.savez(tmp_path / 'float.npz', **{**good, 'x_train': good['x_train'].astype(np.float32)})
  with pytest.raises(DataError, match='uint8'):
    load_dataset(data_config(source='npz', path=str(tmp_path / 'float.npz')), 'cifar10')
  np.savez(tmp_path / 'labels.npz', **{**good, 'y_test': np.arange(4) + 99})
  with pytest.raises(DataError, match=r'labels in 0\.\.9'):
    load_dataset(data_config(source='npz', path=str(tmp_path / 'labels.npz')), 'cifar10')
  np.savez(tmp_path / 'missing.npz', x_train=good['x_train'])
  with pytest.raises(DataError, match='lacks arrays'):
    load_dataset(data_config(source='npz', path=str(tmp_path / 'missing.npz')), 'cifar10')
  (tmp_path / 'corrupt.npz').write_bytes(b'PK\x03\x04 not really a zip file')
  with pytest.raises(DataError, match='not an .npz file'):
    load_dataset(data_config(source='npz', path=str(tmp_path / 'corrupt.npz')), 'cifar10')
  ds100 = load_dataset(data_config(source='npz', path=str(tmp_path / 'ok.npz')), 'cifar100')
  assert ds100.num_classes == 100 and ds100.std == (0.267, 0.256, 0.276)


def test_jpeg_compressed_cifar_copy_is_decoded(tmp_path):
  rng = np.random.default_rng(0)
  arrays = {}
  for split, n in (('train', 6), ('test', 3)):
    blobs, offsets = [], [0]
    for _ in range(n):
      buf = io.BytesIO()
      Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(buf, 'JPEG', quality=75)
      blobs.append(buf.getvalue())
      offsets.append(offsets[-1] + len(buf.getvalue()))
    arrays[f'{split}_jpeg'] = np.frombuffer(b''.join(blobs), np.uint8)
    arrays[f'{split}_offsets'] = np.asarray(offsets, np.int64)
    arrays[f'{split}_labels'] = np.arange(n, dtype=np.uint8)
  np.savez(tmp_path / 'jpeg.npz', **arrays)
  ds = load_dataset(data_config(source='npz', path=str(tmp_path / 'jpeg.npz')), 'cifar10')
  assert ds.x_train.shape == (6, 32, 32, 3) and ds.x_test.shape == (3, 32, 32, 3)
  assert ds.y_test.tolist() == [0, 1, 2]
  for x, split in ((ds.x_train, 'train'), (ds.x_test, 'test')):  # each image as PIL decodes its own bytes
    blob, offsets = arrays[f'{split}_jpeg'].tobytes(), arrays[f'{split}_offsets']
    for i in range(len(x)):
      np.testing.assert_array_equal(x[i], np.asarray(Image.open(io.BytesIO(blob[offsets[i]:offsets[i + 1]]))))


def test_nothing_found_lists_every_attempt_and_the_fix(tmp_path, monkeypatch):
  broken = types.ModuleType('tensorflow_datasets')

  def builder(*a, **k):
    raise ConnectionError('no network')
  broken.builder = builder
  monkeypatch.setitem(sys.modules, 'tensorflow_datasets', broken)
  monkeypatch.setattr(sources, 'DEFAULT_IDX_DIR', str(tmp_path))
  with pytest.raises(DataError) as e:
    load_dataset(data_config(source='auto'), 'fashion_mnist')
  message = str(e.value)
  assert 'tried idx' in message and 'tfds:' in message
  assert 'apt-get install dataset-fashion-mnist' in message and '\n' not in message
  # A file or folder named explicitly is the only place looked at: its problem is the message.
  with pytest.raises(DataError, match=r'data.path=.*none.npz does not exist: give an .npz file of fashion_mnist \(docs/DATA.md[^\n]*\)$'):
    load_dataset(data_config(source='auto', path=str(tmp_path / 'none.npz')), 'fashion_mnist')
  with pytest.raises(DataError, match=r'tried idx: FileNotFoundError: .*train-images-idx3-ubyte.gz not found\)'):
    load_dataset(data_config(source='auto', idx_dir=str(tmp_path)), 'fashion_mnist')


def test_tfds_source_through_its_data_source_api(monkeypatch, caplog):
  """Read through tfds' random-access API; a download is announced first (offline, tfds retries for minutes)."""
  fake = types.ModuleType('tensorflow_datasets')
  rng = np.random.default_rng(0)
  splits = {s: [{'image': rng.integers(0, 256, (32, 32, 3), dtype=np.uint8), 'label': i % 10}
                for i in range(n)] for s, n in (('train', 8), ('test', 4))}
  prepared = []

  class Builder:
    data_dir = '/nowhere/cifar10'

    def is_prepared(self):
      return bool(prepared)

    def download_and_prepare(self):
      prepared.append(True)

    def as_data_source(self, split):
      return splits[split]
  fake.builder = lambda name, data_dir=None: Builder()
  monkeypatch.setitem(sys.modules, 'tensorflow_datasets', fake)
  with caplog.at_level('INFO'):
    ds = load_dataset(data_config(source='tfds', tfds_download=True), 'cifar10')
  assert prepared and ds.source == 'tfds' and ds.x_train.shape == (8, 32, 32, 3)
  assert ds.y_test.tolist() == [0, 1, 2, 3]
  announced = [r.getMessage() for r in caplog.records if 'downloading' in r.getMessage()]
  assert len(announced) == 1 and 'not prepared in /nowhere/cifar10' in announced[0], announced
  assert '--config.data.path=FILE.npz' in announced[0]
  caplog.clear()
  with caplog.at_level('INFO'):
    load_dataset(data_config(source='tfds', tfds_download=True), 'cifar10')  # prepared now: nothing announced
  assert not [r for r in caplog.records if 'downloading' in r.getMessage()]


def test_a_file_holding_too_few_classes_is_named_in_a_warning(tmp_path, caplog):
  """A CIFAR-10 file given to a CIFAR-100 config holds labels in range: it trains, but the log says that only 10
  of the 100 classes are there; a file holding every class says nothing."""
  rng = np.random.default_rng(0)
  images = lambda n: rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
  ten, hundred = tmp_path / 'ten.npz', tmp_path / 'hundred.npz'
  np.savez(ten, x_train=images(1000), y_train=np.arange(1000) % 10, x_test=images(20), y_test=np.arange(20) % 10)
  np.savez(hundred, x_train=images(1000), y_train=np.arange(1000) % 100, x_test=images(20), y_test=np.arange(20))
  with caplog.at_level('WARNING'):
    load_dataset(data_config(source='npz', path=str(hundred)), 'cifar100')
  assert not [r for r in caplog.records if 'classes' in r.getMessage()]
  with caplog.at_level('WARNING'):
    ds = load_dataset(data_config(source='npz', path=str(ten)), 'cifar100')
  warned = [r.getMessage() for r in caplog.records if 'classes' in r.getMessage()]
  assert ds.num_classes == 100 and len(warned) == 1 and 'holds 10 of cifar100\'s 100 classes (labels 0..9)' in warned[0]


def test_train_order_is_a_reproducible_permutation_per_epoch():
  order = TrainOrder(100, 10, seed=3)
  again = TrainOrder(100, 10, seed=3)
  epoch0 = np.concatenate([order.indices(s) for s in range(10)])
  assert sorted(epoch0.tolist()) == list(range(100))
  epoch1 = np.concatenate([order.indices(s) for s in range(10, 20)])
  assert sorted(epoch1.tolist()) == list(range(100)) and not np.array_equal(epoch0, epoch1)
  np.testing.assert_array_equal(again.indices(13), order.indices(13))  # random access, no replay
  assert not np.array_equal(TrainOrder(100, 10, seed=4).indices(0), order.indices(0))
  assert TrainOrder(105, 10, seed=0).steps_per_epoch == 10  # the incomplete batch is dropped


def test_augment_is_a_padded_crop_and_a_flip():
  pre = Preprocess((0.5,), (0.25,), crop_padding=2, flip=True, augment=True)
  images = jnp.asarray(np.random.default_rng(0).integers(1, 256, (16, 6, 6, 1)), jnp.uint8)
  out = np.asarray(augment(jax.random.key(0), images, pre))
  padded = np.pad(np.asarray(images), ((0, 0), (2, 2), (2, 2), (0, 0)))
  flips = 0
  for i in range(16):
    candidates = [padded[i, a:a + 6, b:b + 6] for a in range(5) for b in range(5)]
    plain = any(np.array_equal(out[i], c) for c in candidates)
    flipped = any(np.array_equal(out[i], c[:, ::-1]) for c in candidates)
    assert plain or flipped
    flips += flipped and not plain
  assert 0 < flips < 16
  off = Preprocess((0.5,), (0.25,), augment=False)
  np.testing.assert_array_equal(augment(jax.random.key(0), images, off), images)
  np.testing.assert_allclose(normalize(images, pre), (np.asarray(images) / 255 - 0.5) / 0.25, rtol=1e-5, atol=1e-6)


def test_synthetic_data_is_learnable_and_shaped_like_the_dataset():
  ds = load_dataset(data_config(source='synthetic', synthetic_train_size=50, synthetic_test_size=10),
                    'cifar100')
  assert ds.x_train.shape == (50, 32, 32, 3) and ds.num_classes == 100 and ds.source == 'synthetic'
  # learnable: each image's mean colour, classified by the nearest class's mean colour over the training set,
  # gets the test labels right far above chance (10%)
  ds = load_dataset(data_config(source='synthetic', synthetic_train_size=300, synthetic_test_size=100), 'cifar10')
  colour = lambda x: x.reshape(len(x), -1, 3).mean(axis=1)
  means = np.stack([colour(ds.x_train[ds.y_train == c]).mean(axis=0) for c in range(10)])
  guess = np.argmin(((colour(ds.x_test)[:, None] - means[None]) ** 2).sum(-1), axis=1)
  assert (guess == ds.y_test).mean() > 0.9
