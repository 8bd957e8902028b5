"""When each stage's compiled calls really ran, and the bubble that follows: measured, not modelled.

A driver that is given a ``Recorder`` reports each compiled call it dispatches: the stage, a label (F3, B3,
W3 for a synchronous pass; 'iteration 7' for an asynchronous stage's whole iteration), the arrays it
produces and the arrays it waits for (an activation or gradient moved from another device). A thread per
call waits (in JAX, releasing the interpreter) for its outputs, and one for its inputs, and notes the time
they became ready: a call's end is when its outputs became ready. A device computes one call at a time
(XLA:CPU may run a call queued later first when it needs nothing of the earlier one, so the calls are taken
in the order they ended), so a call starts when the call that ended before it on its device has ended and
its inputs have arrived: ``start = max(previous end on the device, inputs ready)``. Both are times that
really happened; no pass is assumed to cost anything. Where a device does run two calls at once (threads
of XLA:CPU's pool), their busy time is still the device's: the union of what it was computing.

The measured bubble of an iteration is the stages' idle share of it: 1 - sum(busy_k) / (K x span), span
from the first start to the last end. It waits for the devices, so the training loop measures only every
``profile_every_steps`` steps.

Each call also carries when its dispatch returned to the driver (``dispatched``). A device cannot start a call
before the host has handed it over, so where the host is the slower side (many small kernels on a fast GPU,
or a dispatch that waits for its results) the calls end just after they are dispatched and the devices sit
idle between them: ``host_share`` (the span's share until the last dispatch returned) near 1 with a large
bubble says the driver, not the stages, set the pace.
"""
from __future__ import annotations

import sys
import threading
import time
from typing import Any, Callable

import jax


class Recorder:
  """Collects the calls of one or more iterations and when their arrays became ready: a waiting thread per
  call's outputs and per call's inputs (blocked in JAX, off the interpreter, until the arrays are ready), so
  neither a busy driver nor a polling loop blurs the times."""

  def __init__(self):
    self.start = time.perf_counter()
    self.calls: list[tuple[int, Any, str, int, int, float]] = []  # (stage, device, label, outputs' key,
    # inputs' key, seconds from the start when the dispatch returned)
    self.ready: dict[int, float] = {}  # key -> seconds since start
    self._waiters: list[threading.Thread] = []

  def _watch(self, arrays: list) -> int:
    key = len(self._waiters)
    if not arrays:
      self.ready[key] = None
      self._waiters.append(None)
      return key

    def wait():
      jax.block_until_ready(arrays)
      self.ready[key] = time.perf_counter() - self.start
    thread = threading.Thread(target=wait, daemon=True)
    self._waiters.append(thread)
    thread.start()
    return key

  def __call__(self, stage: int, device, label: str, outputs, inputs=()) -> None:
    local = lambda tree: [x for x in jax.tree.leaves(tree) if isinstance(x, jax.Array) and x.is_fully_addressable]
    dispatched = time.perf_counter() - self.start
    self.calls.append((stage, device, label, self._watch(local(outputs)), self._watch(local(inputs)), dispatched))

  def finish(self, timeout_s: float = 600.0) -> list[dict]:
    """Waits for every recorded array (at most ``timeout_s``) and returns the calls as dicts: stage, label,
    start, end and dispatched (when the driver's dispatch of it returned) in seconds from the recorder's
    start, in dispatch order."""
    deadline = time.perf_counter() + timeout_s
    for thread in self._waiters:
      if thread is not None:
        thread.join(max(0.0, deadline - time.perf_counter()))
        if thread.is_alive():
          raise TimeoutError(f'a timed pipeline iteration\'s arrays were not ready after {timeout_s:.0f} s')
    free, timed = {}, []
    calls = [(self.ready[c[3]], i, c) for i, c in enumerate(self.calls) if self.ready[c[3]] is not None]
    for end, i, (stage, device, label, outs, ins, dispatched) in sorted(calls, key=lambda e: (e[0], e[1])):
      start = min(end, max(free.get(device, 0.0), self.ready[ins] or 0.0))
      free[device] = end
      timed.append((i, {'stage': stage, 'label': label, 'start': round(start, 6), 'end': round(end, 6),
                        'dispatched': round(dispatched, 6)}))
    return [p for _, p in sorted(timed, key=lambda e: e[0])]


def measure(run: Callable[[Recorder], Any]) -> tuple[Any, list[dict]]:
  """``run(recorder)`` dispatches one or more iterations, reporting its calls; returns its result and the
  measured passes. The devices should be idle when it starts (block on the state first)."""
  interval = sys.getswitchinterval()
  sys.setswitchinterval(1e-4)  # a woken waiter gets the interpreter within 0.1 ms, not Python's default 5 ms
  try:
    recorder = Recorder()
    result = run(recorder)
    return result, recorder.finish()
  finally:
    sys.setswitchinterval(interval)


def summary(passes: list[dict], num_stages: int) -> dict[str, float]:
  """Each stage's busy and idle seconds within the measured span, the measured bubble fraction, and the
  host's share of the span (until the driver's last dispatch returned; see the module's docstring)."""
  if not passes:
    return {}
  begin = min(p['start'] for p in passes)
  span = max(p['end'] for p in passes) - begin
  out, busy_total = {}, 0.0
  for k in range(num_stages):
    busy = sum(p['end'] - p['start'] for p in passes if p['stage'] == k)
    busy_total += busy
    out[f'stage{k}_busy_s'], out[f'stage{k}_idle_s'] = round(busy, 5), round(span - busy, 5)
  out['span_s'] = round(span, 5)
  out['bubble_measured'] = round(1 - busy_total / (num_stages * span), 4) if span > 0 else 0.0
  if span > 0 and all('dispatched' in p for p in passes):
    out['host_share'] = round(min(1.0, max(0.0, max(p['dispatched'] for p in passes) - begin) / span), 4)
  return out
