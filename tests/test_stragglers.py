"""Stragglers, simulated (jaxdecouple/replica/stragglers.py): the round model on figures worked out by hand, and
the engine timing its rounds for real beside it without changing what it trains."""
import json
import os

import numpy as np
import pytest

from conftest import assert_trees_equal
from jaxdecouple.errors import ConfigError
from jaxdecouple.replica.stragglers import round_model
from jaxdecouple.train import train_and_evaluate
from test_resist import replica_config


def test_a_round_waits_for_its_slowest_worker():
  # four workers of 3 s each, one at half speed, an exchange of 1 s: the round is 6 + 1 s, and the three fast
  # workers wait 3 s each of it: 9 of the 4 x 7 worker-seconds
  out = round_model([3.0] * 4, [1, 1, 1, 0.5], exchange_s=1.0)
  assert out['round_s'] == 7.0 and out['busy_s'] == [3.0, 3.0, 3.0, 6.0]
  assert out['idle_fraction'] == pytest.approx(9 / 28)
  assert round_model([2.0, 4.0], [1, 1])['idle_fraction'] == pytest.approx(2 / 8)  # unequal work, equal speed
  assert round_model([3.0] * 2, [1, 1], exchange_s=1.0) == {'round_s': 4.0, 'busy_s': [3.0, 3.0], 'idle_fraction': 0.0}
  with pytest.raises(ValueError, match='one positive speed per worker'):
    round_model([1.0, 1.0], [1.0, 0.0])


def test_the_engine_times_each_round_and_trains_the_same(tmp_path):
  """Local SGD, S = 2, L = 2, 3 rounds, worker 1 at half speed: every round logs its measured seconds (local
  steps plus exchange) and the model's round (twice the local steps plus the exchange); the trained network is
  bit for bit the one of the same run without speeds."""
  kw = {'workers': 2, 'steps': 6, 'local': 2, 'log_every_steps': 2}
  slow = train_and_evaluate(replica_config('localsgd', **kw, **{'replica.worker_speeds': (1.0, 0.5)}),
                            str(tmp_path / 'slow'))
  plain = train_and_evaluate(replica_config('localsgd', **kw), str(tmp_path / 'plain'))
  assert_trees_equal(slow.state.params, plain.state.params)
  with open(os.path.join(tmp_path, 'slow', 'metrics.jsonl')) as f:
    rounds = [r for r in map(json.loads, f) if 'round_s' in r]
  assert len(rounds) == 3
  for r in rounds:
    local, exchange = r['round_local_s'], r['round_exchange_s']
    assert local > 0 and exchange > 0
    np.testing.assert_allclose(r['round_s'], local + exchange, rtol=1e-9)
    np.testing.assert_allclose(r['round_s_stragglers'], 2 * local + exchange, rtol=1e-9)
    np.testing.assert_allclose(r['stragglers_idle_fraction'], local / (2 * (2 * local + exchange)), rtol=1e-9)
  with open(os.path.join(tmp_path, 'plain', 'metrics.jsonl')) as f:
    assert not any('round_s' in r for r in map(json.loads, f))  # untimed (no waits) without speeds


@pytest.mark.parametrize('method,speeds', [('localsgd', (1.0,)), ('resist', (1.0, 0.0)), ('ensemble', (1.0, 0.5)),
                                           ('bp', (1.0, 0.5))])
def test_bad_speeds_name_the_field(method, speeds, tmp_path):
  with pytest.raises(ConfigError, match=r'replica\.worker_speeds'):
    train_and_evaluate(replica_config(method, workers=2, **{'replica.worker_speeds': speeds}), str(tmp_path))
