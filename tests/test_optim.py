"""Optimizer and schedules against hand-written references of torch.optim.SGD and the recipes."""
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import tiny_config
from jaxdecouple.optim import make_optimizer, make_schedule


@pytest.mark.parametrize('nesterov', [False, True])
def test_sgd_matches_torch_semantics(nesterov):
  c = tiny_config()
  c.optim.nesterov = nesterov
  opt = make_optimizer(c.optim)
  rng = np.random.default_rng(0)
  p = rng.normal(size=5).astype(np.float32)
  params, state = {'w': jnp.asarray(p)}, opt.init({'w': jnp.asarray(p)})
  ref_p, buf = p.astype(np.float64), np.zeros(5)
  for t in range(4):
    g = rng.normal(size=5).astype(np.float32)
    lr = 0.1 / (t + 1)
    params, state = opt.update({'w': jnp.asarray(g)}, state, params, lr)
    d = g + 5e-4 * ref_p            # weight decay added to the gradient
    buf = 0.9 * buf + d             # momentum buffer, dampening 0
    ref_p = ref_p - lr * (d + 0.9 * buf if nesterov else buf)
  np.testing.assert_allclose(np.asarray(params['w']), ref_p, rtol=1e-5)


def test_milestones_and_constant_warmup():
  c = tiny_config()
  c.optim.milestones = (2, 3)
  c.optim.warmup = 'constant'
  c.optim.warmup_epochs = 1.0
  schedule = make_schedule(c.optim, steps_per_epoch=10)
  got = [float(schedule(s)) for s in (0, 9, 10, 19, 20, 29, 30, 100)]
  np.testing.assert_allclose(got, [0.01, 0.01, 0.1, 0.1, 0.01, 0.01, 0.001, 0.001], rtol=1e-6)


def test_linear_warmup_per_iteration():
  c = tiny_config()
  c.optim.milestones = (5,)
  c.optim.warmup = 'linear'
  c.optim.warmup_epochs = 2.0
  schedule = make_schedule(c.optim, steps_per_epoch=10)
  for s in (0, 5, 19):
    np.testing.assert_allclose(float(schedule(s)), 0.001 + (0.1 - 0.001) * s / 20, rtol=1e-5)
  np.testing.assert_allclose(float(schedule(20)), 0.1, rtol=1e-6)
  np.testing.assert_allclose(float(schedule(50)), 0.01, rtol=1e-6)


def test_inverse_sqrt_decay_and_its_refusal_with_milestones():
  """optim.decay_steps = N: lr / sqrt(1 + t / N) per iteration (the diminishing rate of FDG's Theorem 1); with
  milestones as well it is refused (one of the two decays)."""
  from jaxdecouple.errors import ConfigError
  from jaxdecouple.methods import validate
  c = tiny_config()
  c.optim.milestones, c.optim.decay_steps = (), 4.0
  schedule = make_schedule(c.optim, steps_per_epoch=10)
  np.testing.assert_allclose([float(schedule(t)) for t in (0, 4, 12, 60)], [0.1, 0.1 / 2 ** 0.5, 0.05, 0.025],
                             rtol=1e-6)
  c.optim.milestones = (1,)
  with pytest.raises(ConfigError, match=r'config\.optim\.decay_steps'):
    validate(c)
