"""ResIST, local SGD and the ensemble against sequential references; partitions; aggregation."""
import functools
import math
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from conftest import assert_trees_close, reference_objective, sgd_step, tiny_config
from jaxdecouple.data import Preprocess, TrainOrder, load_dataset, preprocess_for, train_inputs
from jaxdecouple.errors import ConfigError
from jaxdecouple.models import build_model
from jaxdecouple.replica import SLOTS, compress, draw_partition, partitioned_blocks, slice_sizes, slot_apply
from jaxdecouple.models.slots import check_partitioned_run
from jaxdecouple.replica import slot_count
from jaxdecouple.train import train_and_evaluate


def replica_config(method, workers=4, steps=5, local=2, **kw):
  # Batch 32 of 256 images (the suite's tiny_config has 16 of 128): these nets amplify rounding fast, and the
  # comparisons of two compilations below were sized for batch 32 (multiprocess_worker.replica_run_config too).
  return tiny_config(method=method, max_steps=steps, **{
      'model': 'preact_tiny', 'replica.num_workers': workers, 'replica.local_steps': local,
      'optim.learning_rate': 0.005, 'batch_size': 32, 'data.synthetic_train_size': 256, **kw})


# --- partitions -----------------------------------------------------------------------------------

def test_partitioned_blocks_are_the_third_sections_non_strided_ones():
  assert partitioned_blocks(build_model('preact101', 100)) == tuple(f's3b{i}' for i in range(1, 23))
  assert len(partitioned_blocks(build_model('preact_s3_30', 10))) == 29
  assert partitioned_blocks(build_model('preact_tiny', 10)) == tuple(f's3b{i}' for i in range(1, 6))
  with pytest.raises(ValueError, match='pre-activation'):
    partitioned_blocks(build_model('resnet20', 10))


@pytest.mark.parametrize('workers,sizes', [(2, [11, 11]), (4, [6, 6, 5, 5]), (8, [3, 3, 3, 3, 3, 3, 2, 2])])
def test_partition_covers_disjointly_with_the_papers_slice_sizes(workers, sizes):
  assert slice_sizes(22, workers) == sizes
  for r in range(5):
    member = draw_partition(22, workers, seed=0, round_index=r)
    assert member.shape == (workers, 22)
    assert (member.sum(axis=0) == 1).all()  # every block exactly one owner
    assert sorted(member.sum(axis=1).tolist(), reverse=True) == sizes


def test_partition_is_a_function_of_seed_and_round():
  a = draw_partition(22, 4, seed=3, round_index=7)
  assert (a == draw_partition(22, 4, seed=3, round_index=7)).all()
  assert not (a == draw_partition(22, 4, seed=3, round_index=8)).all()
  assert not (a == draw_partition(22, 4, seed=4, round_index=7)).all()


def test_minimum_depth_pads_short_sub_networks():
  for r in range(10):
    member = draw_partition(22, 8, seed=0, round_index=r, min_depth=4)
    assert (member.sum(axis=1) >= 4).all()
    assert (member.sum(axis=0) >= 1).all()  # still covers every block
  assert draw_partition(22, 8, 0, 0, min_depth=4).sum() > 22  # so some blocks are shared


def test_a_section_with_fewer_blocks_than_workers_goes_to_random_workers():
  """The naive partition deals each section on its own: a lone block (s1b0 of preact_tiny) or two blocks among
  four workers land on random workers each round, each block on exactly one."""
  owners = {int(np.flatnonzero(draw_partition(1, 4, 0, r, group=1, allow_idle=True)[:, 0])[0]) for r in range(40)}
  assert owners == {0, 1, 2, 3}
  for r in range(5):
    m = draw_partition(2, 4, 0, r, group=2, allow_idle=True)
    assert (m.sum(axis=0) == 1).all() and m.sum(axis=1).max() == 1
  with pytest.raises(ValueError, match='some workers'):  # the third section's partition refuses idle workers
    draw_partition(2, 4, 0, 0)


# --- a sequential reference -----------------------------------------------------------------------

def reference_replica(config, steps, partition=True, average=True, redraw=True, warmup=0, sections=None,
                      close=False, tx=None):
  """S workers one after another. Worker w draws batch t from its own shuffle (stream w) and its own
  augmentation; its forward skips the partitioned blocks it does not own this round; SGD (weight
  decay 5e-4 added to the gradient, momentum 0.9) updates only the blocks it ran. Every L steps:
  each shared block averaged over all workers, each partitioned block over its owners, momentum
  restarted, a new partition drawn (unless ``redraw`` is off). With a ``warmup`` of W steps, the first W
  are local SGD (every worker runs every block, the partitioned ones' branches scaled by 1/S as at test
  time). ``sections``: the naive partition's groups of blocks (one per section), each dealt out on its own
  from its own stream. The round's end follows the config's outer optimizer (jaxdecouple/replica/outer.py):
  with outer lr eta and momentum mu each block's anchor (its value at the round's start) takes the step
  delta = anchor - mean over holders, m = mu m + delta, anchor - eta (delta + mu m) (Nesterov; else
  anchor - eta m), and with compressed updates each worker's shared-layer change plus its unsent error is
  compressed (``numpy_compress``), the error kept, the arrivals averaged. ``close``: the round under way at
  the last step ends there too (what evaluation scores mid-round). ``tx``: an optax transformation (its learning
  rate inside, constant) in place of SGD, each worker's state of it per block, restarted with the momentum
  every round (a block's state is its own: Adam's moments and step count, Muon's per matrix), or a dict of them
  by block name (each block stepped by its own). Returns each
  worker's variables (every
  block, as this reference keeps them all) and under 'stored' the names of the blocks the worker holds in the
  round the last step left it in: the shared ones and its own partitioned ones."""
  r = config.replica
  S, L = r.num_workers, r.local_steps
  ds = load_dataset(config.data, config.dataset)
  model = build_model(config.model, ds.num_classes, anchors=ds.anchors)
  objective_of = reference_objective(ds)  # cross-entropy, or YOLO-v2's loss on a detection data set
  blocks = partitioned_blocks(model) if partition and not sections else tuple(n for g in sections or () for n in g)
  init = model.init(jax.random.key(config.seed), jnp.zeros((1, *ds.image_shape)))
  params = [dict(init['params']) for _ in range(S)]  # one dict per worker: blocks are replaced in it
  stats = [init['batch_stats'] for _ in range(S)]
  tx_of = (tx if isinstance(tx, dict) else dict.fromkeys(init['params'], tx)) if tx else None
  # optax's own update, compiled once per transformation and block shapes (Muon's Newton-Schulz loop is a scan,
  # traced again at every eager call)
  jitted = {id(t): jax.jit(t.update) for t in tx_of.values()} if tx else {}
  tx_update = lambda n, *a: jitted[id(tx_of[n])](*a)
  restart = lambda: ({n: tx_of[n].init(v) for n, v in init['params'].items()} if tx
                     else jax.tree.map(jnp.zeros_like, init['params']))
  momentum = [restart() for _ in range(S)]  # each worker's SGD momentum (or optax state) per block
  lr_out, mu, updates = r.outer_lr, r.outer_momentum, r.compress == 'updates'
  outer = lr_out != 1 or mu or updates
  anchor = dict(init['params'])  # every block's value at the round's start, the same on every holder
  outer_m = jax.tree.map(np.zeros_like, dict(init['params']))
  error = [jax.tree.map(np.zeros_like, dict(init['params'])) for _ in range(S)]  # shared layers' unsent change
  chunk_error = {}  # two-stage exchange: each chunk owner's unsent error of its chunk
  orders = [TrainOrder(len(ds.x_train), config.batch_size, config.seed, stream=w) for w in range(S)]
  pre = preprocess_for(ds, config.data)
  spe = len(ds.x_train) // config.batch_size
  # a state per block equals the engine's per worker (one Adam step count) only while every block a worker holds
  # steps every step, the state restarts every round and the rate inside tx is the run's (before a milestone)
  assert not tx or (r.momentum == 'restart' and steps <= (config.optim.milestones or (math.inf,))[0] * spe)

  def owned(w, round_index):
    if not partition:
      return set()
    if round_index * L < warmup:  # warm-up: every block on every worker
      return set(blocks)
    if sections:
      return {b for i, g in enumerate(sections) for b, own in zip(g, draw_partition(
          len(g), S, config.seed, round_index if redraw else 0, group=i + 1, allow_idle=True)[w]) if own}
    m = draw_partition(len(blocks), S, config.seed, round_index if redraw else 0, r.min_depth)
    return {b for b, own in zip(blocks, m[w]) if own}

  modules = dict(zip(model.block_names, model.chain.modules))
  scaled = {n: m.clone(residual_scale=1 / S) if n in blocks else m for n, m in modules.items()}

  def grad_fn(run, module_of):
    """d loss / d params of the sub-network that runs the blocks in ``run``, one block after another."""
    def loss(p, stats, x, labels):
      h, new = x, dict(stats)
      for n in model.block_names:
        if n in run:
          v = {'params': p[n], **({'batch_stats': stats[n]} if n in stats else {})}
          h, upd = train_block(module_of[n], v, h)
          if n in stats:
            new[n] = upd
      return objective_of(h, labels), new
    return jax.grad(loss, has_aux=True)

  for t in range(steps):
    lr = config.optim.learning_rate * (0.1 if t >= config.optim.milestones[0] * spe else 1.0)
    for w in range(S):
      mine = owned(w, t // L)
      run = tuple(n for n in model.block_names if n not in blocks or n in mine)
      idx = orders[w].indices(t)
      x = train_inputs(jnp.asarray(ds.x_train[idx]), t, config.seed, pre, stream=jnp.int32(w))
      grads, stats[w] = grad_fn(run, scaled if t < warmup else modules)(params[w], stats[w], x,
                                                                        jnp.asarray(ds.y_train[idx]))
      for n in run:
        if tx:
          step, momentum[w][n] = tx_update(n, grads[n], momentum[w][n], params[w][n])
          params[w][n] = optax.apply_updates(params[w][n], step)
        else:
          params[w][n], momentum[w][n] = sgd_step(params[w][n], momentum[w][n], grads[n], lr)
    if average and ((t + 1) % L == 0 or (close and t + 1 == steps)):
      holders = {n: [w for w in range(S) if n not in blocks or n in owned(w, t // L)]
                 for n in model.block_names}
      mean = lambda trees, n: tree_mean([trees[w][n] for w in holders[n]])
      new_params = {n: mean(params, n) for n in model.block_names}
      if updates:
        shared = [n for n in model.block_names if n not in blocks]
        changes = [{n: jax.tree.map(lambda a, p, e: np.asarray(a) - np.asarray(p) + (e if r.error_feedback else 0),
                                    anchor[n], params[w][n], error[w][n]) for n in shared} for w in range(S)]
        sent, deltas = compressed_updates(changes, r.quantize_bits, r.sparsify, r.update_exchange == 'two_stage',
                                          chunk_error if r.error_feedback else None)
        for w in range(S):
          error[w].update(jax.tree.map(lambda x, c: x - c, changes[w], sent[w]))
      for n in model.block_names if outer else ():
        if updates and n not in blocks:
          delta = deltas[n]
        else:
          delta = jax.tree.map(lambda a, p: np.asarray(a) - np.asarray(p), anchor[n], new_params[n])
        outer_m[n] = jax.tree.map(lambda m, d: mu * m + d, outer_m[n], delta)
        step = jax.tree.map(lambda d, m: d + mu * m, delta, outer_m[n]) if r.outer_nesterov else outer_m[n]
        new_params[n] = jax.tree.map(lambda a, u: np.asarray(a) - lr_out * u, anchor[n], step)
      anchor = dict(new_params)
      new_stats = {n: mean(stats, n) for n in stats[0]}
      params = [dict(new_params) for _ in range(S)]
      stats = [dict(new_stats) for _ in range(S)]
      momentum = [restart() for _ in range(S)]
  held = lambda w: {n for n in model.block_names if n not in blocks} | owned(w, steps // L)
  return [{'params': p, 'batch_stats': s, 'stored': held(w)} for w, (p, s) in enumerate(zip(params, stats))]


def compressed_updates(changes, bits, keep, two_stage, chunk_error):
  """Each worker's change (plus unsent error) of the shared layers sent through the codec. All-gather: each
  leaf compressed on its own, the arrivals averaged. Two stage: a worker's leaves joined and cut into S
  chunks, each compressed; chunk j's arrivals averaged by worker j, which adds its unsent error of the chunk
  (``chunk_error``, updated in place; None: no error feedback) and compresses the result again, which is
  what everyone gets. Returns (what arrived of each worker's change, the average change)."""
  S = len(changes)
  if not two_stage:
    sent = [jax.tree.map(lambda x: numpy_compress(x, bits, keep), v) for v in changes]
    return sent, jax.tree.map(lambda *xs: sum(xs) / S, *sent)
  leaves, treedef = jax.tree.flatten(changes[0])
  sizes = [int(np.size(x)) for x in leaves]
  total, c = sum(sizes), -(-sum(sizes) // S)
  unjoin = lambda flat: treedef.unflatten([flat[a:b].reshape(np.shape(x)) for a, b, x in zip(
      np.cumsum([0] + sizes)[:-1], np.cumsum(sizes), leaves)])
  arrived = []
  for v in changes:
    joined = np.pad(np.concatenate([np.ravel(x) for x in jax.tree.leaves(v)]), (0, S * c - total))
    arrived.append(np.concatenate([numpy_compress(joined[j * c:(j + 1) * c], bits, keep) for j in range(S)]))
  mean = sum(arrived) / S
  second = []
  for j in range(S):
    x = mean[j * c:(j + 1) * c] + (chunk_error.get(j, 0) if chunk_error is not None else 0)
    second.append(numpy_compress(x, bits, keep))
    if chunk_error is not None:
      chunk_error[j] = x - second[-1]
  return [unjoin(a[:total]) for a in arrived], unjoin(np.concatenate(second)[:total])


@functools.partial(jax.jit, static_argnums=0)
def train_block(module, v, h):
  """One block in training mode: its output and (with BatchNorm) its new batch statistics. Jitted
  per block only to keep the suite fast."""
  if 'batch_stats' in v:
    h, updated = module.apply(v, h, train=True, mutable=['batch_stats'])
    return h, updated['batch_stats']
  return module.apply(v, h, train=True), None


@jax.jit
def tree_mean(trees):
  return jax.tree.map(lambda *xs: sum(xs) / len(xs), *trees)


def worker_variables(result, w):
  """What worker w stores, by block name: the shared blocks and the partitioned blocks it holds."""
  engine, state = result.method.engine, result.state
  member = np.asarray(state.membership) if engine.partitioned else None
  return {c: engine.layout.worker_network(jax.device_get(getattr(state, f)), member, w)
          for c, f in (('params', 'params'), ('batch_stats', 'batch_stats'))}


def stored_part(reference, variables, exact=True):
  """The reference's blocks that a worker stores (ResIST: the others live on other workers). ``exact``: and
  first, that the worker stores exactly the blocks the reference says it holds (so a worker that dropped or
  kept a block it should not cannot pass by comparing fewer blocks)."""
  for c in variables if exact else ():
    want = {n for n in reference['stored'] if n in reference[c]}
    assert set(variables[c]) == want, f"{c}: the worker stores {sorted(variables[c])}, the reference {sorted(want)}"
  return {c: {n: reference[c][n] for n in variables[c]} for c in variables}


def build_method(config):
  from jaxdecouple.methods import METHODS
  from jaxdecouple.train import build_setup
  ds = load_dataset(config.data, config.dataset)
  return METHODS[config.method](build_setup(config, ds)), ds


def initial_state(config):
  """(method, its initial state) of ``config``, without training."""
  method, ds = build_method(config)
  return method, method.init(jax.random.key(0), method.train_batch(ds.x_train, ds.y_train,
                                                                   TrainOrder(len(ds.x_train), 32, 0), 0))


def noisy(tree, seed):
  """``tree`` (device arrays) on the host plus standard normal noise."""
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda x: (np.asarray(x) + rng.normal(size=x.shape)).astype(x.dtype), jax.device_get(tree))


def test_the_shared_run_is_this_files_config(resist_run):
  assert resist_run.method.setup.config == replica_config('resist')


@pytest.mark.parametrize('method', ['resist', 'localsgd'])
def test_matches_the_sequential_reference(method, workdir, request):
  """L = 2, 5 steps: two averaging rounds and one step into the third.

  Tolerance: this tiny pre-activation net (8 to 64 channels) amplifies float32 rounding unusually
  fast (about 6x per step at lr 0.005): two compilations of the engine itself (4 devices against 1)
  drift 5e-5 apart in 7 steps, a reference that runs block by block up to 1e-3; hence few steps. A
  semantic slip is far larger: the reference without the re-draw is 0.3 away (checked below)."""
  if method == 'resist':
    result = request.getfixturevalue('resist_run')
    config = result.method.setup.config
  else:
    config = replica_config(method, workers=2)
    result = train_and_evaluate(config, workdir)
  reference = reference_replica(config, 5, partition=method == 'resist')
  for w in range(config.replica.num_workers):
    mine = worker_variables(result, w)
    assert_trees_close(mine, stored_part(reference[w], mine), tol=1e-3)
  # sharp: ResIST's reference without the re-draw, local SGD's without the averaging, are far
  mine = worker_variables(result, 0)
  far = reference_replica(config, 5, redraw=False) if method == 'resist' else \
      reference_replica(config, 5, partition=False, average=False)
  with pytest.raises(AssertionError, match='max error'):
    assert_trees_close(mine, stored_part(far[0], mine, exact=False), tol=1e-3)


def test_an_engine_built_from_a_spec_alone_matches_the_reference():
  """The engine needs no config and no Setup: a ReplicaSpec (seed and batch included) and the training
  pieces (model, optimizer, learning-rate schedule, preprocessing) build it, and 5 steps of ResIST at L = 2
  driven by hand equal the sequential reference (tolerance as in the test above)."""
  from jaxdecouple.optim import make_optimizer, make_schedule
  from jaxdecouple.replica import Replica, ReplicaSpec
  config = replica_config('resist')
  ds = load_dataset(config.data, config.dataset)
  spec = ReplicaSpec(num_workers=4, local_steps=2, partition=True, seed=config.seed, batch_size=config.batch_size)
  engine = Replica(build_model(config.model, ds.num_classes), spec, jax.devices(), make_optimizer(config.optim),
                   make_schedule(config.optim, len(ds.x_train) // config.batch_size),
                   Preprocess(ds.mean, ds.std, config.data.crop_padding, config.data.flip, config.data.augment))
  state = engine.init(jax.random.key(config.seed), engine.train_batch(ds.x_train, ds.y_train, 0))
  for t in range(5):
    state, _ = engine.step(state, engine.train_batch(ds.x_train, ds.y_train, t), t)
  reference = reference_replica(config, 5)
  member = np.asarray(state.membership)
  for w in range(4):
    mine = {c: engine.layout.worker_network(jax.device_get(getattr(state, f)), member, w)
            for c, f in (('params', 'params'), ('batch_stats', 'batch_stats'))}
    assert_trees_close(mine, stored_part(reference[w], mine), tol=1e-3)


def test_a_local_sgd_warm_up_then_resist_matches_the_reference(workdir):
  """replica.warmup_steps = 2 (one round of local SGD, partitioned branches scaled by 1/S), then ResIST:
  each worker then stores only its blocks; and a run stopped after the switch of layouts restores its
  checkpoint in ResIST's layout and ends with the same numbers."""
  config = replica_config('resist', workers=2, steps=5, **{'replica.warmup_steps': 2, 'checkpoint_every_steps': 3})
  result = train_and_evaluate(config, workdir)
  reference = reference_replica(config, 5, warmup=2)
  for w in range(2):
    mine = worker_variables(result, w)
    assert_trees_close(mine, stored_part(reference[w], mine), tol=1e-3)
  assert SLOTS in result.state.params
  folder = os.path.join(workdir, 'checkpoints')  # as if stopped after the switch of layouts, at step 3
  for name in os.listdir(folder) + [f'checksums/{n}' for n in os.listdir(os.path.join(folder, 'checksums'))]:
    step = name.split('/')[-1].split('.')[0]
    if step.isdigit() and int(step) > 3:
      path = os.path.join(folder, name)
      shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
  resumed = train_and_evaluate(config, workdir)
  assert resumed.step == 5 and not [f for f in os.listdir(folder) if 'damaged' in f]  # restored, not restarted
  assert_trees_close((resumed.state.params, resumed.state.batch_stats),
                     (result.state.params, result.state.batch_stats), tol=1e-6)


def test_the_naive_partition_deals_out_every_section_and_matches_the_reference(workdir):
  """replica.partition='every_section', the paper's A.1 "naive" partition: every block that keeps its input's
  shape is partitioned (preact_tiny: s1b0 alone in its section, and s3b1..s3b5), each section dealt out on its
  own and kept in its own slots; the numbers are the sequential reference's, which draws each section itself."""
  sections = (('s1b0',), tuple(f's3b{i}' for i in range(1, 6)))
  config = replica_config('resist', workers=2, steps=3, **{'replica.partition': 'every_section'})
  result = train_and_evaluate(config, workdir)
  e = result.method.engine
  assert [g.names for g in e.groups] == list(sections) and [g.key for g in e.groups] == ['slots_s1', SLOTS]
  assert [g.slots for g in e.groups] == [1, 3] and e.layout.slots == 4
  member = np.asarray(result.state.membership)
  assert member.shape == (2, 6) and (member.sum(axis=0) == 1).all()  # every block one owner, s1b0 too
  assert set(result.state.params) == {'stem', 's2b0', 's3b0', 's4b0', 'head', 'slots_s1', SLOTS}
  reference = reference_replica(config, 3, sections=sections)  # a round (L = 2) and a step into the next
  for w in range(2):
    mine = worker_variables(result, w)
    assert ('s1b0' in mine['params']) == bool(member[w, 0])  # stored by its owner only
    assert_trees_close(mine, stored_part(reference[w], mine), tol=1e-3)
  scales = {n: getattr(m, 'residual_scale', None) for n, m in zip(e.chain.names, e.eval_model().chain.modules)}
  assert scales['s1b0'] == scales['s3b1'] == 0.5 and scales['s2b0'] == scales['s3b0'] == 1.0


def test_post_activation_resist_matches_the_sequential_reference(workdir):
  """ResIST on a post-activation ResNet (the paper's A.1): the same definition, blocks relu(shortcut +
  branch), the partitioned ones scaled by 1/S at test time."""
  config = replica_config('resist', workers=2, steps=3, model='postact_tiny')
  result = train_and_evaluate(config, workdir)
  reference = reference_replica(config, 3)
  for w in range(2):
    mine = worker_variables(result, w)
    assert_trees_close(mine, stored_part(reference[w], mine), tol=1e-3)
  model = result.method.engine.eval_model()
  block = dict(zip(model.block_names, model.chain.modules))['s3b1']
  assert block.residual_scale == 0.5
  x = jnp.asarray(np.random.default_rng(0).normal(size=(4, 8, 8, 32)), jnp.float32)
  v = block.init(jax.random.key(0), x, train=False)
  full, half = block.clone(residual_scale=1.0).apply(v, x, train=False), block.apply(v, x, train=False)
  np.testing.assert_allclose(block.clone(residual_scale=0.0).apply(v, x, train=False), jax.nn.relu(x), atol=1e-6)
  both = (full > 0) & (half > 0)  # relu(x + y) and relu(x + y / 2): where both pass, half - x = (full - x) / 2
  assert both.mean() > 0.2
  np.testing.assert_allclose(np.where(both, half - x, 0), np.where(both, (full - x) / 2, 0), atol=1e-5)


def test_ensemble_matches_its_reference_and_averages_predictions(workdir):
  config = replica_config('ensemble', workers=2)
  result = train_and_evaluate(config, workdir)
  reference = reference_replica(config, 5, average=False, redraw=False)
  for w in range(2):
    mine = worker_variables(result, w)
    assert_trees_close(mine, stored_part(reference[w], mine), tol=1e-3)
  assert not np.allclose(result.state.params['s1b0']['Conv_0']['kernel'][0],
                         result.state.params['s1b0']['Conv_0']['kernel'][1])  # never averaged
  # Its evaluation: the mean of the two sub-networks' probabilities.
  x = jnp.asarray(np.random.default_rng(0).normal(size=(16, 32, 32, 3)), jnp.float32)
  member = np.asarray(result.state.membership)
  probs = []
  for w in range(2):
    variables, h = worker_variables(result, w), x
    blocks = partitioned_blocks(result.method.setup.model)
    for n, module in zip(result.method.setup.model.block_names, result.method.setup.model.chain.modules):
      if n in blocks and not member[w, blocks.index(n)]:
        continue
      v = {c: variables[c][n] for c in variables if n in variables[c]}
      h = train_block(module, v, h)[0]
    probs.append(jax.nn.softmax(h))
  predict = result.method.predict_fn()
  np.testing.assert_allclose(jnp.exp(predict(result.variables, x)), (probs[0] + probs[1]) / 2, atol=1e-5)


def test_s1_with_momentum_averaged_equals_plain_sgd(workdir, tmp_path):
  """One worker owning every block, momentum carried over rounds: nothing but SGD remains."""
  resist = train_and_evaluate(replica_config('resist', workers=1, **{'replica.momentum': 'average'}), workdir)
  bp = train_and_evaluate(tiny_config(model='preact_tiny', max_steps=5, split_backward='off', batch_size=32,
                                      **{'optim.learning_rate': 0.005, 'data.synthetic_train_size': 256}),
                          str(tmp_path / 'bp'))
  assert_trees_close(worker_variables(resist, 0), bp.variables, tol=2e-4)  # see the note above


def test_fewer_devices_than_workers_give_the_same_numbers(resist_run, workdir):
  """4 workers on 4 devices, and looped two to a device on 2: the same program per worker, only
  XLA's fusion around the loop differs (see the tolerance note above). (One device looping over all
  4 is the same code; 2 keep the compilation, which grows with the workers per device, short.)"""
  looped = train_and_evaluate(replica_config('resist', **{'replica.num_devices': 2}), workdir)
  runs = [resist_run, looped]
  assert [r.method.engine.mesh.devices.size for r in runs] == [4, 2]
  assert [r.method.engine.per_device for r in runs] == [1, 2]
  assert_trees_close((looped.state.params, looped.state.batch_stats),
                     (resist_run.state.params, resist_run.state.batch_stats), tol=2e-4)


def test_a_worker_stores_only_its_sub_network(workdir):
  """Between and within rounds each device holds the shared layers and its workers' slots, nothing
  else of the partitioned section: the bytes resident on each device (summed from the arrays'
  addressable shards) are exactly S_here * (shared + slots * block) for parameters, statistics and
  momentum. A slot a sub-network leaves over stays zero through training (parameters and momentum). (The
  storage does not depend on replica.skip: test_gathered_and_conditional_skipping_train_alike.)"""
  config = replica_config('resist', workers=4, local=2, **{'replica.min_depth': 2})
  method, ds = build_method(config)
  engine = method.engine
  order = TrainOrder(len(ds.x_train), config.batch_size, config.seed)
  state = method.init(jax.random.key(0), method.train_batch(ds.x_train, ds.y_train, order, 0))
  full = jax.device_get(engine.model.init(jax.random.key(0), jnp.zeros((1, 32, 32, 3))))
  nbytes = lambda tree: sum(np.asarray(x).nbytes for x in jax.tree.leaves(tree))
  shared = sum(nbytes(full[c][n]) for c in full for n in full[c] if n not in engine.partitioned)
  block = sum(nbytes(full[c]['s3b1']) for c in full)
  shared += nbytes({n: v for n, v in full['params'].items() if n not in engine.partitioned})  # momentum
  block += nbytes(full['params']['s3b1'])
  assert engine.layout.slots == 2 and len(engine.partitioned) == 5
  for t in range(5):  # two repartitions
    held = engine.resident_bytes(state)
    assert list(held.values()) == [shared + engine.layout.slots * block] * 4, (held, shared, block)
    member = np.asarray(state.membership)
    for w in range(4):
      for j in range(member[w].sum(), engine.layout.slots):  # leftover slots: zero
        assert all((np.asarray(x)[w, j] == 0).all()
                   for x in jax.tree.leaves((state.params[SLOTS], state.opt_state[1].trace[SLOTS])))
    state, _ = method.step(state, method.train_batch(ds.x_train, ds.y_train, order, t), t)
  assert shared + engine.layout.slots * block < nbytes(full) + nbytes(full['params'])  # less than the network


def test_slots_hold_the_largest_sub_network():
  assert [slot_count(22, s) for s in (2, 4, 8)] == [11, 6, 3]
  assert slot_count(22, 8, min_depth=4) == 4 and slot_count(5, 2) == 3 and slot_count(5, 1, 9) == 5
  for workers, depth in ((2, 0), (4, 0), (8, 0), (8, 4), (4, 9)):
    for r in range(5):
      assert draw_partition(22, workers, 0, r, depth).sum(1).max() == slot_count(22, workers, depth)


@pytest.mark.parametrize('member', [[1, 0, 1, 0, 1], [0, 1, 0, 0, 1], [0, 0, 0, 1, 0]])
def test_slots_selected_and_conditional_compute_the_sub_network(member):
  """One forward (BN in training mode) of the sub-network, three ways: the owned blocks in 3 slots
  (leftover slots zero, their outputs dropped), ``lax.cond`` per slot, and the chain run block by block
  without the blocks not owned. Outputs and the owned blocks' batch statistics agree."""
  model = build_model('preact_tiny', 10)
  blocks = partitioned_blocks(model)
  x = jnp.asarray(np.random.default_rng(1).normal(size=(8, 32, 32, 3)), jnp.float32)
  variables = model.init(jax.random.key(3), x[:1])
  noise = np.random.default_rng(4)  # numpy: an eager jax.random draw compiles once per leaf shape
  variables = jax.tree.map(lambda v: v + np.float32(0.1) * noise.normal(size=v.shape).astype(np.float32), variables)
  owned = [b for b, m in zip(blocks, member) if m]
  slotted = {}
  for c, v in variables.items():
    slots = [v[n] for n in owned] + [jax.tree.map(jnp.zeros_like, v[blocks[0]])] * (3 - len(owned))
    slotted[c] = {**{n: t for n, t in v.items() if n not in blocks}, SLOTS: jax.tree.map(lambda *xs: jnp.stack(xs), *slots)}
  valid = jnp.arange(3) < len(owned)
  run = lambda skip: jax.jit(lambda v, x, m: slot_apply(model.chain, blocks, v, x, m, train=True, skip=skip))(
      slotted, x, valid)
  h, stats = x, {}
  for n, module in zip(model.block_names, model.chain.modules):
    v = {c: variables[c][n] for c in variables if n in variables[c]}
    if n not in blocks or n in owned:
      h, upd = train_block(module, v, h)
      if 'batch_stats' in v:
        stats[n] = upd
  for skip in ('gather', 'cond'):
    out, new = run(skip)
    assert_trees_close(out, h, tol=1e-5)
    assert_trees_close({n: t for n, t in new.items() if n != SLOTS}, {n: t for n, t in stats.items() if n not in blocks},
                       tol=1e-5)
    for j, n in enumerate(owned):
      assert_trees_close(jax.tree.map(lambda s: s[j], new[SLOTS]), stats[n], tol=1e-5)
    for j in range(len(owned), 3):  # leftover slots keep their (zero) statistics
      assert all((np.asarray(s[j]) == 0).all() for s in jax.tree.leaves(new[SLOTS]))


def test_gathered_and_conditional_skipping_train_alike(tmp_path):
  """One round (L = 2 steps, then the repartition) each way: XLA:CPU runs a convolution inside a conditional's
  branch about 20x slower (docs/PERFORMANCE.md), so the conditional run is kept to one round (5 steps took 20 CPU s)."""
  gathered, conditional = (train_and_evaluate(replica_config('resist', steps=2, **{'replica.skip': skip}),
                                              str(tmp_path / skip)) for skip in ('gather', 'cond'))
  assert gathered.method.engine.spec.skip == 'gather' and conditional.method.engine.spec.skip == 'cond'
  assert_trees_close((conditional.state.params, conditional.state.batch_stats),
                     (gathered.state.params, gathered.state.batch_stats), tol=2e-4)
  # and each device stores the same (the slots), whichever way empty slots are skipped
  held = lambda r: list(r.method.engine.resident_bytes(r.state).values())
  assert held(conditional) == held(gathered) and jax.tree.structure(conditional.state) == \
      jax.tree.structure(gathered.state)


# --- aggregation against numpy ---------------------------------------------------------------------

@pytest.mark.parametrize('momentum', ['restart', 'average'])
def test_aggregation_matches_numpy(momentum):
  """Noise in every stored value, then one repartition: each worker's next sub-network is the shared
  layers averaged over all workers and each of its next blocks averaged over the block's owners of
  the round (their slots); momentum likewise, or zero; leftover slots zero."""
  config = replica_config('resist', **{'replica.momentum': momentum, 'replica.min_depth': 2})
  method, state = initial_state(config)
  engine = method.engine
  params, stats, opt = noisy(state.params, 1), noisy(state.batch_stats, 2), noisy(state.opt_state, 3)
  member = np.asarray(state.membership)
  assert (member.sum(axis=0) > 1).any()  # min depth 2 with 5 blocks and 4 workers: shared blocks
  state = state._replace(params=engine.put_workers(params), batch_stats=engine.put_workers(stats),
                         opt_state=engine.put_workers(opt))
  out = engine.aggregate(state, 0)
  nxt = engine.layout.membership(1)
  np.testing.assert_equal(np.asarray(out.membership), nxt)

  def expect(tree, w):
    views = [engine.layout.worker_network(tree, member, v) for v in range(4)]
    names = [n for n in views[0] if n not in engine.partitioned]
    names += [engine.partitioned[b] for b in np.flatnonzero(nxt[w])]  # w's blocks next round
    return {n: jax.tree.map(lambda *xs: np.mean(xs, axis=0), *[v[n] for v in views if n in v]) for n in names}
  trace = lambda o: o[1].trace
  for w in range(4):
    got = lambda tree: engine.layout.worker_network(jax.device_get(tree), nxt, w)
    assert_trees_close(got(out.params), expect(params, w), tol=1e-6)
    assert_trees_close(got(out.batch_stats), expect(stats, w), tol=1e-6)
    want = expect(trace(opt), w)
    if momentum == 'restart':
      want = jax.tree.map(np.zeros_like, want)
    assert_trees_close(got(trace(out.opt_state)), want, tol=1e-6)
    for j in range(nxt[w].sum(), engine.layout.slots):
      assert all((np.asarray(x)[w, j] == 0).all() for x in jax.tree.leaves(out.params[SLOTS]))


def numpy_compress(x, bits, keep):
  """What arrives of a sent tensor, by the paper's A.5: the ceil(keep * n) entries of largest magnitude
  (all with keep 0), their values on a uniform 2**bits grid over their range (unchanged with bits 0),
  zero elsewhere."""
  flat = np.asarray(x, np.float32).reshape(-1)
  index = np.argsort(-np.abs(flat), kind='stable')[:int(np.ceil(keep * flat.size))] if keep else np.arange(flat.size)
  values = flat[index]
  if bits:
    lo, hi = values.min(), values.max()
    step = np.float32(max(hi - lo, 1e-12) / (2 ** bits - 1))  # a constant tensor: one grid point
    values = lo + np.round((values - lo) / step) * step
  out = np.zeros_like(flat)
  out[index] = values
  return out.reshape(np.shape(x))


def test_batch_statistics_average_only_every_period():
  """replica.stats_every_steps = 2 rounds (the paper's ImageNet runs: 1300): after round 0 each worker keeps
  its own shared-layer statistics (and none of them enters the all-reduce), after round 1 they are averaged;
  parameters every round."""
  config = replica_config('localsgd', **{'replica.stats_every_steps': 4})  # L = 2
  method, state = initial_state(config)
  engine = method.engine
  params, stats = noisy(state.params, 3), noisy(state.batch_stats, 4)
  state = state._replace(params=engine.put_workers(params), batch_stats=engine.put_workers(stats))
  out = engine.aggregate(state, 0)
  assert_trees_close(jax.device_get(out.batch_stats), stats, tol=0)  # kept, per worker
  assert_trees_close(jax.device_get(out.params), jax.tree.map(lambda x: np.broadcast_to(x.mean(0), x.shape), params),
                     tol=1e-6)
  # what one device (one worker each) puts into the all-reduce, counted here from the float32 leaves
  f32 = lambda tree: 4 * sum(x[0].size for x in jax.tree.leaves(tree))
  assert engine.last_traffic.all_reduce == f32(params) > 0  # parameters only (momentum restarts, not averaged)
  out = engine.aggregate(out, 1)
  assert_trees_close(jax.device_get(out.batch_stats), jax.tree.map(lambda x: np.broadcast_to(x.mean(0), x.shape), stats),
                     tol=1e-6)
  assert engine.last_traffic.all_reduce == f32(params) + f32(stats) and f32(stats) > 0


def test_the_start_up_line_names_the_statistics_averaging_period_when_it_is_not_every_round():
  from jaxdecouple.replica.accounting import describe
  for every, said in ((8, "the shared layers' running statistics averaged every 4 rounds"), (0, None)):
    method, state = initial_state(replica_config('resist', workers=2, steps=8,
                                                 **{'replica.stats_every_steps': every}))
    line = describe(method.engine, state)[0]
    assert (said in line) if said else 'averaged every' not in line, line


def test_resist_starts_from_the_warm_ups_averaged_statistics_between_statistics_rounds():
  """A local-SGD warm-up whose last round is not a statistics round (replica.stats_every_steps longer than the
  warm-up, as in the ImageNet configs: 1300 rounds against 500) leaves each worker its own BatchNorm statistics;
  ResIST starts from their mean over the workers (one network), not from worker 0's."""
  config = replica_config('resist', workers=2, steps=8, **{'replica.warmup_steps': 2, 'replica.stats_every_steps': 8})
  method, state = initial_state(config)
  warm = method.warm
  stats = noisy(state.batch_stats, 5)
  state = state._replace(batch_stats=warm.put_workers(stats))
  after = warm.aggregate(state, 0)  # the warm-up's one round: not a statistics round (every 4)
  assert_trees_close(jax.device_get(after.batch_stats), stats, tol=0)  # each worker kept its own
  handed = method._after_warmup(after)
  mean = jax.tree.map(lambda x: x.mean(0), stats)
  member = np.asarray(handed.membership)
  for w in range(2):
    mine = method.engine.layout.worker_network(jax.device_get(handed.batch_stats), member, w)
    assert mine and set(mine) < set(mean)  # the shared blocks and this worker's own
    assert_trees_close(mine, {n: mean[n] for n in mine}, tol=1e-6)
  with pytest.raises(AssertionError, match='max error'):  # sharp: worker 0's statistics are far from the mean
    assert_trees_close({n: jax.tree.map(lambda x: x[0], stats[n]) for n in mine}, {n: mean[n] for n in mine}, tol=1e-3)


@pytest.mark.parametrize('extra', [{'replica.quantize_bits': 4}, {'replica.quantize_bits': 4, 'replica.min_depth': 2},
                                   {'replica.sparsify': 0.25, 'replica.min_depth': 2}])
def test_mid_round_evaluation_with_compressed_weights_scores_what_the_rounds_end_makes(extra):
  """Compressed weights (the paper's Table 9 runs): evaluated one step into a round (L = 2), the network is the one
  the round's end would make, each worker's shared layers encoded and each block as its next owners receive it
  (through the codec where it changes worker), as a boundary's evaluation after that end scores it; not the exact
  float32 mean of the workers, which no round's end makes (what it scored before 2026-12-06)."""
  config = replica_config('resist', **extra)
  method, state = initial_state(config)
  engine = method.engine
  state = state._replace(params=engine.put_workers(noisy(state.params, 3)),
                         batch_stats=engine.put_workers(noisy(state.batch_stats, 4)))
  engine.steps_done = 1  # one step into round 0: its end comes at step 2
  mid = method.eval_variables(state)
  plain = jax.tree.map(lambda x: x.addressable_data(0), dict(zip(('params', 'batch_stats'),
                                                                 engine.averaging.averaged(state))))
  ended = engine.aggregate(state, 0)  # the round's end itself (donates state)
  engine.steps_done = 2
  assert_trees_close(mid, method.eval_variables(ended), tol=1e-5)
  with pytest.raises(AssertionError, match='max error'):  # sharp: the float32 mean is far from it
    assert_trees_close(plain['params'], mid['params'], tol=1e-3)


def encoded_bytes(n, bits, keep):
  """Bytes of n float32 values on the wire by A.5, counted here: the ceil(keep * n) kept values (all with keep
  0), each as a code of ``bits`` bits packed into bytes after an 8-byte grid (lo, step), or as float32 with
  bits 0; and a 4-byte index per kept value when some are dropped."""
  k = int(np.ceil(keep * n)) if keep else n
  return (8 + -(-k * bits // 8) if bits else 4 * k) + (4 * k if keep else 0)


@pytest.mark.parametrize('bits,keep', [(0, 0.25), (4, 0.0), (5, 0.25), (8, 0.5)])
def test_compression_matches_numpy_and_its_size(bits, keep):
  from jaxdecouple.replica import wire
  x = np.random.default_rng(0).normal(size=(40,)).astype(np.float32)
  np.testing.assert_allclose(compress(jnp.asarray(x), bits, keep), numpy_compress(x, bits, keep), atol=1e-6)
  buf = wire.encode(jnp.asarray(x), bits, keep)
  want = encoded_bytes(40, bits, keep)
  assert buf.dtype == jnp.uint8 and buf.shape == (want,) == (wire.encoded_size(40, bits, keep),)
  if bits:
    assert len(np.unique(np.asarray(compress(jnp.asarray(x), bits, keep)))) <= 2 ** bits + (1 if keep else 0)


@pytest.mark.parametrize('method', ['resist', 'localsgd'])
def test_compressed_repartition_sends_encoded_parameters(method):
  """quantize_bits 4, sparsify 0.5: every worker's shared parameters arrive compressed and are averaged
  (statistics as they are); a block that changes worker arrives compressed (its statistics not), one
  that stays is untouched. The bytes that cross are the encoded rows', fewer than float32 ones."""
  config = replica_config(method, **{'replica.quantize_bits': 4, 'replica.sparsify': 0.5})
  method_, state = initial_state(config)
  engine = method_.engine
  member = np.asarray(state.membership) if engine.partitioned else None
  params, stats = noisy(state.params, 2), noisy(state.batch_stats, 5)
  if engine.partitioned:  # leftover slots stay zero
    empty = np.arange(engine.layout.slots)[None, :] >= member.sum(1)[:, None]
    params[SLOTS] = jax.tree.map(lambda x: np.where(empty.reshape(*empty.shape, *[1] * (x.ndim - 2)), 0, x), params[SLOTS])
  out = engine.aggregate(state._replace(params=engine.put_workers(params), batch_stats=engine.put_workers(stats)), 0)
  nxt = engine.layout.membership(1) if engine.partitioned else None
  views = [engine.layout.worker_network(params, member, w) for w in range(4)]
  stat_views = [engine.layout.worker_network(stats, member, w) for w in range(4)]
  for w in range(4):
    got = engine.layout.worker_network(jax.device_get(out.params), nxt, w)
    got_stats = engine.layout.worker_network(jax.device_get(out.batch_stats), nxt, w)
    for n, tree in got.items():
      if n not in engine.partitioned:
        want = jax.tree.map(lambda *xs: np.mean([numpy_compress(x, 4, 0.5) for x in xs], axis=0), *[v[n] for v in views])
        assert_trees_close(tree, want, tol=1e-5)
        assert_trees_close(got_stats.get(n, {}), jax.tree.map(lambda *xs: np.mean(xs, axis=0),
                                                              *[v[n] for v in stat_views]) if n in got_stats else {}, tol=1e-6)
        continue
      (owner,) = [v for v in range(4) if n in views[v]]
      want = views[owner][n] if owner == w else jax.tree.map(lambda x: numpy_compress(x, 4, 0.5), views[owner][n])
      assert_trees_close(tree, want, tol=1e-5)
      assert_trees_close(got_stats[n], stat_views[owner][n], tol=0)
  # the bytes, counted here from the leaves: a block's parameters each encoded, its statistics float32; the
  # shared layers' statistics float32 into the all-reduce, their parameters each encoded into the all-gather
  traffic = engine.last_traffic
  values = lambda tree, axes: [int(np.prod(x.shape[axes:])) for x in jax.tree.leaves(tree)]
  if engine.partitioned:
    row = sum(encoded_bytes(n, 4, 0.5) for n in values(params[SLOTS], 2)) + 4 * sum(values(stats[SLOTS], 2))
    moved = sum(1 for w in range(4) for b in np.flatnonzero(nxt[w]) if not member[w, b])  # one device per worker
    assert moved > 0 and traffic.sent.sum() == traffic.received.sum() == moved * row
    # half the entries, each 4 bits plus a 4-byte index: about 0.56 of float32
    assert row < 0.6 * 4 * sum(values(params[SLOTS], 2) + values(stats[SLOTS], 2))
  shared = lambda tree: {n: v for n, v in tree.items() if n != SLOTS}
  shared_f32 = 4 * sum(values(shared(params), 1) + values(shared(stats), 1))
  want = 4 * sum(values(shared(stats), 1)) + sum(encoded_bytes(n, 4, 0.5) for n in values(shared(params), 1))
  assert traffic.all_reduce == want < 0.6 * shared_f32


@pytest.mark.parametrize('workers,per_device,depth', [(4, 1, 0), (4, 2, 0), (8, 2, 4), (4, 1, 3)])
def test_exchange_plan_moves_each_needed_block_once(workers, per_device, depth):
  """The plan carried out in numpy: every next slot gets the mean of its block's copies from the round's
  owners; rows cross only between different devices, each at most once per destination device, and
  exactly the copies whose holder's device differs from the next owner's."""
  from jaxdecouple.replica import exchange
  P = 11
  slots = slot_count(P, workers, depth)
  rng = np.random.default_rng(workers + per_device + depth)
  for r in range(3):
    now, nxt = draw_partition(P, workers, 0, r, depth), draw_partition(P, workers, 0, r + 1, depth)
    route = exchange.plan(now, nxt, slots, per_device)
    devices, rows = workers // per_device, per_device * slots
    data = rng.normal(size=(devices, rows, 3))
    received = {d: [] for d in range(devices)}
    needed = set()
    for s, d, index in route.messages:
      assert s != d and len(set(index)) == len(index)
      received[d].extend(data[s, list(index)])
    for w2 in range(workers):
      for b in np.flatnonzero(nxt[w2]):
        for w in np.flatnonzero(now[:, b]):
          if w // per_device != w2 // per_device:
            needed.add((w // per_device, w2 // per_device, (w % per_device) * slots + int(np.flatnonzero(now[w]).tolist().index(b))))
    assert sum(len(i) for _, _, i in route.messages) == len(needed)
    for w2 in range(workers):
      d = w2 // per_device
      incoming = np.concatenate([data[d], np.reshape(received[d], (-1, 3))])
      for j, b in enumerate(np.flatnonzero(nxt[w2])):
        i = (w2 % per_device) * slots + j
        got = incoming[route.gather[d, i, :route.counts[d, i]]].mean(axis=0)
        copies = [data[w // per_device, (w % per_device) * slots + np.flatnonzero(now[w]).tolist().index(b)]
                  for w in np.flatnonzero(now[:, b])]
        np.testing.assert_allclose(got, np.mean(copies, axis=0))
      for j in range(nxt[w2].sum(), slots):
        assert route.counts[d, (w2 % per_device) * slots + j] == 0


def test_a_resist_round_moves_its_share_of_local_sgds_bytes():
  """One round at S = 4 on 4 devices, counted from the transfers made: local SGD all-reduces every
  layer; ResIST all-reduces the shared layers and sends each block that changes device once."""
  engines, states, traffic = {}, {}, {}
  for method in ('resist', 'localsgd'):
    m, states[method] = initial_state(replica_config(method))
    engines[method] = m.engine
    m.engine.aggregate(states[method], 0)
    traffic[method] = m.engine.last_traffic
  e = engines['resist']
  full = jax.device_get(e.model.init(jax.random.key(0), jnp.zeros((1, 32, 32, 3))))
  size = lambda names: 4 * sum(x.size for c in full for n in names if n in full[c] for x in jax.tree.leaves(full[c][n]))
  shared, block = size([n for n in e.chain.names if n not in e.partitioned]), size(['s3b1'])
  now, nxt = e.layout.membership(0), e.layout.membership(1)
  moved = sum(1 for w in range(4) for b in np.flatnonzero(nxt[w]) if not now[w, b])
  assert traffic['localsgd'].all_reduce == shared + 5 * block and not traffic['localsgd'].sent.any()
  assert traffic['resist'].all_reduce == shared
  assert traffic['resist'].sent.sum() == traffic['resist'].received.sum() == moved * block
  resist = shared + traffic['resist'].sent.mean()
  assert resist / traffic['localsgd'].all_reduce == pytest.approx((shared + moved * block / 4) / (shared + 5 * block))
  assert resist < traffic['localsgd'].all_reduce


# --- evaluation and accounting -------------------------------------------------------------------

def test_test_time_scales_every_partitioned_residual_branch():
  method, ds = build_method(replica_config('resist'))
  engine = method.engine
  model = engine.eval_model()
  scales = {n: getattr(m, 'residual_scale', None) for n, m in zip(model.block_names, model.chain.modules)}
  assert all(scales[n] == 0.25 for n in engine.partitioned)
  assert scales['s3b0'] == 1.0 and scales['s1b0'] == 1.0
  # The block computes shortcut + scale * branch (identity shortcut inside section 3).
  block = dict(zip(model.block_names, model.chain.modules))['s3b1']
  x = jnp.asarray(np.random.default_rng(0).normal(size=(4, 8, 8, 32)), jnp.float32)
  v = block.init(jax.random.key(0), x, train=False)
  full = block.clone(residual_scale=1.0).apply(v, x, train=False)
  np.testing.assert_allclose(block.apply(v, x, train=False), x + 0.25 * (full - x), atol=1e-5)
  deep, _ = build_method(replica_config('resist', **{'replica.min_depth': 3}))
  assert deep.engine.eval_model().chain.modules[model.block_names.index('s3b1')].residual_scale == 0.6
  unscaled, _ = build_method(replica_config('resist', **{'replica.test_time_scale': False}))  # A.1's ablation
  assert all(getattr(m, 'residual_scale', 1.0) == 1.0 for m in unscaled.engine.eval_model().chain.modules)


def test_the_papers_deeper_resnets_partition_their_longer_third_sections():
  for name, depth, blocks in (('preact101', 101, 23), ('preact152', 152, 40), ('preact200', 200, 56)):
    model = build_model(name, 100)
    assert 3 * len(model.sections) + 2 == depth  # the paper counts depth as ResNet-101's name does
    assert sum(s == 2 for s, _ in model.sections.values()) == blocks
    assert len(partitioned_blocks(model)) == blocks - 1  # every extra block is partitioned (A.4)
  for cifar in ('resnet152', 'resnet200'):  # the CIFAR ResNets (6n+2) are not them, and say so
    with pytest.raises(ValueError, match='preact152 and preact200'):
      partitioned_blocks(build_model(cifar, 10))
  with pytest.raises(ValueError, match=r'or postact101, postact_tiny$'):  # the hint only where the name could be taken for the paper's
    partitioned_blocks(build_model('resnet20', 10))


def test_table_8s_config_builds_each_cell_and_refuses_others():
  import importlib.util
  from jaxdecouple.methods import validate
  from jaxdecouple.papers import RESIST_DEEPER
  path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'configs', 'resist_deeper.py')
  spec = importlib.util.spec_from_file_location('resist_deeper', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  for (dataset, workers, model) in RESIST_DEEPER:
    for method in ('resist', 'localsgd'):
      c = module.get_config(f'{method},{model},{dataset},{workers}')
      validate(c)
      assert (c.method, c.model, c.dataset, c.replica.num_workers) == (method, model, dataset, workers)
      assert (c.num_epochs, c.optim.milestones, c.replica.local_steps) == (80, (40, 60), 100)  # Table 8's
  for bad in ('resist,preact101,cifar10,4', 'resist,preact152,cifar10,8', 'sgd,preact152,cifar10,4', 'resist'):
    with pytest.raises(ValueError, match='resist_deeper.py'):
      module.get_config(bad)


def test_the_release_recipe_takes_the_network_its_study_measured():
  """Issue 42 item 0: the paper's ResIST configs take the release's initialisation, head and test batch, exactly
  the fields study cpu_cifar10_resist_release switched on its last setting; the CPU ResIST studies keep the
  library's network, as their committed runs were made."""
  import glob
  import importlib.util
  from jaxdecouple.recipes import resist_release
  from jaxdecouple.study.definitions import cpu_cifar10_resist, cpu_cifar10_resist_release
  name, release = cpu_cifar10_resist_release.SETTINGS[-1]
  assert name == 'release init, head and test batch'
  for method in ('resist', 'localsgd'):
    ours = cpu_cifar10_resist.build(method, 2)()
    assert (ours.model_init, ours.model_head_norm, ours.eval_batch_size) == ('he', True, 1000)
    paper = resist_release(method, 'cifar10', 2, 8, 'preact_tiny_s3_9')
    differs = {k: paper[k] for k in ('model_init', 'model_head_norm', 'eval_batch_size') if paper[k] != ours[k]}
    assert differs == release
    library = resist_release(method, 'cifar10', 2, 8, 'preact_tiny_s3_9', release_net=False)
    library.data.source, library.log_every_steps, library.checkpoint_every_steps = 'npz', 100, 500  # as the study
    assert library.to_dict() == ours.to_dict()
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  paths = [p for p in sorted(glob.glob(os.path.join(root, 'configs', '*preact101*.py')))]
  assert len(paths) >= 10
  for path in paths + [os.path.join(root, 'configs', 'resist_deeper.py')]:
    spec = importlib.util.spec_from_file_location('c', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    c = module.get_config()
    assert (c.model_init, c.model_head_norm, c.eval_batch_size) == ('torch', False, 100), path


def test_communication_for_resnet101_against_the_papers_table():
  """Per round each worker sends what it trained and receives its next network, float32. Local SGD
  matches the paper's Table 1 exactly, and so does ResIST at S = 2; the paper's S = 4 and S = 8
  figures are exactly sub-networks of 6 and 4 blocks, i.e. a minimum depth of 6 and 4. Our plain partition deals
  the 22 alike blocks of the third section (s3b1..s3b22) out as 22 / S a worker on average (5.5 and 2.75), so
  each worker sends and receives (6 - 5.5) and (4 - 2.75) blocks fewer than at those depths: 0.701 and 1.195 GB."""
  from jaxdecouple.replica import Replica, ReplicaSpec, traffic_model
  model = build_model('preact101', 100)
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, 32, 32, 3))))['params']
  traffic = lambda workers, **kw: traffic_model(Replica(model, ReplicaSpec(workers, 50, **kw), jax.devices(), None,
                                                        None, None), shapes, 0)['total'] / 1e9
  for workers, local_gb, resist_gb, depth in ((2, 0.662, 0.454, 0), (4, 1.325, 0.720, 6), (8, 2.649, 1.289, 4)):
    assert traffic(workers, partition=False) == pytest.approx(local_gb, abs=6e-4)
    assert traffic(workers, partition=True, min_depth=depth) == pytest.approx(resist_gb, abs=6e-4)
  alike = [name for name in shapes if name.startswith('s3b') and name != 's3b0']  # s3b0 changes the shape
  assert len(alike) == 22
  block_gb = sum(4 * math.prod(x.shape) for x in jax.tree.leaves(shapes['s3b1'])) / 1e9
  assert all(sum(4 * math.prod(x.shape) for x in jax.tree.leaves(shapes[n])) / 1e9 == block_gb for n in alike)
  for workers, depth in ((4, 6), (8, 4)):
    fewer = workers * 2 * (depth - len(alike) / workers) * block_gb  # S workers, each sending and receiving
    assert traffic(workers, partition=True) == pytest.approx(traffic(workers, partition=True, min_depth=depth) - fewer,
                                                             rel=1e-9)
  assert traffic(4, partition=True) == pytest.approx(0.701, abs=1e-3)  # the figures the docs quote
  assert traffic(8, partition=True) == pytest.approx(1.195, abs=1e-3)


def test_the_table1_count_counts_encoded_bytes_both_ways_and_the_travelling_outer_momentum():
  """Table 1's count with compression or an outer step (the start-up log's model): what travels encoded is
  counted encoded both ways (what is received is what was sent): with compressed weights every parameter (8 bits:
  a quarter of float32), with compressed updates ResIST's shared layers only (its blocks move whole) and all of
  local SGD's; with outer momentum a partitioned block's momentum travels with it (its bytes twice over), a shared
  layer's never."""
  from jaxdecouple.replica import Replica, ReplicaSpec, traffic_model
  model = build_model('preact_tiny_s3_9', 10)
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, 32, 32, 3))))['params']
  S = 4

  def count(partition, **kw):
    engine = Replica(model, ReplicaSpec(S, 50, partition=partition, **kw), jax.devices(), None, None, None)
    return traffic_model(engine, shapes, 0), engine.layout.parameter_counts(shapes)[0]
  for partition in (False, True):
    plain, shared = count(partition)
    shared_f32 = 2 * S * 4 * shared  # the shared layers' float32 bytes, sent and received by every worker
    assert plain['sent_per_worker'] == pytest.approx(plain['received_per_worker'])  # round 0 -> 1: as many blocks
    weights8, _ = count(partition, quantize_bits=8)
    assert weights8['total'] == pytest.approx(plain['total'] / 4)
    assert weights8['sent_per_worker'] == pytest.approx(weights8['received_per_worker'])
    updates8, _ = count(partition, quantize_bits=8, compress='updates')
    updates_kept, _ = count(partition, sparsify=0.25, compress='updates')  # a quarter of values and int32 indices
    if partition:
      assert updates8['total'] == pytest.approx(plain['total'] - shared_f32 + shared_f32 / 4)
      assert updates_kept['total'] == pytest.approx(plain['total'] - shared_f32 + shared_f32 / 2)
    else:
      assert updates8['total'] == pytest.approx(plain['total'] / 4)
      assert updates_kept['total'] == pytest.approx(plain['total'] / 2)
    outer, _ = count(partition, outer_momentum=0.5)
    assert outer['total'] == pytest.approx(plain['total'] + (plain['total'] - shared_f32 if partition else 0))
    assert count(partition, outer_lr=0.7)[0]['total'] == pytest.approx(plain['total'])  # no momentum: nothing more
    # SGD's momentum averaged with its parameters (replica.momentum='average'): one float32 more per parameter
    assert count(partition, momentum='average')[0]['total'] == pytest.approx(2 * plain['total'])


@pytest.mark.parametrize('overrides,field', [
    ({'replica.num_workers': 0}, 'replica.num_workers'),
    ({'replica.num_workers': 6}, 'replica.num_workers'),
    ({'replica.momentum': 'keep'}, 'replica.momentum'),
    ({'replica.skip': 'mask'}, 'replica.skip'),
    ({'replica.quantize_bits': 2}, 'replica.quantize_bits'),
    ({'replica.stats_every_steps': 3}, 'replica.stats_every_steps'),  # not a multiple of L = 2
    ({'replica.warmup_steps': 3}, 'replica.warmup_steps'),  # not a multiple of L = 2
    ({'replica.warmup_steps': 6}, 'replica.warmup_steps'),  # longer than the 5-step run
    # longer than a run counted in epochs (1 epoch of 256 / 32 = 8 steps), which only the data's size tells
    ({'replica.warmup_steps': 8, 'steps': 0, 'num_epochs': 1, 'optim.milestones': ()}, 'replica.warmup_steps'),
    ({'replica.partition': 'all'}, 'replica.partition'),
    ({'replica.partition': 'every_section', 'replica.min_depth': 2}, 'replica.min_depth'),
    ({'model': 'resnet8'}, 'model'),
])
def test_bad_replica_settings_are_refused(overrides, field, workdir):
  with pytest.raises(ConfigError, match=field.replace('.', r'\.')):
    kw = dict(overrides)
    train_and_evaluate(replica_config('resist', steps=kw.pop('steps', 5), **kw), workdir)


def test_slots_need_contiguous_alike_partitioned_blocks():
  model = build_model('preact_tiny', 10)
  with pytest.raises(ValueError, match='contiguous'):
    check_partitioned_run(model.chain, ('s3b1', 's3b3'))  # s3b2 between them is shared
  with pytest.raises(ValueError, match='definition'):
    check_partitioned_run(model.chain, ('s3b0', 's3b1'))  # the strided block differs
  check_partitioned_run(model.chain, partitioned_blocks(model))
