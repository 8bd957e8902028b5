"""A ResIST worker's training step against a full-model step.

  python benchmarks/resist_worker.py --model=preact101 --batch=32 --workers=4 [--with_cond]
  python benchmarks/resist_worker.py --model=preact101 --batch=32 --workers=4 --speeds=1,1,1,0.5   # a straggler

Times, on one device, jitted training steps (forward, backward and masked update) of: the full model
with no skipping machinery at all (local SGD's worker step: the reference), the full model through
the slots (every block owned, as many slots as blocks: what the slot machinery costs), and each of
the S sub-networks of round 0 as the replica engine runs them: by default (replica.skip=gather) the
worker's own partitioned blocks in its fixed slots, a leftover slot's output dropped, no control flow;
with --with_cond also with lax.cond per slot (replica.skip=cond). Also the shared layers alone (the
partitioned blocks taken out), so that one partitioned block's time is measured: (full - shared) / blocks.
Reports the median seconds over --iters timed iterations after --warmup (compilation), each waiting
for its result (with --rounds=R: every row compiled and warmed first, then R rounds each timing every
row in turn; seconds and ratio are medians over the rounds, with the ratios' range), the ratio to the
full step, the ratio predicted from the blocks' FLOPs (XLA's
cost analysis of each block's forward), and the ratio predicted from the measured times (the shared
layers' step plus as many blocks as the row computes). Prints one JSON line per measurement, then a markdown table.

--speeds: a straggler, simulated: each worker's relative speed; a round of ResIST (each worker its own
sub-network's measured step) and of local SGD (every worker the full step) is then L steps at that speed
for each worker, the exchange (--exchange_s) starting when the slowest is done. A model built on the measured
step times, labelled so in its JSON (``"model": true``); the engine itself runs all workers in one program.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
  p.add_argument('--model', default='preact101', help='a pre-activation ResNet: preact101, preact_s3_N, '
                 'preact_tiny')
  p.add_argument('--dataset', default='cifar100', help='shape of the synthetic data (cifar10, cifar100)')
  p.add_argument('--batch', type=int, default=32, help='batch size per worker')
  p.add_argument('--workers', type=int, default=4, help='S: the number of sub-networks')
  p.add_argument('--min_depth', type=int, default=0, help='minimum number of partitioned blocks per worker')
  p.add_argument('--with_cond', action='store_true', help='also time the lax.cond variant (slow on CPU)')
  p.add_argument('--warmup', type=int, default=2, help='untimed iterations (compilation)')
  p.add_argument('--iters', type=int, default=5, help='timed iterations (per round)')
  p.add_argument('--rounds', type=int, default=1, help='time every row in R interleaved rounds; the ratio to '
                 'the full step is the median of the R per-round ratios (noisy machines)')
  p.add_argument('--speeds', default='', help='comma-separated relative speed of each worker (1: as measured; '
                 "0.5: a straggler at half speed): print a round's wall-clock for ResIST and local SGD, a model "
                 'from the measured step times')
  p.add_argument('--local_steps', type=int, default=50, help='L, for the --speeds model')
  p.add_argument('--exchange_s', type=float, default=0.0, help="a round's exchange seconds, for the --speeds "
                 'model (measure it with resist_round.py)')
  p.add_argument('--json_out', default='', help='also append the JSON lines to this file')
  return p.parse_args(argv)


def round_model(step_seconds, speeds, local_steps: int, exchange_s: float = 0.0) -> dict:
  """A model (not a measurement) of one round's wall-clock from measured step times: worker w runs its L
  local steps in L * t_w / v_w seconds (v_w its relative speed), the exchange starts when the slowest is
  done (jaxdecouple/replica/stragglers.py, which the engine uses too)."""
  from jaxdecouple.replica.stragglers import round_model as model
  return model([local_steps * t for t in step_seconds], speeds, exchange_s)


def print_round_model(results, args):
  """Each method's round with the given per-worker speeds, beside the same with every worker at full speed."""
  speeds = [float(v) for v in args.speeds.split(',')]
  if len(speeds) != args.workers or min(speeds) <= 0:
    raise SystemExit(f'resist_worker.py: --speeds needs {args.workers} positive numbers, got {args.speeds!r}')
  full = results[0]['seconds']
  workers = [r['seconds'] for r in results if r['run'].startswith('worker ') and r['skip'] == 'gather']
  out = []
  for method, steps in (('resist', workers), ('localsgd', [full] * args.workers)):
    even = round_model(steps, [1.0] * args.workers, args.local_steps, args.exchange_s)
    slow = round_model(steps, speeds, args.local_steps, args.exchange_s)
    out.append({'method': method, 'speeds': speeds, 'local_steps': args.local_steps, 'exchange_s': args.exchange_s,
                'round_s': round(slow['round_s'], 3), 'round_s_all_full_speed': round(even['round_s'], 3),
                'idle_fraction': round(slow['idle_fraction'], 3), 'model': True})
    print(json.dumps(out[-1]), flush=True)
  print(f"\nA round's wall-clock, a model from the step times above (L = {args.local_steps}, exchange "
        f"{args.exchange_s:g} s, worker speeds {args.speeds}; the exchange waits for the slowest worker):\n")
  print('| method | round s | round s, all at full speed | slowdown | workers idle |')
  print('|---|---|---|---|---|')
  for r in out:
    print(f"| {r['method']} | {r['round_s']:.2f} | {r['round_s_all_full_speed']:.2f} | "
          f"{r['round_s'] / r['round_s_all_full_speed']:.2f}x | {r['idle_fraction']:.0%} |")
  return out


def main(argv=None):
  args = parse_args(argv)
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jaxdecouple.config import get_default_config
  from jaxdecouple.data import load_dataset
  from jaxdecouple.methods import METHODS
  from jaxdecouple.pipeline.splits import block_flops
  from jaxdecouple.train import build_setup

  c = get_default_config()
  c.method, c.model, c.dataset, c.batch_size = 'resist', args.model, args.dataset, args.batch
  c.data.source = 'synthetic'
  c.data.synthetic_train_size = max(args.batch, 256)
  c.replica.num_workers, c.replica.min_depth, c.replica.num_devices = args.workers, args.min_depth, 1
  ds = load_dataset(c.data, c.dataset)
  engines = {}
  for skip in ('gather', 'cond') if args.with_cond else ('gather',):
    c.replica.skip = skip
    engines[skip] = METHODS['resist'](build_setup(c, ds)).engine
  c.replica.skip, c.replica.min_depth = 'gather', len(engines['gather'].partitioned)
  engines['gather_all'] = METHODS['resist'](build_setup(c, ds)).engine  # as many slots as blocks
  c.replica.min_depth = args.min_depth
  engine = engines['gather']
  variables = jax.device_get(engine.model.init(jax.random.key(0), jnp.zeros((1, *ds.image_shape))))

  def worker_state(e, w):
    """Worker w's stored state in engine e's layout (shared layers, its slots of round 0)."""
    member = e.layout.membership(0)
    take = lambda tree: jax.tree.map(lambda x: jnp.asarray(x[w]), e.layout.to_workers(tree, member))
    params = take(variables['params'])
    return params, take(variables['batch_stats']), e.optimizer.init(params)
  images, labels = jnp.asarray(ds.x_train[:args.batch]), jnp.asarray(ds.y_train[:args.batch])
  steps = {skip: jax.jit(e.worker_step) for skip, e in engines.items()}
  c.method = 'localsgd'
  local_sgd = METHODS['localsgd'](build_setup(c, ds)).engine
  plain = jax.jit(local_sgd.worker_step)  # no skipping at all
  # The shared layers alone (the partitioned blocks taken out of the chain): what a worker's step costs
  # before its blocks, so that the time of one partitioned block is measured, not assumed from FLOPs.
  from jaxdecouple.models import Chain
  from jaxdecouple.replica import Replica
  kept = [(n, m) for n, m in zip(local_sgd.chain.names, local_sgd.chain.modules) if n not in engine.partitioned]
  bare_model = dataclasses.replace(local_sgd.model, chain=Chain(tuple(n for n, _ in kept), tuple(m for _, m in kept)))
  bare = Replica(bare_model, local_sgd.spec, local_sgd.devices, local_sgd.optimizer, local_sgd.schedule,
                 local_sgd.preprocess)
  shared_only = jax.jit(bare.worker_step)
  flops = block_flops(engine.model, ds.image_shape)
  flops = dict(zip(engine.model.block_names, flops))
  full_flops = sum(flops.values())

  def step(worker, skip):
    if skip == 'shared':
      params, stats, opt_state = worker_state(local_sgd, 0)
      drop = lambda tree: {n: v for n, v in tree.items() if n not in engine.partitioned}
      params, stats = drop(params), drop(stats)
      opt_state = local_sgd.optimizer.init(params)
      return lambda: jax.block_until_ready(shared_only(params, stats, opt_state, (), images, labels, 0, np.int32(0)))
    if worker is None:
      fn, e, member = plain, local_sgd, ()
    else:
      fn, e = steps[skip], engines[skip]
      member = jnp.asarray(e.layout.membership(0)[worker])
    params, stats, opt_state = worker_state(e, worker or 0)
    return lambda: jax.block_until_ready(fn(params, stats, opt_state, member, images, labels, 0, np.int32(0)))

  def timed(call):
    times = []
    for _ in range(args.iters):
      start = time.perf_counter()
      call()
      times.append(time.perf_counter() - start)
    return statistics.median(times)

  blocks = engine.partitioned
  membership = engine.layout.membership(0)
  rows = [('full model (local SGD step, no skipping)', None, None, None),
          ('shared layers only (partitioned blocks removed)', np.zeros(len(blocks), bool), 'shared', None),
          ('full model through the slots (one per block)', np.ones(len(blocks), bool), 'gather_all', 0)]
  rows += [(f'worker {w} of {args.workers}, slots', membership[w], 'gather', w) for w in range(args.workers)]
  if args.with_cond:
    rows += [(f'worker {w} of {args.workers}, lax.cond', membership[w], 'cond', w) for w in range(args.workers)]
  calls = [step(worker, skip) for _, _, skip, worker in rows]
  for call in calls:  # compilation and warm-up of every row first, then the timed rounds
    for _ in range(args.warmup):
      call()
  rounds = [[timed(call) for call in calls] for _ in range(args.rounds)]
  results = []
  # The time of one partitioned block, measured: (full step - shared layers' step) / blocks, per round
  block_share = [(r[0] - r[1]) / len(blocks) / r[0] for r in rounds]
  for i, (label, member, skip, _) in enumerate(rows):
    seconds = statistics.median(r[i] for r in rounds)
    ratios = [r[i] / r[0] for r in rounds]
    active = np.ones(len(blocks), bool) if member is None else member
    # gathered: every slot is computed, a sub-network smaller than the largest one drops its last slot
    computed = engines[skip].layout.slots if skip in ('gather', 'gather_all') else int(active.sum())
    predicted = (sum(v for n, v in flops.items() if n not in blocks)
                 + computed * flops[blocks[0]]) / full_flops
    # the same prediction from measured times: the shared layers' step plus `computed` blocks
    timed_share = statistics.median(r[1] / r[0] + computed * b for r, b in zip(rounds, block_share))
    record = {'model': args.model, 'batch': args.batch, 'run': label, 'skip': skip, 'blocks': int(active.sum()),
              'computed': computed,
              'seconds': round(seconds, 4), 'ratio': round(statistics.median(ratios), 3),
              'flop_ratio': round(predicted, 3), 'time_share_ratio': round(timed_share, 3),
              'device': str(jax.devices()[0].device_kind)}
    if args.rounds > 1:
      record['rounds'], record['ratio_range'] = args.rounds, [round(min(ratios), 3), round(max(ratios), 3)]
    results.append(record)
    print(json.dumps(record), flush=True)
    if args.json_out:
      with open(args.json_out, 'a', encoding='utf-8') as f:
        f.write(json.dumps(record) + '\n')
  print(f'\n{args.model}, batch {args.batch} per worker, {len(blocks)} partitioned blocks, S = {args.workers}, '
        f'on {jax.devices()[0].device_kind}\n')
  print('| step | partitioned blocks owned | computed | s/step | vs full'
        + (' [min-max over rounds]' if args.rounds > 1 else '') + ' | FLOP ratio | time-share ratio |')
  print('|---|---|---|---|---|---|---|')
  for r in results:
    spread = ' [{:.2f}-{:.2f}]'.format(*r['ratio_range']) if 'ratio_range' in r else ''
    print(f"| {r['run']} | {r['blocks']} | {r['computed']} | {r['seconds']:.3f} | {r['ratio']:.2f}{spread} | "
          f"{r['flop_ratio']:.2f} | {r['time_share_ratio']:.2f} |")
  flop_share = sum(flops[b] for b in blocks) / full_flops
  time_share = statistics.median(len(blocks) * b for b in block_share)
  print(f'\nThe partitioned blocks hold {flop_share:.2f} of the FLOPs and take {time_share:.2f} of the full step\'s '
        'time (full step minus the shared layers\' step). FLOP ratio: a step predicted from the blocks\' FLOPs; '
        'time-share ratio: predicted from the measured times (shared layers\' step + computed x one block\'s).')
  if args.speeds:
    results += print_round_model(results, args)
  return results


if __name__ == '__main__':
  main()
