"""A convolution and a dense layer whose gradients XLA:CPU computes fast inside a loop as well as outside one.

XLA:CPU gives the weight gradient of a convolution (a "backward filter" convolution, which sums over the batch)
its fast path only when it can choose the operands' layouts, and inside a ``lax.scan`` body it cannot: a scanned
run of nine 3x3 convolutions (batch 32, 8x8x64) took 1.70 s for its gradient against 0.091 s unrolled on an AMD
EPYC core (jax-ml/jax#12868 is the same family). Written as k x k plain matrix products of shifted inputs,

  dW[kh, kw, ci, co] = sum_{n, h, w} x_pad[n, h + kh, w + kw, ci] dY[n, h, w, co]
                     = (patch_{kh, kw} as [N H' W', ci])^T (dY as [N H' W', co]),

the same weight gradient is fast in a loop (nine 3x3 convolutions at batch 128: 0.63 s scanned against 0.52 s
unrolled at 32x32x16, 0.31 against 0.36 s at 8x8x64; a single convolution of transposed operands was as fast at
8x8 but 3.3x slower at 32x32, where it becomes a 32 x 32 kernel over the batch). The input gradient is written as
a forward convolution: dY, padded by k - 1 - p on each side, convolved with the kernel flipped in space and its
input and output channels swapped. ``conv_general_dilated`` below is
``lax.conv_general_dilated`` with that gradient for the case the CIFAR and ImageNet ResNets' scanned runs use
(NHWC inputs, HWIO kernels, stride 1, no dilation, one group) on the CPU inside a scan (``in_scan``), and plain
``lax.conv_general_dilated`` otherwise (other backends have a backward-filter kernel of their own). The forward is the same call either way;
the gradients agree within float rounding (tested against JAX's own).

A dense layer's weight gradient inside a loop has the same trouble: twelve GELU MLP blocks (width 128, 16 x 128
tokens) took 0.616 s for their gradient scanned against 0.378 s unrolled. ``dot_general`` (the signature Flax's
``nn.Dense`` calls) computes y = x W as JAX does and its gradients as two plain matrix products of 2-D operands,
dX = dY W^T and dW = X^T dY with the tokens and the batch flattened into one axis: 0.313 s scanned, 0.215 s
unrolled.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools

import jax
import jax.numpy as jnp
from jax import lax

NHWC = ('NHWC', 'HWIO', 'NHWC')
# Whether the convolutions being traced are a scan's body (``in_scan``). Outside a loop XLA:CPU's own weight
# gradient is the faster: ResNet-56 at batch 128 took 5.71 s a BP step with the forward-convolution gradient
# everywhere against 2.31 s with XLA's (its first section's weight gradient becomes a convolution with a 32 x 32
# kernel over 128 channels), so the replacement is made only inside scans.
_IN_SCAN = contextvars.ContextVar('in_scan', default=False)


@contextlib.contextmanager
def in_scan():
  """Marks the convolutions traced inside it as a scan body's (``models/core.py`` traces scanned runs in it)."""
  token = _IN_SCAN.set(True)
  try:
    yield
  finally:
    _IN_SCAN.reset(token)


def _plain(lhs, rhs, padding):
  return lax.conv_general_dilated(lhs, rhs, (1, 1), padding, dimension_numbers=NHWC)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _conv(x, w, padding):
  return _plain(x, w, padding)


def _conv_forward(x, w, padding):
  return _plain(x, w, padding), (x, w)


def _conv_backward(padding, residuals, dy):
  x, w = residuals
  k_h, k_w = w.shape[:2]  # the input gradient: dY convolved with the flipped kernel, its in and out swapped
  (top, bottom), (left, right) = padding
  dx = _plain(dy.astype(x.dtype), jnp.flip(w, (0, 1)).transpose(0, 1, 3, 2).astype(x.dtype),
              ((k_h - 1 - top, k_h - 1 - bottom), (k_w - 1 - left, k_w - 1 - right)))
  x_pad = jnp.pad(x, ((0, 0), *padding, (0, 0)))
  h, w_out, c = dy.shape[1], dy.shape[2], x.shape[-1]
  patches = jnp.stack([x_pad[:, i:i + h, j:j + w_out, :].reshape(-1, c) for i in range(k_h) for j in range(k_w)])
  dw = jnp.einsum('pmc,mo->pco', patches, dy.reshape(-1, dy.shape[-1]).astype(x.dtype))
  return dx, dw.reshape(w.shape).astype(w.dtype)


_conv.defvjp(_conv_forward, _conv_backward)


def conv_general_dilated(lhs, rhs, window_strides, padding, lhs_dilation=None, rhs_dilation=None,
                         dimension_numbers=None, feature_group_count=1, batch_group_count=1, precision=None,
                         preferred_element_type=None):
  """``lax.conv_general_dilated`` (the signature Flax's ``nn.Conv`` calls), differentiated as above on the CPU."""
  plain = (tuple(window_strides) == (1, 1) and not any(d not in (None, 1) for d in (*(lhs_dilation or ()),
                                                                                      *(rhs_dilation or ())))
           and feature_group_count == 1 and batch_group_count == 1 and precision is None
           and preferred_element_type is None and lhs.ndim == 4 and not isinstance(padding, str))
  if plain and _IN_SCAN.get() and jax.default_backend() == 'cpu' and _is_nhwc(dimension_numbers, lhs.ndim):
    return _conv(*_match_varying(lhs, rhs), tuple(tuple(p) for p in padding))
  return lax.conv_general_dilated(lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation, dimension_numbers,
                                  feature_group_count, batch_group_count, precision, preferred_element_type)


@jax.custom_vjp
def _matmul(x, w):
  return x @ w


def _matmul_forward(x, w):
  return x @ w, (x, w)


def _matmul_backward(residuals, dy):
  x, w = residuals
  dy = dy.astype(x.dtype)
  dw = x.reshape(-1, x.shape[-1]).T @ dy.reshape(-1, dy.shape[-1])
  return dy @ w.astype(x.dtype).T, dw.astype(w.dtype)


_matmul.defvjp(_matmul_forward, _matmul_backward)


def dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, **kwargs):
  """``lax.dot_general`` (as Flax's ``nn.Dense`` calls it), differentiated as above on the CPU when it is a dense
  layer's product: the last axis of ``lhs`` against the first of a 2-D ``rhs``, no batch axes."""
  (contract_lhs, contract_rhs), (batch_lhs, batch_rhs) = dimension_numbers
  dense = (tuple(contract_lhs) == (lhs.ndim - 1,) and tuple(contract_rhs) == (0,) and rhs.ndim == 2
           and not batch_lhs and not batch_rhs and precision is None and preferred_element_type is None
           and not kwargs and lhs.dtype == rhs.dtype)
  if dense and jax.default_backend() == 'cpu':
    return _matmul(*_match_varying(lhs, rhs))
  return lax.dot_general(lhs, rhs, dimension_numbers, precision, preferred_element_type, **kwargs)


def _varying(a) -> frozenset:
  """The mesh axes ``a`` varies over inside ``jax.shard_map`` (empty outside one)."""
  t = jax.typeof(a)
  manual = getattr(t, 'manual_axis_type', None)
  return frozenset(manual.varying) if manual is not None else frozenset(getattr(t, 'vma', ()))


def _match_varying(*arrays):
  """The operands made to vary over the same mesh axes. A custom gradient must return each cotangent with its
  input's type, and under data parallelism a replicated kernel's gradient (from sharded activations) varies over
  the batch axis: cast the kernel to varying first, and JAX's transpose of that cast sums the gradient over the
  axis, as it does for the products JAX differentiates itself."""
  axes = frozenset().union(*map(_varying, arrays))
  cast = getattr(lax, 'pcast', None)
  out = []
  for a in arrays:
    missing = tuple(sorted(axes - _varying(a)))
    if missing:
      a = cast(a, missing, to='varying') if cast is not None else lax.pvary(a, missing)
    out.append(a)
  return out


def _is_nhwc(dimension_numbers, ndim: int) -> bool:
  if dimension_numbers is None:
    return False
  if isinstance(dimension_numbers, lax.ConvDimensionNumbers):
    return dimension_numbers == lax.conv_dimension_numbers((1,) * ndim, (1,) * ndim, NHWC)
  return tuple(dimension_numbers) == NHWC
