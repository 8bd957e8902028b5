"""The papers' networks as chains of blocks: CIFAR ResNets, ResNet-18, WRN-28-10, pre-activation ResNets,
and the ImageNet ResNets (7x7 stem and max-pool; basic and bottleneck blocks).

Every network ends in global average pooling (the reference code averaged only the top-left 6x6
of the 8x8 map, a pooling-window bug we do not copy). BatchNorm uses PyTorch's defaults
(momentum 0.1, i.e. Flax momentum 0.9; epsilon 1e-5) and convolutions He (fan-out) initialisation.
"""
from __future__ import annotations

import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from jaxdecouple.models.gradients import conv_general_dilated
from jaxdecouple.models.core import Chain, Model

conv_init = nn.initializers.variance_scaling(2.0, 'fan_out', 'normal')
# conv_general_dilated: on the CPU its weight gradient is a forward convolution, fast inside a scan (models/gradients.py)
Conv = functools.partial(nn.Conv, use_bias=False, kernel_init=conv_init, conv_general_dilated=conv_general_dilated)


def batch_norm(train: bool, axis_name: str | None = None, name: str | None = None, dtype=jnp.float32) -> nn.BatchNorm:
  # Two-pass variance: Flax's default E[x^2] - E[x]^2 loses precision in float32 when activations
  # have a large mean, and the lost bits differ between compilations.
  # axis_name: statistics over the whole batch when it is sharded over that mapped axis (data parallel).
  # dtype: that of the output; Flax computes the statistics in at least float32, and keeps them and the
  # scale and bias in float32 (mixed precision).
  return nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-5, use_fast_variance=False,
                      axis_name=axis_name if train else None, name=name, dtype=dtype)


class Stem(nn.Module):
  """3x3 convolution, optionally followed by BatchNorm and ReLU (pre-activation nets omit them)."""
  features: int
  norm: bool = True
  bn_axis: str | None = None  # see batch_norm
  dtype: Any = jnp.float32     # compute type (bfloat16: mixed precision); parameters stay float32

  @nn.compact
  def __call__(self, x, train: bool = True):
    x = Conv(self.features, (3, 3), padding=1, dtype=self.dtype)(x)
    if self.norm:
      x = nn.relu(batch_norm(train, self.bn_axis, dtype=self.dtype)(x))
    return x


class ImageNetStem(nn.Module):
  """The ImageNet ResNets' stem: 7x7 stride-2 convolution, then (post-activation nets) BatchNorm and
  ReLU, then a 3x3 stride-2 max-pool: 224 pixels become 56."""
  features: int = 64
  norm: bool = True
  bn_axis: str | None = None  # see batch_norm
  dtype: Any = jnp.float32     # compute type (bfloat16: mixed precision); parameters stay float32

  @nn.compact
  def __call__(self, x, train: bool = True):
    x = Conv(self.features, (7, 7), 2, padding=3, dtype=self.dtype)(x)
    if self.norm:
      x = nn.relu(batch_norm(train, self.bn_axis, dtype=self.dtype)(x))
    return nn.max_pool(x, (3, 3), (2, 2), padding=((1, 1), (1, 1)))


class BasicBlock(nn.Module):
  """Post-activation basic block. ``shortcut='pad'`` is He et al.'s option A (CIFAR ResNets:
  subsample and zero-pad channels, no parameters); ``'conv'`` is a 1x1 projection (ResNet-18).
  ``residual_scale`` multiplies the residual branch (ResIST's test-time scaling on post-activation
  ResNets, relu(shortcut + scale * branch)); 1.0 is the plain block."""
  features: int
  stride: int = 1
  shortcut: str = 'conv'
  residual_scale: float = 1.0
  bn_axis: str | None = None  # see batch_norm
  dtype: Any = jnp.float32     # compute type (bfloat16: mixed precision); parameters stay float32

  @nn.compact
  def __call__(self, x, train: bool = True):
    y = Conv(self.features, (3, 3), self.stride, padding=1, dtype=self.dtype)(x)
    y = nn.relu(batch_norm(train, self.bn_axis, dtype=self.dtype)(y))
    y = Conv(self.features, (3, 3), padding=1, dtype=self.dtype)(y)
    y = batch_norm(train, self.bn_axis, dtype=self.dtype)(y)
    if x.shape != y.shape:
      if self.shortcut == 'pad':
        x = x[:, ::self.stride, ::self.stride, :]
        extra = self.features - x.shape[-1]
        x = jnp.pad(x, ((0, 0), (0, 0), (0, 0), (extra // 2, extra - extra // 2)))
      else:
        x = Conv(self.features, (1, 1), self.stride, dtype=self.dtype)(x)
        x = batch_norm(train, self.bn_axis, dtype=self.dtype)(x)
    return nn.relu(x + (y if self.residual_scale == 1.0 else self.residual_scale * y))


class Bottleneck(nn.Module):
  """Post-activation bottleneck block of ResNet-50/101/152: 1x1 to ``features``, 3x3 (carrying the
  stride, as torchvision's "v1.5"), 1x1 to 4 x ``features``; a 1x1 projection shortcut where the shape
  changes. The last BatchNorm's scale starts at 1 (torchvision's default)."""
  features: int
  stride: int = 1
  bn_axis: str | None = None  # see batch_norm
  dtype: Any = jnp.float32     # compute type (bfloat16: mixed precision); parameters stay float32

  @nn.compact
  def __call__(self, x, train: bool = True):
    bn = functools.partial(batch_norm, train, self.bn_axis, dtype=self.dtype)
    conv = functools.partial(Conv, dtype=self.dtype)
    y = nn.relu(bn()(conv(self.features, (1, 1))(x)))
    y = nn.relu(bn()(conv(self.features, (3, 3), self.stride, padding=1)(y)))
    y = bn()(conv(4 * self.features, (1, 1))(y))
    if x.shape != y.shape:
      x = bn()(conv(4 * self.features, (1, 1), self.stride)(x))
    return nn.relu(x + y)


class PreActBlock(nn.Module):
  """Pre-activation basic block (BN-ReLU-conv twice), of WRN and of ResIST's ResNets.
  ``residual_scale`` multiplies the residual branch only (ResIST's test-time scaling); 1.0 is the
  plain block."""
  features: int
  stride: int = 1
  residual_scale: float = 1.0
  bn_axis: str | None = None  # see batch_norm
  dtype: Any = jnp.float32     # compute type (bfloat16: mixed precision); parameters stay float32

  @nn.compact
  def __call__(self, x, train: bool = True):
    out = nn.relu(batch_norm(train, self.bn_axis, dtype=self.dtype)(x))
    shortcut = x
    if self.stride != 1 or x.shape[-1] != self.features:
      shortcut = Conv(self.features, (1, 1), self.stride, dtype=self.dtype)(out)
    y = Conv(self.features, (3, 3), self.stride, padding=1, dtype=self.dtype)(out)
    y = nn.relu(batch_norm(train, self.bn_axis, dtype=self.dtype)(y))
    y = Conv(self.features, (3, 3), padding=1, dtype=self.dtype)(y)
    return shortcut + self.residual_scale * y


class Head(nn.Module):
  """Optional final BN-ReLU (pre-activation nets), global average pooling, linear classifier."""
  num_classes: int
  norm: bool = False
  bn_axis: str | None = None  # see batch_norm
  dtype: Any = jnp.float32     # compute type (bfloat16: mixed precision); parameters stay float32

  @nn.compact
  def __call__(self, x, train: bool = True):
    if self.norm:
      x = nn.relu(batch_norm(train, self.bn_axis, dtype=self.dtype)(x))
    x = jnp.mean(x, axis=(1, 2))
    return nn.Dense(self.num_classes, dtype=self.dtype)(x).astype(jnp.float32)


def _chain(stem: nn.Module, sections: Sequence[Sequence[nn.Module]], head: nn.Module):
  names, modules, where = ['stem'], [stem], {}
  for s, blocks in enumerate(sections):
    for b, block in enumerate(blocks):
      name = f's{s + 1}b{b}'
      names.append(name)
      modules.append(block)
      where[name] = (s, b)
  names.append('head')
  modules.append(head)
  return Chain(tuple(names), tuple(modules)), where


def _sections(block, depths: Sequence[int], widths: Sequence[int], first_stride: int = 1, **kw):
  return [[block(features=w, stride=(first_stride if s == 0 else 2) if b == 0 else 1, **kw)
           for b in range(n)] for s, (n, w) in enumerate(zip(depths, widths))]


def cifar_resnet(depth: int, num_classes: int) -> Model:
  """He et al.'s CIFAR ResNet-(6n+2): three sections of n basic blocks, 16/32/64 channels."""
  if depth < 8 or (depth - 2) % 6:
    raise ValueError(f'CIFAR ResNet depth must be 6n+2 with n >= 1, got {depth}')
  n = (depth - 2) // 6
  chain, where = _chain(Stem(16), _sections(BasicBlock, [n] * 3, [16, 32, 64], shortcut='pad'),
                        Head(num_classes))
  return Model(f'resnet{depth}', chain, num_classes, where)


def resnet18(num_classes: int) -> Model:
  """ResNet-18 in its CIFAR form: 3x3 stem, no max-pool, [2, 2, 2, 2] blocks of 64..512 channels."""
  chain, where = _chain(Stem(64), _sections(BasicBlock, [2, 2, 2, 2], [64, 128, 256, 512]),
                        Head(num_classes))
  return Model('resnet18', chain, num_classes, where)


def wide_resnet(depth: int, widen: int, num_classes: int) -> Model:
  """WRN-depth-widen: three sections of (depth-4)/6 pre-activation blocks, 16k/32k/64k channels
  (no dropout, as in the papers' runs)."""
  if (depth - 4) % 6:
    raise ValueError(f'WRN depth must be 6n+4, got {depth}')
  n = (depth - 4) // 6
  chain, where = _chain(Stem(16, norm=False),
                        _sections(PreActBlock, [n] * 3, [16 * widen, 32 * widen, 64 * widen]),
                        Head(num_classes, norm=True))
  return Model(f'wrn{depth}_{widen}', chain, num_classes, where)


def preact_resnet(depths: Sequence[int], num_classes: int, widths=(64, 128, 256, 512),
                  name: str | None = None) -> Model:
  """Pre-activation ResNet of ResIST's release: 3x3 stem (64 channels), basic blocks."""
  chain, where = _chain(Stem(widths[0], norm=False), _sections(PreActBlock, depths, widths),
                        Head(num_classes, norm=True))
  return Model(name or 'preact_' + '_'.join(map(str, depths)), chain, num_classes, where)


def postact_resnet(depths: Sequence[int], num_classes: int, widths=(64, 128, 256, 512),
                   name: str | None = None) -> Model:
  """The post-activation counterpart of ``preact_resnet`` (ResIST's A.1 ablation and the backbone of its
  section 6.3): 3x3 stem with BatchNorm, post-activation basic blocks with projection shortcuts."""
  chain, where = _chain(Stem(widths[0]), _sections(BasicBlock, depths, widths), Head(num_classes))
  return Model(name or 'postact_' + '_'.join(map(str, depths)), chain, num_classes, where)


IMAGENET_DEPTHS = {18: (BasicBlock, [2, 2, 2, 2]), 34: (BasicBlock, [3, 4, 6, 3]),
                   50: (Bottleneck, [3, 4, 6, 3]), 101: (Bottleneck, [3, 4, 23, 3]),
                   152: (Bottleneck, [3, 8, 36, 3])}


def imagenet_resnet(depth: int, num_classes: int) -> Model:
  """He et al.'s ImageNet ResNet-18/34 (basic blocks) and -50/101/152 (bottlenecks): 7x7 stride-2 stem
  with max-pool, four sections of 64..512 (x4 for bottlenecks) channels, the first unstrided."""
  if depth not in IMAGENET_DEPTHS:
    raise ValueError(f'ImageNet ResNet depth must be one of {sorted(IMAGENET_DEPTHS)}, got {depth}')
  block, depths = IMAGENET_DEPTHS[depth]
  chain, where = _chain(ImageNetStem(), _sections(block, depths, [64, 128, 256, 512]), Head(num_classes))
  return Model(f'imagenet_resnet{depth}', chain, num_classes, where)


def imagenet_preact_resnet(depths: Sequence[int], num_classes: int, name: str) -> Model:
  """ResIST's pre-activation ResNet (basic blocks, [3, 4, n, 3]) with the ImageNet stem (7x7 stride-2
  convolution and max-pool; BatchNorm and ReLU come first in each block, as in the CIFAR form)."""
  chain, where = _chain(ImageNetStem(norm=False), _sections(PreActBlock, depths, [64, 128, 256, 512]),
                        Head(num_classes, norm=True))
  return Model(name, chain, num_classes, where)


def imagenet_postact_resnet(depths: Sequence[int], num_classes: int, name: str) -> Model:
  """``postact_resnet``'s blocks (post-activation basic blocks, [3, 4, n, 3]) with the ImageNet stem (7x7
  stride-2 convolution, BatchNorm-ReLU, max-pool): stride 32 in all, so a 416-pixel image ends on YOLO-v2's
  13 x 13 grid (the backbone of ResIST's detection experiment, models/detection.py)."""
  chain, where = _chain(ImageNetStem(), _sections(BasicBlock, depths, [64, 128, 256, 512]), Head(num_classes))
  return Model(name, chain, num_classes, where)


def adaptive_avg_pool(x: jax.Array, size: int) -> jax.Array:
  """PyTorch's AdaptiveAvgPool2d on NHWC: output cell i averages rows floor(i*H/size) to
  ceil((i+1)*H/size) (bins overlap when ``size`` does not divide H), likewise for columns."""
  def bins(n: int) -> np.ndarray:
    m = np.zeros((size, n), np.float32)
    for i in range(size):
      lo, hi = (i * n) // size, -(-((i + 1) * n) // size)
      m[i, lo:hi] = 1.0 / (hi - lo)
    return m
  return jnp.einsum('ih,bhwc,jw->bijc', bins(x.shape[1]), x, bins(x.shape[2]))


class AuxHead(nn.Module):
  """DGL's auxiliary classifier as the ADL code builds it: adaptive average pool to ceil(H/4),
  three (1x1 convolution, BN, ReLU) layers keeping the channels, adaptive average pool to
  min(ceil(H/4), 2), flatten, three (linear, BN, ReLU) layers keeping the width, linear classifier."""
  num_classes: int
  bn_axis: str | None = None  # see batch_norm
  dtype: Any = jnp.float32     # compute type (bfloat16: mixed precision); parameters stay float32

  @nn.compact
  def __call__(self, x, train: bool = True):
    size = -(-x.shape[1] // 4)
    x = adaptive_avg_pool(x, size)
    for _ in range(3):
      x = Conv(x.shape[-1], (1, 1), dtype=self.dtype)(x)
      x = nn.relu(batch_norm(train, self.bn_axis, dtype=self.dtype)(x))
    x = adaptive_avg_pool(x, min(size, 2))
    x = x.reshape(x.shape[0], -1)
    for _ in range(3):
      x = nn.Dense(x.shape[-1], use_bias=False, dtype=self.dtype)(x)
      x = nn.relu(batch_norm(train, self.bn_axis, dtype=self.dtype)(x))
    return nn.Dense(self.num_classes, dtype=self.dtype)(x).astype(jnp.float32)
