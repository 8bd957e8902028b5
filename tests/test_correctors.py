"""Staleness correctors on the real pipeline, each against a sequential FDG reference of its definition.

The reference is FDG written stage by stage (as tests/test_fdg.py's), with each corrector's formula written
here from its paper: weight prediction W + s·Δ, DC-ASGD's g + λ·g⊙g⊙(W_now - W_then), PipeMare's rate
η·τ^-(1 - min(t/T, 1)) and AsyncPP's W + γΔ - η(1 - γ)(g + wd·W) with the forward at W + γΔ; s (the
staleness) is FDG's 2(K-1-k) - 1 optimizer steps, written out here rather than taken from the Schedule.
"""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from conftest import SequentialStages, assert_trees_close, tiny_config
from jaxdecouple.errors import ConfigError
from jaxdecouple.methods import validate
from jaxdecouple.pipeline.correctors import Corrector
from jaxdecouple.train import train_and_evaluate

STEPS = 10


def corrected_config(k, corrector, steps=STEPS, **kw):
  return tiny_config(method='fdg', max_steps=steps, **{'pipeline.num_stages': k, 'pipeline.corrector': corrector,
                                                       'pipeline.beta': 0.5, 'optim.learning_rate': 0.005, **kw})


def tree(f, *trees):
  return jax.tree.map(f, *trees)


def reference(config, corrector, dc_lambda=0.0, anneal=1, gamma=0.0, staleness_offset=0, scale=1.0):
  """FDG K stages, each non-last stage with ``corrector``; plain SGD (5e-4 weight decay, momentum 0.9)."""
  K, beta = config.pipeline.num_stages, config.pipeline.beta
  ref = SequentialStages(config)
  staleness = [2 * (K - 1 - k) - 1 + staleness_offset for k in range(K)]
  last_step = [tree(jnp.zeros_like, p) for p in ref.params]  # Δ of each stage
  inputs, met, deltas, labels = [{} for _ in range(K)], [{} for _ in range(K)], [{} for _ in range(K)], {}

  def update(k, g, t, then):
    lr, w = ref.lr(t), ref.params[k]
    if corrector == 'dc':
      g = tree(lambda g, w, w0: g + dc_lambda * g * g * (w - w0), g, w, then)
    if corrector == 'pipemare_lr':
      first = 2 * K - 2 - k  # stage k's first backward (and update) in FDG
      lr = lr * max(1.0, staleness[k]) ** -(1 - min(max(t - first, 0) / anneal, 1.0))
    if corrector == 'nesterov':
      new = tree(lambda w, d, g: w + gamma * d - scale * lr * (1 - gamma) * (g + 5e-4 * w), w, last_step[k], g)
    else:
      ref.sgd(k, g, lr)
      new = ref.params[k]
    last_step[k], ref.params[k] = tree(jnp.subtract, new, w), new

  def forward_params(k):
    w, d = ref.params[k], last_step[k]
    if corrector == 'predict':
      return tree(lambda w, d: w + staleness[k] * d, w, d)
    if corrector == 'nesterov':
      return tree(lambda w, d: w + gamma * d, w, d)
    return w

  for t in range(STEPS):
    inputs[0][t], labels[t] = ref.batch(t)
    for k in range(K):
      if k == K - 1:  # the last stage: plain SGD on the loss, no corrector (no delay)
        m = t - (K - 1)
        if m < 0:
          continue

        def loss(p, x):
          logits, new = ref.run(k, p, x, ref.stats[k])
          return optax.softmax_cross_entropy_with_integer_labels(logits, labels[m]).mean(), new
        (gp, gx), ref.stats[k] = jax.grad(loss, argnums=(0, 1), has_aux=True)(ref.params[k], inputs[k][m])
        ref.sgd(k, gp, ref.lr(t))
        deltas[k - 1][m] = gx
        continue
      m = t - 2 * K + 2 + k
      if m >= 0:
        _, vjp = jax.vjp(lambda p, x: ref.run(k, p, x, ref.stats[k])[0], met[k][m], inputs[k][m])
        gp, gx = vjp(beta * deltas[k][m])
        update(k, gp, t, met[k][m])
        if k > 0:
          deltas[k - 1][m] = gx
      m = t - k
      if m >= 0:
        met[k][m] = forward_params(k)
        inputs[k + 1][m], ref.stats[k] = ref.run(k, met[k][m], inputs[k][m], ref.stats[k])
  return ref.variables()


CASES = {  # corrector: (extra config, reference arguments, a wrong reference's arguments)
    # (dc: a lambda large enough that the compensation moves the parameters beyond the tolerance in 10 steps)
    'predict': ({}, {}, {'staleness_offset': 1}),
    'dc': ({'pipeline.dc_lambda': 3e4}, {'dc_lambda': 3e4}, {'dc_lambda': 0.0}),
    'pipemare_lr': ({'pipeline.lr_anneal_epochs': 0.5}, {'anneal': 4}, {'anneal': 1}),
    'nesterov': ({'pipeline.nesterov_gamma': 0.9}, {'gamma': 0.9}, {'gamma': 0.8}),
}


@pytest.mark.parametrize('corrector', sorted(CASES))
def test_each_corrector_matches_its_definition(corrector, workdir):
  """K = 3 (staleness 3 and 1), 10 steps; and the comparison is sharp: the reference with the corrector's
  quantity changed (the staleness by one step, no compensation, another anneal, another gamma) is far."""
  extra, right, wrong = CASES[corrector]
  config = corrected_config(3, corrector, **{**extra, 'pipeline.diagnose_every_steps': 5})
  result = train_and_evaluate(config, workdir)
  assert_trees_close(result.variables, reference(config, corrector, **right), tol=5e-4)  # diagnostics change nothing
  assert_diagnostics_finite(workdir)
  with pytest.raises(AssertionError, match='max error'):
    assert_trees_close(result.variables, reference(config, corrector, **wrong), tol=5e-4)


def test_nesterov_rate_scale_matches_its_definition(workdir):
  """``pipeline.nesterov_lr_scale`` c: the update W + γΔ - c·η(1 - γ)(g + wd·W); sharp against c = 1."""
  config = corrected_config(3, 'nesterov', **{'pipeline.nesterov_gamma': 0.9, 'pipeline.nesterov_lr_scale': 10.0})
  result = train_and_evaluate(config, workdir)
  assert_trees_close(result.variables, reference(config, 'nesterov', gamma=0.9, scale=10.0), tol=5e-4)
  assert 'corrector nesterov (gamma 0.9, rate x10, staleness 3)' in result.method.describe(result.state)[1]
  with pytest.raises(AssertionError, match='max error'):
    assert_trees_close(result.variables, reference(config, 'nesterov', gamma=0.9), tol=5e-4)


def test_nesterov_scale_one_over_one_minus_momentum_gives_sgds_steady_step():
  """Why the scale: under a constant gradient g, SGD with momentum μ (PyTorch's buffer) tends to steps of
  η·g / (1 - μ), eq. 10 to c·η·g; with c = 1 / (1 - μ) the two agree."""
  mu, lr, gamma, g = 0.9, 0.1, 0.99, {'w': jnp.ones(3, jnp.float32)}
  buf, step = jnp.zeros(3), {'w': jnp.zeros(3, jnp.float32)}
  corrector = Corrector('nesterov', 1, 1, gamma=gamma, lr_scale=1 / (1 - mu))
  origin = {'w': jnp.zeros(3, jnp.float32)}  # without weight decay the step does not depend on W: kept at 0
  for _ in range(3000):                        # so that float32 rounding of a growing W stays out of the step
    buf = mu * buf + g['w']
    _, step = corrector.nesterov_update(g, origin, step, lr)
  np.testing.assert_allclose(step['w'], -lr * buf, rtol=1e-3)
  np.testing.assert_allclose(step['w'], -lr / (1 - mu) * g['w'], rtol=1e-3)


def test_no_corrector_is_plain_fdg(workdir, tmp_path):
  from conftest import assert_trees_equal
  plain = train_and_evaluate(corrected_config(3, 'none'), workdir)
  reference_none = reference(corrected_config(3, 'none'), 'none')
  assert_trees_close(plain.variables, reference_none, tol=5e-4)
  fdg = train_and_evaluate(tiny_config(method='fdg', max_steps=STEPS, **{
      'pipeline.num_stages': 3, 'pipeline.beta': 0.5, 'optim.learning_rate': 0.005}), str(tmp_path / 'fdg'))
  assert_trees_equal(plain.state, fdg.state)  # off by default: FDG's numbers unchanged


@pytest.mark.parametrize('corrector,copies', [('predict', [1, 1, 0]), ('dc', [4, 2, 0]), ('pipemare_lr', [0, 0, 0]),
                                              ('nesterov', [1, 1, 0])])
def test_what_a_corrector_keeps_is_bounded_by_the_schedule_and_logged(corrector, copies, workdir):
  """Stage k's corrector keeps at most (delay + 1) copies of its parameters: predict and nesterov its last
  step, dc the parameters each of its delay forwards in flight met; counted from the state's arrays."""
  result = train_and_evaluate(corrected_config(3, corrector, steps=2), workdir)
  pipeline, lines = result.method.pipeline, result.method.describe(result.state)
  for k, (stage, st) in enumerate(zip(pipeline.stages, result.state.stages)):
    params = sum(x.nbytes for x in jax.tree.leaves(st.params))
    held = sum(x.nbytes for x in jax.tree.leaves(st.corrector))
    assert held == copies[k] * params and copies[k] <= pipeline.schedule.delay(k) + 1
    if k < 2:
      assert f'corrector {corrector}' in lines[k + 1] and f'{copies[k]} cop{"y" if copies[k] == 1 else "ies"} of' in lines[k + 1]


def test_weight_prediction_makes_a_delayed_gradient_exact_on_a_quadratic():
  """f(w) = ½ wᵀHw along a straight path w_t = w_0 + t·Δ (a steady optimizer step): the gradient a stage
  applies s steps late is H w_{t-s}; predicted, the forward meets w_{t-s} + s·Δ = w_t and the gradient is
  exactly H w_t (cosine 1), where the plain delayed one is not."""
  rng = np.random.default_rng(0)
  a = rng.normal(size=(6, 6))
  H, w0, step = a @ a.T + np.eye(6), rng.normal(size=6), rng.normal(size=6)
  s, t = 5, 9
  w = lambda i: jnp.asarray(w0 + i * step, jnp.float32)
  grad = jax.grad(lambda w: 0.5 * w @ jnp.asarray(H, jnp.float32) @ w)
  predictor = Corrector('predict', staleness=s, delay=s + 1)
  predicted = predictor.forward_params({'w': w(t - s)}, {'w': jnp.asarray(step, jnp.float32)})['w']
  cosine = lambda g: float(jnp.dot(g, grad(w(t))) / (jnp.linalg.norm(g) * jnp.linalg.norm(grad(w(t)))))
  assert cosine(grad(predicted)) == pytest.approx(1.0, abs=1e-6)
  assert cosine(grad(w(t - s))) < 0.99
  np.testing.assert_allclose(grad(predicted), grad(w(t)), rtol=1e-5, atol=1e-5)


def assert_diagnostics_finite(folder) -> list[dict]:
  """The run's staleness diagnostics (stage 0's cosine and norm ratio to BP's gradient): present and finite."""
  from jaxdecouple.writers import read_metrics
  records = [r for r in read_metrics(folder) if r['kind'] == 'diagnose' and 'stage0_cosine' in r]
  assert records and all(np.isfinite(r['stage0_cosine']) and np.isfinite(r['stage0_norm_ratio']) for r in records)
  return records


def test_diagnostics_show_prediction_raising_the_cosine(tmp_path):
  """On a smooth start (lr 0.02, a few steps) weight prediction brings stage 0's applied gradient closer to BP's.
  (The diagnostics run with every corrector, changing none of its numbers: the oracle tests above.)"""
  cosines = {}
  for corrector in ('none', 'predict'):
    folder = str(tmp_path / corrector)
    train_and_evaluate(corrected_config(3, corrector, steps=12, **{'pipeline.diagnose_every_steps': 2,
                                                                       'optim.learning_rate': 0.02}), folder)
    cosines[corrector] = np.mean([r['stage0_cosine'] for r in assert_diagnostics_finite(folder)])
  assert cosines['predict'] > cosines['none'], cosines


@pytest.mark.parametrize('overrides,field', [
    ({'method': 'bp', 'pipeline.corrector': 'dc'}, 'pipeline.corrector'),
    ({'method': 'dp', 'pipeline.corrector': 'predict'}, 'pipeline.corrector'),
    ({'method': 'dgl', 'pipeline.corrector': 'nesterov'}, 'pipeline.corrector'),
    ({'method': 'fr', 'pipeline.corrector': 'predict'}, 'pipeline.corrector'),
    ({'method': 'fdg', 'pipeline.corrector': 'magic'}, 'pipeline.corrector'),
    ({'method': 'fdg', 'pipeline.corrector': 'dc', 'pipeline.dc_lambda': -1.0}, 'pipeline.dc_lambda'),
    ({'method': 'fdg', 'pipeline.corrector': 'pipemare_lr', 'pipeline.lr_anneal_epochs': 0.0},
     'pipeline.lr_anneal_epochs'),
    ({'method': 'fdg', 'pipeline.corrector': 'nesterov', 'pipeline.nesterov_gamma': 1.0}, 'pipeline.nesterov_gamma'),
    ({'method': 'fdg', 'pipeline.num_stages': 1, 'pipeline.corrector': 'predict'}, 'pipeline.corrector'),  # no delay
    # another corrector's setting would be ignored without a word
    ({'method': 'fdg', 'pipeline.dc_lambda': 0.1}, 'pipeline.dc_lambda'),
    ({'method': 'fdg', 'pipeline.corrector': 'predict', 'pipeline.lr_anneal_epochs': 3.0}, 'pipeline.lr_anneal_epochs'),
    ({'method': 'adl', 'pipeline.corrector': 'dc', 'pipeline.nesterov_gamma': 0.9}, 'pipeline.nesterov_gamma'),
    ({'method': 'fdg', 'pipeline.corrector': 'nesterov', 'pipeline.nesterov_lr_scale': 0.0},
     'pipeline.nesterov_lr_scale'),
    ({'method': 'fdg', 'pipeline.corrector': 'predict', 'pipeline.nesterov_lr_scale': 10.0},
     'pipeline.nesterov_lr_scale'),
])
def test_bad_corrector_settings_name_the_field(overrides, field):
  with pytest.raises(ConfigError, match=field.replace('.', r'\.')):
    validate(tiny_config(**overrides))
