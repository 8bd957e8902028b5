"""ADL against a sequential reference of its definition; M = 1 is FDG; exact resume mid-accumulation."""
import jax
import jax.numpy as jnp
import optax
import pytest

from conftest import SequentialStages, assert_trees_close, assert_trees_equal, tiny_config
from jaxdecouple.errors import ConfigError
from jaxdecouple.train import train_and_evaluate


def adl_config(k, m, mode='B', steps=12, **kw):
  return tiny_config(method='adl', max_steps=steps,
                     **{'pipeline.num_stages': k, 'pipeline.accumulation': m, 'pipeline.adl_mode': mode,
                        'pipeline.beta': 0.5, 'optim.learning_rate': 0.005, **kw})


def reference_adl(config, steps, mode=None, predict=None, last_waits=True):
  """ADL written from the SPEC, one stage at a time, with explicit histories and counters.

  The schedule is FDG's: at iteration t stage k < K-1 back-propagates micro-batch t-2K+2+k (through
  that forward as it was: stored input, stored parameters, fresh jax.vjp; beta on the incoming
  gradient) and forwards micro-batch t-k; the last stage trains on micro-batch t-K+1. Every stage
  adds each parameter gradient to its accumulator and counts them from its first; when the count
  since its last step reaches M it takes one SGD step with the sum at the learning rate of that
  iteration. The last stage steps only in an iteration in which stage K-2 back-propagates (the ADL code's
  ``receive_grad``): mode A's step closes its iteration; mode B's, which the code takes at the start of the
  next iteration, is taken here at the end of this one when stage K-2 back-propagates in that next one. Mode B:
  the step comes before the forward of the new micro-batch; mode A: after it. ``predict`` ({stage: s}): weight
  prediction, the forward (and the backward through it) at W + s * Δ, Δ the stage's last step.
  ``last_waits=False``: the last stage steps whenever its count reaches M (a wrong reference, for sharpness).
  """
  K, beta, M = config.pipeline.num_stages, config.pipeline.beta, config.pipeline.accumulation
  mode = mode or config.pipeline.adl_mode
  ref = SequentialStages(config)
  inputs, met, deltas = [{} for _ in range(K)], [{} for _ in range(K)], [{} for _ in range(K)]
  labels, acc, count = {}, [None] * K, [0] * K
  last_step = [jax.tree.map(jnp.zeros_like, p) for p in ref.params]

  def accumulate(k, grads, lr, may_step=True):
    acc[k] = grads if acc[k] is None else jax.tree.map(jnp.add, acc[k], grads)
    count[k] += 1
    if count[k] >= M and may_step:
      before = ref.params[k]
      ref.sgd(k, acc[k], lr)
      last_step[k] = jax.tree.map(jnp.subtract, ref.params[k], before)
      acc[k], count[k] = None, 0

  for t in range(steps):
    lr = ref.lr(t)
    inputs[0][t], labels[t] = ref.batch(t)
    for k in range(K - 1):
      def forward():
        if t - k >= 0:
          s = (predict or {}).get(k, 0.0)
          met[k][t - k] = jax.tree.map(lambda w, d: w + s * d, ref.params[k], last_step[k])
          inputs[k + 1][t - k], ref.stats[k] = ref.run(k, met[k][t - k], inputs[k][t - k], ref.stats[k])
      if mode == 'A':
        forward()
      m = t - 2 * K + 2 + k
      if m >= 0:
        _, vjp = jax.vjp(lambda p, x: ref.run(k, p, x, ref.stats[k])[0], met[k][m], inputs[k][m])
        gp, gx = vjp(beta * deltas[k][m])
        if k > 0:
          deltas[k - 1][m] = gx
        accumulate(k, gp, lr)
      if mode == 'B':
        forward()
    m = t - (K - 1)
    if m >= 0:
      def loss(p, x):
        logits, new = ref.run(K - 1, p, x, ref.stats[K - 1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels[m]).mean(), new
      (gp, gx), ref.stats[K - 1] = jax.grad(loss, argnums=(0, 1), has_aux=True)(
          ref.params[K - 1], inputs[K - 1][m])
      if K > 1:
        deltas[K - 2][m] = gx
      second_last_backprops = lambda i: i - 2 * K + 2 + (K - 2) >= 0  # stage K-2's micro-batch at iteration i
      accumulate(K - 1, gp, lr, may_step=K == 1 or not last_waits or second_last_backprops(t if mode == 'A' else t + 1))
  return ref.variables()


@pytest.fixture(scope='module')
def adl_2_2_b(tmp_path_factory):
  """K = 2, M = 2, mode B: trained once, compared against the reference and against the wrong ones."""
  return train_and_evaluate(adl_config(2, 2, 'B'), str(tmp_path_factory.mktemp('adl') / 'run'))


@pytest.mark.parametrize('k,m,mode', [(1, 2, 'B'), (2, 2, 'B'), (3, 2, 'B'), (3, 3, 'A'), (2, 1, 'A'), (3, 1, 'A')])
def test_adl_matches_the_sequential_reference(k, m, mode, workdir, request):
  config = adl_config(k, m, mode)
  if (k, m, mode) == (2, 2, 'B'):
    result = request.getfixturevalue('adl_2_2_b')
  else:
    result = train_and_evaluate(config, workdir)
  assert result.step == 12
  assert_trees_close(result.variables, reference_adl(config, 12), tol=5e-4)
  if m == 1 and mode == 'A':  # sharp: the last stage's wait (one step fewer, at iteration K) is seen
    with pytest.raises(AssertionError, match='max error'):
      assert_trees_close(result.variables, reference_adl(config, 12, last_waits=False), tol=5e-4)


def test_the_comparison_is_sharp(adl_2_2_b):
  """Mode A and mode B (and M = 2 against M = 1) are told apart by the tolerance above."""
  result, config = adl_2_2_b, adl_config(2, 2, 'B')
  with pytest.raises(AssertionError, match='max error'):
    assert_trees_close(result.variables, reference_adl(config, 12, mode='A'), tol=5e-4)
  with pytest.raises(AssertionError, match='max error'):
    assert_trees_close(result.variables, reference_adl(adl_config(2, 1, 'B'), 12), tol=5e-4)


def test_m1_equals_fdg(workdir, tmp_path):
  adl = train_and_evaluate(adl_config(3, 1), workdir)
  fdg = train_and_evaluate(tiny_config(method='fdg', max_steps=12, **{
      'pipeline.num_stages': 3, 'pipeline.beta': 0.5, 'optim.learning_rate': 0.005}), str(tmp_path / 'f'))
  assert_trees_equal(adl.state, fdg.state)


def test_resume_mid_accumulation_is_exact(workdir, tmp_path):
  """K = 3, M = 4, stopped after iteration 4, when every stage holds a partial sum of gradients (not zero), and
  resumed to 12: the state of 12 uninterrupted steps, bit for bit."""
  kw = {'checkpoint_every_steps': 5, 'pipeline.keep': 'recompute'}
  stopped = train_and_evaluate(adl_config(3, 4, steps=5, **kw), workdir)
  assert all(float(jnp.abs(leaf).max()) > 0 for s in stopped.state.stages
             for leaf in jax.tree.leaves(s.accum)[:1])
  resumed = train_and_evaluate(adl_config(3, 4, steps=12, **kw), workdir)
  whole = train_and_evaluate(adl_config(3, 4, steps=12, **kw), str(tmp_path / 'whole'))
  assert_trees_equal(resumed.state, whole.state)


def test_logs_staleness_in_updates(workdir):
  result = train_and_evaluate(adl_config(3, 2, steps=1), workdir)
  lines = result.method.describe(result.state)
  assert 'accumulating 2 backwards per update' in lines[0]
  # Mode B, delay 4 and 2 with M = 2: 1.5 and 0.5 steps between a forward and the step its gradient
  # enters (FDG's would be 3 and 1); the last stage is never stale.
  assert 'delay 4, staleness 1.50 updates, first update at iteration 5' in lines[1]
  assert 'delay 2, staleness 0.50 updates, first update at iteration 4' in lines[2]
  assert 'delay 0, staleness 0.00 updates, first update at iteration 3' in lines[3]
  assert 'MB/step to stage 1' in lines[1] and 'nothing crosses' not in lines[1]  # a device per stage here


@pytest.mark.parametrize('overrides,field', [
    ({'method': 'adl', 'pipeline.accumulation': 0}, 'pipeline.accumulation'),
    ({'method': 'adl', 'pipeline.adl_mode': 'C'}, 'pipeline.adl_mode'),
    ({'method': 'fdg', 'pipeline.accumulation': 2}, 'pipeline.accumulation'),
    ({'method': 'ddg', 'pipeline.adl_mode': 'A'}, 'pipeline.adl_mode'),
])
def test_bad_accumulation_settings_are_refused(overrides, field, workdir):
  with pytest.raises(ConfigError, match=field.replace('.', r'\.')):
    train_and_evaluate(tiny_config(**overrides), workdir)


def test_adl_with_weight_prediction_matches_its_definition(workdir):
  """ADL's accumulation makes a stage's staleness a fraction: K = 2, M = 2, mode B, stage 0 forwards micro-batch m
  at iteration m after any step there, its gradient arrives at m + 2, and it steps at iterations 3, 5, 7, ...
  (every second backward from its first, at 2): m even enters the step at m + 3 with the step at m + 1 between,
  m odd the step at m + 2 with none between, so s = (1 + 0) / 2 = 0.5 steps. The run equals the reference
  extrapolating over 0.5 steps, and not over 1.5."""
  config = adl_config(2, 2, 'B', **{'pipeline.corrector': 'predict'})
  result = train_and_evaluate(config, workdir)
  assert_trees_close(result.variables, reference_adl(config, 12, predict={0: 0.5}), tol=5e-4)
  with pytest.raises(AssertionError, match='max error'):
    assert_trees_close(result.variables, reference_adl(config, 12, predict={0: 1.5}), tol=5e-4)
