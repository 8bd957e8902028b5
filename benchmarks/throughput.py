"""Training throughput of every method, side by side, in one process.

  python benchmarks/throughput.py --model=resnet56 --batch=128 --cpu_devices=2 \
      --runs=bp:1,fdg:2:1,fdg:2:2
  python benchmarks/throughput.py --model=preact101 --dataset=cifar100 --batch=32 --cpu_devices=4 \
      --runs=bp,localsgd:4:4,resist:4:4 --local_steps=10 --iters=20

Each run is METHOD:K:DEVICES (K and DEVICES default to 1):
- bp: K and DEVICES ignored (one device).
- dp: DEVICES is the number of devices the batch is sharded over (dp:1:2).
- pipeline methods (fdg, adl, ddg, fr, dgl): K stages on DEVICES devices (stages share devices when
  DEVICES < K); adl accumulates --accumulation gradients.
- replica methods (resist, localsgd, ensemble): K = S workers on DEVICES devices (workers share a device
  when DEVICES < S); --batch is per worker, so an iteration trains S x batch images, and the workers
  average every --local_steps iterations (the averaging's cost is in the mean, not in the median).
For every run: the median seconds per iteration over --iters timed iterations (after --warmup
iterations, which include compilation and the pipeline fill; every timed iteration waits for its
results) and their mean, images/s (from the median), the ratio to the first run, and: for pipeline
methods each stage's time measured on idle devices plus the speed-up that K devices would give if they
were perfectly overlapped (sum of stage times / max stage time); for replica methods the time of one
worker's step (the iteration's time over the workers each device runs one after another). Peak device
memory is reported where the backend has it (GPUs). Prints one JSON line per run, then a markdown table.
Models: see jaxdecouple.models (the replica methods need a pre-activation ResNet, e.g. preact101,
preact_tiny; BP and the pipeline methods run it too).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
  p.add_argument('--model', default='resnet56', help='model name (see jaxdecouple.models)')
  p.add_argument('--dataset', default='cifar10', help='shape of the synthetic data: cifar10, cifar100, '
                 'fashion_mnist')
  p.add_argument('--batch', type=int, default=128, help='batch size (global)')
  p.add_argument('--runs', default='bp:1,fdg:2:1,fdg:2:2',
                 help='comma-separated METHOD:K:DEVICES; the first is the baseline of the ratios')
  p.add_argument('--keep', default='vjp', choices=['vjp', 'recompute'], help='what pipeline stages keep')
  p.add_argument('--accumulation', type=int, default=2, help='adl: gradients accumulated per update (M)')
  p.add_argument('--local_steps', type=int, default=50, help='replica methods: iterations between averagings')
  p.add_argument('--warmup', type=int, default=8, help='untimed iterations (compilation, pipeline fill)')
  p.add_argument('--iters', type=int, default=10, help='timed iterations')
  p.add_argument('--cpu_devices', type=int, default=0, help='split the host CPU into N JAX devices')
  p.add_argument('--json_out', default='', help='also append the JSON lines to this file')
  return p.parse_args(argv)


def main(argv=None):
  args = parse_args(argv)
  import jax
  if args.cpu_devices:
    jax.config.update('jax_num_cpu_devices', args.cpu_devices)
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  from jaxdecouple.config import get_default_config
  from jaxdecouple.data import load_dataset
  from jaxdecouple.data.batches import TrainOrder
  from jaxdecouple.methods import METHODS
  from jaxdecouple.train import build_setup

  results = []
  for run in args.runs.split(','):
    parts = run.split(':')
    method, k = parts[0], int(parts[1]) if len(parts) > 1 else 1
    n_dev = int(parts[2]) if len(parts) > 2 else 1
    c = get_default_config()
    c.method, c.model, c.dataset, c.batch_size = method, args.model, args.dataset, args.batch
    c.data.source = 'synthetic'
    c.data.synthetic_train_size = args.batch * 4 * max(k, 1)
    c.data.synthetic_test_size = 8
    c.pipeline.num_stages, c.pipeline.num_devices, c.pipeline.keep = k, n_dev, args.keep
    c.dp.num_devices = n_dev
    c.pipeline.accumulation = args.accumulation if method == 'adl' else 1
    c.replica.num_workers, c.replica.num_devices, c.replica.local_steps = k, n_dev, args.local_steps
    ds = load_dataset(c.data, c.dataset)
    setup = build_setup(c, ds)
    m = METHODS[method](setup)
    order = TrainOrder(len(ds.x_train), c.batch_size, c.seed)
    batch = lambda t: m.train_batch(ds.x_train, ds.y_train, order, t)
    state = m.init(jax.random.key(0), batch(0))
    t = 0
    for _ in range(args.warmup):
      state, _ = m.step(state, batch(t), t)
      t += 1
    jax.block_until_ready(state)
    times = []
    for _ in range(args.iters):
      start = time.perf_counter()
      state, _ = m.step(state, batch(t), t)
      jax.block_until_ready(state)
      times.append(time.perf_counter() - start)
      t += 1
    median = statistics.median(times)
    engine = getattr(m, 'engine', None)
    replica = engine is not None and hasattr(engine, 'per_device')
    images = args.batch * (k if replica else 1)
    record = {'model': args.model, 'batch': args.batch, 'method': method, 'stages': k,
              'devices': n_dev if method != 'bp' else 1, 'seconds_per_iter': round(median, 5),
              'mean_seconds_per_iter': round(statistics.mean(times), 5),
              'images_per_sec': round(images / median, 1), 'backend': jax.default_backend(),
              'device_kind': jax.devices()[0].device_kind}
    if replica:
      record['workers'], record['devices'] = k, int(engine.mesh.devices.size)
      record['images_per_iter'] = images
      record['worker_seconds'] = round(median / engine.per_device, 5)
    pipeline = getattr(m, 'pipeline', None)
    if pipeline is not None:
      stage_times = []
      for _ in range(3):
        state, _, st = pipeline.timed_step(state, batch(t), t)
        stage_times.append(st)
        t += 1
      per_stage = [statistics.median(s[i] for s in stage_times) for i in range(k)]
      record['stage_seconds'] = [round(s, 5) for s in per_stage]
      record['predicted_speedup_on_k_devices'] = round(sum(per_stage) / max(per_stage), 3)
    stats = jax.devices()[0].memory_stats() or {}
    if 'peak_bytes_in_use' in stats:
      record['peak_memory_gb'] = round(stats['peak_bytes_in_use'] / 2**30, 3)
    results.append(record)
    print(json.dumps(record), flush=True)
    if args.json_out:
      with open(args.json_out, 'a', encoding='utf-8') as f:
        f.write(json.dumps(record) + '\n')

  base = results[0]['seconds_per_iter']
  print(f'\n| method | K or S | devices | s/iter (median) | s/iter (mean) | images/s | '
        f'vs {results[0]["method"]} (time) | stage s / worker s | predicted K-device speed-up |')
  print('|---|---|---|---|---|---|---|---|---|')
  for r in results:
    parts = ", ".join(f"{s:.3f}" for s in r.get("stage_seconds", [])) or (
        f'{r["worker_seconds"]:.3f}' if 'worker_seconds' in r else '-')
    print(f'| {r["method"]} | {r["stages"]} | {r["devices"]} | {r["seconds_per_iter"]:.4f} | '
          f'{r["mean_seconds_per_iter"]:.4f} | {r["images_per_sec"]:.0f} | {r["seconds_per_iter"] / base:.3f} | '
          f'{parts} | {r.get("predicted_speedup_on_k_devices", "-")} |')
  return results


if __name__ == '__main__':
  main()
