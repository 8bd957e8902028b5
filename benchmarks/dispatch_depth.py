"""How many computations a device takes before a dispatch waits: a chain of compiled calls, each on the previous
one's output, dispatched back to back; the first ones return at once (queued), and once the client's limit of
computations in flight is reached each dispatch returns only when one has finished.

  python benchmarks/dispatch_depth.py                  # XLA:CPU here: 31 returned at once, then ~3 ms each
  taskset -c 0 python benchmarks/dispatch_depth.py --calls=80 --size=600

Why it matters: a pipeline driver that launches more computations an iteration than that limit (every eager
operation counts) cannot run ahead of its device, and a transfer it would post next waits with it
(``pipeline/sync_engine.py``'s docstring; docs/PERFORMANCE.md). Prints one JSON line and a table.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0], epilog=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--calls', type=int, default=60, help='compiled calls dispatched back to back')
  p.add_argument('--size', type=int, default=600, help='each call multiplies a SIZE x SIZE matrix by itself')
  p.add_argument('--waited_ms', type=float, default=0.5, help='a dispatch slower than this counts as one that waited')
  return p.parse_args(argv)


def main(argv=None) -> dict:
  args = parse_args(argv)
  import jax
  import jax.numpy as jnp
  step = jax.jit(lambda x: jnp.tanh(x @ x) * 1e-3)
  x = jnp.ones((args.size, args.size), jnp.float32)
  step(x).block_until_ready()  # compiled, and the device idle
  one = time.perf_counter()
  step(x).block_until_ready()
  one_ms = 1000 * (time.perf_counter() - one)
  dispatch_ms = []
  for _ in range(args.calls):
    start = time.perf_counter()
    x = step(x)
    dispatch_ms.append(1000 * (time.perf_counter() - start))
  x.block_until_ready()
  first_wait = next((i for i, ms in enumerate(dispatch_ms) if ms > args.waited_ms), None)
  waited = dispatch_ms[first_wait:] if first_wait is not None else []
  out = {'device': str(jax.devices()[0]), 'platform': jax.devices()[0].platform, 'calls': args.calls,
         'one_call_ms': round(one_ms, 3), 'returned_at_once': first_wait if first_wait is not None else args.calls,
         'median_dispatch_ms_after': round(statistics.median(waited), 3) if waited else None}
  print(json.dumps(out), flush=True)
  print('\n| device | one call ms | dispatches that returned at once | median dispatch ms after them |')
  print('|---|---|---|---|')
  print(f"| {out['device']} | {out['one_call_ms']} | {out['returned_at_once']} of {args.calls} | "
        f"{out['median_dispatch_ms_after']} |")
  return out


if __name__ == '__main__':
  main()
