"""DDG and features replay against sequential references of their definitions."""
import jax
import optax
import pytest

from conftest import SequentialStages, assert_trees_close, assert_trees_equal, tiny_config
from jaxdecouple.errors import ConfigError
from jaxdecouple.train import train_and_evaluate


def locked_config(method, k, steps=12, **kw):
  return tiny_config(method=method, max_steps=steps,
                     **{'pipeline.num_stages': k, 'optim.learning_rate': 0.005, **kw})


def reference_forward_locked(config, steps, replay, predict_offset=None):
  """Iteration t: micro-batch t through every stage in order with the parameters each has at the
  start of t; the last stage takes its SGD step on it. Then stage k < K-1 back-propagates the gradient
  of micro-batch m = t-(K-1-k) (sent by stage k+1 at iteration t-1): DDG through the forward of m as it
  was (stored input, stored parameters); FR through a replay of the stored input with the current
  parameters, which updates BatchNorm's running statistics again. Then it updates.

  ``predict_offset`` (DDG with weight prediction): stage k's forward runs at W + s * Δ, its last step Δ
  extrapolated over its staleness s = K-1-k updates (those of iterations m .. m+K-2-k, between the forward of
  m and the update with its gradient), plus the offset (a wrong reference with 1).
  """
  K = config.pipeline.num_stages
  ref = SequentialStages(config)
  inputs, met, deltas = [{} for _ in range(K)], [{} for _ in range(K)], [{} for _ in range(K)]
  last_step = [jax.tree.map(jax.numpy.zeros_like, p) for p in ref.params]
  for t in range(steps):
    lr = ref.lr(t)
    inputs[0][t], labels = ref.batch(t)
    for k in range(K - 1):
      met[k][t] = ref.params[k] if predict_offset is None else jax.tree.map(
          lambda w, d: w + (K - 1 - k + predict_offset) * d, ref.params[k], last_step[k])
      inputs[k + 1][t], ref.stats[k] = ref.run(k, met[k][t], inputs[k][t], ref.stats[k])

    def loss(p, x):
      logits, new = ref.run(K - 1, p, x, ref.stats[K - 1])
      return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean(), new
    (gp, gx), ref.stats[K - 1] = jax.grad(loss, argnums=(0, 1), has_aux=True)(
        ref.params[K - 1], inputs[K - 1][t])
    ref.sgd(K - 1, gp, lr)
    if K > 1:
      deltas[K - 2][t] = gx
    for k in range(K - 1):
      m = t - (K - 1 - k)
      if m < 0:
        continue
      if replay:
        _, vjp, ref.stats[k] = jax.vjp(lambda p, x: ref.run(k, p, x, ref.stats[k]), ref.params[k],
                                       inputs[k][m], has_aux=True)
      else:
        _, vjp = jax.vjp(lambda p, x: ref.run(k, p, x, ref.stats[k])[0], met[k][m], inputs[k][m])
      gp, gx = vjp(config.pipeline.beta * deltas[k][m])
      before = ref.params[k]
      ref.sgd(k, gp, lr)
      last_step[k] = jax.tree.map(jax.numpy.subtract, ref.params[k], before)
      if k > 0:
        deltas[k - 1][m] = gx
  return ref.variables()


def test_ddg_with_weight_prediction_matches_its_definition(workdir):
  """DDG's staleness differs from FDG's (K-1-k updates, not 2(K-1-k)-1): the corrector takes it from the
  Schedule, and the run equals the reference that extrapolates over K-1-k; over one update more it does not."""
  config = locked_config('ddg', 3, **{'pipeline.corrector': 'predict'})
  result = train_and_evaluate(config, workdir)
  assert_trees_close(result.variables, reference_forward_locked(config, 12, False, predict_offset=0), tol=5e-4)
  with pytest.raises(AssertionError, match='max error'):
    assert_trees_close(result.variables, reference_forward_locked(config, 12, False, predict_offset=1), tol=5e-4)


@pytest.mark.parametrize('method,k', [('ddg', 2), ('ddg', 3), ('fr', 2), ('fr', 3)])
def test_matches_the_sequential_reference(method, k, workdir):
  config = locked_config(method, k)
  result = train_and_evaluate(config, workdir)
  assert_trees_close(result.variables, reference_forward_locked(config, 12, replay=method == 'fr'),
                     tol=5e-4)


def test_ddg_and_fr_differ_by_the_replay(workdir, tmp_path):
  """The two references are far apart, so each comparison above is sharp."""
  config = locked_config('fr', 2)
  fr = train_and_evaluate(config, workdir)
  with pytest.raises(AssertionError, match='max error'):
    assert_trees_close(fr.variables, reference_forward_locked(config, 12, replay=False), tol=5e-4)


def test_ddg_recompute_equals_vjp_and_placement_does_not_matter(tmp_path):
  runs = [train_and_evaluate(locked_config('ddg', 3, **{'pipeline.keep': keep, 'pipeline.num_devices': n}),
                             str(tmp_path / f'{keep}{n}')) for keep, n in (('vjp', 3), ('vjp', 1),
                                                                             ('recompute', 3))]
  assert_trees_equal(runs[0].variables, runs[1].variables)
  assert_trees_close(runs[0].variables, runs[2].variables, tol=1e-4)


@pytest.mark.parametrize('method', ['ddg', 'fr'])
def test_resume_is_exact(method, workdir, tmp_path):
  kw = {'checkpoint_every_steps': 1}
  train_and_evaluate(locked_config(method, 3, steps=1, **kw), workdir)  # ring buffers half full
  resumed = train_and_evaluate(locked_config(method, 3, steps=6, **kw), workdir)
  whole = train_and_evaluate(locked_config(method, 3, steps=6, **kw), str(tmp_path / 'whole'))
  assert_trees_equal(resumed.state, whole.state)


def test_replay_is_only_for_fr(workdir):
  with pytest.raises(ConfigError, match="config.pipeline.keep: 'replay' is not allowed for ddg.*method 'fr'"):
    train_and_evaluate(locked_config('ddg', 2, **{'pipeline.keep': 'replay'}), workdir)


def test_fr_refuses_another_keep(workdir):
  """FR always keeps its inputs and replays them: a pipeline.keep other than the default is refused, not ignored."""
  with pytest.raises(ConfigError, match="config.pipeline.keep: fr always keeps 'replay'"):
    train_and_evaluate(locked_config('fr', 2, **{'pipeline.keep': 'recompute'}), workdir)
