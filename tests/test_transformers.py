"""Transformers as chains of blocks (models/transformer.py) and byte-level text (data/text.py): parameter counts
written out independently, every method against its sequential reference on a tiny GPT (and the image path on a
tiny ViT), ResIST on transformer blocks, mixed precision, the text split and its bits per byte, bad input."""
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import assert_trees_close, tiny_config
from jaxdecouple.data import load_dataset
from jaxdecouple.data.text import HELD_OUT, split, windows
from jaxdecouple.errors import ConfigError, DataError
from jaxdecouple.methods import validate
from jaxdecouple.models import build_model, count_params
from jaxdecouple.train import train_and_evaluate

SEQ = 16


def text_config(method='bp', model='gpt_tiny', steps=6, **kw):
  """A few-second run of a 2-block GPT (width 32) on synthetic text: 64 windows of 16 bytes, batch 8."""
  return tiny_config(method=method, model=model, max_steps=steps, **{
      'dataset': 'fortunes', 'data.sequence_length': SEQ, 'data.synthetic_train_size': 64,
      'data.synthetic_test_size': 16, 'batch_size': 8, 'eval_batch_size': 16, 'optim.learning_rate': 0.005, **kw})


# --- the models, counted by hand ------------------------------------------------------------------

def block_params(d):
  """One pre-norm block: two LayerNorms (scale, bias), q/k/v and the output projection, the 4d MLP."""
  return 2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d)


@pytest.mark.parametrize('name,expected', [
    ('vit_tiny', 8 * 8 * 3 * 32 + 32 + 16 * 32 + 2 * block_params(32) + 2 * 32 + 32 * 10 + 10),  # 16 patches of 8x8
    ('vit6_d128_p4', 4 * 4 * 3 * 128 + 128 + 64 * 128 + 6 * block_params(128) + 2 * 128 + 128 * 10 + 10),
    ('gpt_tiny', 256 * 32 + 64 * 32 + 2 * block_params(32) + 2 * 32 + 32 * 256 + 256),
    ('gpt_small', 256 * 128 + 128 * 128 + 8 * block_params(128) + 2 * 128 + 128 * 256 + 256)])
def test_parameter_counts(name, expected):
  model = build_model(name, 10)
  shape = (1, 32, 32, 3) if name.startswith('vit') else (1, SEQ)
  variables = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros(shape))
  assert count_params(variables['params']) == expected
  assert not jax.tree.leaves(variables.get('batch_stats', {}))  # no BatchNorm


def test_causal_attention_does_not_look_ahead_and_the_vit_sees_every_patch():
  gpt = build_model('gpt_tiny', 256)
  x = jnp.asarray(np.random.default_rng(0).integers(0, 256, (2, SEQ)))
  v = gpt.init(jax.random.key(0), x)
  apply = jax.jit(lambda v, x: gpt.apply(v, x, train=True)[0])
  y, changed = apply(v, x), apply(v, x.at[:, 9].set((x[:, 9] + 1) % 256))
  np.testing.assert_array_equal(y[:, :9], changed[:, :9])  # byte 9 moves only logits 9 and later
  assert not np.allclose(y[:, 9:], changed[:, 9:])
  vit = build_model('vit_tiny', 10)
  img = jnp.asarray(np.random.default_rng(1).normal(size=(2, 32, 32, 3)), jnp.float32)
  w = vit.init(jax.random.key(0), img)
  out = jax.jit(lambda v, x: vit.apply(v, x, train=True)[0])(w, img.at[1].set(img[0].at[28:, 28:].set(0)))
  assert not np.allclose(out[0], out[1])  # the last patch's pixels reach the logits


# --- text data ------------------------------------------------------------------------------------

def test_windows_predict_the_next_byte_and_the_split_is_fixed_and_disjoint():
  corpus = bytes(range(256)) * 8 + b'the end'
  x_train, y_train, x_test, y_test = split(corpus, 10, 'test corpus')
  data = np.frombuffer(corpus, np.uint8)
  cut = int(len(data) * (1 - HELD_OUT))
  assert x_train.dtype == np.uint8 and y_train.dtype == np.int32 and x_train.shape[1] == 10
  for i in range(len(x_train)):  # example i: bytes [10 i, 10 i + 10), labels the next ones
    np.testing.assert_array_equal(x_train[i], data[10 * i:10 * i + 10])
    np.testing.assert_array_equal(y_train[i], data[10 * i + 1:10 * i + 11])
  assert len(x_train) == (cut - 1) // 10 and len(x_test) == (len(data) - cut - 1) // 10
  np.testing.assert_array_equal(x_test[0], data[cut:cut + 10])  # the held-out part is the corpus's end
  assert all(np.array_equal(a, b) for a, b in zip(split(corpus, 10, 'again'), (x_train, y_train, x_test, y_test)))
  x, y = windows(np.arange(7, dtype=np.uint8), 3)  # 7 bytes: two windows, the 7th byte only a label
  np.testing.assert_array_equal(x, [[0, 1, 2], [3, 4, 5]])
  np.testing.assert_array_equal(y, [[1, 2, 3], [4, 5, 6]])


def test_a_folder_is_read_in_name_order_without_the_fortune_indexes(tmp_path):
  (tmp_path / 'b').write_bytes(b'second file. ' * 40)
  (tmp_path / 'a').write_bytes(b'first file. ' * 40)
  (tmp_path / 'a.dat').write_bytes(b'\x00\x01index')
  config = text_config(**{'data.source': 'auto', 'data.path': str(tmp_path), 'dataset': 'text'})
  ds = load_dataset(config.data, 'text')
  joined = np.frombuffer(b'first file. ' * 40 + b'\n' + b'second file. ' * 40, np.uint8)
  np.testing.assert_array_equal(ds.x_train[0], joined[:SEQ])
  assert ds.tokens and ds.num_classes == 256 and ds.image_shape == (SEQ,)


@pytest.fixture(scope='module')
def gpt_bp(tmp_path_factory):
  """BP on the tiny GPT, trained once: the reference test's run, data parallelism's and bfloat16's baseline."""
  return train_and_evaluate(text_config('bp', steps=4), str(tmp_path_factory.mktemp('gpt_bp') / 'run'))


def test_the_evaluation_reports_bits_per_byte_as_the_mean_loss_per_byte(gpt_bp):
  """The evaluator's figures against the loss computed here from the trained model on the held-out windows."""
  result = gpt_bp
  config = result.method.setup.config
  ds = load_dataset(config.data, config.dataset)
  model = build_model(config.model, 256)
  logits = model.apply(result.variables, jnp.asarray(ds.x_test, jnp.int32), train=False)[0]
  nats = -np.take_along_axis(np.asarray(jax.nn.log_softmax(logits)), ds.y_test[..., None], -1).mean()
  accuracy = float(np.mean(np.argmax(np.asarray(logits), -1) == ds.y_test))
  e = result.last_eval
  np.testing.assert_allclose(e['test_loss'], nats, rtol=1e-5)
  np.testing.assert_allclose(e['test_bits_per_byte'], nats / math.log(2), rtol=1e-5)
  np.testing.assert_allclose(e['test_accuracy'], accuracy, atol=1e-6)


# --- every method against its sequential reference, on a tiny GPT -----------------------------------

def _reference(method, config, steps):
  """The sequential reference each method's own test file writes from its definition."""
  if method == 'bp':
    from test_train import reference_bp
    return reference_bp(config, steps)
  if method == 'fdg':
    from test_fdg import reference_fdg
    return reference_fdg(config, steps)
  if method == 'adl':
    from test_adl import reference_adl
    return reference_adl(config, steps)
  if method in ('ddg', 'fr'):
    from test_ddg_fr import reference_forward_locked
    return reference_forward_locked(config, steps, replay=method == 'fr')
  if method == 'dgl':
    from test_dgl import reference_dgl
    return reference_dgl(config, steps)[0]
  from test_sync_pipeline import reference_accumulated_bp
  return reference_accumulated_bp(config, steps)


@pytest.mark.parametrize('method,extra', [
    ('bp', {}), ('fdg', {'pipeline.beta': 0.5}), ('adl', {'pipeline.accumulation': 2, 'pipeline.beta': 0.5}),
    ('ddg', {}), ('fr', {}), ('dgl', {}), ('zb_h1', {'pipeline.micro_batches': 2}),
    ('1f1b', {'pipeline.micro_batches': 2})])
def test_every_pipeline_method_and_bp_match_their_references_on_a_gpt(method, extra, workdir, request):
  """K = 2, 4 steps; tolerance as the methods' own tests (5e-4 of each leaf's scale), whose sharpness they check
  (FDG's here too: the reference with beta 1 is far). ZB-H1 and 1F1B (the study's synchronous pipeline) stand for
  the synchronous schedules (their driver is one; test_sync_pipeline checks each schedule's order)."""
  config = text_config(method, steps=4, **{'pipeline.num_stages': 2, **extra})
  result = request.getfixturevalue('gpt_bp') if method == 'bp' else train_and_evaluate(config, workdir)
  assert result.step == 4
  assert_trees_close(result.variables['params'], _reference(method, config, 4)['params'], tol=5e-4)
  if method == 'fdg':
    with pytest.raises(AssertionError, match='max error'):
      other = text_config(method, steps=4, **{'pipeline.num_stages': 2, 'pipeline.beta': 1.0})
      assert_trees_close(result.variables['params'], _reference(method, other, 4)['params'], tol=5e-4)


def test_local_sgd_on_a_gpt_matches_the_sequential_reference(workdir):
  """S = 2 workers, two rounds of L = 2, every block on every worker (test_resist's reference, unpartitioned)."""
  from test_resist import reference_replica, stored_part, worker_variables
  config = text_config('localsgd', 'gpt4_d32_t16', steps=4, **{'replica.num_workers': 2, 'replica.local_steps': 2})
  result = train_and_evaluate(config, workdir)
  reference = reference_replica(config, 4, partition=False)
  for w in range(2):
    mine = worker_variables(result, w)
    assert_trees_close(mine['params'], stored_part(reference[w], mine)['params'], tol=1e-3)


def test_a_gpt_pipeline_resumes_exactly(workdir, tmp_path):
  """FDG K = 2 on a GPT stopped after step 3 (stage 0's gradients of steps 2 and 3 in flight, its FLOP-balanced
  split recomputed at the restart) and resumed to step 6: the state of 6 uninterrupted steps, bit for bit."""
  from conftest import assert_trees_equal
  kw = {'pipeline.num_stages': 2, 'pipeline.beta': 0.5, 'checkpoint_every_steps': 3}
  train_and_evaluate(text_config('fdg', steps=3, **kw), workdir)
  resumed = train_and_evaluate(text_config('fdg', steps=6, **kw), workdir)
  whole = train_and_evaluate(text_config('fdg', steps=6, **kw), str(tmp_path / 'whole'))
  assert resumed.step == 6
  assert_trees_equal(resumed.state, whole.state)


def test_data_parallel_equals_bp_on_a_gpt(workdir):
  """Data parallel against BP's sequential reference (test_train.py), not the library's own BP."""
  config = text_config('dp', steps=4)
  dp = train_and_evaluate(config, workdir)
  assert_trees_close(dp.variables['params'], _reference('bp', config, 4)['params'], tol=5e-4)


@pytest.mark.parametrize('method,extra', [
    ('bp', {}), ('fdg', {'pipeline.beta': 0.5}), ('adl', {'pipeline.accumulation': 2, 'pipeline.beta': 0.5}),
    ('ddg', {}), ('fr', {}), ('dgl', {}), ('zb_h1', {'pipeline.micro_batches': 2})])
def test_every_pipeline_method_and_bp_match_their_references_on_a_vit(method, extra, workdir):
  """The same on a tiny ViT, which differs from the GPT in its stem (patches) and head (the mean of the patches):
  DGL's local head is the ViT's own, LayerNorm and a linear layer over the mean of the patches."""
  config = tiny_config(method=method, model='vit_tiny', max_steps=4, batch_size=16,
                       **{'pipeline.num_stages': 2, 'optim.learning_rate': 0.005, **extra})
  result = train_and_evaluate(config, workdir)
  assert_trees_close(result.variables['params'], _reference(method, config, 4)['params'], tol=5e-4)


def test_data_parallel_equals_bp_on_a_vit(workdir):
  """The same on the ViT."""
  config = tiny_config(method='dp', model='vit_tiny', max_steps=4, batch_size=16, **{'optim.learning_rate': 0.005})
  dp = train_and_evaluate(config, workdir)
  assert_trees_close(dp.variables['params'], _reference('bp', config, 4)['params'], tol=5e-4)


# --- ResIST on transformer blocks -----------------------------------------------------------------

def test_resist_on_gpt_blocks_matches_the_sequential_reference(workdir):
  """Blocks s1b1.. are partitioned (s1b0 shared), each worker stores only its own; 2 rounds of L = 2."""
  from test_resist import reference_replica, stored_part, worker_variables
  from jaxdecouple.replica.partition import partitioned_blocks
  assert partitioned_blocks(build_model('gpt4_d32_t16', 256)) == ('s1b1', 's1b2', 's1b3')
  config = text_config('resist', 'gpt4_d32_t16', steps=5, **{'replica.num_workers': 2, 'replica.local_steps': 2})
  result = train_and_evaluate(config, workdir)
  reference = reference_replica(config, 5)
  for w in range(2):
    mine = worker_variables(result, w)
    assert len(mine['params']) < 4 + 2  # stem, head, s1b0 and its own blocks only
    assert_trees_close(mine['params'], stored_part(reference[w], mine)['params'], tol=1e-3)


def numpy_block(p, x, scale, heads, causal):
  """A pre-norm transformer block written out in float64 numpy from its definition (GPT-2's layout): x + s * proj(
  attention(LN1(x))), then x + s * MLP(LN2(x)) with tanh-GELU, each head's softmax(q k^T / sqrt(d_head)) v."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), p)
  ln = lambda x, q: (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-6) * q['scale'] + q['bias']
  dense = lambda x, q: x @ q['kernel'] + q['bias']
  gelu = lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
  b, t, d = x.shape
  qkv = dense(ln(x, p['ln1']), p['qkv']).reshape(b, t, 3, heads, d // heads)
  q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))  # [b, heads, t, d_head]
  scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d // heads)
  if causal:
    scores = np.where(np.tril(np.ones((t, t), bool)), scores, -np.inf)
  weights = np.exp(scores - scores.max(-1, keepdims=True))
  attended = (weights / weights.sum(-1, keepdims=True) @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
  x = x + scale * dense(attended, p['proj'])
  return x + scale * dense(gelu(dense(ln(x, p['ln2']), p['mlp_in'])), p['mlp_out'])


def test_resist_on_gpt_blocks_scales_both_branches_at_test_time_and_moves_only_its_blocks():
  """The tested network scales each partitioned block's two residual branches by 1/S (a numpy block of the
  definition as the oracle), the shared s1b0 not at all; a round all-reduces the shared layers (stem, s1b0,
  head) and sends each block that changes owner once, counted from the transfers made."""
  from test_resist import initial_state
  config = text_config('resist', 'gpt4_d32_t16', **{'replica.num_workers': 2, 'replica.local_steps': 2,
                                                     'replica.num_devices': 2, 'cpu_devices': 2})
  method, state = initial_state(config)
  e = method.engine
  model = e.eval_model()
  blocks = dict(zip(model.block_names, model.chain.modules))
  assert tuple(e.partitioned) == ('s1b1', 's1b2', 's1b3')
  assert [blocks[n].residual_scale for n in ('s1b0', 's1b1', 's1b2', 's1b3')] == [1.0, 0.5, 0.5, 0.5]
  x = np.random.default_rng(0).normal(size=(2, SEQ, 32)).astype(np.float32)
  v = blocks['s1b2'].init(jax.random.key(1), x, train=False)
  for scale in (0.5, 1.0):
    np.testing.assert_allclose(blocks['s1b2'].clone(residual_scale=scale).apply(v, x, train=False),
                               numpy_block(v['params'], x, scale, blocks['s1b2'].heads, causal=True), atol=2e-5)
  e.aggregate(state, 0)
  traffic = e.last_traffic
  full = jax.device_get(e.model.init(jax.random.key(0), jnp.zeros((1, SEQ), jnp.int32)))
  size = lambda names: 4 * sum(a.size for c in full for n in names if n in full[c] for a in jax.tree.leaves(full[c][n]))
  shared, block = size([n for n in e.chain.names if n not in e.partitioned]), size(['s1b1'])
  now, nxt = e.layout.membership(0), e.layout.membership(1)
  moved = sum(1 for w in range(2) for b in np.flatnonzero(nxt[w]) if not now[w, b])
  assert traffic.all_reduce == shared
  assert moved > 0 and traffic.sent.sum() == traffic.received.sum() == moved * block  # (this draw moves blocks)


# --- mixed precision ------------------------------------------------------------------------------

@pytest.mark.parametrize('model', ['gpt_tiny', 'vit_tiny'])
def test_bfloat16_compute_stays_near_float32(model, workdir, tmp_path, request):
  """bfloat16 activations and products (float32 parameters and logits): after 4 BP steps every parameter
  within 2e-2 of the float32 run (relative to its leaf's scale; bfloat16 keeps 8 bits of mantissa, 4e-3)."""
  kw = {} if model.startswith('gpt') else {'dataset': 'cifar10', 'batch_size': 16, 'eval_batch_size': 64,
                                           'data.synthetic_train_size': 256, 'data.synthetic_test_size': 64}
  half = train_and_evaluate(text_config('bp', model, steps=4, compute_dtype='bfloat16', **kw), workdir)
  full = request.getfixturevalue('gpt_bp') if model.startswith('gpt') else \
      train_and_evaluate(text_config('bp', model, steps=4, **kw), str(tmp_path / 'f32'))
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(half.variables['params']))
  assert_trees_close(half.variables['params'], full.variables['params'], tol=2e-2)
  assert abs(half.last_eval['test_loss'] - full.last_eval['test_loss']) < 0.05


# --- bad input, one line each ---------------------------------------------------------------------

@pytest.mark.parametrize('overrides,field,words', [
    ({'model': 'vit2_d32_p5', 'dataset': 'cifar10'}, 'model', 'do not tile 32 x 32'),
    ({'data.sequence_length': 65}, 'data.sequence_length', "longer than gpt_tiny's 64 positions"),
    ({'dataset': 'cifar10'}, 'model', 'use a gpt model'),
    ({'model': 'resnet8'}, 'model', 'use a gpt model'),
    ({'model': 'gpt2_d30_h4_t64'}, 'model', 'divisible by the heads'),
    ({'model': 'vit2_d32_t64', 'dataset': 'cifar10'}, 'model', 'names its patch size'),
    ({'method': 'resist', 'replica.num_workers': 2, 'replica.partition': 'every_section'}, 'replica.partition',
     'one section of identical blocks')])
def test_bad_input_is_one_line_naming_the_field(overrides, field, words):
  with pytest.raises(ConfigError) as e:
    validate(text_config(**overrides))
  assert str(e.value).startswith(f'config.{field}:') and words in str(e.value) and '\n' not in str(e.value)


def test_a_missing_corpus_names_the_package(monkeypatch, tmp_path):
  from jaxdecouple.data import text
  monkeypatch.setattr(text, 'FORTUNES_DIR', str(tmp_path / 'none'))
  config = text_config(**{'data.source': 'auto'})
  with pytest.raises(DataError, match='apt-get install fortunes'):
    load_dataset(config.data, 'fortunes')
  (tmp_path / 'short.txt').write_bytes(b'too short')
  with pytest.raises(DataError, match='too few for data.sequence_length=16'):
    load_dataset(text_config(**{'data.source': 'auto', 'data.path': str(tmp_path / 'short.txt')}).data, 'text')


def test_the_installed_corpus_loads():
  """The corpus the README's setup installs (apt-get install fortunes; .ci/run installs it too)."""
  ds = load_dataset(text_config(**{'data.source': 'auto', 'data.sequence_length': 128}).data, 'fortunes')
  assert len(ds.x_train) > 10_000 and len(ds.x_test) > 1_000 and ds.source.startswith('/usr/share/games/fortunes (')
  # the run's log names the corpus by its size and digest (another release of the package splits differently)
  import hashlib
  from jaxdecouple.data.text import read_corpus
  corpus = read_corpus('/usr/share/games/fortunes')
  assert ds.source.endswith(f'({len(corpus):,} bytes, sha256 {hashlib.sha256(corpus).hexdigest()[:12]})')


def test_the_study_report_gives_text_rows_their_bits_per_byte(tmp_path):
  """A study's report prints the held-out bits per byte of its text runs (median, min-max, n) from finished.json."""
  import json
  from jaxdecouple.study.core import Run, Study, run_dir
  from jaxdecouple.study.report import bits_per_byte_table
  runs = tuple(Run('GPT', column, seed, lambda: None) for column in ('BP', 'FDG') for seed in (0, 1, 2))
  study = Study('t', 't', 'text', 'recipe', runs)
  for run, bits in zip(runs[:5], (1.5, 1.7, 1.6, 1.9, 2.1)):  # FDG seed 2 unfinished
    os.makedirs(run_dir(str(tmp_path), run))
    with open(os.path.join(run_dir(str(tmp_path), run), 'finished.json'), 'w') as f:
      json.dump({'test_accuracy': 0.5, 'test_bits_per_byte': bits}, f)
  table = '\n'.join(bits_per_byte_table(study, str(tmp_path)))
  assert '| GPT | 1.600 (1.500-1.700), n=3 | 2.000 (1.900-2.100), n=2 |' in table
  assert bits_per_byte_table(Study('i', 'i', 'images', 'r', runs[:1]), str(tmp_path / 'none')) == []


def test_cpu_gpt_async_gives_the_data_path_to_its_image_runs_only():
  from jaxdecouple.study.definitions import STUDIES
  study = STUDIES['cpu_gpt_async']()
  configs = [r.config('cifar10.npz') for r in study.runs]
  assert {c.data.path for c in configs if c.dataset == 'fortunes'} == {''}
  assert {c.data.path for c in configs if c.dataset == 'cifar10'} == {'cifar10.npz'}
  # 3 seeds of 7 GPT columns and 3 ViT cells; one seed of optax's NAdamW (GPT), of PyTorch's NAdam (two ViT rows)
  # and of PyTorch's NAdam at lr 3e-4 (GPT)
  assert len(study.runs) == 3 * (7 + 3) + 1 + 2 + 1 and {c.model for c in configs} == {'gpt_small', 'vit6_d64_p4'}
  torch_nadam = [c for r, c in zip(study.runs, configs) if r.column == 'FDG NAdam b1 0.99 (PyTorch)']
  assert len(torch_nadam) == 5 and all(c.optim.momentum_decay == 0.004 and c.optim.b1 == 0.99 for c in torch_nadam)
  slow, = [c for r, c in zip(study.runs, configs) if r.column.endswith('lr 3e-4')]
  assert slow.optim.learning_rate == 3e-4 and slow.optim.momentum_decay == 0.004 and study.runs[-1].column.endswith('3e-4')
