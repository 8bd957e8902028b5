"""The CIFAR archive converter (jaxdecouple/data/cifar_archive.py) on small archives of the authors' format,
written here: the pixel layout from the format's definition, both data sets, and damaged or hostile archives."""
import io
import os
import pickle
import subprocess
import sys
import tarfile

import numpy as np
import pytest

from jaxdecouple.data import cifar_archive
from jaxdecouple.data.sources import load_npz

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _write_archive(path, members: dict[str, bytes]):
  with tarfile.open(path, 'w:gz') as tar:
    for name, payload in members.items():
      info = tarfile.TarInfo(name)
      info.size = len(payload)
      tar.addfile(info, io.BytesIO(payload))


def _batch(rng, n, label_key, n_classes):
  """A batch as the authors pickled it (Python 2 cPickle: bytes keys, protocol 2)."""
  data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
  labels = [int(x) for x in rng.integers(0, n_classes, size=n)]
  payload = pickle.dumps({b'batch_label': b'made in the test', label_key: labels, b'data': data,
                          b'filenames': [b'x.png'] * n}, protocol=2)
  return data, labels, payload


def test_cifar10_archive_becomes_the_npz_the_data_source_reads(tmp_path):
  rng = np.random.default_rng(0)
  members, rows, labels = {}, [], []
  for name in cifar_archive.CIFAR10_TRAIN + cifar_archive.CIFAR10_TEST:
    data, lab, members[name] = _batch(rng, 3, b'labels', 10)
    rows.append(data)
    labels.append(lab)
  _write_archive(tmp_path / 'cifar-10-python.tar.gz', members)
  out = tmp_path / 'data' / 'cifar10.npz'
  assert cifar_archive.main([str(tmp_path / 'cifar-10-python.tar.gz'), str(out)]) == 0
  x_train, y_train, x_test, y_test = load_npz('cifar10', str(out))[:4]
  assert x_train.shape == (15, 32, 32, 3) and x_test.shape == (3, 32, 32, 3) and x_train.dtype == np.uint8
  assert y_train.tolist() == sum(labels[:5], []) and y_test.tolist() == labels[5]
  # the format's definition: row i holds the red plane, then green, then blue, each 32 rows of 32 columns
  train_rows = np.concatenate(rows[:5])
  for i, r, c, ch in [(0, 0, 0, 0), (4, 31, 0, 1), (14, 5, 31, 2), (7, 17, 9, 1)]:
    assert x_train[i, r, c, ch] == train_rows[i, ch * 1024 + r * 32 + c]
  assert x_test[2, 3, 4, 2] == rows[5][2, 2 * 1024 + 3 * 32 + 4]


def test_cifar100_archive_uses_the_fine_labels(tmp_path):
  rng = np.random.default_rng(1)
  members = {}
  for name in cifar_archive.CIFAR100_TRAIN + cifar_archive.CIFAR100_TEST:
    data = rng.integers(0, 256, size=(4, 3072), dtype=np.uint8)
    members[name] = pickle.dumps({b'data': data, b'fine_labels': [99, 0, 57, 3], b'coarse_labels': [19, 0, 1, 2]},
                                 protocol=2)
  _write_archive(tmp_path / 'c100.tar.gz', members)
  arrays = cifar_archive.convert(str(tmp_path / 'c100.tar.gz'))
  assert arrays['y_train'].tolist() == [99, 0, 57, 3] and arrays['x_test'].shape == (4, 32, 32, 3)


class _Runs:
  """Unpickling this would run a command; the converter must refuse it."""
  def __reduce__(self):
    return (os.system, ('touch PWNED',))


@pytest.mark.parametrize('case', ['hostile', 'not_cifar', 'short_rows'])
def test_a_bad_archive_stops_with_one_line_and_runs_nothing(tmp_path, case):
  rng = np.random.default_rng(2)
  members = {}
  for name in cifar_archive.CIFAR10_TRAIN + cifar_archive.CIFAR10_TEST:
    members[name] = _batch(rng, 2, b'labels', 10)[2]
  if case == 'hostile':
    members[cifar_archive.CIFAR10_TEST[0]] = pickle.dumps({b'data': _Runs(), b'labels': [1]}, protocol=2)
    words = 'asks for'
  elif case == 'not_cifar':
    members = {'something/else': b'1'}
    words = 'neither CIFAR-10 nor CIFAR-100'
  else:
    members[cifar_archive.CIFAR10_TRAIN[2]] = pickle.dumps({b'data': np.zeros((2, 100), np.uint8),
                                                            b'labels': [1, 2]}, protocol=2)
    words = 'not [N, 3072]'
  _write_archive(tmp_path / 'a.tar.gz', members)
  r = subprocess.run([sys.executable, '-m', 'jaxdecouple.data.cifar_archive', str(tmp_path / 'a.tar.gz'),
                      str(tmp_path / 'out.npz')], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                     env={**os.environ, 'PYTHONPATH': ROOT})
  lines = [x for x in r.stderr.splitlines() if x.strip()]
  assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith('error:') and words in lines[0], r.stderr
  assert not (tmp_path / 'PWNED').exists() and not (tmp_path / 'out.npz').exists()
