"""One ResIST round against one local SGD round: seconds, bytes moved and bytes stored, side by side.

  python benchmarks/resist_round.py --model=preact_s3_9 --batch=32 --local_steps=10 --workers=2,4 --cpu_devices=4
  python benchmarks/resist_round.py --table1 --cpu_devices=8      # ResNet-101 bytes against the paper's Table 1
  python benchmarks/resist_round.py --table1 --cpu_devices=8 --quantize_bits=8   # the same, 8 bits on the wire
  python benchmarks/resist_round.py --table1 --cpu_devices=8 --outer_lr=0.7 --outer_momentum=0.9   # DiLoCo's outer step
  python benchmarks/resist_round.py --round_memory --table1_workers=8 --cpu_devices=8 --sparsify=0.25   # peak memory

A round is L local iterations and the repartition (the engine's own ``step``, as training runs it). For
each S and method, after one untimed round (compilation): the median over --rounds of the local step's
seconds, the repartition's seconds (the exchange, timed by the engine from the last local step's end:
``replica.worker_speeds``' round timing) and the round's; the bytes each device sent and received across
devices (partitioned blocks, counted from the arrays handed to ``jax.device_put``) and put into the shared
layers' collective; and the bytes resident on each device (parameters, BatchNorm statistics, momentum:
summed from the arrays' addressable shards). Workers sit one to a device (S <= --cpu_devices).

--table1: no training; the pre-activation ResNet-101 of the paper (CIFAR-100 head) at S = 2, 4, 8, one
repartition each, float32. "measured" is the bytes that crossed a device boundary, summed over devices,
both ends counted as the paper does (each worker sends and receives): blocks sent plus received, and twice
the shared layers' collective per device (what each device put in: the paper's convention). "in + out" counts
each device's bytes in and out of the collectives as they arrive: an all-gather brings every other device's
buffer (exact), a float32 all-reduce is counted as a ring moves it (2 (D - 1) / D of its bytes each way).
"Table 1's count" is the paper's model (every worker sends all
it trained and receives all its next sub-network, parameters only) computed from the shapes. Prints one
JSON line per measurement, then a markdown table.

--quantize_bits and --sparsify put every run's communicated parameters on the wire compressed as training
does with replica.quantize_bits / replica.sparsify (the paper's A.5): the bytes measured are the encoded
arrays' (codes and grids, kept values and their indices). Table 1's count is then the engine's model
(``replica.traffic_model``) with what travels encoded counted encoded both ways (records before 2026-11-29
counted what a worker receives at float32); "paper GB" stays Table 1's float32 figure.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

TABLE1 = {2: (0.662, 0.454), 4: (1.325, 0.720), 8: (2.649, 1.289)}  # local SGD, ResIST, GB per round (none at other S)


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
  p.add_argument('--model', default='preact_s3_9', help='a pre-activation ResNet (preact_tiny, preact_s3_N, preact101)')
  p.add_argument('--dataset', default='cifar10', help='shape of the synthetic data (cifar10, cifar100)')
  p.add_argument('--batch', type=int, default=32, help='batch size per worker')
  p.add_argument('--local_steps', type=int, default=10, help='L: local iterations per round')
  p.add_argument('--workers', default='2,4', help='comma-separated S values')
  p.add_argument('--rounds', type=int, default=3, help='timed rounds (after one untimed)')
  p.add_argument('--cpu_devices', type=int, default=0, help='split the host CPU into N JAX devices')
  p.add_argument('--table1', action='store_true', help='ResNet-101 bytes at S = 2, 4, 8 against Table 1')
  p.add_argument('--round_memory', action='store_true', help="ResIST's ResNet-101 alone at the first S of "
                 '--table1_workers: peak memory before and after one round')
  p.add_argument('--quantize_bits', type=int, default=0, help='send parameters as b-bit codes (4..8; 0: float32)')
  p.add_argument('--sparsify', type=float, default=0.0, help='send only this fraction of each tensor (0: all)')
  p.add_argument('--compress', default='weights', choices=('weights', 'updates'),
                 help="what --quantize_bits / --sparsify compress: weights (A.5) or the shared layers' updates")
  p.add_argument('--update_exchange', default='all_gather', choices=('all_gather', 'two_stage'),
                 help='with --compress=updates: all_gather or two_stage (bytes that do not grow with S)')
  p.add_argument('--table1_workers', default='2,4,8', help='--table1: the S values (one process per S gives '
                 'each its own peak memory)')
  p.add_argument('--outer_lr', type=float, default=1.0, help='outer learning rate (1 with momentum 0: plain averaging)')
  p.add_argument('--outer_momentum', type=float, default=0.0, help="outer Nesterov momentum (DiLoCo's 0.9)")
  p.add_argument('--json_out', default='', help='also append the JSON lines to this file')
  return p.parse_args(argv)


def emit(record, args):
  print(json.dumps(record), flush=True)
  if args.json_out:
    with open(args.json_out, 'a', encoding='utf-8') as f:
      f.write(json.dumps(record) + '\n')


def build(method, model, dataset, batch, workers, local_steps, args):
  from jaxdecouple.config import get_default_config
  from jaxdecouple.methods import validate
  from jaxdecouple.errors import ConfigError
  from jaxdecouple.data import TrainOrder, load_dataset
  from jaxdecouple.methods import METHODS
  from jaxdecouple.train import build_setup
  import jax
  c = get_default_config()
  c.method, c.model, c.dataset, c.batch_size = method, model, dataset, batch
  c.data.source, c.data.synthetic_train_size = 'synthetic', max(4 * batch, 256)
  c.replica.num_workers, c.replica.local_steps, c.replica.num_devices = workers, local_steps, workers
  c.replica.quantize_bits, c.replica.sparsify = args.quantize_bits, args.sparsify
  c.replica.compress, c.replica.outer_lr, c.replica.outer_momentum = args.compress, args.outer_lr, args.outer_momentum
  c.replica.update_exchange = args.update_exchange
  try:
    validate(c)
  except ConfigError as e:
    raise SystemExit(f'resist_round.py: {e}') from None
  ds = load_dataset(c.data, c.dataset)
  m = METHODS[method](build_setup(c, ds))
  order = TrainOrder(len(ds.x_train), batch, c.seed)
  batch_of = lambda t: m.train_batch(ds.x_train, ds.y_train, order, t)
  return m, m.init(jax.random.key(0), batch_of(0)), batch_of


def rounds(args):
  import jax
  results = []
  for workers in [int(s) for s in args.workers.split(',')]:
    for method in ('resist', 'localsgd'):
      m, state, batch_of = build(method, args.model, args.dataset, args.batch, workers, args.local_steps, args)
      engine, L = m.engine, args.local_steps
      engine.speeds = (1.0,) * workers  # the engine then times each round's exchange itself (replica/stragglers.py)
      batches = [batch_of(t) for t in range(L)]
      local, repartition, total = [], [], []
      for r in range(args.rounds + 1):
        times = []
        for t in range(L):
          start = time.perf_counter()
          state, metrics = m.step(state, batches[t], r * L + t)
          jax.block_until_ready(state)
          times.append(time.perf_counter() - start)
        if r:  # round 0 compiles
          local.append(statistics.median(times[:-1]) if L > 1 else float('nan'))
          repartition.append(metrics['round_exchange_s'])  # from the last local step's end to the exchange's
          total.append(sum(times))
      traffic = engine.last_traffic
      held = list(engine.resident_bytes(state).values())
      record = {'model': args.model, 'batch': args.batch, 'workers': workers, 'method': method, 'local_steps': L,
                'devices': len(engine.devices), 'local_step_s': round(statistics.median(local), 4),
                'repartition_s': round(statistics.median(repartition), 4),
                'round_s': round(statistics.median(total), 3),
                'sent_mb': round(float(traffic.sent.mean()) / 1e6, 3),
                'received_mb': round(float(traffic.received.mean()) / 1e6, 3),
                'collective_mb': round(traffic.all_reduce / 1e6, 3),
                'collective_received_mb': round(traffic.collective_received / 1e6, 3),
                'moved_mb': round((float(traffic.sent.mean()) + traffic.all_reduce) / 1e6, 3),
                'stored_mb': round(statistics.mean(held) / 1e6, 3), 'rounds': args.rounds,
                'device': str(jax.devices()[0].device_kind), **wire(args)}
      results.append(record)
      emit(record, args)
  by = {(r['workers'], r['method']): r for r in results}
  print(f'\n{args.model}, batch {args.batch} per worker, L = {args.local_steps}, one worker per device, '
        f'on {jax.devices()[0].device_kind} (median of {args.rounds} rounds), {wire_text(args)} on the wire\n')
  print('| S | method | local step s | repartition s | round s | sent MB / device (blocks) | shared collective MB '
        '| moved vs local SGD | stored MB / device | stored vs local SGD |')
  print('|---|---|---|---|---|---|---|---|---|---|')
  for r in results:
    base = by[(r['workers'], 'localsgd')]
    print(f"| {r['workers']} | {r['method']} | {r['local_step_s']:.3f} | {r['repartition_s']:.3f} | {r['round_s']:.2f} "
          f"| {r['sent_mb']:.2f} | {r['collective_mb']:.2f} | {r['moved_mb'] / base['moved_mb']:.2f} "
          f"| {r['stored_mb']:.1f} | {r['stored_mb'] / base['stored_mb']:.2f} |")
  return results


def table1(args):
  import jax
  import numpy as np
  from jaxdecouple.replica import traffic_model
  results = []
  for workers in [int(w) for w in args.table1_workers.split(',')]:
    row = {}
    for method in ('localsgd', 'resist'):
      m, state, _ = build(method, 'preact101', 'cifar100', 8, workers, 50, args)
      engine = m.engine
      network = engine.layout.network_shapes(state.params)
      model = traffic_model(engine, network, 0)['total'] / 1e9
      state = engine.aggregate(state, 0)
      t = engine.last_traffic
      blocks = float(t.sent.sum() + t.received.sum())
      measured = (blocks + 2 * len(engine.devices) * t.all_reduce) / 1e9
      in_out = (blocks + 2 * len(engine.devices) * t.collective_received) / 1e9
      held = statistics.mean(engine.resident_bytes(state).values())
      whole = sum(4 * int(np.prod(x.shape)) for x in jax.tree.leaves(network)) * 2  # parameters + momentum
      whole += sum(4 * int(np.prod(x.shape)) for x in jax.tree.leaves(engine.layout.network_shapes(state.batch_stats)))
      row[method] = {'model': 'preact101', 'workers': workers, 'method': method, 'measured_gb': round(measured, 3),
                     'in_out_gb': round(in_out, 3), 'peak_rss_gb': round(peak_rss() / 1e9, 2),
                     'table1_count_gb': round(model, 3),
                     'paper_gb': TABLE1.get(workers, (float('nan'),) * 2)[method == 'resist'],
                     'stored_mb_per_worker': round(held / 1e6, 1), 'stored_fraction': round(held / whole, 3),
                     'device': str(jax.devices()[0].device_kind), **wire(args)}
      emit(row[method], args)
      results.append(row[method])
      del m, state
  print(f'\nPre-activation ResNet-101 (CIFAR-100), one repartition, {wire_text(args)} on the wire, one worker per '
        'device\n')
  print('| S | method | measured GB per round | in + out GB | Table 1\'s count GB | paper GB | stored per worker MB '
        '| of the whole model | peak RSS GB so far |')
  print('|---|---|---|---|---|---|---|---|---|')
  for r in results:
    print(f"| {r['workers']} | {r['method']} | {r['measured_gb']:.3f} | {r['in_out_gb']:.3f} | {r['table1_count_gb']:.3f} "
          f"| {r['paper_gb']:.3f} | {r['stored_mb_per_worker']:.1f} | {r['stored_fraction']:.2f} | {r['peak_rss_gb']:.2f} |")
  return results


def round_memory(args):
  """ResIST's ResNet-101 at the one S of --table1_workers, alone in this process: the peak resident bytes
  (``ru_maxrss``) once the state is built, then after one round's exchange: what the exchange itself holds."""
  import jax
  workers = int(args.table1_workers.split(',')[0])
  m, state, _ = build('resist', 'preact101', 'cifar100', 8, workers, 50, args)
  jax.block_until_ready(state)
  before = peak_rss()
  state = m.engine.aggregate(state, 0)
  jax.block_until_ready(state)
  record = {'model': 'preact101', 'workers': workers, 'method': 'resist', 'peak_rss_gb_before': round(before / 1e9, 2),
            'peak_rss_gb_after_round': round(peak_rss() / 1e9, 2), 'device': str(jax.devices()[0].device_kind),
            **wire(args)}
  emit(record, args)
  print(f"\nResIST, pre-activation ResNet-101, S = {workers}, {wire_text(args)} on the wire: peak RSS "
        f"{record['peak_rss_gb_before']:.2f} GB with the state built, {record['peak_rss_gb_after_round']:.2f} GB "
        'after one round')
  return [record]


def wire(args) -> dict:
  from jaxdecouple.replica.traffic import wire_settings  # the arguments carry the replica fields' names
  return wire_settings(args)


def wire_text(args) -> str:
  parts = ([f'{args.quantize_bits}-bit codes'] if args.quantize_bits else []) + \
      ([f'{args.sparsify:g} of each tensor kept'] if args.sparsify else [])
  text = ', '.join(parts) or 'float32'
  if parts and args.compress == 'updates':
    text += " (the shared layers' updates with error feedback; blocks float32)"
    if args.update_exchange == 'two_stage':
      text += ', two-stage exchange'
  if args.outer_lr != 1 or args.outer_momentum:
    text += f', outer lr {args.outer_lr:g} and momentum {args.outer_momentum:g}'
  return text


def peak_rss() -> int:
  """The process's peak resident bytes so far (``ru_maxrss``, kilobytes on Linux)."""
  import resource
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main(argv=None):
  args = parse_args(argv)
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  import jax
  if args.cpu_devices:
    jax.config.update('jax_num_cpu_devices', args.cpu_devices)
  need = max(int(s) for s in (args.table1_workers if args.table1 or args.round_memory else args.workers).split(','))
  if jax.device_count() < need:
    raise SystemExit(f'resist_round.py: {need} devices needed (one per worker), {jax.device_count()} present; '
                     f'pass --cpu_devices={need} on a CPU')
  if args.round_memory:
    return round_memory(args)
  return table1(args) if args.table1 else rounds(args)


if __name__ == '__main__':
  main()
