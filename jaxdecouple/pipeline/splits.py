"""Where to cut a model into K contiguous stages.

``reference``: the FDG paper's splits (the SPEC's table), named by the first block of stages 1..K-1
(the stem always goes with stage 0, the head with stage K-1). ``balanced``: contiguous stages that
minimise the largest stage's estimated cost (XLA's FLOP count of each block's training forward).
An explicit list of block names or indices is accepted too.

:func:`timed_split` balances measured seconds instead (:func:`block_seconds`: each block's training forward
and backward, timed on the device at the batch one call processes). Why it exists: FLOPs are not time. On
XLA:CPU ResNet-56's early, high-resolution blocks take 2.3-2.9x the seconds per FLOP of its later ones, so
the FLOP-balanced split leaves stage 0 with about twice stage 1's work and stage 1 idle half of every
iteration (docs/PERFORMANCE.md). It is not a ``pipeline.split`` value on purpose: a split measured at start-up
could differ between the processes of one run and between a run and its resume (timings vary), and the stages'
variables follow the split. ``benchmarks/block_times.py`` measures once and prints the split to write into the
config, where it stays fixed.
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxdecouple.models import Chain, Model

# (model, K) -> first block of stages 1..K-1, transcribed from the SPEC's "Reference splits" table.
REFERENCE_SPLITS: dict[tuple[str, int], tuple[str, ...]] = {
    ('resnet56', 2): ('s2b4',),                   # stem+S1+S2[:4] / S2[4:]+S3
    ('resnet56', 3): ('s2b0', 's3b0'),            # S1 / S2 / S3
    ('resnet56', 4): ('s1b6', 's2b4', 's3b2'),    # S1[:6] / S1[6:]+S2[:4] / S2[4:]+S3[:2] / S3[2:]
    ('resnet110', 2): ('s2b9',),                  # S1+S2[:9] / rest
    ('resnet110', 3): ('s2b0', 's3b0'),
    ('resnet110', 4): ('s1b13', 's2b9', 's3b5'),
    ('resnet18', 2): ('s3b0',),                   # stem+S1+S2 / S3+S4
    ('resnet18', 3): ('s2b0', 's3b1'),            # S1 / S2+S3[:1] / rest
    ('wrn28_10', 2): ('s2b2',),                   # stem+S1+S2[:2] / rest
    ('wrn28_10', 3): ('s2b0', 's3b0'),
    ('wrn28_10', 4): ('s1b3', 's2b2', 's3b1'),
}


@dataclasses.dataclass(frozen=True)
class Split:
  boundaries: tuple[int, ...]   # first block index of stages 1..K-1
  how: str                      # 'reference', 'balanced', 'timed' or 'explicit'
  block_costs: tuple[float, ...]

  def stage_blocks(self, model: Model) -> list[tuple[str, ...]]:
    edges = [0, *self.boundaries, len(model.block_names)]
    return [model.block_names[a:b] for a, b in zip(edges, edges[1:])]

  def stage_costs(self) -> list[float]:
    edges = [0, *self.boundaries, len(self.block_costs)]
    return [sum(self.block_costs[a:b]) for a, b in zip(edges, edges[1:])]


_FLOP_CACHE: dict[tuple, tuple[float, ...]] = {}


def block_flops(model: Model, image_shape: Sequence[int], batch: int = 8) -> tuple[float, ...]:
  """XLA's FLOP estimate of each block's training-mode forward (per ``batch`` examples)."""
  key = (model.name, model.num_classes, tuple(image_shape), batch)
  if key in _FLOP_CACHE:
    return _FLOP_CACHE[key]
  x = jax.ShapeDtypeStruct((batch, *image_shape), jnp.float32)
  costs, known = [], {}  # identical blocks on identical inputs cost the same: measured once (ResNet-1202)
  for module in model.chain.modules:
    if (module, x.shape) not in known:
      variables = jax.eval_shape(lambda x: module.init(jax.random.key(0), x, train=False), x)
      fn = lambda v, x: module.apply(v, x, train=True, mutable=['batch_stats'])[0]
      try:
        analysis = jax.jit(fn).lower(variables, x).compile().cost_analysis()
        if isinstance(analysis, (list, tuple)):
          analysis = analysis[0] if analysis else {}
        flops = float((analysis or {}).get('flops', 0.0))
      except Exception:  # a backend without cost analysis: fall back to parameter counts
        flops = 0.0
      if flops <= 0:
        flops = float(sum(l.size for l in jax.tree.leaves(variables.get('params', {})))) * batch * 2
      known[module, x.shape] = (max(flops, 1.0), jax.eval_shape(fn, variables, x))
    flops, x = known[module, x.shape]
    costs.append(flops)
  _FLOP_CACHE[key] = tuple(costs)
  return _FLOP_CACHE[key]


def block_seconds(model: Model, input_shape: Sequence[int], batch: int, input_dtype=jnp.float32,
                  repeats: int = 5, device: jax.Device | None = None) -> tuple[float, ...]:
  """Measured seconds of each block's training step on ``device`` (default: the first) at ``batch`` examples:
  its forward in training mode (BatchNorm on the batch's statistics) and the backward to its parameters and
  its input, as one compiled call; the median of ``repeats`` calls after a compiling one, each waited for.
  Identical blocks on identical inputs are timed once (ResNet-1202). The pipeline's stage calls add the
  optimizer update and the transfers, which this leaves out: a stage costs about the sum of its blocks."""
  device = device or jax.devices()[0]
  rng = np.random.default_rng(0)
  if jnp.issubdtype(input_dtype, jnp.integer):
    x = jax.device_put(jnp.zeros((batch, *input_shape), input_dtype), device)
  else:
    x = jax.device_put(jnp.asarray(rng.standard_normal((batch, *input_shape)), input_dtype), device)
  seconds, known = [], {}
  for name, module in zip(model.chain.names, model.chain.modules):
    key = (module, x.shape, x.dtype)
    if key not in known:
      one = Chain((name,), (module,))  # the model's own init and apply, for one block
      variables = jax.device_put(one.init(jax.random.key(0), x), device)
      params, rest = variables.get('params', {}), {c: v for c, v in variables.items() if c != 'params'}
      wrt_input = jnp.issubdtype(x.dtype, jnp.inexact)

      def step(params, x, one=one, rest=rest, wrt_input=wrt_input):
        forward = lambda p, x: one.apply({'params': p, **rest}, x, train=True)[0]
        if wrt_input:
          y, pullback = jax.vjp(forward, params, x)
        else:
          y, pullback = jax.vjp(lambda p: forward(p, x), params)
        return y, pullback(jnp.ones_like(y))

      compiled = jax.jit(step).lower(params, x).compile()
      y, _ = jax.block_until_ready(compiled(params, x))
      times = []
      for _ in range(max(1, repeats)):
        start = time.perf_counter()
        jax.block_until_ready(compiled(params, x))
        times.append(time.perf_counter() - start)
      known[key] = (statistics.median(times), y)
    elapsed, x = known[key]
    seconds.append(elapsed)
  return tuple(seconds)


def timed_split(model: Model, k: int, input_shape: Sequence[int], batch: int, **timing) -> Split:
  """K contiguous stages that minimise the largest stage's measured seconds (:func:`block_seconds` at the
  batch one stage call processes: the batch for FDG and the other asynchronous methods, a micro-batch for
  GPipe, 1F1B and ZB-H1). Pass its blocks to ``pipeline.split`` (:func:`split_names`)."""
  costs = block_seconds(model, input_shape, batch, **timing)
  return Split(balanced_boundaries(costs, k), 'timed', costs)


def split_names(model: Model, split: Split) -> str:
  """The ``pipeline.split`` value that reproduces ``split``: the first block of stages 1..K-1, e.g. 's1b8'."""
  return ','.join(model.block_names[b] for b in split.boundaries)


def balanced_boundaries(costs: Sequence[float], k: int) -> tuple[int, ...]:
  """Contiguous split of ``costs`` into k non-empty parts minimising the largest part (exact DP)."""
  n = len(costs)
  if not 1 <= k <= n:
    raise ValueError(f'cannot cut {n} blocks into {k} stages')
  prefix = [0.0]
  for c in costs:
    prefix.append(prefix[-1] + c)
  inf = float('inf')
  best = [[inf] * (n + 1) for _ in range(k + 1)]
  cut = [[0] * (n + 1) for _ in range(k + 1)]
  best[0][0] = 0.0
  for parts in range(1, k + 1):
    for end in range(parts, n + 1):
      for start in range(parts - 1, end):
        value = max(best[parts - 1][start], prefix[end] - prefix[start])
        if value < best[parts][end]:
          best[parts][end], cut[parts][end] = value, start
  bounds, end = [], n
  for parts in range(k, 0, -1):
    end = cut[parts][end]
    bounds.append(end)
  return tuple(sorted(bounds)[1:])


def choose_split(model: Model, k: int, how, image_shape: Sequence[int]) -> Split:
  """The split named by ``how``: 'reference', 'balanced', 'auto' (reference if the SPEC has one,
  else balanced) or a sequence of block names/indices that start stages 1..K-1."""
  costs = block_flops(model, image_shape)
  names = model.block_names
  if k > len(names):
    raise ValueError(f'{model.name} has only {len(names)} blocks; it cannot be cut into {k} stages')
  if isinstance(how, str) and how in ('reference', 'auto'):
    ref = REFERENCE_SPLITS.get((model.name, k))
    if ref is not None:
      return Split(tuple(names.index(b) for b in ref), 'reference', costs)
    if how == 'reference' and k > 1:
      known = sorted({m for m, _ in REFERENCE_SPLITS})
      raise ValueError(f'the SPEC has no reference split of {model.name} into {k} stages (it has '
                       f'{", ".join(known)} at K = 2..4); use split="balanced" or list the blocks')
    how = 'balanced'
  if how == 'balanced':
    return Split(balanced_boundaries(costs, k), 'balanced', costs)
  if how in ('timed', 'measured'):  # measured once and written down, never at start-up (the module's docstring)
    raise ValueError(f'pipeline.split={how!r} is not measured at start-up: run python benchmarks/block_times.py '
                     f'--model={model.name} --stages={k} --batch=B (B: the batch one stage call processes) and '
                     'put the split it prints in the config, e.g. --config.pipeline.split=s1b8')
  if isinstance(how, str):
    how = [s.strip() for s in how.split(',') if s.strip()]
  bounds = []
  for b in how:
    if isinstance(b, str) and not b.isdigit():
      if b not in names:
        raise ValueError(f'{model.name} has no block {b!r}; blocks are {", ".join(names)}')
      bounds.append(names.index(b))
    else:
      bounds.append(int(b))
  if len(bounds) != k - 1 or bounds != sorted(set(bounds)) or (bounds and not 0 < bounds[0]) \
      or (bounds and bounds[-1] >= len(names)):
    raise ValueError(f'an explicit split of {model.name} into {k} stages needs {k - 1} increasing '
                     f'block boundaries inside 1..{len(names) - 1}, got {list(how)}')
  return Split(tuple(bounds), 'explicit', costs)
