"""FDG against a sequential reference of its definition, plus the pipeline invariants."""
import jax
import pytest

from conftest import SequentialStages, assert_trees_close, assert_trees_equal, tiny_config
from jaxdecouple.train import train_and_evaluate


def fdg_config(k, steps=12, **kw):
  return tiny_config(method='fdg', max_steps=steps, **{'pipeline.num_stages': k, **kw})


def reference_config(k, beta):
  """lr 0.005: gentle enough that float32 noise stays far below the effect of any semantic change."""
  return fdg_config(k, **{'pipeline.beta': beta, 'optim.learning_rate': 0.005})


def reference_fdg(config, steps, tx=None):
  """FDG written from the SPEC, one stage at a time, with explicit histories.

  Stage k forwards micro-batch t-k at iteration t with its parameters after that iteration's update;
  at iteration t (>= 2K-2-k) it receives the gradient for micro-batch m = t-2K+2+k and recomputes,
  with jax.vjp, that micro-batch's forward from the stored input and the stored parameters the
  forward met; beta multiplies every non-last stage's incoming gradient.
  """
  K, beta = config.pipeline.num_stages, config.pipeline.beta
  ref = SequentialStages(config, tx)
  inputs = [{} for _ in range(K)]        # inputs[k][m]: stage k's input for micro-batch m
  met = [{} for _ in range(K)]           # met[k][m]: the parameters stage k's forward of m used
  deltas = [{} for _ in range(K)]        # deltas[k][m]: gradient w.r.t. stage k's output for m
  labels = {}
  for t in range(steps):
    lr = ref.lr(t)
    inputs[0][t], labels[t] = ref.batch(t)
    for k in range(K):
      if k == K - 1:
        m = t - (K - 1)
        if m < 0:
          continue

        def loss(p, x):
          logits, new = ref.run(k, p, x, ref.stats[k])
          return ref.loss(logits, labels[m]), new
        (gp, gx), ref.stats[k] = jax.grad(loss, argnums=(0, 1), has_aux=True)(ref.params[k], inputs[k][m])
        ref.sgd(k, gp, lr)
        if k > 0:
          deltas[k - 1][m] = gx
        continue
      m = t - 2 * K + 2 + k
      if m >= 0:
        _, vjp = jax.vjp(lambda p, x: ref.run(k, p, x, ref.stats[k])[0], met[k][m], inputs[k][m])
        gp, gx = vjp(beta * deltas[k][m])
        ref.sgd(k, gp, lr)
        if k > 0:
          deltas[k - 1][m] = gx
      m = t - k
      if m >= 0:
        met[k][m] = ref.params[k]
        inputs[k + 1][m], ref.stats[k] = ref.run(k, ref.params[k], inputs[k][m], ref.stats[k])
  return ref.variables()


@pytest.fixture(scope='module')
def fdg_k2(tmp_path_factory):
  """K = 2, beta 0.5: trained once, compared against the reference and against a wrong one."""
  return train_and_evaluate(reference_config(2, beta=0.5), str(tmp_path_factory.mktemp('fdg') / 'run'))


@pytest.mark.parametrize('k', [2, 3, 4])
def test_fdg_matches_the_sequential_reference(k, workdir, request):
  config = reference_config(k, beta=0.5)
  result = request.getfixturevalue('fdg_k2') if k == 2 else train_and_evaluate(config, workdir)
  assert result.step == 12
  assert_trees_close(result.variables, reference_fdg(config, 12), tol=5e-4)


def test_the_comparison_is_sharp(fdg_k2):
  """The tolerance above separates FDG from a reference whose beta differs by only 0.1."""
  result = fdg_k2
  with pytest.raises(AssertionError, match='max error'):
    assert_trees_close(result.variables, reference_fdg(reference_config(2, beta=0.6), 12), tol=5e-4)


def test_k1_equals_bp(workdir, tmp_path):
  fdg = train_and_evaluate(fdg_config(1), workdir)
  bp = train_and_evaluate(tiny_config(max_steps=12), str(tmp_path / 'bp'))
  assert_trees_equal(fdg.variables, bp.variables, rtol=1e-5, atol=1e-6)


def test_saved_forward_and_recompute_give_the_same_parameters(workdir, tmp_path):
  vjp = train_and_evaluate(fdg_config(3, **{'pipeline.keep': 'vjp'}), workdir)
  recompute = train_and_evaluate(fdg_config(3, **{'pipeline.keep': 'recompute'}), str(tmp_path / 'r'))
  assert_trees_equal(vjp.variables, recompute.variables, rtol=1e-5, atol=1e-6)


def test_placement_does_not_change_numbers(tmp_path):
  """DESIGN's invariant: the 4 stages on 1, 2 and 4 devices, the same numbers bit for bit."""
  runs = [train_and_evaluate(fdg_config(4, **{'pipeline.num_devices': n, 'pipeline.beta': 0.7}),
                             str(tmp_path / str(n))) for n in (1, 2, 4)]
  assert [len({str(s.device) for s in r.method.pipeline.stages}) for r in runs] == [1, 2, 4]
  for r in runs[1:]:
    assert_trees_equal(r.variables, runs[0].variables)


def test_stages_live_on_their_devices(workdir):
  result = train_and_evaluate(fdg_config(4, steps=2), workdir)
  for k, stage_state in enumerate(result.state.stages):
    devices = {d for x in jax.tree.leaves(stage_state) for d in x.devices()}
    assert devices == {jax.devices()[k]}


@pytest.mark.parametrize('keep', ['vjp', 'recompute'])
def test_resume_in_a_filling_pipeline_is_exact(keep, workdir, tmp_path):
  """K = 3 fills until iteration 2K-2 = 4; stop at 3 (ring buffers half full), resume, compare."""
  kw = {'pipeline.keep': keep, 'pipeline.beta': 0.5, 'checkpoint_every_steps': 3}
  train_and_evaluate(fdg_config(3, steps=3, **kw), workdir)
  resumed = train_and_evaluate(fdg_config(3, steps=12, **kw), workdir)
  whole = train_and_evaluate(fdg_config(3, steps=12, **kw), str(tmp_path / 'whole'))
  assert_trees_equal(resumed.state, whole.state)


def test_logs_the_split_devices_and_delays(workdir):
  result = train_and_evaluate(fdg_config(3, steps=1), workdir)
  lines = result.method.describe(result.state)
  assert 'into 3 stages' in lines[0]
  assert 'delay 4' in lines[1] and 'delay 2' in lines[2] and 'delay 0' in lines[3]
  devices = jax.devices()  # named as jax names them (cpu:0 here; TFRT_CPU_0 with jax 0.7)
  assert f'on {devices[0]}:' in lines[1] and f'on {devices[2]}:' in lines[3] and 'MB/step' in lines[1]
  # then the schedule as a table: stage 0 back-propagates micro-batch 0 at iteration 4 and updates
  table = [line.split() for line in lines if line.strip().startswith('stage 0 F0')]
  assert table and table[0][2:7] == ['F0', 'F1', 'F2', 'F3', 'F4B0*']
  # what each delayed stage keeps for its forwards in flight, counted from its state's arrays: stage 0 holds 4
  # slots (its delay) of residuals, stage 1 holds 2, the last none
  for k, slots in ((0, 4), (1, 2)):
    st = result.state.stages[k]
    assert len(st.ring) == slots
    kept = sum(x.nbytes for x in jax.tree.leaves(st.ring)) / 1e6
    assert f'keeps {kept:.1f} MB for the {slots} forwards in flight (vjp: their residuals)' in lines[1 + k]
  assert 'forwards in flight' not in lines[3]


def test_profile_records_stage_times_and_traffic(workdir):
  from jaxdecouple.writers import read_metrics
  result = train_and_evaluate(fdg_config(2, steps=8, profile_every_steps=4), workdir)
  profiles = [r for r in read_metrics(workdir) if r['kind'] == 'profile']
  assert [p['step'] for p in profiles] == [4, 8]
  for p in profiles:
    assert p['stage0_seconds'] > 0 and p['stage1_seconds'] > 0
    # ResNet-8 stage 0 ends with 16 channels at 32x32: activation up + gradient down, plus labels.
    batch = result.method.setup.config.batch_size
    expected = (batch * 32 * 32 * 16 * 4 * 2 + batch * 4) / 1e6
    assert p['stage0_sends_mb'] == pytest.approx(expected, rel=1e-3)
  assert result.step == 8


@pytest.mark.parametrize('method,kw', [('fdg', {'pipeline.split': 's1b1', 'pipeline.num_stages': 2}),
                                       ('fdg', {'pipeline.num_stages': 3, 'pipeline.keep': 'recompute'})])
def test_scanned_blocks_train_like_unrolled_ones(method, kw, tmp_path):
  """ResNet-20 with its runs of identical blocks scanned (config.scan_blocks=2; the first split cuts inside
  the run s1b0..s1b2) trains to the unrolled run's parameters; the first case also resumes exactly. (BP's
  whole-model gradient through scanned runs: tests/test_models.py::test_scanned_runs_give_the_unrolled_numbers.)"""
  from jaxdecouple.models import relayout
  resume = kw.get('pipeline.split') == 's1b1'
  config = lambda steps, scan: tiny_config(method=method, model='resnet20', max_steps=steps, scan_blocks=scan,
                                           batch_size=8, **{'optim.learning_rate': 0.005,
                                                            'checkpoint_every_steps': 2, **kw})
  plain = train_and_evaluate(config(4, 0), str(tmp_path / 'plain'))
  if resume:
    train_and_evaluate(config(2, 2), str(tmp_path / 'scan'))
  scanned = train_and_evaluate(config(4, 2), str(tmp_path / 'scan'))  # resumed at step 2 in the first case
  assert 's1b0..s1b2' in scanned.variables['params']
  assert_trees_close(relayout([scanned.variables], plain.method.setup.model.chain, (1, 32, 32, 3)),
                     plain.variables, tol=5e-4)
  if resume:
    whole = train_and_evaluate(config(4, 2), str(tmp_path / 'whole'))
    assert_trees_equal(scanned.state, whole.state)
