"""Where to cut a model into K contiguous stages.

``reference``: the FDG paper's splits (the SPEC's table), named by the first block of stages 1..K-1
(the stem always goes with stage 0, the head with stage K-1). ``balanced``: contiguous stages that
minimise the largest stage's estimated cost (XLA's FLOP count of each block's training forward).
An explicit list of block names or indices is accepted too.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp

from jaxdecouple.models import Model

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
  how: str                      # 'reference', 'balanced' or 'explicit'
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
