"""Stage splits: the SPEC's reference table, the balanced split, explicit splits and their errors."""
import itertools

import flax.linen as nn
import jax
import pytest

from jaxdecouple.models import Chain, Model, build_model
from jaxdecouple.pipeline import balanced_boundaries, block_seconds, choose_split, split_names, timed_split

CIFAR = (32, 32, 3)
# The SPEC's table, as (section, blocks) per stage: e.g. ResNet-56 K=2 is stem+S1+S2[:4] / S2[4:]+S3.
SPEC = {
    ('resnet56', 2): [[(1, 9), (2, 4)], [(2, 5), (3, 9)]],
    ('resnet56', 3): [[(1, 9)], [(2, 9)], [(3, 9)]],
    ('resnet56', 4): [[(1, 6)], [(1, 3), (2, 4)], [(2, 5), (3, 2)], [(3, 7)]],
    ('resnet110', 2): [[(1, 18), (2, 9)], [(2, 9), (3, 18)]],
    ('resnet110', 4): [[(1, 13)], [(1, 5), (2, 9)], [(2, 9), (3, 5)], [(3, 13)]],
    ('resnet18', 2): [[(1, 2), (2, 2)], [(3, 2), (4, 2)]],
    ('resnet18', 3): [[(1, 2)], [(2, 2), (3, 1)], [(3, 1), (4, 2)]],
    ('wrn28_10', 2): [[(1, 4), (2, 2)], [(2, 2), (3, 4)]],
    ('wrn28_10', 4): [[(1, 3)], [(1, 1), (2, 2)], [(2, 2), (3, 1)], [(3, 3)]],
}


@pytest.mark.parametrize('name,k', sorted(SPEC))
def test_reference_splits_follow_the_spec(name, k):
  model = build_model(name, 10)
  split = choose_split(model, k, 'reference', CIFAR)
  stages = split.stage_blocks(model)
  assert stages[0][0] == 'stem' and stages[-1][-1] == 'head'
  for blocks, expected in zip(stages, SPEC[(name, k)]):
    counts = {}
    for b in blocks:
      if b in model.sections:
        section = model.sections[b][0] + 1
        counts[section] = counts.get(section, 0) + 1
    assert sorted(counts.items()) == expected


def test_balanced_split_is_optimal():
  costs = [5.0, 1.0, 1.0, 7.0, 2.0, 2.0, 3.0, 1.0]
  for k in range(1, 6):
    best = min(max(sum(costs[a:b]) for a, b in zip((0, *c), (*c, len(costs))))
               for c in itertools.combinations(range(1, len(costs)), k - 1))
    bounds = balanced_boundaries(costs, k)
    edges = (0, *bounds, len(costs))
    assert len(bounds) == k - 1
    assert max(sum(costs[a:b]) for a, b in zip(edges, edges[1:])) == best


def test_balanced_reproduces_the_papers_resnet56_splits():
  model = build_model('resnet56', 10)
  for k in (2, 4):
    assert choose_split(model, k, 'balanced', CIFAR).boundaries == \
        choose_split(model, k, 'reference', CIFAR).boundaries


def test_auto_falls_back_to_balanced_and_explicit_names_work():
  model = build_model('resnet20', 10)
  assert choose_split(model, 2, 'auto', CIFAR).how == 'balanced'
  explicit = choose_split(model, 3, 's2b0,s3b0', CIFAR)
  assert explicit.how == 'explicit' and explicit.boundaries == (4, 7)
  assert choose_split(model, 2, '5', CIFAR).boundaries == (5,)


@pytest.mark.parametrize('how,message', [('reference', 'no reference split'), ('s9b9', 'has no block'),
                                         ('s3b0,s2b0', 'increasing'), ('s2b0', 'needs 2'),
                                         ('timed', 'benchmarks/block_times.py --model=resnet20 --stages=3')])
def test_bad_splits_say_what_is_wrong(how, message):
  with pytest.raises(ValueError, match=message):
    choose_split(build_model('resnet20', 10), 3, how, CIFAR)


class _Matmuls(nn.Module):
  """A block that multiplies its input by a width x width matrix ``repeats`` times, unrolled."""
  width: int
  repeats: int

  @nn.compact
  def __call__(self, x, train: bool = False):
    w = self.param('w', nn.initializers.normal(0.01), (self.width, self.width))
    for _ in range(self.repeats):
      x = x @ w
    return x


class _LoopedMatmuls(_Matmuls):
  """The same products in a loop: XLA's cost analysis counts a loop's body once, so its FLOP estimate is one
  product's while its seconds are ``repeats`` products': a block where FLOPs and time disagree."""

  @nn.compact
  def __call__(self, x, train: bool = False):
    w = self.param('w', nn.initializers.normal(0.01), (self.width, self.width))
    return jax.lax.fori_loop(0, self.repeats, lambda i, x: x @ w, x)


def test_timed_split_balances_measured_seconds_where_flops_disagree():
  # The looped block does 50 products and each other block 3: by time the looped block is a stage of its own
  # (50 against 9); by FLOPs it looks like a third of one other block, and the FLOP-balanced split puts it with
  # the next block.
  model = Model('matmuls', Chain(('loop', 'a', 'b', 'c'), (_LoopedMatmuls(256, 50), *[_Matmuls(256, 3)] * 3)),
                num_classes=256)
  assert choose_split(model, 2, 'balanced', (256,)).boundaries == (2,)
  seconds = block_seconds(model, (256,), batch=256, repeats=3)
  assert len(seconds) == 4 and min(seconds) > 0
  assert seconds[1] == seconds[2] == seconds[3]  # identical blocks on identical inputs: timed once
  assert seconds[0] > 4 * seconds[1]  # 50 products against 3 (about 20x measured)
  split = timed_split(model, 2, (256,), batch=256, repeats=3)
  assert split.how == 'timed' and split.boundaries == (1,)
  assert split_names(model, split) == 'a'
  assert choose_split(model, 2, split_names(model, split), (256,)).boundaries == split.boundaries


def test_timed_split_of_resnet8_names_blocks_choose_split_accepts():
  model = build_model('resnet8', 10)
  split = timed_split(model, 3, CIFAR, batch=4, repeats=1)
  assert len(split.block_costs) == len(model.block_names) and min(split.block_costs) > 0
  costs, n = split.block_costs, len(split.block_costs)
  largest = lambda cuts: max(sum(costs[a:b]) for a, b in zip((0, *cuts), (*cuts, n)))
  assert largest(split.boundaries) == min(largest(c) for c in itertools.combinations(range(1, n), 2))
  assert choose_split(model, 3, split_names(model, split), CIFAR).boundaries == split.boundaries
