"""Synchronous pipeline schedules: the order in which each stage runs the passes of M micro-batches in one
iteration, which then ends with one optimizer step per stage (the gradient of the whole batch, accumulated
over the micro-batches). All timing of a synchronous pipeline lives here; ``sync_engine.py`` follows it.

A pass is ('F', m) the forward of micro-batch m, ('B', m) its backward and, where the backward is split,
('B', m) the input gradient only and ('W', m) the weight gradient. Stage k's order:

  gpipe  all M forwards, then the M backwards (Huang et al., 2019, "GPipe", Figure 2c; the backwards in
         micro-batch order: the accumulated gradient does not depend on it).
  1f1b   PipeDream-Flush (Narayanan et al., 2021, "Memory-efficient pipeline-parallel DNN training",
         Figure 3): w_k = min(K-1-k, M) warm-up forwards, then one forward and one backward in turn, then
         the remaining backwards. Stage k holds at most min(K-k, M) micro-batches' activations.
  zb_h1  ZB-H1 (Qi et al., ICLR 2024, "Zero Bubble Pipeline Parallelism", section 2.1 and Figure 3 top):
         1F1B's order of forwards and input-gradient backwards, each weight-gradient pass W following
         its backward k backwards later ("delays the start of W passes ... ensuring all pipeline stages
         have the same number of in-flight micro-batches"): every stage holds at most min(K, M)
         micro-batches, stage 0 no more than under 1F1B, and the W passes left at the end fill the
         cool-down's bubbles. With F, B and W of equal cost the iteration takes 3M + K - 1 units against
         1F1B's 3(M + K - 1): a bubble of (K-1)/(3M+K-1), a third of 1F1B's (K-1) units of three.

Dependencies (the only waits): F(k, m) after F(k-1, m); B(k, m) after B(k+1, m); each stage runs its own
order one pass at a time. ``timeline`` plays the orders in unit time (F = 1, a whole backward = 2, or
B = W = 1 when split): the papers' schedule pictures, the model of the bubble, and the order in which
the driver dispatches the passes (so each device's queue is its stage's order).
"""
from __future__ import annotations

import dataclasses
import functools

KINDS = ('gpipe', '1f1b', 'zb_h1')
Pass = tuple  # (kind of pass: 'F', 'B' or 'W'; micro-batch)


@dataclasses.dataclass(frozen=True)
class SyncSchedule:
  kind: str
  num_stages: int
  micro_batches: int

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ValueError(f'unknown synchronous schedule {self.kind!r}; choose one of: {", ".join(KINDS)}')
    if self.num_stages < 1 or self.micro_batches < 1:
      raise ValueError(f'need at least one stage and one micro-batch, got K={self.num_stages}, '
                       f'M={self.micro_batches}')

  @property
  def last(self) -> int:
    return self.num_stages - 1

  @property
  def splits_backward(self) -> bool:
    """Whether the backward is two passes: B (the input's gradient) and W (the weights')."""
    return self.kind == 'zb_h1'

  def order(self, k: int) -> tuple[Pass, ...]:
    """Stage k's passes in the order it runs them."""
    m_all, K = self.micro_batches, self.num_stages
    if self.kind == 'gpipe':
      return tuple(('F', m) for m in range(m_all)) + tuple(('B', m) for m in range(m_all))
    warm = min(K - 1 - k, m_all)
    passes = [('F', m) for m in range(warm)]
    for i in range(m_all - warm):
      passes += [('F', warm + i), ('B', i)]
    passes += [('B', m) for m in range(m_all - warm, m_all)]
    if not self.splits_backward:
      return tuple(passes)
    out, backwards = [], 0
    for p in passes:  # W of micro-batch j right after the (j + k + 1)-th backward; the rest at the end
      out.append(p)
      if p[0] == 'B':
        backwards += 1
        if backwards > k:
          out.append(('W', backwards - k - 1))
    return tuple(out) + tuple(('W', m) for m in range(max(m_all - k, 0), m_all))

  def cost(self, pass_kind: str) -> int:
    """Units of time of a pass in the model: F = 1; a whole backward 2; B = W = 1 when split."""
    return 1 if pass_kind == 'F' or self.splits_backward else 2

  @functools.cached_property
  def timeline(self) -> dict[tuple[int, Pass], tuple[int, int]]:
    """(stage, pass) -> (start, end) in units, every pass as early as its dependencies and its stage allow."""
    orders = [self.order(k) for k in range(self.num_stages)]
    done: dict[tuple[int, Pass], tuple[int, int]] = {}
    position, free = [0] * self.num_stages, [0] * self.num_stages
    while any(position[k] < len(orders[k]) for k in range(self.num_stages)):
      moved = False
      for k in range(self.num_stages):
        if position[k] == len(orders[k]):
          continue
        p = orders[k][position[k]]
        need = (k - 1, p) if p[0] == 'F' and k > 0 else (k + 1, p) if p[0] == 'B' and k < self.last else None
        if need is not None and need not in done:
          continue
        start = max(free[k], done[need][1] if need else 0)
        done[k, p] = (start, start + self.cost(p[0]))
        free[k], position[k], moved = start + self.cost(p[0]), position[k] + 1, True
      if not moved:
        raise RuntimeError(f'the {self.kind} orders deadlock at K={self.num_stages}, M={self.micro_batches}')
    return done

  def dispatch_order(self) -> list[tuple[int, Pass]]:
    """Every (stage, pass) of an iteration, by its start in the timeline (then by stage): each stage's
    passes keep their order and every pass comes after the passes it needs."""
    return sorted(self.timeline, key=lambda key: (self.timeline[key][0], key[0]))

  @property
  def span(self) -> int:
    """The iteration's length in units of the model."""
    return max(end for _, end in self.timeline.values())

  def bubble_model(self) -> float:
    """The idle fraction of the stages in the model: 1 - (work per stage) / (K x span). GPipe and 1F1B:
    (K-1)/(M+K-1); ZB-H1: (K-1)/(3M+K-1)."""
    work = self.micro_batches * 3
    return 1 - work / self.span

  def held(self, k: int) -> int:
    """The most micro-batches whose forward stage k keeps at once (from its forward of one until its
    weight gradient, or its whole backward, is done): GPipe M, 1F1B min(K-k, M), ZB-H1 min(K, M)."""
    now = most = 0
    for p in self.order(k):
      now += 1 if p[0] == 'F' else -1 if p[0] == ('W' if self.splits_backward else 'B') else 0
      most = max(most, now)
    return most

  def table(self) -> str:
    """The timeline as text, one row per stage and one column per unit: F3 a forward of micro-batch 3,
    B3 its backward (two columns when whole), W3 its weight gradient, '.' idle."""
    width = len(f'F{self.micro_batches - 1}') + 1
    rows = []
    for k in range(self.num_stages):
      cells = ['.'] * self.span
      for (stage, p), (start, end) in self.timeline.items():
        if stage == k:
          for u in range(start, end):
            cells[u] = f'{p[0]}{p[1]}'
      rows.append(f'stage {k}  ' + ''.join(c.ljust(width) for c in cells).rstrip())
    return '\n'.join(rows)
