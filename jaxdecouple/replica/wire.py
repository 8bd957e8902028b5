"""Compression on the wire (the ResIST paper's A.5): what a worker sends of a parameter tensor, as bytes.

``encode`` turns a flat float32 tensor into one uint8 buffer: with ``keep`` in (0, 1) only the
ceil(keep * n) entries of largest magnitude (their values and their int32 indices); with ``bits`` in
4..8 those values as ``bits``-bit codes, packed 8 / bits to a byte, plus the float32 minimum and step of
the uniform grid over their range. ``decode`` gives what arrives: the values on that grid at their
places, zero elsewhere. ``compress`` is decode after encode, the numbers the receiver trains on.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp


def kept(n: int, keep: float) -> int:
  return max(1, int(math.ceil(keep * n))) if keep else n


def encoded_size(n: int, bits: int, keep: float) -> int:
  """Bytes of one encoded tensor of ``n`` float32 values."""
  k = kept(n, keep)
  values = 8 + -(-k * bits // 8) if bits else 4 * k
  return values + (4 * k if keep else 0)


def _bytes(x: jax.Array) -> jax.Array:
  return jax.lax.bitcast_convert_type(x, jnp.uint8).reshape(-1)


def _from_bytes(b: jax.Array, dtype) -> jax.Array:
  return jax.lax.bitcast_convert_type(b.reshape(-1, 4), dtype)


def _pack_bits(codes: jax.Array, bits: int) -> jax.Array:
  flat = ((codes[:, None] >> jnp.arange(bits, dtype=jnp.uint8)) & 1).reshape(-1)
  flat = jnp.pad(flat, (0, -flat.size % 8))
  return jnp.sum(flat.reshape(-1, 8) << jnp.arange(8, dtype=jnp.uint8), axis=1, dtype=jnp.uint8)


def _unpack_bits(packed: jax.Array, count: int, bits: int) -> jax.Array:
  flat = ((packed[:, None] >> jnp.arange(8, dtype=jnp.uint8)) & 1).reshape(-1)[:count * bits]
  return jnp.sum(flat.reshape(count, bits).astype(jnp.int32) << jnp.arange(bits), axis=1)


def encode(x: jax.Array, bits: int, keep: float) -> jax.Array:
  """A flat float32 tensor -> its uint8 buffer (``encoded_size`` bytes)."""
  n = x.shape[0]
  values = x
  if keep:
    index = jax.lax.top_k(jnp.abs(x), kept(n, keep))[1].astype(jnp.int32)
    values = x[index]
  if bits:
    lo, hi = jnp.min(values), jnp.max(values)
    step = jnp.maximum(hi - lo, 1e-12) / (2 ** bits - 1)
    codes = jnp.round((values - lo) / step).astype(jnp.uint8)
    parts = [_bytes(jnp.stack([lo, step])), _pack_bits(codes, bits)]
  else:
    parts = [_bytes(values)]
  if keep:
    parts.append(_bytes(index))
  return jnp.concatenate(parts)


def decode(buf: jax.Array, n: int, bits: int, keep: float) -> jax.Array:
  """The inverse of ``encode``: the float32 tensor that arrives."""
  k = kept(n, keep)
  if bits:
    lo, step = _from_bytes(buf[:8], jnp.float32)
    end = 8 + -(-k * bits // 8)
    values = lo + _unpack_bits(buf[8:end], k, bits).astype(jnp.float32) * step
  else:
    end = 4 * k
    values = _from_bytes(buf[:end], jnp.float32)
  if not keep:
    return values
  index = _from_bytes(buf[end:end + 4 * k], jnp.int32)
  return jnp.zeros((n,), jnp.float32).at[index].set(values)


def compress(x: jax.Array, bits: int, keep: float) -> jax.Array:
  """What arrives of ``x`` (any shape) when it is sent encoded."""
  flat = x.reshape(-1).astype(jnp.float32)
  return decode(encode(flat, bits, keep), flat.shape[0], bits, keep).reshape(x.shape).astype(x.dtype)


class Codec:
  """Encodes rows whose first segments (``sizes``) are parameters, compressed, and the rest (statistics,
  momentum) float32 as bytes; the row width ``width`` (floats) -> ``encoded_width`` bytes."""

  def __init__(self, sizes: list[int], width: int, bits: int, keep: float):
    self.sizes, self.width, self.bits, self.keep = list(sizes), width, bits, keep
    self.rest = width - sum(self.sizes)
    self.encoded_width = sum(encoded_size(n, bits, keep) for n in self.sizes) + 4 * self.rest

  def encode_row(self, row: jax.Array) -> jax.Array:
    parts, start = [], 0
    for n in self.sizes:
      parts.append(encode(row[start:start + n], self.bits, self.keep))
      start += n
    parts.append(_bytes(row[start:]))
    return jnp.concatenate(parts)

  def decode_row(self, buf: jax.Array) -> jax.Array:
    parts, start = [], 0
    for n in self.sizes:
      size = encoded_size(n, self.bits, self.keep)
      parts.append(decode(buf[start:start + size], n, self.bits, self.keep))
      start += size
    parts.append(_from_bytes(buf[start:], jnp.float32).reshape(-1))
    return jnp.concatenate(parts)

  def encode(self, rows: jax.Array) -> jax.Array:
    return jax.vmap(self.encode_row)(rows)

  def decode(self, rows: jax.Array) -> jax.Array:
    return jax.vmap(self.decode_row)(rows)

  @functools.cached_property
  def jitted(self):
    """(encode, decode, round trip), each jitted once for this codec."""
    return jax.jit(self.encode), jax.jit(self.decode), jax.jit(lambda r: self.decode(self.encode(r)))

