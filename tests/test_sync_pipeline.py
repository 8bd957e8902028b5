"""Synchronous pipelines (GPipe, 1F1B, ZB-H1): each stage's order against tables written by hand from the
papers' pictures, the unit-time spans and memory the papers state, and whole runs against a sequential
reference of back-propagation with the gradient accumulated over M micro-batches."""
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from conftest import SequentialStages, assert_trees_close, assert_trees_equal, tiny_config
from jaxdecouple.errors import ConfigError
from jaxdecouple.methods import validate
from jaxdecouple.pipeline.sync_schedule import SyncSchedule
from jaxdecouple.plots import plot_timeline, timelines
from jaxdecouple.train import train_and_evaluate
from jaxdecouple.writers import read_metrics

# --- the schedules ------------------------------------------------------------------------------------

# Each stage's passes, read off the papers' figures (GPipe Figure 2c; PipeDream-Flush / Megatron's 1F1B
# Figure; ZB-H1 Figure 3 top: W of a micro-batch k backwards after its B at stage k).
HAND = {
    ('gpipe', 3, 4): ['F0 F1 F2 F3 B0 B1 B2 B3'] * 3,
    ('1f1b', 4, 8): ['F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7',
                     'F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7',
                     'F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7',
                     'F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7'],
    ('1f1b', 3, 2): ['F0 F1 B0 B1', 'F0 F1 B0 B1', 'F0 B0 F1 B1'],  # fewer micro-batches than warm-up
    ('zb_h1', 3, 4): ['F0 F1 F2 B0 W0 F3 B1 W1 B2 W2 B3 W3',
                      'F0 F1 B0 F2 B1 W0 F3 B2 W1 B3 W2 W3',
                      'F0 B0 F1 B1 F2 B2 W0 F3 B3 W1 W2 W3'],
}
# 1F1B, K = 2, M = 3 in unit time (F = 1, a backward 2): the picture itself
GRID_1F1B_2_3 = ['F0 F1 .  .  B0 B0 F2 B1 B1 .  B2 B2',
                 '.  F0 B0 B0 F1 B1 B1 F2 B2 B2 .  .']


def test_packing_gives_back_every_leaf_exactly():
  """A stage's passes hand over its parameters, statistics, gradient sum and residuals packed, one buffer per
  dtype (sync_engine.Packing): unpacked they are the leaves, bit for bit and in their dtypes (an int32 index
  above 2**24 and a bool mask included, which one float buffer would round), with the tree's structure."""
  from jaxdecouple.pipeline.sync_engine import Packing
  rng = np.random.default_rng(0)
  tree = {'w': rng.normal(size=(3, 4)).astype(np.float32), 'i': np.array([2**24 + 1, -7], np.int32),
          'b': {'m': rng.normal(size=(5,)) > 0, 's': np.float32(1.5), 'h': rng.normal(size=(2, 2)).astype(jnp.bfloat16)},
          'v': rng.normal(size=(7,)).astype(np.float32)}
  packing = Packing()
  buffers = jax.jit(packing.pack)(tree)
  # in the order of the leaves (b.h, b.m, b.s, i, v, w): a dtype's buffer holds its leaves end to end
  assert [b.dtype for b in buffers] == [jnp.bfloat16, np.dtype(np.bool_), np.float32, np.int32]
  assert [b.size for b in buffers] == [4, 5, 1 + 7 + 12, 2]
  assert_trees_equal(jax.jit(packing.unpack)(buffers), tree)
  assert jax.tree.structure(packing.unpack(buffers)) == jax.tree.structure(tree)


@pytest.mark.parametrize('kind,k,m', list(HAND))
def test_each_stage_runs_the_papers_order(kind, k, m):
  s = SyncSchedule(kind, k, m)
  assert [' '.join(f'{p}{i}' for p, i in s.order(stage)) for stage in range(k)] == HAND[kind, k, m]


def test_the_timeline_is_the_papers_picture():
  rows = SyncSchedule('1f1b', 2, 3).table().splitlines()
  assert [r.split('  ', 1)[1].split() for r in rows] == [g.split() for g in GRID_1F1B_2_3]


@pytest.mark.parametrize('kind', ['gpipe', '1f1b', 'zb_h1'])
def test_spans_and_memory_are_the_papers(kind):
  """Unit-time span: GPipe and 1F1B 3(M + K - 1) (bubble (K-1)/(M+K-1)); ZB-H1 3M + K - 1 for M >= K
  (the paper's bubble (K-1)(T_F + T_B - T_W), a third of 1F1B's). Micro-batches held at once: GPipe M,
  1F1B min(K - k, M), ZB-H1 min(K, M). Every pass once, after the passes it needs."""
  for K in (1, 2, 3, 4):
    for M in (1, 2, 3, 4, 8):
      s = SyncSchedule(kind, K, M)
      if kind != 'zb_h1':
        assert s.span == 3 * (M + K - 1) and s.bubble_model() == pytest.approx((K - 1) / (M + K - 1))
      elif M >= K:
        assert s.span == 3 * M + K - 1 and s.bubble_model() == pytest.approx((K - 1) / (3 * M + K - 1))
      want = {'gpipe': [M] * K, '1f1b': [min(K - k, M) for k in range(K)], 'zb_h1': [min(K, M)] * K}[kind]
      assert [s.held(k) for k in range(K)] == want
      passes = 'FBW' if kind == 'zb_h1' else 'FB'
      for k in range(K):
        assert sorted(s.order(k)) == sorted((p, m) for p in passes for m in range(M))
      seen = set()
      for k, (p, m) in s.dispatch_order():
        need = {'F': (k - 1, ('F', m)) if k else None, 'B': (k + 1, ('B', m)) if k < K - 1 else None,
                'W': (k, ('B', m))}[p]
        assert need is None or need in seen, (kind, K, M, k, p, m)
        seen.add((k, (p, m)))


def test_the_bubble_model_at_k4_m8():
  """Figures quoted in the docs: 1F1B's 3/11 and ZB-H1's 3/27 at K = 4, M = 8."""
  assert SyncSchedule('1f1b', 4, 8).bubble_model() == pytest.approx(3 / 11)
  assert SyncSchedule('zb_h1', 4, 8).bubble_model() == pytest.approx(3 / 27)


# --- whole runs against back-propagation with accumulation ---------------------------------------------

def sync_config(kind, k=2, m=4, steps=3, **kw):
  return tiny_config(method=kind, max_steps=steps, **{'pipeline.num_stages': k, 'pipeline.micro_batches': m,
                                                      'optim.learning_rate': 0.02, **kw})


def reference_accumulated_bp(config, steps, losses=None):
  """BP written out: each step's batch cut into M micro-batches; each micro-batch forwarded through the
  stages in order (every stage's BatchNorm statistics moving once per micro-batch) and back-propagated
  from its mean loss; the parameter gradients summed over the micro-batches, divided by M, one SGD step.
  ``losses``: a list that receives each step's mean of its micro-batches' losses (what the step logs)."""
  M = config.pipeline.micro_batches
  ref = SequentialStages(config)
  K = len(ref.params)

  def loss(params, x, labels, stats):
    new = []
    for k in range(K):
      x, s = ref.run(k, params[k], x, stats[k])
      new.append(s)
    return optax.softmax_cross_entropy_with_integer_labels(x, labels).mean(), new
  for t in range(steps):
    images, labels = ref.batch(t)
    total, step_losses = None, []
    for x, y in zip(np.split(np.asarray(images), M), np.split(np.asarray(labels), M)):
      (value, ref.stats), grads = jax.value_and_grad(loss, has_aux=True)(ref.params, x, y, ref.stats)
      total = grads if total is None else jax.tree.map(np.add, total, grads)
      step_losses.append(float(value))
    if losses is not None:
      losses.append(np.mean(step_losses))
    for k in range(K):
      ref.sgd(k, jax.tree.map(lambda g: g / M, total[k]), ref.lr(t))
  return ref.variables()


@pytest.mark.parametrize('kind,k,m,devices', [('gpipe', 2, 4, 0), ('1f1b', 3, 4, 0), ('zb_h1', 3, 2, 1)])
def test_synchronous_schedules_equal_accumulated_bp(kind, k, m, devices, workdir, monkeypatch):
  """With the residuals handed from F to B packed, as on a GPU (``sync_engine.PACK_RESIDUALS_ON``; the other
  runs of this file keep XLA:CPU's default, leaf by leaf). And the residuals the driver really held at once
  are the schedule's count (GPipe M, 1F1B K - k, ZB-H1 K, at most M); the last step is profiled: its measured
  timeline has every stage's passes in the schedule's order, and where the stages share one device (ZB-H1
  here) no two passes overlap in time, so the measured bubble is at least 1 - 1/K."""
  from jaxdecouple.pipeline import sync_engine
  monkeypatch.setattr(sync_engine, 'PACK_RESIDUALS_ON', (*sync_engine.PACK_RESIDUALS_ON, 'cpu'))
  config = sync_config(kind, k, m, profile_every_steps=3, log_every_steps=1, **{'pipeline.num_devices': devices})
  result = train_and_evaluate(config, workdir)
  assert all(stage.packs_residuals for stage in result.method.pipeline.stages)
  losses = []
  reference = reference_accumulated_bp(config, 3, losses)
  assert_trees_close(result.variables, reference, tol=5e-4)
  # what an iteration logs (averaged in one compiled call with the learning rate): its micro-batches' mean loss
  logged = [r for r in read_metrics(workdir) if r['kind'] == 'train']
  assert [r['step'] for r in logged] == [2, 3]
  for r in logged:
    assert r['train_loss'] == pytest.approx(losses[r['step'] - 1], rel=1e-4)
    assert r['learning_rate'] == pytest.approx(0.02)
  with pytest.raises(AssertionError, match='max error'):  # sharp: one micro-batch (plain BP) differs through BatchNorm
    assert_trees_close(result.variables, reference_accumulated_bp(sync_config(kind, k, 1), 3), tol=5e-4)
  s = result.method.pipeline.schedule
  assert result.method.pipeline.held == [s.held(stage) for stage in range(k)]
  passes = timelines(workdir)[3]
  for stage in range(k):
    want = [f'{p}{i}' for p, i in s.order(stage) if not (p == 'B' and stage == 0 and s.splits_backward)]
    assert [p['label'] for p in passes if p['stage'] == stage] == want + ['update']
  assert all(p['end'] >= p['start'] >= 0 and p['end'] >= p['dispatched'] >= 0 for p in passes)
  profile = [r for r in read_metrics(workdir) if r['kind'] == 'profile'][-1]
  assert 0 <= profile['bubble_measured'] < 1 and profile['bubble_model'] == round(s.bubble_model(), 4)
  assert 0 <= profile['host_share'] <= 1
  assert profile[f'stage{k - 1}_held_microbatches'] == s.held(k - 1)
  if devices == 1:
    ordered = sorted(passes, key=lambda p: (p['start'], p['end']))  # a call that took no time first
    assert all(a['end'] <= b['start'] + 1e-6 for a, b in zip(ordered, ordered[1:]))
    assert profile['bubble_measured'] >= 1 - 1 / k - 0.01
  plot_timeline(workdir, path=workdir + '_timeline.png')
  assert os.path.getsize(workdir + '_timeline.png') > 0
  # the bytes each boundary carries an iteration: every micro-batch's activations up and gradients down (float32,
  # the reference's stage outputs), and the labels once (they go from stage 0's device to the last stage's)
  ref = SequentialStages(config)
  x = np.split(np.asarray(ref.batch(0)[0], np.float32), m)[0]
  micro = x.shape[0]
  for stage in range(k - 1):
    x, _ = ref.run(stage, ref.params[stage], x, ref.stats[stage])
    assert result.method.pipeline.message_bytes[stage] == m * (2 * x.size * 4 + (micro * 4 if stage == 0 else 0))
  # the start-up lines say where stages share their devices, so that nothing crosses between them
  sends = [line for line in result.method.describe(result.state) if 'MB per iteration to and from' in line]
  assert len(sends) == k - 1 and all(('nothing crosses' in line) == (devices == 1) for line in sends), sends


def test_one_micro_batch_is_bp(workdir, tmp_path):
  """K = 2, M = 1 and K = 1 (any schedule): back-propagation's numbers (the residuals leaf by leaf, XLA:CPU's
  default)."""
  bp = train_and_evaluate(tiny_config(max_steps=3, **{'optim.learning_rate': 0.02}), str(tmp_path / 'bp'))
  for kind, k in (('1f1b', 2), ('gpipe', 1)):
    run = train_and_evaluate(sync_config(kind, k, 1), str(tmp_path / kind))
    assert_trees_equal(run.variables, bp.variables, rtol=1e-5, atol=1e-6)


def test_a_resumed_run_is_exact(workdir):
  """Nothing is in flight between iterations: stopped after step 2 and resumed, the run equals 4 steps."""
  whole = train_and_evaluate(sync_config('zb_h1', steps=4), workdir + '_whole')
  train_and_evaluate(sync_config('zb_h1', steps=2), workdir)
  resumed = train_and_evaluate(sync_config('zb_h1', steps=4), workdir)
  assert resumed.step == 4
  assert_trees_equal(resumed.variables, whole.variables)


def test_data_parallel_stages_give_one_devices_numbers(tmp_path):
  """K = 2 x D = 2 on 4 devices: each micro-batch split over its stage's 2 devices (BatchNorm's statistics and
  the gradients summed over them by the all-reduces XLA inserts) trains to the numbers of D = 1 and of the
  sequential reference; every stage's state lives replicated on its own 2 devices, and what a stage holds
  is counted per device (less than D = 1's, at least half)."""
  one = train_and_evaluate(sync_config('1f1b', steps=3, profile_every_steps=3), str(tmp_path / 'd1'))
  two = train_and_evaluate(sync_config('1f1b', steps=3, profile_every_steps=3, **{'pipeline.data_parallel': 2}),
                           str(tmp_path / 'd2'))
  assert_trees_close(two.variables, one.variables, tol=5e-4)
  assert_trees_close(two.variables, reference_accumulated_bp(sync_config('1f1b'), 3), tol=5e-4)
  devices = jax.devices()
  for k, st in enumerate(two.state.stages):
    for leaf in jax.tree.leaves(st.params):
      assert leaf.devices() == set(devices[2 * k:2 * k + 2])
  assert two.method.pipeline.held == one.method.pipeline.held
  # per device: the split activations' half, plus what XLA keeps whole on both (parameters the vjp holds)
  assert all(b1 / 2 <= b2 < b1 for b1, b2 in zip(one.method.pipeline.held_bytes, two.method.pipeline.held_bytes))
  # the all-reduces XLA compiled into the passes, per stage and iteration: in each of the M backwards the
  # stage's weight gradient and 2 floats per BatchNorm channel, in each forward BatchNorm's 2 batch statistics
  # per channel (as many bytes as its running statistics), at the last stage also the mean loss and accuracy
  M = 4
  for k, st in enumerate(two.state.stages):
    params = sum(x.nbytes for x in jax.tree.leaves(st.params))
    stats = sum(x.nbytes for x in jax.tree.leaves(st.batch_stats))
    assert two.method.pipeline.allreduce_bytes[k] == M * (params + 2 * stats) + (8 * M if k == 1 else 0)
  profile = [r for r in read_metrics(str(tmp_path / 'd2')) if r['kind'] == 'profile'][-1]
  assert profile['stage1_allreduce_mb'] == round(two.method.pipeline.allreduce_bytes[1] / 1e6, 4)
  assert one.method.pipeline.allreduce_bytes is None  # one device per stage: nothing to reduce


@pytest.mark.parametrize('kind', ['gpipe', 'zb_h1'])
def test_data_parallel_stages_of_gpipe_and_zb_h1(kind, tmp_path):
  """GPipe's and ZB-H1's orders with each stage split over 2 devices (K = 2 x D = 2 on 4 devices) train to the
  sequential reference's numbers too, every stage's parameters on its own 2 devices (1F1B's test above holds the
  rest: the same driver, bytes and memory)."""
  two = train_and_evaluate(sync_config(kind, **{'pipeline.data_parallel': 2}), str(tmp_path / 'd2'))
  assert_trees_close(two.variables, reference_accumulated_bp(sync_config(kind), 3), tol=5e-4)
  devices = jax.devices()
  for k, st in enumerate(two.state.stages):
    for leaf in jax.tree.leaves(st.params):
      assert leaf.devices() == set(devices[2 * k:2 * k + 2])


@pytest.mark.parametrize('method,extra', [('fdg', {'pipeline.keep': 'recompute', 'pipeline.corrector': 'predict'}),
                                          ('ddg', {}), ('fr', {}), ('dgl', {})])
def test_data_parallel_stages_of_the_asynchronous_methods(method, extra, tmp_path):
  """The asynchronous pipelines split each stage over 2 devices too (K = 2 x D = 2): the numbers of one device
  per stage, every stage's state on its own 2 devices. DGL too, its auxiliary heads' BatchNorm over the whole
  batch (it was refused for being 1e-6 apart after one step where FDG was 0, but FDG's first step updates
  nothing yet). The two differ by float rounding of the sharded sums, which training amplifies about 2x a step:
  the worst leaf's error relative to its scale after 1, 2, 3, 4 and 6 steps of FR was 2.8e-5, 5.4e-5, 8.5e-5,
  1.6e-4 and 5.8e-4 on an Intel Xeon host (2026-11-26; DDG and FDG alike), so 6 steps crossed the tolerance
  there while passing on an AMD EPYC. 4 steps keep every stage updating (FR's and DDG's stage 0 from step 2)
  with a margin of 3; a semantic difference is far larger (BatchNorm statistics of half the batch, GPipe
  at M = 2 against M = 1 for 4 steps: the worst leaf 0.66 of its scale apart)."""
  kw = dict(method=method, max_steps=4, **{'pipeline.num_stages': 2, 'optim.learning_rate': 0.02, **extra})
  one = train_and_evaluate(tiny_config(**kw), str(tmp_path / 'd1'))
  two = train_and_evaluate(tiny_config(**kw, **{'pipeline.data_parallel': 2}), str(tmp_path / 'd2'))
  assert_trees_close(two.variables, one.variables, tol=5e-4)
  for k, st in enumerate(two.state.stages):
    assert jax.tree.leaves(st.params)[0].devices() == set(jax.devices()[2 * k:2 * k + 2])


@pytest.mark.parametrize('overrides,field', [
    ({'pipeline.micro_batches': 3}, 'pipeline.micro_batches'),  # batch 32
    ({'pipeline.micro_batches': 0}, 'pipeline.micro_batches'),
    ({'pipeline.beta': 0.5}, 'pipeline.beta'),
    ({'pipeline.corrector': 'dc'}, 'pipeline.corrector'),
    ({'pipeline.keep': 'recompute'}, 'pipeline.keep'),
    ({'pipeline.diagnose_every_steps': 5}, 'pipeline.diagnose_every_steps'),
    ({'pipeline.data_parallel': 3}, 'pipeline.data_parallel'),  # micro-batches of 8
    ({'pipeline.data_parallel': 0}, 'pipeline.data_parallel'),
    ({'pipeline.data_parallel': 2, 'pipeline.num_devices': 2}, 'pipeline.num_devices'),
])
def test_bad_synchronous_settings_stop_with_one_line(overrides, field):
  with pytest.raises(ConfigError, match=f'^config.{field}: '):
    validate(sync_config('1f1b', **overrides))


def test_more_stages_times_devices_than_present_stop_before_compute(workdir):
  with pytest.raises(ConfigError, match=r'^config.pipeline.data_parallel: 2 stages x 4 devices = 8 devices, but only 4'):
    train_and_evaluate(sync_config('gpipe', **{'pipeline.data_parallel': 4}), workdir)
  with pytest.raises(ConfigError, match=r'^config.pipeline.data_parallel: 2 devices per stage do not divide the batch'):
    validate(tiny_config(method='fdg', batch_size=31, **{'pipeline.data_parallel': 2}))
