"""The pipeline schedule: what every stage does at every iteration. All timing lives here.

A method chooses how data and gradients flow, never a delay:

  forward_locked  micro-batch t goes through every stage during iteration t (DDG, FR); otherwise an
                  activation moves one stage up per iteration, so stage k forwards micro-batch t-k
                  (FDG, ADL, DGL).
  local_heads     every stage but the last learns from its own auxiliary classifier (DGL): no
                  gradient crosses a stage boundary.
  accumulation    M: a stage sums M backwards into one optimizer step, counting from its first (ADL).
  forward_first   forward the new micro-batch with the parameters from before this iteration's
                  update (ADL's mode A; forward-locked stages always do).

The delays follow from that flow. The last stage back-propagates a micro-batch in the iteration it
arrives; a gradient then moves one stage down per iteration. So stage k, which met micro-batch m at
iteration arrives(k, m), gets its gradient at arrives(K-1, m) + (K-1-k): a delay of 2(K-1-k)
iterations for FDG (the FDG paper's Algorithm 1), K-1-k when the forward is locked (DDG), and 0 for a
stage that learns from a loss of its own (the last stage; DGL's stages). The engine follows this
schedule and checks, as it moves messages, that every gradient meets the forward it belongs to.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Schedule:
  num_stages: int
  forward_locked: bool = False
  local_heads: bool = False
  accumulation: int = 1
  forward_first: bool = False

  @property
  def last(self) -> int:
    return self.num_stages - 1

  def arrives(self, k: int, m: int) -> int:
    """The iteration at which micro-batch m reaches stage k (and stage k forwards it)."""
    return m if self.forward_locked else m + k

  def source(self, k: int) -> str:
    """Where stage k's gradient comes from: 'loss' (the model's head), 'local' (its own auxiliary
    classifier) or 'neighbour' (stage k+1, delayed)."""
    if k == self.last:
      return 'loss'
    return 'local' if self.local_heads else 'neighbour'

  def sends_gradient(self, k: int) -> bool:
    """Whether stage k sends the gradient of its input down to stage k-1."""
    return k > 0 and not self.local_heads

  def delay(self, k: int) -> int:
    """Iterations between stage k's forward of a micro-batch and its backward of it."""
    if self.source(k) != 'neighbour':
      return 0
    return self.arrives(self.last, 0) + (self.last - k) - self.arrives(k, 0)

  def forward_before_update(self, k: int) -> bool:
    """Whether stage k forwards with the parameters it has before this iteration's update."""
    return self.forward_first or self.forward_locked or self.source(k) != 'neighbour'

  def forward_batch(self, k: int, t: int) -> int | None:
    """The micro-batch stage k forwards at iteration t (None before its first)."""
    m = t if self.forward_locked else t - k
    return m if m >= 0 else None

  def backward_batch(self, k: int, t: int) -> int | None:
    """The micro-batch whose gradient stage k back-propagates at iteration t (None while filling)."""
    return self.forward_batch(k, t - self.delay(k))

  def first_backward(self, k: int) -> int:
    return self.arrives(k, 0) + self.delay(k)

  def updates_at(self, k: int, t: int) -> bool:
    """Whether stage k takes an optimizer step at iteration t: every M-th backward, counted from its first (and
    from its first update, where a wait delayed that one: see ``first_update``)."""
    first = self.first_update(k)
    return t >= first and (t - first) % self.accumulation == 0

  def first_update(self, k: int) -> int:
    """The M-th backward, or later where the last stage waits (ADL): it steps only once stage K-2 has received
    its first gradient (SPEC; the ADL code's ``receive_grad``, True in an iteration in which stage K-2
    back-propagated). In mode A that is stage K-2's first backward, iteration K, and binds at M = 1 only: the
    last stage's first step, at K, sums its backwards of K-1 and K. In mode B the code steps at the start of the
    next iteration, after stage K-2's backward of it; here the same step ends the iteration before (the
    parameters every forward meets are the same), so the wait never binds."""
    first = self.first_backward(k) + self.accumulation - 1
    if self.forward_first and k == self.last and k > 0 and self.source(k - 1) == 'neighbour':
      first = max(first, self.first_backward(k - 1))
    return first

  def accumulates(self, k: int) -> bool:
    """Whether stage k keeps an accumulator: M > 1, or a first step that sums several backwards (above)."""
    return self.accumulation > 1 or self.first_update(k) > self.first_backward(k)

  def staleness(self, k: int) -> float:
    """Optimizer steps stage k takes between its forward of a micro-batch and the step that micro-batch's
    gradient enters, averaged over the steady state (FDG: delay - 1; ADL: about (delay - 1) / M)."""
    m0 = self.num_stages + 4 * self.accumulation * (self.delay(k) + 1)
    counts = []
    for m in range(m0, m0 + self.accumulation):
      forward = self.arrives(k, m)
      enters = next(u for u in range(forward + self.delay(k), forward + self.delay(k) + self.accumulation)
                    if self.updates_at(k, u))
      before = self.forward_before_update(k)
      counts.append(sum(1 for u in range(forward, enters) if self.updates_at(k, u) and (before or u > forward)))
    return sum(counts) / len(counts)

  def table(self, iterations: int) -> str:
    """The schedule as text: per stage and iteration, F<m> for a forward of micro-batch m, B<m> for the
    backward of m, '*' after an optimizer step."""
    width = len(f'F{iterations}B{iterations}*') + 1
    lines = ['t'.ljust(8) + ''.join(str(t).ljust(width) for t in range(iterations))]
    for k in range(self.num_stages):
      cells = []
      for t in range(iterations):
        f, b = self.forward_batch(k, t), self.backward_batch(k, t)
        cell = ('' if f is None else f'F{f}') + ('' if b is None or self.delay(k) == 0 else f'B{b}')
        cells.append((cell + ('*' if self.updates_at(k, t) else '') or '.').ljust(width))
      lines.append(f'stage {k}'.ljust(8) + ''.join(cells))
    return '\n'.join(lines)
