"""Bytes each device moves per training iteration: ResIST, local SGD, data parallelism and GPipe on the same model
and the same images per iteration (the ResIST paper's Figure 4, counted here from what moves).

  python benchmarks/bytes_per_iteration.py --model=preact101 --workers=4 --batch=32 --local_steps=50 --cpu_devices=4 \
      --figure=docs/figures/bytes_per_iteration_preact101.png

S = --workers devices; every method trains S x --batch images per iteration:
- resist, localsgd: S workers of --batch each, averaging every --local_steps iterations. One round is run and
  the replica engine's own count of it taken (each device's sent blocks plus the shared layers' all-reduce, as
  docs/METHODS.md describes), divided by L.
- dp: the batch of S x --batch split over S devices. The bytes its all-reduces reduce per device, read from
  the compiled step's program (jaxdecouple/pipeline/collectives.py): gradients and BatchNorm statistics.
- gpipe: S stages on S devices, --micro_batches micro-batches of the S x --batch images: the activations sent
  up and gradients sent down between stages (with the labels), as the driver moves them, averaged over the
  devices (the busiest boundary beside it).
Prints one JSON line per method and a table. Bytes only: nothing here is timed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0], epilog=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--model', default='preact101')
  p.add_argument('--dataset', default='cifar10')
  p.add_argument('--workers', type=int, default=4, help='S: devices, replica workers and pipeline stages')
  p.add_argument('--batch', type=int, default=32, help='images per worker and iteration')
  p.add_argument('--local_steps', type=int, default=50, help='L: iterations per round (resist, localsgd)')
  p.add_argument('--micro_batches', type=int, default=4, help='gpipe: micro-batches per iteration')
  p.add_argument('--cpu_devices', type=int, default=0, help='split the host CPU into N JAX devices')
  p.add_argument('--json_out', default='', help='also append the JSON lines to this file')
  p.add_argument('--figure', default='', help='also draw the bars to this PNG')
  return p.parse_args(argv)


def draw(records, path: str, title: str) -> None:
  """A bar per method: MB per device and iteration (log scale: they differ by orders of magnitude)."""
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(6, 3.2))
  names = [r['method'] for r in records]
  values = [r['per_iteration_mb'] for r in records]
  ax.bar(names, values, color=['C0', 'C1', 'C2', 'C3'][:len(names)])
  ax.set_yscale('log')
  ax.set(ylabel='MB per device and iteration', title=title)
  for i, v in enumerate(values):
    ax.text(i, v, f'{v:.3g}', ha='center', va='bottom', fontsize=8)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=120, metadata={'Software': None})


def config(args, method: str):
  from jaxdecouple.config import get_default_config
  c = get_default_config()
  c.method, c.model, c.dataset, c.data.source = method, args.model, args.dataset, 'synthetic'
  S = args.workers
  c.batch_size = args.batch if method in ('resist', 'localsgd') else S * args.batch
  c.data.synthetic_train_size, c.data.synthetic_test_size = 4 * S * args.batch, 8
  c.replica.num_workers, c.replica.num_devices, c.replica.local_steps = S, S, 1  # one round: one iteration
  c.dp.num_devices = S
  c.pipeline.num_stages, c.pipeline.micro_batches, c.pipeline.split = S, args.micro_batches, 'balanced'
  return c


def measure(args, method: str) -> dict:
  import jax
  import numpy as np
  from jaxdecouple.data import TrainOrder, load_dataset
  from jaxdecouple.methods import METHODS
  from jaxdecouple.pipeline.collectives import compiled_all_reduce_bytes
  from jaxdecouple.train import build_setup
  c = config(args, method)
  ds = load_dataset(c.data, c.dataset)
  m = METHODS[method](build_setup(c, ds))
  order = TrainOrder(len(ds.x_train), c.batch_size, c.seed)
  batch = m.train_batch(ds.x_train, ds.y_train, order, 0)
  state = m.init(jax.random.key(0), batch)
  out = {'model': args.model, 'method': method, 'devices': args.workers, 'images_per_iteration': args.workers * args.batch}
  if method in ('resist', 'localsgd'):
    state, _ = m.step(state, batch, 0)  # L = 1 here: the round ends at this step
    t = m.engine.last_traffic
    per_round = float(t.sent.mean()) + t.all_reduce
    out.update(per_iteration_mb=round(per_round / args.local_steps / 1e6, 4), per_round_mb=round(per_round / 1e6, 3),
               local_steps=args.local_steps, counted='replica engine: blocks sent + shared all-reduce, per round / L')
  elif method == 'dp':
    images, labels = m._put_batch(batch)
    step = jax.jit(lambda st, x, y, s: m._step(st, x, y, s))
    reduced = compiled_all_reduce_bytes(step, state, images, labels, np.int32(0))
    out.update(per_iteration_mb=round(reduced / 1e6, 4), counted='all-reduces of the compiled step (HLO)')
  else:  # gpipe
    sends = m.pipeline.message_bytes  # per boundary and iteration: activations up, gradients down, labels
    out.update(per_iteration_mb=round(sum(sends) / args.workers / 1e6, 4),
               busiest_boundary_mb=round(max(sends) / 1e6, 4), micro_batches=args.micro_batches,
               counted='activations and gradients between stages, as the driver moves them, mean per device')
  return out


def main(argv=None):
  args = parse_args(argv)
  import jax
  if args.cpu_devices:
    jax.config.update('jax_num_cpu_devices', args.cpu_devices)
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  if len(jax.devices()) < args.workers:
    raise SystemExit(f'bytes_per_iteration.py: --workers={args.workers} needs as many devices, '
                     f'{len(jax.devices())} present (on a CPU: --cpu_devices={args.workers})')
  records = [measure(args, method) for method in ('resist', 'localsgd', 'dp', 'gpipe')]
  for r in records:
    print(json.dumps(r), flush=True)
    if args.json_out:
      with open(args.json_out, 'a', encoding='utf-8') as f:
        f.write(json.dumps(r) + '\n')
  base = records[2]['per_iteration_mb']
  print(f'\n{args.model}, S = {args.workers} devices, {args.workers * args.batch} images per iteration, '
        f'L = {args.local_steps}, GPipe M = {args.micro_batches}\n')
  print('| method | MB per device and iteration | vs data parallel | counted from |')
  print('|---|---|---|---|')
  for r in records:
    print(f"| {r['method']} | {r['per_iteration_mb']:.4f} | {r['per_iteration_mb'] / base:.3f} | {r['counted']} |")
  if args.figure:
    draw(records, args.figure, f'{args.model}, S = {args.workers}, L = {args.local_steps}, GPipe M = {args.micro_batches}')
  return records


if __name__ == '__main__':
  main()
