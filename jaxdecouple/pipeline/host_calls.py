"""Where a pipeline driver's host time goes: each compiled call's dispatch, counted by kind, and the rest.

On one GPU every pipeline run was host-bound (``host_share`` 0.84-0.99, docs/PERFORMANCE.md, "a third loan"):
GPipe's iteration took 94 ms where BP's took 11, with 16 passes and 2 updates to hand over. Whether that is
the calls' own dispatch (each handles every array it takes and returns: a forward returns its residuals, 270
arrays for a ResNet-56 half) or the driver's Python between them decides what to change, so this measures
it rather than guess: every ``jax.jit`` function held by the pipeline and its stages is wrapped, for a few
iterations, by a timer of how long its call took to return, with the arrays it took and returned; the
iteration's host time (until ``step`` returned, before waiting for the devices) less the calls' (and the
timers' own bookkeeping) is the driver's own: its Python, eager operations, transfers, and the benchmark's
batch building. Only functions held as attributes of the pipeline and its stages are seen. On a GPU a call returns once it is queued, so its time is its dispatch; on XLA:CPU a call may
run part of its program before returning, so there the figures mix in compute.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import jax


def _compiled(fn) -> bool:
  """A ``jax.jit`` function (it can be lowered) or a ``common.vjp_call`` (one or two of them: ``calls``), not
  a plain callable such as the learning-rate schedule."""
  return callable(fn) and ((hasattr(fn, 'lower') and hasattr(fn, 'trace')) or hasattr(fn, 'calls'))


def host_calls(pipeline, step: Callable[[], Any], iters: int) -> dict:
  """Runs ``step()`` (one iteration; it returns what to wait for) ``iters`` times with the compiled calls of
  ``pipeline`` and its stages timed. Returns, per iteration: ``host_ms`` (until step returned), ``iter_ms``
  (until its results were ready), ``other_ms`` (host time outside the compiled calls: the driver), and per
  call name (summed over stages) its ``ms``, ``calls`` and ``arrays`` (taken and returned, per call)."""
  owners = [pipeline, *getattr(pipeline, 'stages', [])]
  seen: dict[str, list] = {}  # name -> [seconds, calls, arrays]
  bookkeeping = [0.0]  # the timers' own time (counting arrays), taken out of the driver's
  patched = []
  for owner in owners:
    for name, fn in list(vars(owner).items()):
      if not _compiled(fn):
        continue

      def timed(*args, _fn=fn, _name=name.lstrip('_'), **kwargs):
        began = time.perf_counter()
        out = _fn(*args, **kwargs)
        took = time.perf_counter() - began
        record = seen.setdefault(_name, [0.0, 0, 0])
        record[0] += took
        record[1] += 1
        record[2] += len(jax.tree.leaves((args, kwargs))) + len(jax.tree.leaves(out))
        bookkeeping[0] += time.perf_counter() - began - took
        return out
      patched.append((owner, name, fn))
      setattr(owner, name, timed)
  host = whole = 0.0
  try:
    for _ in range(iters):
      began = time.perf_counter()
      result = step()
      returned = time.perf_counter()
      jax.block_until_ready(result)
      host += returned - began
      whole += time.perf_counter() - began
  finally:
    for owner, name, fn in patched:
      setattr(owner, name, fn)
  calls = {name: {'ms': round(1e3 * s / iters, 3), 'calls': round(n / iters, 2), 'arrays': round(a / n, 1)}
           for name, (s, n, a) in sorted(seen.items(), key=lambda kv: -kv[1][0])}
  return {'host_ms': round(1e3 * host / iters, 3), 'iter_ms': round(1e3 * whole / iters, 3),
          'other_ms': round(1e3 * (host - bookkeeping[0] - sum(s for s, _, _ in seen.values())) / iters, 3),
          'calls': calls}
