"""Staleness made visible: each stage's applied gradient against back-propagation's, on cases with a
known answer."""
import statistics

import pytest

from conftest import tiny_config
from jaxdecouple.errors import ConfigError
from jaxdecouple.train import train_and_evaluate
from jaxdecouple.writers import read_metrics


def diagnosed(workdir, method='fdg', k=2, steps=12, every=2, **kw):
  config = tiny_config(method=method, max_steps=steps, **{'pipeline.num_stages': k,
                                                          'pipeline.diagnose_every_steps': every, **kw})
  train_and_evaluate(config, workdir)
  return [r for r in read_metrics(workdir) if r['kind'] == 'diagnose']


def test_k1_is_back_propagation(workdir):
  lines = diagnosed(workdir, k=1, steps=6)
  assert [r['step'] for r in lines] == [2, 4]
  for r in lines:
    assert r['stage0_cosine'] == pytest.approx(1.0, abs=1e-5)
    assert r['stage0_norm_ratio'] == pytest.approx(1.0, abs=1e-4)


@pytest.mark.parametrize('method', ['fdg', 'ddg'])
def test_a_frozen_network_makes_stale_gradients_exact(method, workdir):
  """With a learning rate of 1e-12 nothing moves, so a gradient 2(K-1-k) iterations old is today's:
  cosine 1, and the norm ratio is beta^(K-1-k): every stage below the last shrinks what it receives and
  passes the shrunk gradient on."""
  lines = diagnosed(workdir, method=method, k=3, **{'optim.learning_rate': 1e-12, 'pipeline.beta': 0.5})
  assert lines and all(f'stage{k}_cosine' in lines[-1] for k in range(3))
  for r in lines:
    for k in range(3):
      if f'stage{k}_cosine' in r:
        assert r[f'stage{k}_cosine'] == pytest.approx(1.0, abs=1e-4)
        assert r[f'stage{k}_norm_ratio'] == pytest.approx(0.5 ** (2 - k), abs=1e-3)


def test_a_moving_network_makes_older_gradients_worse(workdir):
  """At lr 0.1 the stages' gradients drift from back-propagation's, the more the older they are."""
  lines = diagnosed(workdir, k=4, steps=16, every=1, **{'optim.learning_rate': 0.1})
  mean = [statistics.mean(r[f'stage{k}_cosine'] for r in lines if f'stage{k}_cosine' in r) for k in range(3)]
  assert mean[0] < mean[1] < mean[2] < 0.999, mean


def test_off_by_default_and_only_for_pipeline_methods(workdir):
  train_and_evaluate(tiny_config(method='fdg', max_steps=4), workdir)
  assert not [r for r in read_metrics(workdir) if r['kind'] == 'diagnose']
  with pytest.raises(ConfigError, match=r'config\.pipeline\.diagnose_every_steps: .*bp has no stages'):
    train_and_evaluate(tiny_config(**{'pipeline.diagnose_every_steps': 5}), workdir)
  with pytest.raises(ConfigError, match=r'config\.pipeline\.diagnose_every_steps: must be non-negative'):
    train_and_evaluate(tiny_config(method='fdg', **{'pipeline.diagnose_every_steps': -1}), workdir)
