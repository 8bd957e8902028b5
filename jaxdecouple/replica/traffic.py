"""What one round of the replica engine moved, per device: counted from the arrays handed to the transfers
and the collectives, never from a formula of the model (except a float32 all-reduce's algorithm, named)."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Traffic(NamedTuple):
  """Bytes one round moved across device boundaries, per device: the blocks' transfers counted from the
  arrays sent; the shared layers' collectives from the arrays each device put in."""
  sent: np.ndarray
  received: np.ndarray
  all_reduce: int      # bytes of the shared layers each device put into the collectives (float32 and encoded)
  all_gather: int = 0  # of which encoded buffers, all-gathered (compression on)
  all_to_all: int = 0  # and encoded chunks sent to the other devices (the two-stage exchange; as many arrive)
  devices: int = 1

  @property
  def collective_received(self) -> float:
    """Bytes arriving at each device from the collectives: every other device's encoded buffers (an
    all-gather's output less the device's own: exact, whatever the algorithm), the chunks an all-to-all
    brings (exact), plus, for the float32
    all-reduce, what a ring all-reduce (reduce-scatter then all-gather, the bandwidth-optimal one) moves,
    2 (D - 1) / D of the reduced bytes: a count of that algorithm, as XLA does not report its own.
    A device sends as many bytes as it receives."""
    d = self.devices
    if d <= 1:
      return 0.0
    ring = self.all_reduce - self.all_gather - self.all_to_all
    return 2 * (d - 1) / d * ring + (d - 1) * self.all_gather + self.all_to_all


def wire_settings(section) -> dict:
  """What changes a round's bytes, by the replica fields' names (``config.replica``, or anything with the same
  attributes, as resist_round.py's arguments), defaults left out: how its records name a setting, and how a
  study's report finds the record of a column's setting (study/budget.py)."""
  out = {k: getattr(section, k) for k in ('quantize_bits', 'sparsify') if getattr(section, k)}
  if section.compress != 'weights':
    out['compress'] = section.compress
    if section.update_exchange != 'all_gather':
      out['update_exchange'] = section.update_exchange
  if section.outer_lr != 1 or section.outer_momentum:
    out['outer'] = [section.outer_lr, section.outer_momentum]
  return out
