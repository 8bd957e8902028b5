"""Four CPU devices for every test (set before JAX starts) and small shared helpers."""
import os
import sys

os.environ.setdefault('JAX_NUM_CPU_DEVICES', '4')
os.environ.setdefault('XLA_FLAGS', '--xla_force_host_platform_device_count=4')
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

jax.config.update('jax_num_cpu_devices', 4)

from jaxdecouple.config import get_default_config  # noqa: E402


def tiny_config(**overrides):
  """A few-second run: ResNet-8 on synthetic CIFAR-shaped data, batch 32, 8 steps per epoch."""
  c = get_default_config()
  c.model = 'resnet8'
  c.dataset = 'cifar10'
  c.data.source = 'synthetic'
  c.data.synthetic_train_size = 256
  c.data.synthetic_test_size = 64
  c.batch_size = 32
  c.eval_batch_size = 64
  c.num_epochs = 2
  c.optim.milestones = (1,)
  c.log_every_steps = 4
  c.checkpoint_every_steps = 4
  for key, value in overrides.items():
    target = c
    *path, last = key.split('.')
    for p in path:
      target = target[p]
    target[last] = value
  return c


def assert_trees_equal(a, b, atol=0.0, rtol=0.0):
  la, ta = jax.tree.flatten(a)
  lb, tb = jax.tree.flatten(b)
  assert ta == tb, f'different structures:\n{ta}\n{tb}'
  for x, y in zip(la, lb):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=atol, rtol=rtol)


@pytest.fixture
def workdir(tmp_path):
  return str(tmp_path / 'run')


def assert_trees_close(a, b, tol):
  """Every leaf within ``tol`` of the reference, relative to that leaf's scale (at least 0.1).

  Float32 rounding differences between a jitted engine and an eager reference grow during training
  (BatchNorm at a high learning rate amplifies them); this keeps the comparison sharp (a real
  semantic change moves parameters by 1e-2 and more) without failing on that noise.
  """
  la, ta = jax.tree.flatten(a)
  lb, tb = jax.tree.flatten(b)
  assert ta == tb, f'different structures:\n{ta}\n{tb}'
  for path, x, y in zip(jax.tree_util.tree_flatten_with_path(b)[0], la, lb):
    x, y = np.asarray(x), np.asarray(y)
    scale = max(float(np.max(np.abs(y))), 0.1)
    err = float(np.max(np.abs(x - y)))
    assert err <= tol * scale, f'{jax.tree_util.keystr(path[0])}: max error {err:.3g} > {tol} x {scale:.3g}'
