"""ResIST's layer-wise partitions: which blocks are partitioned, and who owns which block each round.

Only the non-strided blocks of a pre-activation ResNet's third section are partitioned (for ResIST's
[3, 4, 23, 3] ResNet-101, blocks s3b1..s3b22); every other layer is shared by all sub-networks. A transformer's
blocks after its first are partitioned (ours: no anchor partitions transformers; see docs/METHODS.md). A
round's partition is a random permutation of those blocks cut into S contiguous slices, drawn from
(seed, round) alone, so every worker and every restart derives the same one without communication.

The paper's A.1 ablation ("naive": "evenly splits all convolutional blocks between subnetworks") is
``scope='every_section'``: every block a sub-network can skip, i.e. every block whose output has its input's
shape (a block that changes the shape, the first of a section, cannot be dropped and stays shared), in one
group per run of identical blocks of a section, each group dealt out to the S workers on its own.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxdecouple.models import DETECTION_PREFIX, Model
from jaxdecouple.models.resnet import BasicBlock, PreActBlock
from jaxdecouple.models.transformer import TransformerBlock

PARTITIONED_SECTION = 2  # the third section (0-based)


def is_transformer(model: Model) -> bool:
  return isinstance(model.chain.modules[1], TransformerBlock)


def block_kinds(model: Model) -> tuple[type, ...]:
  """The residual blocks ResIST may partition: post-activation ones only in the models built for it (postact*,
  also as a detection backbone, yolo_postact*), since a CIFAR resnet152 is not ResIST's."""
  postact = 'postact' in model.name.removeprefix(DETECTION_PREFIX)  # postact*, imagenet_postact101
  return (PreActBlock, BasicBlock) if postact else (PreActBlock,)


def partitioned_blocks(model: Model) -> tuple[str, ...]:
  """Names of the blocks ResIST partitions: the third section's blocks after its first (strided) one; in a
  transformer (one section of identical blocks) every block after the first, which stays shared as a ResNet
  section's first block does, so every sub-network keeps at least one whole block.

  Raises ValueError when the model is not a pre-activation ResNet with at least two such blocks.
  """
  modules = dict(zip(model.chain.names, model.chain.modules))
  if is_transformer(model):
    return tuple(n for n, (s, i) in model.sections.items() if i >= 1)
  kinds = block_kinds(model)
  names = tuple(n for n, (s, i) in model.sections.items()
                if s == PARTITIONED_SECTION and i >= 1 and isinstance(modules[n], kinds))
  if len(names) < 1:
    hint = (f' ({model.name} is the CIFAR ResNet of depth 6n+2, post-activation; the ResIST paper\'s '
            'ResNet-152 and ResNet-200 are preact152 and preact200, any third-section depth is preact_s3_N)'
            ) if model.name in ('resnet152', 'resnet200') else ''
    raise ValueError(f'{model.name} has no non-strided pre-activation blocks in its third section to '
                     f'partition; use a pre-activation ResNet (preact101, preact152, preact200, preact_s3_N, preact_tiny) or postact101, postact_tiny{hint}')
  return names


SCOPES = ('third_section', 'every_section')


def partitioned_groups(model: Model, scope: str = 'third_section') -> tuple[tuple[str, ...], ...]:
  """The partitioned blocks in groups of identical, contiguous blocks (each group dealt out on its own and
  stored in its own slots): ResIST's third section (one group), or with ``scope='every_section'`` (A.1's
  naive partition) every block whose output has its input's shape, one group per run of such identical
  blocks within a section, in chain order."""
  if scope == 'third_section':
    return (partitioned_blocks(model),)
  if scope != 'every_section':
    raise ValueError(f'partition scope {scope!r}: one of {", ".join(SCOPES)}')
  if is_transformer(model):
    raise ValueError(f"{model.name}: a transformer has one section of identical blocks, so 'every_section' is "
                     "'third_section' (its blocks after the first): use the default")
  kinds = block_kinds(model)
  x = jax.ShapeDtypeStruct((1, 32, 32, 3), jnp.float32)
  groups: list[list[str]] = []
  last = None  # (section, module) of the group being built
  for name, module in zip(model.chain.names, model.chain.modules):
    variables = jax.eval_shape(lambda x, m=module: m.init(jax.random.key(0), x, train=False), x)
    y = jax.eval_shape(lambda v, x, m=module: m.apply(v, x, train=False), variables, x)
    if name in model.sections and isinstance(module, kinds) and y.shape == x.shape:
      here = (model.sections[name][0], module)
      if here == last:
        groups[-1].append(name)
      else:
        groups.append([name])
      last = here
    else:
      last = None
    x = y
  if not groups:
    raise ValueError(f'{model.name} has no pre-activation block that keeps its input\'s shape to partition')
  return tuple(tuple(g) for g in groups)


def slice_sizes(num_blocks: int, num_workers: int) -> list[int]:
  """Sizes of the S contiguous slices of the permutation: as equal as possible, larger ones first
  (22 blocks: S=2 11,11; S=4 6,6,5,5; S=8 3,3,3,3,3,3,2,2)."""
  base, extra = divmod(num_blocks, num_workers)
  return [base + 1] * extra + [base] * (num_workers - extra)


def draw_partition(num_blocks: int, num_workers: int, seed: int, round_index: int,
                   min_depth: int = 0, group: int = 0, allow_idle: bool = False) -> np.ndarray:
  """Membership of round ``round_index``: a (S, num_blocks) bool array, row w = worker w's blocks.

  A random permutation of the blocks cut into S contiguous slices, so each block has exactly one
  owner; with ``min_depth`` m, a worker with fewer than m blocks gets random extra blocks (not already
  its own) until it has m, so blocks may then be shared. ``group`` > 0 draws another group's partition
  from its own stream (the naive partition's sections); ``allow_idle``: a group with fewer blocks than
  workers leaves some workers without one, and which workers get the larger slices is drawn too (else a
  lone block would always go to worker 0). Depends only on its arguments.
  """
  if num_workers > num_blocks and min_depth == 0 and not allow_idle:
    raise ValueError(f'{num_workers} workers but only {num_blocks} partitioned blocks: some workers '
                     'would get none (set a minimum depth or use fewer workers)')
  rng = np.random.default_rng([seed, round_index, 0x5E515, *([group] if group else [])])
  order = rng.permutation(num_blocks)
  member = np.zeros((num_workers, num_blocks), bool)
  start = 0
  for w, size in enumerate(slice_sizes(num_blocks, num_workers)):
    member[w, order[start:start + size]] = True
    start += size
  if allow_idle:
    member = member[rng.permutation(num_workers)]
  for w in range(num_workers):
    short = min(min_depth, num_blocks) - int(member[w].sum())
    if short > 0:
      member[w, rng.choice(np.flatnonzero(~member[w]), short, replace=False)] = True
  return member


def test_time_scale(num_blocks: int, num_workers: int, min_depth: int = 0) -> float:
  """The factor on every partitioned block's residual branch when all blocks run at test time:
  1/S, or max(1/S, m / number of partitioned blocks) with a minimum depth m."""
  return max(1.0 / num_workers, min_depth / num_blocks)
