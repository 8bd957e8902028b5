"""Models: parameter counts, and that stages cut at any boundary compose back into the whole model."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import assert_trees_equal
from jaxdecouple.models import build_model, count_params, merge, subset

# The SPEC's counts (the FDG README's 0.46M for ResNet-56 is wrong: it has 0.85M).
PAPER_COUNTS = {'resnet20': 0.27e6, 'resnet56': 0.85e6, 'resnet110': 1.7e6, 'resnet18': 11.2e6,
                'wrn28_10': 36.5e6, 'preact101': 41.4e6}


@pytest.mark.parametrize('name', sorted(PAPER_COUNTS))
def test_parameter_counts_match_the_papers(name):
  model = build_model(name, 100 if name == 'preact101' else 10)
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, 32, 32, 3))))
  assert abs(count_params(shapes['params']) / PAPER_COUNTS[name] - 1) < 0.02


# torchvision's counts (1000 classes), and ResIST's pre-activation ResNet-101 with the ImageNet stem.
IMAGENET_COUNTS = {'imagenet_resnet18': 11_689_512, 'imagenet_resnet34': 21_797_672,
                   'imagenet_resnet50': 25_557_032, 'imagenet_resnet101': 44_549_160,
                   'imagenet_resnet152': 60_192_808, 'imagenet_preact101': 41_867_304}


@pytest.mark.parametrize('name', sorted(IMAGENET_COUNTS))
def test_imagenet_resnets_have_torchvisions_parameter_counts(name):
  model = build_model(name, 1000)
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, 224, 224, 3))))
  assert count_params(shapes['params']) == IMAGENET_COUNTS[name]
  out = jax.eval_shape(lambda v, x: model.apply(v, x, train=False)[0], shapes, jnp.zeros((2, 224, 224, 3)))
  assert out.shape == (2, 1000)


def test_imagenet_resnets_are_cut_and_partitioned_like_the_cifar_ones():
  """The stem's 7x7 convolution and max-pool take 224 pixels to 56; stages cut anywhere compose (the test
  below, on a small input); ResIST partitions the third section's blocks after its first."""
  from jaxdecouple.pipeline.splits import choose_split
  from jaxdecouple.replica.partition import partitioned_blocks
  model = build_model('imagenet_resnet50', 1000)
  stem = jax.eval_shape(lambda: model.chain.modules[0].init_with_output(
      jax.random.key(0), jnp.zeros((1, 224, 224, 3)), train=False)[0])
  assert stem.shape == (1, 56, 56, 64)
  assert len(model.block_names) == 18 and model.block_names[1:5] == ('s1b0', 's1b1', 's1b2', 's2b0')
  split = choose_split(build_model('imagenet_resnet18', 10), 2, 'balanced', (64, 64, 3))
  assert len(split.boundaries) == 1
  assert partitioned_blocks(build_model('imagenet_preact101', 1000)) == tuple(f's3b{i}' for i in range(1, 23))


@pytest.mark.parametrize('name,depth', [('resnet20', 9), ('resnet110', 54), ('resnet18', 8),
                                        ('wrn28_10', 12), ('preact101', 33)])
def test_block_lists(name, depth):
  model = build_model(name, 10)
  assert model.block_names[0] == 'stem' and model.block_names[-1] == 'head'
  assert len(model.block_names) == depth + 2
  assert len(model.sections) == depth


def test_unknown_model_names_the_allowed_ones():
  with pytest.raises(ValueError, match='resnet18'):
    build_model('resnet7', 10)


@pytest.mark.parametrize('name,boundaries', [('resnet20', [1]), ('resnet20', [4, 7, 10]),
                                             ('preact_tiny', [3, 9]), ('resnet8', [1, 2, 3, 4]),
                                             ('imagenet_resnet18', [3, 7])])
def test_stages_compose_to_the_whole_model(name, boundaries):
  model = build_model(name, 10)
  x = jax.random.normal(jax.random.key(1), (4, 32, 32, 3))
  variables = model.init(jax.random.key(0), x)
  for train in (True, False):
    whole, whole_stats = model.apply(variables, x, train=train)
    h, stats = x, []
    for stage in model.cut(boundaries):
      h, s = stage.apply(subset(variables, stage.names), h, train=train)
      stats.append({'batch_stats': s})
    np.testing.assert_array_equal(np.asarray(h), np.asarray(whole))
    assert_trees_equal(merge(stats)['batch_stats'], whole_stats)
  parts = [subset(variables, stage.names) for stage in model.cut(boundaries)]
  assert_trees_equal(merge(parts), variables)


def test_cut_rejects_bad_boundaries():
  model = build_model('resnet8', 10)
  with pytest.raises(ValueError, match='increasing'):
    model.cut([3, 2])
  with pytest.raises(ValueError, match='increasing'):
    model.cut([0])


def test_train_mode_updates_running_statistics_with_torch_momentum():
  """Running mean moves 10% of the way to the batch mean, as PyTorch's momentum=0.1."""
  model = build_model('resnet8', 10)
  x = jax.random.normal(jax.random.key(1), (8, 32, 32, 3)) + 3.0
  variables = model.init(jax.random.key(0), x)
  _, stats = model.apply(variables, x, train=True)
  stem = variables['params']['stem']
  conv = jax.lax.conv_general_dilated(x, stem['Conv_0']['kernel'], (1, 1), ((1, 1), (1, 1)),
                                      dimension_numbers=('NHWC', 'HWIO', 'NHWC'))
  np.testing.assert_allclose(stats['stem']['BatchNorm_0']['mean'], 0.1 * conv.mean((0, 1, 2)),
                             rtol=1e-4, atol=1e-5)


def test_scanned_runs_give_the_unrolled_numbers():
  """scan_min=2: ResNet-20's three runs of identical blocks (s1b0..s1b2; s2b1..s2b2 and s3b1..s3b2, after each
  section's shape-changing first block) are stacked and scanned; initialisation, training forward and the
  statistics it moves equal the unrolled model's, and relayout moves variables between the layouts."""
  from jaxdecouple.models import relayout
  plain, scanned = build_model('resnet20', 10), build_model('resnet20', 10, scan_min=2)
  shape = (1, 32, 32, 3)
  assert scanned.chain.runs(shape) == ((1, 4), (5, 7), (8, 10))
  assert build_model('resnet20', 10, scan_min=4).chain.runs(shape) == ()  # runs shorter than 4 stay unrolled
  assert build_model('resnet1202', 10, scan_min=16).chain.runs(shape) == ((1, 201), (202, 401), (402, 601))
  v_plain = plain.init(jax.random.key(3), jnp.zeros(shape))
  v_scan = scanned.init(jax.random.key(3), jnp.zeros(shape))
  assert sorted(v_scan['params']) == ['head', 's1b0..s1b2', 's2b0', 's2b1..s2b2', 's3b0', 's3b1..s3b2', 'stem']
  assert v_scan['params']['s1b0..s1b2']['Conv_0']['kernel'].shape == (3, 3, 3, 16, 16)
  assert_trees_equal(relayout([v_scan], plain.chain, shape), v_plain)
  assert_trees_equal(relayout([v_plain], scanned.chain, shape), v_scan)
  x = jnp.asarray(np.random.default_rng(0).normal(size=(8, 32, 32, 3)), jnp.float32)
  run = lambda m, v, x: jax.jit(lambda v, x: m.chain.apply(v, x, train=True))(v, x)
  (y_plain, s_plain), (y_scan, s_scan) = run(plain, v_plain, x), run(scanned, v_scan, x)
  np.testing.assert_allclose(y_scan, y_plain, rtol=1e-5, atol=1e-5)
  assert_trees_equal(relayout([{'batch_stats': s_scan}], plain.chain, shape), {'batch_stats': s_plain},
                     rtol=1e-5, atol=1e-6)
  # BP's gradient through the scanned runs is the unrolled one (what one whole-model training step uses)
  grad = lambda m, v: jax.jit(jax.grad(lambda p, x: jnp.mean(m.chain.apply({**v, 'params': p}, x, train=True)[0] ** 2)))(
      v['params'], x)
  assert_trees_equal(relayout([{'params': grad(scanned, v_scan)}], plain.chain, shape),
                     {'params': grad(plain, v_plain)}, rtol=1e-4, atol=1e-6)
  # A cut inside a run: each stage gets its part of the stack; the stages compose to the whole model.
  first, second = scanned.cut([2])  # stem, s1b0 | s1b1..s3b2, head
  p1 = relayout([v_scan], first, shape)
  y1, _ = first.apply(p1, x, train=True)
  p2 = relayout([v_scan], second, (1, *y1.shape[1:]))
  assert sorted(p2['params'])[:2] == ['head', 's1b1..s1b2']
  np.testing.assert_allclose(second.apply(p2, y1, train=True)[0], y_scan, rtol=1e-5, atol=1e-5)
  assert_trees_equal(relayout([p1, p2], scanned.chain, shape), v_scan)


def test_a_scanned_gpt_keeps_only_its_products_and_gives_the_unrolled_gradient():
  """A scanned run of transformer blocks on the CPU is rematerialised under its block's policy (models/core.py
  _scan_remat: the matrix products' outputs kept, the elementwise rest recomputed in the backward): its vjp
  carries fewer residual bytes than the same scan without the policy, and the loss and gradient are the
  unrolled model's."""
  from jaxdecouple.models import relayout
  from jaxdecouple.models.transformer import TransformerBlock
  plain, scanned = build_model('gpt4_d32_t16', 256), build_model('gpt4_d32_t16', 256, scan_min=2)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, (4, 16)), jnp.int32)
  shape = tokens.shape
  v_plain, v_scan = plain.init(jax.random.key(1), tokens), scanned.init(jax.random.key(1), tokens)
  assert scanned.chain.runs(shape) == ((1, 5),)

  def loss(m, v):
    return lambda p: m.loss(m.chain.apply({**v, 'params': p}, tokens, train=True)[0], tokens)[0]

  def residual_bytes(m, v):
    vjp = jax.eval_shape(lambda p: jax.tree.leaves(jax.vjp(loss(m, v), p)[1]), v['params'])
    return sum(int(np.prod(a.shape)) * a.dtype.itemsize for a in vjp)
  kept = residual_bytes(scanned, v_scan)
  policy = TransformerBlock.SCAN_REMAT_POLICY
  try:
    TransformerBlock.SCAN_REMAT_POLICY = None  # the same scan, every residual kept
    everything = residual_bytes(scanned, v_scan)
  finally:
    TransformerBlock.SCAN_REMAT_POLICY = policy
  assert kept < 0.6 * everything, (kept, everything)
  value = lambda m, v: jax.jit(jax.value_and_grad(loss(m, v)))(v['params'])
  (l_plain, g_plain), (l_scan, g_scan) = value(plain, v_plain), value(scanned, v_scan)
  np.testing.assert_allclose(l_scan, l_plain, rtol=1e-6)
  assert_trees_equal(relayout([{'params': g_scan}], plain.chain, shape), {'params': g_plain}, rtol=1e-4, atol=1e-7)


def test_torch_default_init_and_the_release_head():
  """model_init='torch': every convolution and linear kernel and the linear bias uniform in +-1/sqrt(fan_in)
  (PyTorch's kaiming_uniform with a = sqrt(5)), BatchNorm untouched; model_head_norm=False drops the
  pre-activation head's BN-ReLU (the ResIST release's head); other networks refuse it with one line."""
  import jax.numpy as jnp
  from jaxdecouple.errors import ConfigError
  from jaxdecouple.config import get_default_config
  from jaxdecouple.config_checks import validate
  torch = build_model('preact_tiny', 10, init='torch', head_norm=False)
  variables = torch.init(jax.random.key(0), jnp.zeros((1, 32, 32, 3)))
  he = build_model('preact_tiny', 10).init(jax.random.key(0), jnp.zeros((1, 32, 32, 3)))
  for path, x in jax.tree_util.tree_flatten_with_path(variables['params'])[0]:
    name = jax.tree_util.keystr(path)
    if 'kernel' in name or ('Dense' in name and 'bias' in name):
      fan_in = int(np.prod(x.shape[:-1])) if 'kernel' in name else \
          int(variables['params']['head']['Dense_0']['kernel'].shape[0])
      bound = 1 / np.sqrt(fan_in)
      assert np.abs(x).max() <= bound and np.abs(x).max() > 0.9 * bound, name
      if x.size >= 1000:
        assert abs(float(np.std(x)) - bound / np.sqrt(3)) < 0.05 * bound, name
  k = variables['params']['s3b1']['Conv_0']['kernel']
  assert float(np.std(he['params']['s3b1']['Conv_0']['kernel'])) / float(np.std(k)) == pytest.approx(np.sqrt(6), rel=0.05)
  assert list(variables['params']['head']) == ['Dense_0'] and 'BatchNorm_0' in he['params']['head']
  assert torch.apply(variables, jnp.zeros((2, 32, 32, 3)), train=False)[0].shape == (2, 10)
  for overrides, field in (({'model_init': 'xavier'}, 'model_init'),
                           ({'model': 'resnet20', 'model_head_norm': False}, 'model_head_norm'),
                           ({'model_init': 'torch', 'scan_blocks': 4}, 'model_init')):
    c = get_default_config()
    for k_, v in overrides.items():
      c[k_] = v
    with pytest.raises(ConfigError, match=f'config.{field}:'):
      validate(c)
