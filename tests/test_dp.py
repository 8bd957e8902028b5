"""Data parallel equals BP on the same global batch, on 1, 2 and 4 devices: the sequential reference of
test_train.py (plain SGD written from the definition), not the library's own BP."""
import jax
import pytest

from conftest import assert_trees_close, tiny_config
from test_train import reference_bp
from jaxdecouple.errors import ConfigError
from jaxdecouple.train import train_and_evaluate


# lr 0.005: reduction-order noise between per-device and whole-batch sums grows fast with 2 devices
# (2e-3 after 10 steps at lr 0.02, against 1e-7 with 4); a real error (e.g. gradients summed, not
# averaged) moves parameters by far more than this tolerance (see the test below).
@pytest.mark.parametrize('devices', [1, 2, 4])
def test_dp_equals_bp_on_the_same_global_batch(devices, workdir, tmp_path):
  kw = {'max_steps': 10, 'optim.learning_rate': 0.005}
  config = tiny_config(method='dp', **{'dp.num_devices': devices}, **kw)
  dp = train_and_evaluate(config, workdir)
  assert dp.method.mesh.devices.size == devices
  assert_trees_close(dp.variables, reference_bp(config, 10), tol=5e-4)
  for leaf in jax.tree.leaves(dp.state.params):
    assert len(leaf.devices()) == devices  # replicated on every device of the mesh


def test_the_comparison_catches_summed_gradients(workdir, tmp_path):
  """Gradients summed over 2 devices instead of averaged equals BP at twice the learning rate."""
  kw = {'max_steps': 10}
  dp = train_and_evaluate(tiny_config(method='dp', **{'dp.num_devices': 2, 'optim.learning_rate': 0.005},
                                      **kw), workdir)
  doubled = reference_bp(tiny_config(method='bp', **{'optim.learning_rate': 0.01}, **kw), 10)
  with pytest.raises(AssertionError, match='max error'):
    assert_trees_close(dp.variables, doubled, tol=5e-4)


def test_batch_must_divide_over_the_devices(workdir):
  with pytest.raises(ConfigError, match=r'config.batch_size: 30 is not divisible by the 4 devices'):
    train_and_evaluate(tiny_config(method='dp', batch_size=30), workdir)


def test_dp_resumes_exactly(workdir, tmp_path):
  kw = {'method': 'dp', 'dp.num_devices': 2, 'checkpoint_every_steps': 3}
  train_and_evaluate(tiny_config(max_steps=3, **kw), workdir)
  resumed = train_and_evaluate(tiny_config(max_steps=8, **kw), workdir)
  whole = train_and_evaluate(tiny_config(max_steps=8, **kw), str(tmp_path / 'whole'))
  assert_trees_close(resumed.state, whole.state, tol=0.0)


def test_split_and_fused_steps_agree(workdir, tmp_path):
  """On the CPU DP compiles forward and backward as two calls (split_backward=auto); the fused step
  computes the same thing."""
  kw = {'max_steps': 6, 'optim.learning_rate': 0.005, 'dp.num_devices': 2}
  split = train_and_evaluate(tiny_config(method='dp', split_backward='on', **kw), workdir)
  fused = train_and_evaluate(tiny_config(method='dp', split_backward='off', **kw), str(tmp_path / 'fused'))
  assert (split.method._step.calls, fused.method._step.calls) == (2, 1)
  assert_trees_close(split.variables, fused.variables, tol=5e-4)
