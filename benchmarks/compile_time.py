"""Start-up cost of deep networks: initialisation and the first training step's compilation.

  python benchmarks/compile_time.py --models=resnet110,resnet1202 --runs=fdg:2,bp --scan_blocks=0,16
  python benchmarks/compile_time.py --models=preact_tiny_s3_9 --runs=resist:4 --scan_blocks=0 --cache

For every model, run (METHOD:K) and scan setting (``config.scan_blocks``; 0 unrolls every block), in a
fresh process each (so no compilation is shared): the wall seconds to build and initialise the state
(``init``: the split's cost estimate, the model's initialisation, compiled, and the pipeline's buffers),
the seconds JAX spends tracing, lowering and compiling during the first 2K-1 training steps
(``steps_compile``, from jax.monitoring's compile events: a pipeline compiles new work until its first
stage's first backward, iteration 2K-2), their sum ``startup``, and the compute of one steady step
after them (``step``: the median of ``--steps`` steady steps). Synthetic CIFAR-shaped data (synthetic text of
``--sequence_length`` bytes for gpt models); a small batch keeps the steps themselves short.
Replica runs (``resist:S``, ``localsgd:S``: S workers) take rounds of 2 local steps, so the round's end is among
the first steps measured.

``--cache``: each measurement twice, the first with an empty JAX persistent compilation cache folder
(``cold``, jaxdecouple/compilation_cache.py) and the second, again in a fresh process, with the folder the first
left (``warm``): what a resume or a study's next seed pays. Its ``steps_compile`` then includes the seconds spent
loading programs from the cache, and ``loaded``/``compiled`` count the programs (JAX's cache events).
Prints one JSON line per measurement, then a markdown table.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0], epilog=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--models', default='resnet110,resnet1202', help='comma-separated model names')
  p.add_argument('--runs', default='fdg:2', help='comma-separated METHOD:K (pipeline methods) or METHOD')
  p.add_argument('--scan_blocks', default='16', help='comma-separated config.scan_blocks values to compare')
  p.add_argument('--batch', type=int, default=4)
  p.add_argument('--cpu_devices', type=int, default=2)
  p.add_argument('--steps', type=int, default=3, help='steady steps timed (their median is reported)')
  p.add_argument('--split_backward', default='auto', help="config.split_backward: auto (on for the CPU), on, off")
  p.add_argument('--sequence_length', type=int, default=128, help='gpt models: bytes per example')
  p.add_argument('--cache', action='store_true', help='each measurement with an empty, then a warm compilation cache')
  p.add_argument('--cache_dir', default='', help=argparse.SUPPRESS)  # the folder this process uses
  p.add_argument('--one', default='', help=argparse.SUPPRESS)  # MODEL:RUN:SCAN measured in this process
  p.add_argument('--json_out', default='', help='also append the JSON lines to this file')
  return p.parse_args(argv)


def measure(args, model: str, run: str, scan: int) -> dict:
  import jax
  if args.cpu_devices:
    jax.config.update('jax_num_cpu_devices', args.cpu_devices)
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  from jaxdecouple.config import get_default_config
  from jaxdecouple.data import TrainOrder, load_dataset
  from jaxdecouple.methods import METHODS
  from jaxdecouple.models import count_params
  from jaxdecouple.train import build_setup
  from jaxdecouple.compilation_cache import counts, use_compilation_cache
  use_compilation_cache(args.cache_dir)  # '' (none) unless --cache
  method, _, k = run.partition(':')
  c = get_default_config()
  c.method, c.model, c.batch_size, c.scan_blocks = method, model, args.batch, scan
  c.split_backward = args.split_backward
  c.pipeline.num_stages = int(k or 1)
  replicas = METHODS[method].name in ('resist', 'localsgd', 'ensemble')
  if replicas:
    c.replica.num_workers, c.replica.local_steps = int(k or 2), 2
  c.data.source, c.data.synthetic_train_size, c.data.synthetic_test_size = 'synthetic', args.batch * 4, 8
  if model.startswith('gpt'):  # byte-level text of the model's length (synthetic)
    c.dataset, c.data.sequence_length = 'fortunes', args.sequence_length
  ds = load_dataset(c.data, c.dataset)
  m = METHODS[method](build_setup(c, ds))
  order = TrainOrder(len(ds.x_train), c.batch_size, c.seed)
  batch = lambda t: m.train_batch(ds.x_train, ds.y_train, order, t)
  start = time.perf_counter()
  state = m.init(jax.random.key(0), batch(0))
  jax.block_until_ready(state)
  init = time.perf_counter() - start
  fill, compiling = (c.replica.local_steps + 1) if replicas else 2 * int(k or 1) - 1, []
  events = ('/jax/core/compile/jaxpr_trace_duration', '/jax/core/compile/jaxpr_to_mlir_module_duration',
            '/jax/core/compile/backend_compile_duration')  # (around compiling or loading from the cache)
  jax.monitoring.register_event_duration_secs_listener(
      lambda event, seconds, **_: compiling.append(seconds) if event in events else None)
  for t in range(fill):
    state, _ = m.step(state, batch(t), t)
  jax.block_until_ready(state)
  steps_compile = sum(compiling)
  times = []
  for t in range(fill, fill + args.steps):  # the median of a few steady steps
    start = time.perf_counter()
    state, _ = m.step(state, batch(t), t)
    jax.block_until_ready(state)
    times.append(time.perf_counter() - start)
  step = sorted(times)[len(times) // 2]
  return {'model': model, 'run': run, 'scan_blocks': scan, 'batch': args.batch,
          'params_m': round(count_params(m.eval_variables(state)['params']) / 1e6, 3),
          'init_s': round(init, 2), 'steps_compile_s': round(steps_compile, 2), 'fill_steps': fill,
          'startup_s': round(init + steps_compile, 2), 'step_s': round(step, 3), 'backend': jax.default_backend(),
          'loaded': counts().loaded, 'compiled': counts().compiled}


def main(argv=None):
  args = parse_args(argv)
  if args.one:
    model, run, scan = args.one.split('/')
    print(json.dumps(measure(args, model, run, int(scan))), flush=True)
    return None
  records = []
  for model in args.models.split(','):
    for run in args.runs.split(','):
      for scan in args.scan_blocks.split(','):
        folder = tempfile.mkdtemp(prefix='compile-time-cache-') if args.cache else ''
        for cache in (('cold', 'warm') if args.cache else ('none',)):  # the folder empty, then as the first left it
          cmd = [sys.executable, os.path.abspath(__file__), f'--batch={args.batch}', f'--steps={args.steps}',
                 f'--sequence_length={args.sequence_length}', f'--cpu_devices={args.cpu_devices}',
                 f'--split_backward={args.split_backward}', f'--cache_dir={folder}',
                 f'--one={model}/{run}/{scan}']
          records.append(_measure_in_a_fresh_process(args, cmd, model, run, scan, cache))
        if folder:
          shutil.rmtree(folder, ignore_errors=True)
  print('\n| model | run | scan_blocks | params (M) | cache | init s | compiling in the first steps s (steps) | '
        'start-up s | steady step s (batch) |')
  print('|---|---|---|---|---|---|---|---|---|')
  for r in records:
    cache = f"{r['cache']} ({r['loaded']} loaded, {r['compiled']} compiled)" if r['cache'] != 'none' else 'none'
    print(f"| {r['model']} | {r['run']} | {r['scan_blocks']} | {r['params_m']} | {cache} | {r['init_s']} | "
          f"{r['steps_compile_s']} ({r['fill_steps']}) | {r['startup_s']} | {r['step_s']} ({r['batch']}) |")
  return records


def _measure_in_a_fresh_process(args, cmd, model, run, scan, cache: str) -> dict:
  """One measurement in a process of its own; its JSON line printed (and appended to --json_out)."""
  proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
  if proc.returncode:
    raise SystemExit(f'compile_time.py: {model} {run} scan_blocks={scan} failed:\n{proc.stderr[-3000:]}')
  record = {**json.loads(next(l for l in proc.stdout.splitlines() if l.startswith('{'))), 'cache': cache}
  print(json.dumps(record), flush=True)
  if args.json_out:
    with open(args.json_out, 'a', encoding='utf-8') as f:
      f.write(json.dumps(record) + '\n')
  return record


if __name__ == '__main__':
  main()
