"""CIFAR-100 ready: the bp_*_c100 configs sit beside the FDG ones, and the CIFAR-100 path (a .npz of that
format made here: 32x32x3 uint8 images, labels 0..99) trains BP and FDG with a 100-way head and reports
top-5 accuracy."""
import glob
import importlib.util
import os

import numpy as np
import pytest

from conftest import tiny_config
from jaxdecouple.train import train_and_evaluate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load(path):
  spec = importlib.util.spec_from_file_location('cfg', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_every_fdg_cifar100_config_has_its_bp_baseline():
  for fdg in sorted(glob.glob(os.path.join(ROOT, 'configs', 'fdg_*_c100.py'))):
    bp = fdg.replace('fdg_', 'bp_')
    assert os.path.exists(bp), f'{bp} is missing'
    a, b = load(fdg).get_config(), load(bp).get_config()
    assert (b.method, b.dataset, b.model) == ('bp', 'cifar100', a.model)
    assert (b.num_epochs, b.optim.milestones, b.optim.warmup) == (a.num_epochs, a.optim.milestones, a.optim.warmup)
  assert 'README' in load(os.path.join(ROOT, 'configs', 'fdg_resnet56_c100.py')).__doc__  # which beta, and why


@pytest.fixture(scope='module')
def cifar100_npz(tmp_path_factory):
  rng = np.random.default_rng(0)
  path = str(tmp_path_factory.mktemp('c100') / 'cifar100.npz')
  np.savez(path, x_train=rng.integers(0, 256, (256, 32, 32, 3), dtype=np.uint8),
           y_train=rng.integers(0, 100, 256).astype(np.int64),
           x_test=rng.integers(0, 256, (128, 32, 32, 3), dtype=np.uint8),
           y_test=np.arange(128) % 100)
  return path


@pytest.mark.parametrize('method', ['bp', 'fdg'])
def test_the_cifar100_path_trains_with_a_100_way_head(method, cifar100_npz, workdir):
  config = tiny_config(method=method, dataset='cifar100', max_steps=4,
                       **{'data.source': 'npz', 'data.path': cifar100_npz})
  result = train_and_evaluate(config, workdir)
  head = result.variables['params']['head']
  assert [x.shape[-1] for x in jax_leaves(head)] and max(x.shape[-1] for x in jax_leaves(head)) == 100
  assert 0.0 <= result.last_eval['test_top5_accuracy'] <= 1.0 and np.isfinite(result.last_eval['test_loss'])


def jax_leaves(tree):
  import jax
  return jax.tree.leaves(tree)
