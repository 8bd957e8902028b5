"""A model is an ordered chain of blocks that can be cut at any block boundary.

Each block is its own Flax Linen module with its own variables, stored under the block's name:
``{'params': {name: ...}, 'batch_stats': {name: ...}}``. A stage is a contiguous slice of the chain,
so the variables of the whole model are exactly the union of its stages' variables and running the
stages one after another is exactly running the whole model.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
from flax import linen as nn

Variables = dict[str, dict[str, Any]]
COLLECTIONS = ('params', 'batch_stats')


@dataclasses.dataclass(frozen=True)
class Chain:
  """An ordered tuple of named blocks; ``Chain.apply`` runs them in order."""
  names: tuple[str, ...]
  modules: tuple[nn.Module, ...]

  def __post_init__(self):
    if len(self.names) != len(self.modules) or not self.names:
      raise ValueError('a chain needs one name per block and at least one block')
    if len(set(self.names)) != len(self.names):
      raise ValueError(f'block names must be unique, got {self.names}')

  def __len__(self) -> int:
    return len(self.names)

  def init(self, rng: jax.Array, x: jax.Array) -> Variables:
    """Initialises every block on the output shape of the previous one (block i from
    fold_in(rng, i)), all in one compiled call: eager initialisation dispatches hundreds of small
    computations and took seconds even for tiny models."""
    return _init_chain(self, rng, jax.ShapeDtypeStruct(x.shape, x.dtype))

  def apply(self, variables: Mapping[str, Mapping[str, Any]], x: jax.Array,
            train: bool) -> tuple[jax.Array, dict[str, Any]]:
    """Runs the blocks in order. Returns the output and the new batch statistics.

    In training mode BatchNorm uses the batch's statistics and updates the running ones;
    in evaluation mode it uses the running statistics and the returned ones are unchanged.
    """
    new_stats = {}
    for name, module in zip(self.names, self.modules):
      block_vars = {c: v[name] for c, v in variables.items() if name in v}
      if train and 'batch_stats' in block_vars:
        x, updated = module.apply(block_vars, x, train=True, mutable=['batch_stats'])
        new_stats[name] = updated['batch_stats']
      else:
        x = module.apply(block_vars, x, train=train)
        if 'batch_stats' in block_vars:
          new_stats[name] = block_vars['batch_stats']
    return x, new_stats

  def slice(self, start: int, stop: int) -> 'Chain':
    return Chain(self.names[start:stop], self.modules[start:stop])


@dataclasses.dataclass(frozen=True)
class Model:
  """A named network: its chain of blocks plus what the rest of the library needs to know."""
  name: str
  chain: Chain
  num_classes: int
  # Block name -> (section index, index inside the section) for residual blocks; used by the
  # reference stage splits ("S2[:4]") and by width-wise partitions.
  sections: Mapping[str, tuple[int, int]] = dataclasses.field(default_factory=dict)

  @property
  def block_names(self) -> tuple[str, ...]:
    return self.chain.names

  def init(self, rng: jax.Array, x: jax.Array) -> Variables:
    return self.chain.init(rng, x)

  def apply(self, variables, x, train: bool):
    return self.chain.apply(variables, x, train)

  def with_batch_norm_axis(self, axis_name: str | None) -> 'Model':
    """The same network whose BatchNorm averages its batch statistics over a mapped axis."""
    modules = tuple(m.clone(bn_axis=axis_name) for m in self.chain.modules)
    return dataclasses.replace(self, chain=Chain(self.chain.names, modules))

  def cut(self, boundaries: Sequence[int]) -> list[Chain]:
    """Cuts the chain into stages; ``boundaries`` are the first block index of stages 1..K-1."""
    edges = [0, *boundaries, len(self.chain)]
    if any(b <= a for a, b in zip(edges, edges[1:])):
      raise ValueError(f'stage boundaries must be strictly increasing inside (0, {len(self.chain)}), '
                       f'got {list(boundaries)}')
    return [self.chain.slice(a, b) for a, b in zip(edges, edges[1:])]


def _init_chain_fn(chain: 'Chain', x_shape: jax.ShapeDtypeStruct):
  def init(rng):
    variables: Variables = {c: {} for c in COLLECTIONS}
    x = jnp.zeros(x_shape.shape, x_shape.dtype)
    for i, (name, module) in enumerate(zip(chain.names, chain.modules)):
      block_vars = module.init(jax.random.fold_in(rng, i), x, train=False)
      for collection, value in block_vars.items():
        variables.setdefault(collection, {})[name] = value
      out = jax.eval_shape(lambda v, x, module=module: module.apply(v, x, train=False), block_vars, x)
      x = jnp.zeros(out.shape, x.dtype)
    return variables
  return init


@functools.lru_cache(maxsize=32)
def _compiled_init(chain: 'Chain', x_shape: jax.ShapeDtypeStruct, backend: str):
  """The whole chain's initialisation as one executable. On the CPU it is compiled without XLA's
  backend optimisations: the random-number code compiles 5x faster and runs once, in milliseconds
  either way."""
  lowered = jax.jit(_init_chain_fn(chain, x_shape)).lower(jax.random.key(0))
  options = {'xla_backend_optimization_level': 0} if backend == 'cpu' else None
  return lowered.compile(compiler_options=options) if options else lowered.compile()


def _init_chain(chain: 'Chain', rng: jax.Array, x_shape: jax.ShapeDtypeStruct) -> Variables:
  if isinstance(rng, jax.core.Tracer):  # inside a trace (eval_shape, jit): trace it in place
    return _init_chain_fn(chain, x_shape)(rng)
  return _compiled_init(chain, x_shape, jax.default_backend())(rng)


def subset(variables: Mapping[str, Mapping[str, Any]], names: Sequence[str]) -> Variables:
  """The variables of the named blocks only (a stage's share of the whole model)."""
  return {c: {n: v[n] for n in names if n in v} for c, v in variables.items()}


def merge(parts: Sequence[Mapping[str, Mapping[str, Any]]]) -> Variables:
  """The union of several stages' variables: the whole model's variable dict."""
  out: Variables = {c: {} for c in COLLECTIONS}
  for part in parts:
    for c, v in part.items():
      out.setdefault(c, {}).update(v)
  return out


def count_params(params: Any) -> int:
  return int(sum(x.size for x in jax.tree.leaves(params)))
