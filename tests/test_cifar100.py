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
    # the same recipe whole: every optimizer and schedule field, the batch, the data pipeline, the epochs
    assert (b.num_epochs, b.batch_size, b.seed) == (a.num_epochs, a.batch_size, a.seed)
    assert b.optim.to_dict() == a.optim.to_dict() and b.data.to_dict() == a.data.to_dict()
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
  # a 100-way head is evaluated top-5 as well (its count against numpy: test_imagenet's evaluator test): on labels
  # spread over all 100 classes, never below top-1, and above it here (4 steps: near chance, 5% against 1%)
  top1, top5 = result.last_eval['test_accuracy'], result.last_eval['test_top5_accuracy']
  assert 0.0 <= top1 < top5 <= 1.0 and np.isfinite(result.last_eval['test_loss']), (top1, top5)


def jax_leaves(tree):
  import jax
  return jax.tree.leaves(tree)


def test_imagenet_configs_are_set_as_the_paper_ran_them():
  """ResIST's ImageNet runs: the shared layers' BatchNorm statistics averaged every 1300 rounds, and (ResIST only)
  a local-SGD warm-up of a few epochs before ResIST, a multiple of L and shorter than the run."""
  for name in ('resist_imagenet_s2', 'resist_imagenet_s4', 'localsgd_imagenet_s2', 'localsgd_imagenet_s4'):
    c = load(os.path.join(ROOT, 'configs', f'{name}.py')).get_config()
    assert c.replica.stats_every_steps == 1300 * c.replica.local_steps
    if c.method == 'resist':
      assert c.replica.warmup_steps % c.replica.local_steps == 0
      assert 3 * 5004 <= c.replica.warmup_steps <= 10 * 5004  # a few epochs of 5,004 steps
    else:
      assert c.replica.warmup_steps == 0


def test_holdout_evaluates_a_fixed_part_of_the_training_set(cifar100_npz, workdir, caplog):
  """data.holdout = 0.25: a quarter of the training set (the same for every seed), never trained on, is the
  test set; the real test set is not used; the eval lines say which split they score."""
  import logging
  caplog.set_level(logging.INFO)
  from jaxdecouple.data import load_dataset
  from jaxdecouple.data.holdout import hold_out
  config = tiny_config(dataset='cifar100', max_steps=2, **{'data.source': 'npz', 'data.path': cifar100_npz,
                                                           'data.holdout': 0.25})
  whole = load_dataset(config.data, 'cifar100')
  split = hold_out(whole, 0.25)
  assert (len(split.x_train), len(split.x_test)) == (192, 64)
  train_rows = {x.tobytes() for x in split.x_train}
  assert not any(x.tobytes() in train_rows for x in split.x_test)  # held out, never trained on
  assert {x.tobytes() for x in split.x_test} <= {x.tobytes() for x in whole.x_train}
  assert all((hold_out(whole, 0.25).x_test == split.x_test).flatten())  # a fixed split
  result = train_and_evaluate(config, workdir)
  assert result.method.setup.steps_per_epoch == 192 // config.batch_size  # trains on the rest only
  from jaxdecouple.evaluate import Evaluator
  evaluate = Evaluator(result.method.predict_fn(), result.method.setup.preprocess, 64, result.method.setup.devices[0])
  assert evaluate(result.variables, split.x_test, split.y_test) == pytest.approx(
      {k: v for k, v in result.last_eval.items() if k in ('test_loss', 'test_accuracy')}, rel=1e-5)
  evals = [r.getMessage() for r in caplog.records if r.getMessage().startswith('epoch ')]
  assert evals and all('hold-out accuracy' in m and 'hold-out loss' in m and 'test' not in m for m in evals), evals


def test_a_holdout_that_leaves_less_than_a_batch_stops_naming_it(cifar100_npz, workdir):
  """Holding out so much that not one batch is left to train on stops before any compute, naming both fields."""
  from jaxdecouple.errors import ConfigError
  config = tiny_config(dataset='cifar100', max_steps=2, **{'data.source': 'npz', 'data.path': cifar100_npz,
                                                           'data.holdout': 0.95})
  with pytest.raises(ConfigError) as e:
    train_and_evaluate(config, workdir)
  assert str(e.value).startswith('config.batch_size:') and 'data.holdout=0.95' in str(e.value) and \
      'hold out less' in str(e.value) and '\n' not in str(e.value)


@pytest.mark.parametrize('overrides,words', [
    ({'data.holdout': 1.0}, 'must be in [0, 1)'),
    ({'data.holdout': -0.1}, 'must be in [0, 1)'),
    ({'data.holdout': 0.1, 'dataset': 'imagenet', 'model': 'imagenet_resnet18', 'data.source': 'folder',
      'data.path': '/nowhere'}, 'imagenet is streamed: leave it at 0'),
])
def test_a_bad_holdout_is_one_line_naming_the_field(overrides, words):
  from jaxdecouple.errors import ConfigError
  from jaxdecouple.methods import validate
  with pytest.raises(ConfigError) as e:
    validate(tiny_config(**overrides))
  assert str(e.value).startswith('config.data.holdout:') and words in str(e.value) and '\n' not in str(e.value)
