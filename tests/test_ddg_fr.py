"""DDG and features replay against sequential references of their definitions."""
import jax
import jax.numpy as jnp
import optax
import pytest

from conftest import assert_trees_close, assert_trees_equal, tiny_config
from jaxdecouple.data import Preprocess, TrainOrder, load_dataset, train_inputs
from jaxdecouple.errors import ConfigError
from jaxdecouple.models import build_model, subset
from jaxdecouple.pipeline import choose_split
from jaxdecouple.train import train_and_evaluate


def locked_config(method, k, steps=12, **kw):
  return tiny_config(method=method, max_steps=steps,
                     **{'pipeline.num_stages': k, 'optim.learning_rate': 0.02, **kw})


def reference_forward_locked(config, steps, replay):
  """Iteration t: micro-batch t through every stage in order with the parameters each has at the
  start of t; the last stage takes its SGD step on it. Then stage k < K-1 back-propagates the gradient
  of micro-batch m = t-(K-1-k) (sent by stage k+1 at iteration t-1): DDG through the forward of m as it
  was (stored input, stored parameters); FR through a replay of the stored input with the current
  parameters, which updates BatchNorm's running statistics again. Then it updates.
  """
  K = config.pipeline.num_stages
  ds = load_dataset(config.data, config.dataset)
  model = build_model(config.model, ds.num_classes)
  variables = model.init(jax.random.key(config.seed), jnp.zeros((1, *ds.image_shape)))
  stages = model.cut(choose_split(model, K, config.pipeline.split, ds.image_shape).boundaries)
  params = [subset(variables, s.names)['params'] for s in stages]
  stats = [subset(variables, s.names).get('batch_stats', {}) for s in stages]
  momentum = [jax.tree.map(jnp.zeros_like, p) for p in params]
  order = TrainOrder(len(ds.x_train), config.batch_size, config.seed)
  pre = Preprocess(ds.mean, ds.std, 4, True, True)
  spe = order.steps_per_epoch
  inputs, met, deltas = [{} for _ in range(K)], [{} for _ in range(K)], [{} for _ in range(K)]

  def sgd(k, grads, lr):
    grads = jax.tree.map(lambda g, p: g + 5e-4 * p, grads, params[k])
    momentum[k] = jax.tree.map(lambda m, g: 0.9 * m + g, momentum[k], grads)
    params[k] = jax.tree.map(lambda p, m: p - lr * m, params[k], momentum[k])

  def run(k, p, x, s):
    return stages[k].apply({'params': p, 'batch_stats': s}, x, train=True)

  for t in range(steps):
    lr = config.optim.learning_rate * (0.1 if t >= config.optim.milestones[0] * spe else 1.0)
    idx = order.indices(t)
    inputs[0][t] = train_inputs(jnp.asarray(ds.x_train[idx]), t, config.seed, pre)
    labels = jnp.asarray(ds.y_train[idx])
    for k in range(K - 1):
      met[k][t] = params[k]
      inputs[k + 1][t], stats[k] = run(k, params[k], inputs[k][t], stats[k])

    def loss(p, x):
      logits, new = run(K - 1, p, x, stats[K - 1])
      return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean(), new
    (gp, gx), stats[K - 1] = jax.grad(loss, argnums=(0, 1), has_aux=True)(params[K - 1], inputs[K - 1][t])
    sgd(K - 1, gp, lr)
    if K > 1:
      deltas[K - 2][t] = gx
    for k in range(K - 1):
      m = t - (K - 1 - k)
      if m < 0:
        continue
      if replay:
        _, vjp, stats[k] = jax.vjp(lambda p, x: run(k, p, x, stats[k]), params[k], inputs[k][m],
                                   has_aux=True)
      else:
        _, vjp = jax.vjp(lambda p, x: run(k, p, x, stats[k])[0], met[k][m], inputs[k][m])
      gp, gx = vjp(config.pipeline.beta * deltas[k][m])
      sgd(k, gp, lr)
      if k > 0:
        deltas[k - 1][m] = gx
  merged = {'params': {}, 'batch_stats': {}}
  for p, s in zip(params, stats):
    merged['params'].update(p)
    merged['batch_stats'].update(s)
  return merged


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
  with pytest.raises(AssertionError):
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
  with pytest.raises(ConfigError, match="config.pipeline.keep: 'replay' is features replay"):
    train_and_evaluate(locked_config('ddg', 2, **{'pipeline.keep': 'replay'}), workdir)
