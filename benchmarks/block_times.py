"""Each block's measured training seconds, and the pipeline split that balances them.

  python benchmarks/block_times.py --model=resnet56 --stages=2 --batch=32
  python benchmarks/block_times.py --model=resnet56 --stages=2 --batch=8      # 1F1B's micro-batch of 32 / 4
  python benchmarks/block_times.py --model=gpt_small --stages=4 --batch=8 --input_shape=128 --input_dtype=int32

Times each block's forward in training mode and its backward (to its parameters and its input) as one compiled
call on the first device, at the batch one stage call processes (the batch for FDG, ADL, DDG, FR and DGL; a
micro-batch for GPipe, 1F1B and ZB-H1): the median of --repeats calls after a compiling one
(jaxdecouple.pipeline.block_seconds). Then the contiguous split into --stages stages that minimises the largest
stage's measured seconds, beside the FLOP-balanced split and the paper's reference split, with each one's
stage seconds from the same measurements. Prints one JSON line per block and one for the splits, then a
table, and the line to put in the config:

  python main.py --config=configs/fdg_resnet56.py --config.pipeline.split=s1b8

Run it where the run will train (pin it as the run is pinned: `taskset -c 0` for a one-core stage): blocks'
seconds per FLOP differ between machines, which is why a measured split exists (docs/PERFORMANCE.md, "A split
balanced by measured seconds").
"""
from __future__ import annotations

import argparse
import json
import os
import sys


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0], epilog=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--model', default='resnet56')
  p.add_argument('--num_classes', type=int, default=10)
  p.add_argument('--stages', type=int, default=2, help='K: the number of pipeline stages')
  p.add_argument('--batch', type=int, default=32, help='examples per stage call')
  p.add_argument('--input_shape', default='32,32,3', help='one example\'s shape (a GPT: its sequence length)')
  p.add_argument('--input_dtype', default='float32', help='float32 (images) or int32 (tokens)')
  p.add_argument('--repeats', type=int, default=5, help='timed calls per block (the median counts)')
  return p.parse_args(argv)


def main(argv=None):
  args = parse_args(argv)
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  import jax.numpy as jnp
  from jaxdecouple.models import build_model
  from jaxdecouple.pipeline import REFERENCE_SPLITS, choose_split, split_names, timed_split
  model = build_model(args.model, args.num_classes)
  shape = tuple(int(s) for s in args.input_shape.split(','))
  split = timed_split(model, args.stages, shape, args.batch, input_dtype=jnp.dtype(args.input_dtype),
                      repeats=args.repeats)
  records = [{'block': name, 'ms': round(1e3 * s, 3)} for name, s in zip(model.block_names, split.block_costs)]
  for r in records:
    print(json.dumps(r))
  splits = {'timed': split}
  if args.stages > 1:
    splits['flop_balanced'] = choose_split(model, args.stages, 'balanced', shape)
    if (args.model, args.stages) in REFERENCE_SPLITS:
      splits['reference'] = choose_split(model, args.stages, 'reference', shape)
  edges = lambda s: list(zip((0, *s.boundaries), (*s.boundaries, len(model.block_names))))
  summary = {'model': args.model, 'stages': args.stages, 'batch': args.batch,
             'splits': {how: {'split': split_names(model, s),
                              'stage_ms': [round(1e3 * sum(split.block_costs[a:b]), 2) for a, b in edges(s)]}
                        for how, s in splits.items()}}
  for entry in summary['splits'].values():  # the largest stage's share of the mean: 1.0 is perfectly balanced
    entry['largest_over_mean'] = round(max(entry['stage_ms']) * len(entry['stage_ms']) / sum(entry['stage_ms']), 3)
  print(json.dumps(summary))
  print('\n| block | ms (forward + backward) |\n|---|---|')
  for r in records:
    print(f"| {r['block']} | {r['ms']:.3f} |")
  print('\n| split | first blocks of stages 1..K-1 | measured ms per stage | largest / mean |\n|---|---|---|---|')
  for how, entry in summary['splits'].items():
    print(f"| {how} | {entry['split'] or '-'} | {', '.join(f'{m:.1f}' for m in entry['stage_ms'])} | "
          f"{entry['largest_over_mean']:.3f} |")
  if args.stages > 1:
    print(f"\nput in the config: --config.pipeline.split={summary['splits']['timed']['split']}")
  return summary


if __name__ == '__main__':
  main()
