"""The bytes a compiled program's collectives move, read from the program XLA really compiled.

A stage split over D devices (``sync_engine.StagePlace``) runs the same pass functions as on one device;
XLA partitions them and inserts the all-reduces that sum BatchNorm's batch statistics and the weight
gradients over the devices. What they move is not written anywhere in this library, so it is read from the
compiled program's HLO: every ``all-reduce`` (or ``all-reduce-start``) and the shapes of what it reduces.
The figure is the bytes each device puts into its all-reduces per call (a ring all-reduce then sends and
receives 2 (D - 1) / D of that per device; the logs say which they show).
"""
from __future__ import annotations

import re

ITEM_BYTES = {'pred': 1, 's8': 1, 'u8': 1, 's16': 2, 'u16': 2, 'f16': 2, 'bf16': 2, 's32': 4, 'u32': 4, 'f32': 4,
              's64': 8, 'u64': 8, 'f64': 8}
_REDUCE = re.compile(r'=\s*(\([^=]*?\)|[a-z0-9]+\[[0-9,]*\](?:\{[0-9,]*\})?)\s+all-reduce(?:-start)?\(')
_SHAPE = re.compile(r'\b(' + '|'.join(ITEM_BYTES) + r')\[([0-9,]*)\]')


def shape_bytes(text: str) -> int:
  """Bytes of every array shape written in ``text`` (f32[3,3,16,16] is 2304 x 4)."""
  total = 0
  for dtype, dims in _SHAPE.findall(text):
    n = 1
    for d in filter(None, dims.split(',')):
      n *= int(d)
    total += n * ITEM_BYTES[dtype]
  return total


def all_reduce_bytes(hlo: str) -> int:
  """Bytes reduced by the all-reduces of an HLO module's text (their results' shapes, tuples included)."""
  hlo = re.sub(r'/\*.*?\*/', '', hlo)  # XLA numbers long tuples' elements in comments: /*index=5*/
  return sum(shape_bytes(m.group(1)) for m in _REDUCE.finditer(hlo))


def compiled_all_reduce_bytes(jitted, *args) -> int:
  """``all_reduce_bytes`` of the program ``jitted(*args)`` runs (lowered and compiled again with these
  arguments' shapes and shardings; XLA's compilation cache usually answers)."""
  return all_reduce_bytes(jitted.lower(*args).compile().as_text())
