"""A model is an ordered chain of blocks that can be cut at any block boundary.

Each block is its own Flax Linen module with its own variables, stored under the block's name:
``{'params': {name: ...}, 'batch_stats': {name: ...}}``. A stage is a contiguous slice of the chain,
so the variables of the whole model are exactly the union of its stages' variables and running the
stages one after another is exactly running the whole model.

Very deep networks (ResNet-1202: 600 blocks) would take minutes to compile with every block unrolled.
A chain built with ``scan_min=n`` runs each run of at least n identical, shape-keeping consecutive
blocks as one ``jax.lax.scan`` over their stacked variables, stored under ``'first..last'`` (e.g.
``'s1b0..s1b199'``) with a leading axis of one entry per block. The layout follows the variables:
``apply`` scans what is stacked and unrolls the rest, and ``relayout`` moves variables between layouts
(a stage cut inside a run gets its part of the stack), so cuts and splits work as before.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from jaxdecouple.models.gradients import in_scan
from jaxdecouple.models.objectives import classification_loss

Variables = dict[str, dict[str, Any]]
COLLECTIONS = ('params', 'batch_stats')


@dataclasses.dataclass(frozen=True)
class Chain:
  """An ordered tuple of named blocks; ``Chain.apply`` runs them in order."""
  names: tuple[str, ...]
  modules: tuple[nn.Module, ...]
  scan_min: int = 0  # runs of at least this many identical blocks are scanned (0: never)

  def __post_init__(self):
    if len(self.names) != len(self.modules) or not self.names:
      raise ValueError('a chain needs one name per block and at least one block')
    if len(set(self.names)) != len(self.names):
      raise ValueError(f'block names must be unique, got {self.names}')

  def __len__(self) -> int:
    return len(self.names)

  def init(self, rng: jax.Array, x: jax.Array) -> Variables:
    """Initialises every block on the output shape of the previous one (block i from
    fold_in(rng, i); a scanned run's blocks in one vmapped call, with the same values), all in one
    compiled call: eager initialisation dispatches hundreds of small computations and took seconds
    even for tiny models."""
    return _init_chain(self, rng, jax.ShapeDtypeStruct(x.shape, x.dtype))

  def runs(self, x_shape: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """The [start, stop) block ranges this chain scans on inputs of shape ``x_shape``: maximal runs of
    equal modules that keep their input's shape, at least ``scan_min`` long."""
    return _runs(self, tuple(x_shape))

  def apply(self, variables: Mapping[str, Mapping[str, Any]], x: jax.Array,
            train: bool) -> tuple[jax.Array, dict[str, Any]]:
    """Runs the blocks in order (stacked runs as one scan). Returns the output and the new batch
    statistics, in the variables' layout.

    In training mode BatchNorm uses the batch's statistics and updates the running ones;
    in evaluation mode it uses the running statistics and the returned ones are unchanged.
    """
    new_stats, i = {}, 0
    stacked = {k.split('..')[0]: k for v in variables.values() for k in v if '..' in k}
    while i < len(self.names):
      key = stacked.get(self.names[i], self.names[i])
      module, count = self.modules[i], (self.names.index(key.split('..')[1]) - i + 1 if '..' in key else 1)
      block_vars = {c: v[key] for c, v in variables.items() if key in v}
      if count > 1:
        def body(x, v, module=module):
          x, stats = apply_block(module, v, x, train)
          return x, stats
        body = _scan_remat(module, body)
        with in_scan():  # on the CPU, gradients written for loop bodies (models/gradients.py)
          x, stats = jax.lax.scan(body, x, block_vars)
      else:
        x, stats = apply_block(module, block_vars, x, train)
      if 'batch_stats' in block_vars:
        new_stats[key] = stats
      i += count
    return x, new_stats

  def slice(self, start: int, stop: int) -> 'Chain':
    return Chain(self.names[start:stop], self.modules[start:stop], self.scan_min)


def _scan_remat(module, body):
  """A scanned run's body under the remat policy its block names (``SCAN_REMAT_POLICY``, a name in
  ``jax.checkpoint_policies``), on the CPU only.

  Why: a scan's forward writes each iteration's residuals (what its backward will need) into stacked arrays,
  and XLA:CPU does that slowly, about a second per GB on the EPYC host here, where an unrolled forward leaves
  them in place. A transformer block's residuals are large (a 12-block GPT at 32 x 128 tokens: 1.14 GB, most
  of it the GELU's and the softmax's elementwise intermediates), and its scanned forward took 2.4x the
  unrolled one. Saving only the matrix products' outputs (``dots_saveable``: 375 MB) and recomputing the
  elementwise rest in the backward made the scanned GPT's BP step 1.06-1.21x the unrolled one instead of 1.41x
  (docs/PERFORMANCE.md). On a GPU the scan was already as fast as unrolled, so nothing is recomputed there.
  The values are the same either way: the recomputation repeats the forward's operations."""
  policy = getattr(type(module), 'SCAN_REMAT_POLICY', None)
  if policy is None or jax.default_backend() != 'cpu':
    return body
  return jax.checkpoint(body, policy=getattr(jax.checkpoint_policies, policy))


def apply_block(module, block_vars, x, train: bool):
  """One block's output and its batch statistics (updated when training with BatchNorm, else as given)."""
  if train and 'batch_stats' in block_vars:
    x, updated = module.apply(block_vars, x, train=True, mutable=['batch_stats'])
    return x, updated['batch_stats']
  return module.apply(block_vars, x, train=train), block_vars.get('batch_stats')


def _out_shape(module, x_shape):
  x = jax.ShapeDtypeStruct(x_shape, jnp.float32)
  return jax.eval_shape(lambda x: module.init_with_output(jax.random.key(0), x, train=False)[0], x).shape


@functools.lru_cache(maxsize=256)
def _runs(chain: 'Chain', x_shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
  runs, i, n = [], 0, len(chain.modules)
  while i < n:
    j, module = i + 1, chain.modules[i]
    while j < n and chain.modules[j] == module:
      j += 1
    out = _out_shape(module, x_shape)
    start = i if out == x_shape else i + 1  # a section's first block changes the shape, the rest keep it
    if start > i and j > start and _out_shape(module, out) != out:
      start = j  # every block changes the shape (e.g. strided ones): nothing to scan
    if chain.scan_min and j - start >= max(chain.scan_min, 2):
      runs.append((start, j))
    x_shape = out
    for _ in range(i + 1, j if start == j else i + 1):
      x_shape = _out_shape(module, x_shape)
    i = j
  return tuple(runs)


def segments(chain: 'Chain', x_shape) -> list[tuple[str, int, int]]:
  """(key, start, stop) of every stored piece of ``chain``'s variables: a block, or a scanned run."""
  runs = dict(chain.runs(x_shape))
  out, i = [], 0
  while i < len(chain.names):
    stop = runs.get(i, i + 1)
    out.append((chain.names[i] if stop == i + 1 else f'{chain.names[i]}..{chain.names[stop - 1]}', i, stop))
    i = stop
  return out


def relayout(parts: Sequence[Variables], chain: 'Chain', x_shape) -> Variables:
  """The variables of ``chain``'s blocks, in the layout ``chain`` runs on inputs of shape ``x_shape``
  (its scanned runs stacked), gathered from ``parts`` (the whole model's variables, or its stages') in
  whatever layout they have."""
  where: dict[str, dict] = {}  # collection -> block name -> (that collection's dict, key, index in a stack)
  for part in parts:
    for c, v in part.items():
      for key in v:
        first, _, last = key.partition('..')
        names = _name_range(first, last) if last else [key]
        where.setdefault(c, {}).update({n: (v, key, j if last else None) for j, n in enumerate(names)})
  out: Variables = {c: {} for c in where}
  for key, start, stop in segments(chain, x_shape):
    names = chain.names[start:stop]
    for c, located in where.items():
      if names[0] not in located:
        continue
      pieces, b = [], 0
      while b < len(names):  # consecutive blocks of one stack are taken as one slice
        v, k, j = located[names[b]]
        e = b + 1
        while j is not None and e < len(names) and located[names[e]][1:] == (k, j + e - b):
          e += 1
        if stop - start == 1:
          pieces.append(v[k] if j is None else jax.tree.map(lambda a, j=j: a[j], v[k]))
        else:
          pieces.append(jax.tree.map(lambda a: a[None], v[k]) if j is None else
                        jax.tree.map(lambda a, j=j, n=e - b: a[j:j + n], v[k]))
        b = e
      out[c][key] = pieces[0] if len(pieces) == 1 else jax.tree.map(lambda *a: jnp.concatenate(a), *pieces)
  return out


def _name_range(first: str, last: str) -> list[str]:
  """'s1b3', 's1b7' -> s1b3..s1b7 (block names are PREFIX + index within a section)."""
  prefix = first.rstrip('0123456789')
  return [f'{prefix}{i}' for i in range(int(first[len(prefix):]), int(last[len(prefix):]) + 1)]


@dataclasses.dataclass(frozen=True)
class Predict:
  """``(variables, x) -> outputs`` of a chain in one mode (``train``: batch statistics). A value, equal for equal
  chains, so a jitted function that takes it as a static argument (the evaluator's) is traced once per network
  and mode in a process, not once per run: a study's runs, or a test suite's, share that program. (A closure
  would be a new function each run, and ``jax.jit`` keys its cache on the function.)"""
  chain: Chain
  train: bool = False

  def __call__(self, variables, x):
    return self.chain.apply(variables, x, self.train)[0]


@dataclasses.dataclass(frozen=True)
class Model:
  """A named network: its chain of blocks plus what the rest of the library needs to know."""
  name: str
  chain: Chain
  num_classes: int
  # Block name -> (section index, index inside the section) for residual blocks; used by the
  # reference stage splits ("S2[:4]") and by width-wise partitions.
  sections: Mapping[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
  dtype: Any = jnp.float32  # the blocks' compute type (bfloat16: mixed precision; parameters stay float32)
  init_scheme: str = 'he'   # he: the modules' own (He fan-out convolutions); torch: PyTorch's defaults
  aux_head: Any = None      # DGL's auxiliary classifier for a stage of this model (None: models.resnet.AuxHead)
  # (outputs, labels) -> (mean loss, a metric logged as train_accuracy): what every method minimises
  loss: Callable = classification_loss
  detector: Any = None      # detection networks: models.detection.Detector (anchors, decoding, per-image loss)

  @property
  def block_names(self) -> tuple[str, ...]:
    return self.chain.names

  def init(self, rng: jax.Array, x: jax.Array) -> Variables:
    variables = self.chain.init(rng, x)
    if self.init_scheme == 'torch':
      variables = {**variables, 'params': torch_default_init(variables['params'], jax.random.fold_in(rng, 1 << 20))}
    return variables

  def apply(self, variables, x, train: bool):
    return self.chain.apply(variables, x, train)

  def predict(self, train: bool = False) -> Predict:
    """The network's outputs, ``(variables, x) -> outputs``, as a hashable value (``Predict``)."""
    return Predict(self.chain, train)

  def with_batch_norm_axis(self, axis_name: str | None) -> 'Model':
    """The same network whose BatchNorm averages its batch statistics over a mapped axis."""
    modules = tuple(m.clone(bn_axis=axis_name) for m in self.chain.modules)
    return dataclasses.replace(self, chain=dataclasses.replace(self.chain, modules=modules))

  def cut(self, boundaries: Sequence[int]) -> list[Chain]:
    """Cuts the chain into stages; ``boundaries`` are the first block index of stages 1..K-1."""
    edges = [0, *boundaries, len(self.chain)]
    if any(b <= a for a, b in zip(edges, edges[1:])):
      raise ValueError(f'stage boundaries must be strictly increasing inside (0, {len(self.chain)}), '
                       f'got {list(boundaries)}')
    return [self.chain.slice(a, b) for a, b in zip(edges, edges[1:])]


def torch_default_init(params, rng: jax.Array):
  """PyTorch's default initialisation (what the ResIST release keeps): every convolution and linear kernel,
  and every linear bias, uniform in +-1/sqrt(fan_in) (kaiming_uniform with a = sqrt(5); a convolution's fan-in
  is h * w * in), BatchNorm's scale 1 and bias 0 as before. For a 3x3 convolution the standard deviation is
  1/sqrt(3 fan_in), 1/sqrt(6) of He fan-out's at equal widths."""
  leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
  out = []
  for i, (path, x) in enumerate(leaves):
    name = path[-1].key if isinstance(path[-1], jax.tree_util.DictKey) else ''
    dense_bias = name == 'bias' and any(isinstance(k, jax.tree_util.DictKey) and str(k.key).startswith('Dense')
                                        for k in path)
    if name == 'kernel' or dense_bias:
      kernel = x if name == 'kernel' else _sibling_kernel(params, path)
      fan_in = int(np.prod(kernel.shape[:-1]))
      bound = 1.0 / np.sqrt(fan_in)
      x = jax.random.uniform(jax.random.fold_in(rng, i), x.shape, x.dtype, -bound, bound)
    out.append(x)
  return jax.tree_util.tree_unflatten(treedef, out)


def _sibling_kernel(params, path):
  node = params
  for k in path[:-1]:
    node = node[k.key]
  return node['kernel']


def _init_chain_fn(chain: 'Chain', x_shape: jax.ShapeDtypeStruct):
  def init(rng):
    variables: Variables = {c: {} for c in COLLECTIONS}
    x = jnp.zeros(x_shape.shape, x_shape.dtype)
    for key, start, stop in segments(chain, x_shape.shape):
      module = chain.modules[start]
      one = lambda i, x=x, module=module: module.init(jax.random.fold_in(rng, i), x, train=False)
      block_vars = one(start) if stop == start + 1 else jax.vmap(one)(jnp.arange(start, stop))
      for collection, value in block_vars.items():
        variables.setdefault(collection, {})[key] = value
      for i in range(start, start + 1 if stop > start + 1 else stop):  # a scanned run keeps the shape
        v = block_vars if stop == start + 1 else jax.tree.map(lambda a: a[0], block_vars)
        x = jnp.zeros(jax.eval_shape(lambda v, x: module.apply(v, x, train=False), v, x).shape, x.dtype)
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
