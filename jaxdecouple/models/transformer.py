"""Transformers as chains of blocks: a ViT for CIFAR-sized images and a decoder-only GPT for byte-level text.

A transformer is a stem, identical pre-norm residual blocks and a head, so every cut, balanced split, schedule,
checkpoint, placement and method of the library works on it unchanged (models/core.py). Blocks are named
``s1b0 .. s1b{L-1}`` in one section, as a ResNet's are.

- ViT (Dosovitskiy et al., ICLR 2021): a P x P patch embedding (a stride-P convolution) plus a learned position
  embedding; pre-norm blocks x + MHA(LN(x)), x + MLP(LN(x)) with a GELU MLP of 4 x the width; the head is
  LN, the mean over the patches (no class token, as big_vision's ``pool_type='gap'``) and a linear classifier.
- GPT (Radford et al. 2019, GPT-2's pre-norm layout): token and position embeddings of bytes (a vocabulary of
  256), causal pre-norm blocks and a head of LN and a linear layer to the 256 next-byte logits (untied from the
  embedding, so the stem and the head can live on different stages).

Initialisation after GPT-2 / nanoGPT: every kernel and embedding normal(0.02), biases zero, LayerNorm scale 1 (both
also scale the residual projections' kernels by 1 / sqrt(2 x depth); these do not). No
dropout (the runs here are short). Attention is written out (q, k, v projections, softmax in float32) so that
mixed precision (``dtype`` bfloat16: activations and matrix products in bfloat16, parameters, LayerNorm
statistics, softmax and the logits in float32) is explicit. There is no BatchNorm: a block's variables are
its ``params`` alone, and ``bn_axis`` (data parallelism's BatchNorm axis) is accepted and unused.
"""
from __future__ import annotations

import re
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from jaxdecouple.models.core import Chain, Model
from jaxdecouple.models.gradients import dot_general

INIT = nn.initializers.normal(0.02)
VOCAB = 256  # bytes
HEAD_DIM = 32  # default heads: width / 32 (at least one)


def _dense(features: int, dtype, name: str | None = None) -> nn.Dense:
  # dot_general: on the CPU its gradients are two plain matrix products, fast inside a scan (models/gradients.py)
  return nn.Dense(features, dtype=dtype, kernel_init=INIT, name=name, dot_general=dot_general)


def _layer_norm(dtype, name: str | None = None) -> nn.LayerNorm:
  return nn.LayerNorm(epsilon=1e-6, dtype=dtype, name=name)


class TransformerBlock(nn.Module):
  """Pre-norm residual block: x + s * Attention(LN(x)), then x + s * MLP(LN(x)), on [B, T, width] tokens.
  ``causal``: token t attends to tokens <= t (GPT). ``residual_scale`` s multiplies both residual branches
  (ResIST's test-time scaling; 1.0 is the plain block)."""
  width: int
  heads: int
  causal: bool = False
  mlp_ratio: int = 4
  residual_scale: float = 1.0
  bn_axis: str | None = None  # no BatchNorm: accepted so data parallelism can clone every block alike
  dtype: Any = jnp.float32
  # In a scanned run on the CPU, keep only the matrix products' outputs for the backward and recompute the
  # rest (models/core.py _scan_remat says why). A class constant, not a field: it is no part of the block.
  SCAN_REMAT_POLICY = 'dots_saveable'

  @nn.compact
  def __call__(self, x, train: bool = True):
    b, t, d = x.shape
    h, hd = self.heads, d // self.heads
    y = _layer_norm(self.dtype, 'ln1')(x)
    # heads moved next to the batch first, so every product is a plain batched matrix product ([b, h] leading):
    # XLA:CPU runs those, and their gradients, fast inside a scan too (models/gradients.py)
    q, k, v = _dense(3 * d, self.dtype, 'qkv')(y).reshape(b, t, 3, h, hd).transpose(2, 0, 3, 1, 4)
    scores = jnp.matmul(q, k.swapaxes(-1, -2)).astype(jnp.float32) / jnp.sqrt(jnp.float32(hd))
    if self.causal:
      scores = jnp.where(jnp.tril(jnp.ones((t, t), bool)), scores, jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(scores, axis=-1).astype(self.dtype)
    attended = jnp.matmul(weights, v).transpose(0, 2, 1, 3).reshape(b, t, d)
    x = x + self.residual_scale * _dense(d, self.dtype, 'proj')(attended)
    y = _layer_norm(self.dtype, 'ln2')(x)
    y = _dense(d, self.dtype, 'mlp_out')(nn.gelu(_dense(self.mlp_ratio * d, self.dtype, 'mlp_in')(y)))
    return x + self.residual_scale * y


class PatchStem(nn.Module):
  """ViT's stem: non-overlapping P x P patches embedded by a stride-P convolution, plus a learned position
  embedding: [B, H, W, C] images -> [B, (H/P)(W/P), width] tokens."""
  width: int
  patch: int
  bn_axis: str | None = None
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, train: bool = True):
    p = self.patch
    x = nn.Conv(self.width, (p, p), strides=(p, p), padding='VALID', kernel_init=INIT, dtype=self.dtype,
                name='embed')(x)
    x = x.reshape(x.shape[0], -1, self.width)
    positions = self.param('positions', INIT, (x.shape[1], self.width))
    return x + positions.astype(self.dtype)


class TokenStem(nn.Module):
  """GPT's stem: byte embedding plus a learned position embedding of ``positions`` entries:
  [B, T] byte values (any dtype holding integers) -> [B, T, width]."""
  width: int
  positions: int
  vocab: int = VOCAB
  bn_axis: str | None = None
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, train: bool = True):
    if x.shape[1] > self.positions:
      raise ValueError(f'a sequence of {x.shape[1]} tokens is longer than the model\'s {self.positions} positions')
    tokens = nn.Embed(self.vocab, self.width, embedding_init=INIT, name='tokens')(x.astype(jnp.int32))
    positions = self.param('positions', INIT, (self.positions, self.width))
    return (tokens + positions[:x.shape[1]]).astype(self.dtype)


class TokenHead(nn.Module):
  """LayerNorm, then (``pool``: the mean over the tokens, a ViT) a linear layer: logits in float32, one row per
  example ([B, classes]) or, without pooling, per token ([B, T, classes], a language model). Also DGL's
  auxiliary classifier for a transformer's stages (see ``Model.aux_head``)."""
  num_classes: int
  pool: bool = False
  bn_axis: str | None = None
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, train: bool = True):
    x = _layer_norm(self.dtype, 'ln')(x)
    if self.pool:
      x = jnp.mean(x, axis=1)
    return _dense(self.num_classes, self.dtype, 'out')(x).astype(jnp.float32)


def _chain(stem: nn.Module, block: nn.Module, depth: int, head: nn.Module) -> tuple[Chain, dict]:
  names = ('stem', *(f's1b{i}' for i in range(depth)), 'head')
  return Chain(names, (stem, *[block] * depth, head)), {f's1b{i}': (0, i) for i in range(depth)}


def vit(depth: int, width: int, heads: int, patch: int, num_classes: int, name: str) -> Model:
  """A ViT of ``depth`` blocks of ``width`` with ``heads`` heads on P x P patches."""
  chain, where = _chain(PatchStem(width, patch), TransformerBlock(width, heads), depth,
                        TokenHead(num_classes, pool=True))
  return Model(name, chain, num_classes, where, aux_head=TokenHead(num_classes, pool=True))


def gpt(depth: int, width: int, heads: int, positions: int, name: str, vocab: int = VOCAB) -> Model:
  """A decoder-only GPT of ``depth`` causal blocks of ``width``, ``positions`` positions, next-byte logits."""
  chain, where = _chain(TokenStem(width, positions, vocab), TransformerBlock(width, heads, causal=True), depth,
                        TokenHead(vocab))
  return Model(name, chain, vocab, where, aux_head=TokenHead(vocab))


# name -> the general form it stands for: the tests' and the studies' sizes
ALIASES = {'vit_tiny': 'vit2_d32_p8', 'vit_small': 'vit6_d128_p4',
           'gpt_tiny': 'gpt2_d32_t64', 'gpt_small': 'gpt8_d128_t128', 'gpt12': 'gpt12_d128_t128'}
PATTERN = re.compile(r'(vit|gpt)(\d+)_d(\d+)(?:_h(\d+))?(?:_p(\d+))?(?:_t(\d+))?')
HELP = ('vit{L}_d{D}[_h{H}]_p{P} (ViT: L blocks of width D, H heads (default D/32), P x P patches; vit_tiny, '
        'vit_small), gpt{L}_d{D}[_h{H}]_t{T} (byte-level GPT with T positions; gpt_tiny, gpt_small, gpt12)')


def build_transformer(name: str, num_classes: int) -> Model | None:
  """The transformer a registered name stands for; None when ``name`` is not a transformer's; ValueError for a
  transformer's name whose sizes do not fit (naming what is allowed)."""
  m = PATTERN.fullmatch(ALIASES.get(name, name))
  if not m:
    return None
  kind, depth, width = m.group(1), int(m.group(2)), int(m.group(3))
  heads = int(m.group(4)) if m.group(4) else max(1, width // HEAD_DIM)
  patch, positions = m.group(5), m.group(6)
  if depth < 1 or width < 1 or width % heads:
    raise ValueError(f'model {name!r}: at least one block, and a width ({width}) divisible by the heads ({heads})')
  if kind == 'vit':
    if not patch or positions:
      raise ValueError(f'model {name!r}: a ViT names its patch size (_p{{P}}) and no positions; {HELP}')
    return vit(depth, width, heads, int(patch), num_classes, name)
  if not positions or patch:
    raise ValueError(f'model {name!r}: a GPT names its positions (_t{{T}}) and no patch size; {HELP}')
  return gpt(depth, width, heads, int(positions), name)


def check_input(model: Model, input_shape: tuple[int, ...], tokens: bool) -> None:
  """Raises ValueError (one line naming the fix) when ``model`` cannot read inputs of ``input_shape`` (one
  example's: (H, W, C) images, or (T,) bytes when ``tokens``): a GPT given images or a network of images given
  text, a patch size that does not divide the image, a sequence longer than the model's positions."""
  stem = model.chain.modules[0]
  if tokens != isinstance(stem, TokenStem):
    raise ValueError(f'{model.name} reads {"bytes" if not tokens else "images"} and the data set holds '
                     f'{"text" if tokens else "images"}: use a gpt model with dataset=fortunes or text, and an image '
                     'model (resnet*, preact*, vit*) with images')
  if isinstance(stem, PatchStem) and (input_shape[0] % stem.patch or input_shape[1] % stem.patch):
    raise ValueError(f'{model.name}: patches of {stem.patch} x {stem.patch} do not tile {input_shape[0]} x '
                     f'{input_shape[1]} images; choose a patch size that divides the image (e.g. _p4 or _p8 for 32)')
  if isinstance(stem, TokenStem) and input_shape[0] > stem.positions:
    raise ValueError(f'data.sequence_length={input_shape[0]} is longer than {model.name}\'s {stem.positions} '
                     f'positions: shorten the sequence or name a model with more (_t{input_shape[0]})')
