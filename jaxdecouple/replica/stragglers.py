"""Stragglers, simulated: what a round of the replica methods would take if the workers ran at different speeds.

Local SGD and ResIST end every round with an exchange that needs every worker's L local steps, so a round waits
for its slowest worker (DiLoCo and its successors discuss the same). The engine runs every worker in one
program, in lockstep, so a straggler cannot be measured on it directly; ``replica.worker_speeds`` makes the
engine time each round for real (the local steps, then the exchange, each waited for) and put beside it this
model: worker w at relative speed v_w runs its local steps in t_local / v_w seconds, the exchange starts when the
slowest is done, and every other worker idles until then:

  round_s = max_w t_w / v_w + t_exchange,
  idle = sum_w (max_u t_u / v_u - t_w / v_w) / (S * round_s)   (the fraction of the workers' time spent waiting).

The logged ``round_s`` is measured; ``round_s_stragglers`` and ``stragglers_idle_fraction`` are this model (the
names say so). ``benchmarks/resist_worker.py --speeds`` uses it with each worker's own measured step time.
"""
from __future__ import annotations

from typing import Sequence


def round_model(busy_seconds: Sequence[float], speeds: Sequence[float], exchange_s: float = 0.0) -> dict:
  """The model above, from each worker's local seconds at full speed (``busy_seconds``: its L steps) and its
  relative speed (1: as measured; 0.5: half speed). Returns the round's seconds, each worker's busy seconds at
  its speed and the fraction of the workers' time spent idle."""
  if len(busy_seconds) != len(speeds) or min(speeds) <= 0:
    raise ValueError(f'one positive speed per worker: {len(busy_seconds)} workers, speeds {tuple(speeds)}')
  busy = [t / v for t, v in zip(busy_seconds, speeds)]
  longest = max(busy)
  round_s = longest + exchange_s
  idle = sum(longest - b for b in busy) / (len(busy) * round_s) if round_s > 0 else 0.0
  return {'round_s': round_s, 'busy_s': busy, 'idle_fraction': idle}
