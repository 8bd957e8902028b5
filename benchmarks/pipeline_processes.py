"""A pipeline across processes on one machine: FDG K = 2 (and any other pipeline method: --pipelines, e.g.
the synchronous 1f1b with --micro_batches) with each stage in its own process pinned to one core
(jax.distributed on loopback, JAX's cross-process transfers between the stages), against BP in one process
on one core and on two.

  python benchmarks/pipeline_processes.py --model=resnet56 --batch=128 --warmup=4 --iters=10
  python benchmarks/pipeline_processes.py --model=resnet56 --batch=128 --pipelines=fdg,1f1b,gpipe,zb_h1 \
      --micro_batches=4
  python benchmarks/pipeline_processes.py --model=resnet56 --batch=32 --pipelines=fdg,1f1b,zb_h1 --split=timed
  python benchmarks/pipeline_processes.py --model=resnet56 --batch=32 --pipelines=fdg,1f1b --split=timed \
      --iters=20 --rounds=5      # interleaved repeats: medians, and FDG / 1F1B round by round

Each pipeline run also times 3 more iterations call by call (jaxdecouple/pipeline/timeline.py): each process
the seconds its stage computed in an iteration (from when its calls' outputs really became ready; the
median of the 3); a stage idles the rest of the measured iteration, and the run's measured bubble is the
stages' mean idle share, 1 - mean(busy) / period, the period being the slower process's median wall seconds
of those same 3 iterations (printed as timed_seconds_per_iter).

Every run is a fresh set of processes, pinned with sched_setaffinity before JAX starts (XLA:CPU then
sizes its thread pools to the cores it may use). A timed iteration waits for the results of the stages
the timing process drives; in the 2-process run each process times its own loop (the transfers keep
the two in step) and the slower one counts; then --iters more iterations are timed as training runs
them, waiting only at the end ("streamed": the host dispatches ahead, transfers overlap compute). Prints one JSON line per run, then a markdown table with
images/s and the ratio to BP on one core (target: FDG K = 2 over 2 single-core processes >= 1.5x).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0], epilog=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--model', default='resnet56')
  p.add_argument('--batch', type=int, default=128)
  p.add_argument('--warmup', type=int, default=4, help='untimed iterations (compilation, pipeline fill)')
  p.add_argument('--iters', type=int, default=10, help='timed iterations')
  p.add_argument('--pipelines', default='fdg', help='comma-separated pipeline methods, each K = 2 over the 2 '
                 'processes: fdg, adl, ddg, fr, dgl, gpipe, 1f1b, zb_h1')
  p.add_argument('--micro_batches', type=int, default=4, help='gpipe, 1f1b, zb_h1: micro-batches per iteration')
  p.add_argument('--split', default='auto', help="pipeline.split: auto (the paper's reference split), balanced, "
                 "explicit blocks (s1b8), or timed: each method's stages balanced by measured seconds "
                 "(pipeline.timed_split, measured once per method in a process pinned to one core, at the batch "
                 "one stage call processes)")
  p.add_argument('--role', default='', help=argparse.SUPPRESS)  # bp | stage:PROCESS_ID:PORT:METHOD (a child)
  p.add_argument('--rounds', type=int, default=1, help='repeat every run this many times, interleaved (round 1 '
                 'runs each once, then round 2, ...), and print the medians across rounds and, per round, the first '
                 "pipeline's images/s over each other's beside what the measured bubbles predict: a shared host's "
                 'noise moves single runs by 10-20%%')
  p.add_argument('--json_out', default='', help='also append the JSON lines to this file')
  args = p.parse_args(argv)
  if args.rounds < 1:
    p.error(f'--rounds must be at least 1, got {args.rounds}')
  return args


def child(args) -> dict:
  """One process of a run: builds the method, warms up, times --iters iterations."""
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  import jax
  jax.config.update('jax_num_cpu_devices', 1)
  from jaxdecouple.config import get_default_config
  from jaxdecouple.data import TrainOrder, load_dataset
  from jaxdecouple.methods import METHODS
  from jaxdecouple.process_start import start_processes
  from jaxdecouple.train import build_setup
  c = get_default_config()
  c.model, c.batch_size, c.data.source = args.model, args.batch, 'synthetic'
  c.data.synthetic_train_size, c.data.synthetic_test_size = args.batch * 8, 8
  c.method = 'bp'
  if args.role.startswith('stage'):
    _, pid, port, method = args.role.split(':')
    c.method, c.pipeline.num_stages, c.pipeline.micro_batches, c.pipeline.split = method, 2, args.micro_batches, args.split
    c.distributed.coordinator, c.distributed.num_processes, c.distributed.process_id = f'127.0.0.1:{port}', 2, int(pid)
    start_processes(c.distributed, transfers=True)
  ds = load_dataset(c.data, c.dataset)
  m = METHODS[c.method](build_setup(c, ds))
  order = TrainOrder(len(ds.x_train), c.batch_size, c.seed)
  state = m.init(jax.random.key(0), m.train_batch(ds.x_train, ds.y_train, order, 0))
  mine = lambda s: [x for x in jax.tree.leaves(s) if x.is_fully_addressable]  # this process's arrays
  times = []
  for t in range(args.warmup + args.iters):
    start = time.perf_counter()
    state, _ = m.step(state, m.train_batch(ds.x_train, ds.y_train, order, t), t)
    jax.block_until_ready(mine(state))
    if t >= args.warmup:
      times.append(time.perf_counter() - start)
  start, first = time.perf_counter(), args.warmup + args.iters  # as training runs: no wait per iteration
  for t in range(first, first + args.iters):
    state, _ = m.step(state, m.train_batch(ds.x_train, ds.y_train, order, t), t)
  jax.block_until_ready(mine(state))
  out = {'seconds_per_iter': round(statistics.median(times), 5),
         'streamed_seconds_per_iter': round((time.perf_counter() - start) / args.iters, 5),
         'process': jax.process_index(), 'cores': sorted(os.sched_getaffinity(0))}
  if c.method != 'bp':  # this process's stage, call by call: the seconds it computed in an iteration
    from jaxdecouple.pipeline.accounting import timed_step
    busy, period, first = [], [], first + args.iters
    for t in range(first, first + 3):
      start = time.perf_counter()
      state, _, seconds, _ = timed_step(m.pipeline, state, m.train_batch(ds.x_train, ds.y_train, order, t), t)
      jax.block_until_ready(mine(state))
      period.append(time.perf_counter() - start)  # the same iteration's wall seconds: busy never exceeds it
      busy.append(sum(seconds.values()))
    out['stage_busy_s'] = round(statistics.median(busy), 5)
    out['timed_seconds_per_iter'] = round(statistics.median(period), 5)
  return out


SYNCHRONOUS = ('gpipe', '1f1b', 'zb_h1')


def time_split(args) -> dict:
  """The timed split of a child role ``split:METHOD``: stages balanced by each block's measured seconds at the
  batch one stage call of METHOD processes (a micro-batch for the synchronous schedules)."""
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  import jax
  jax.config.update('jax_num_cpu_devices', 1)
  from jaxdecouple.models import build_model
  from jaxdecouple.pipeline import split_names, timed_split
  method = args.role.split(':')[1]
  batch = args.batch // args.micro_batches if method in SYNCHRONOUS else args.batch
  model = build_model(args.model, 10)
  split = timed_split(model, 2, (32, 32, 3), batch)
  return {'split': split_names(model, split), 'stage_seconds': [round(c, 5) for c in split.stage_costs()],
          'timed_batch': batch}


def bubble(got: list[dict]) -> float:
  """The measured bubble of one 2-process run: the stages' mean idle share of the iterations they were timed
  in, 1 - mean(busy) / period, the period being the slower process's median wall seconds of those same 3
  iterations. Busy and period come from the same iterations, so the share lies in [0, 1): against the
  --iters iterations timed before (another sample, 2 of them in the tests) a noisy machine printed -0.02."""
  period = max(g['timed_seconds_per_iter'] for g in got)
  return round(1 - statistics.mean(g['stage_busy_s'] for g in got) / period, 4)


def launch(args, role: str, cores: list[int], split: str | None = None) -> subprocess.Popen:
  cmd = [sys.executable, os.path.abspath(__file__), f'--model={args.model}', f'--batch={args.batch}',
         f'--warmup={args.warmup}', f'--iters={args.iters}', f'--micro_batches={args.micro_batches}',
         f'--split={split or args.split}', f'--role={role}']
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu'}
  return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                          preexec_fn=lambda: os.sched_setaffinity(0, cores))


def result(procs) -> list[dict]:
  out = []
  for p in procs:
    stdout, stderr = p.communicate(timeout=1800)
    if p.returncode:
      for q in procs:
        q.kill()
      raise SystemExit(f'pipeline_processes.py: a process failed:\n{stderr[-3000:]}')
    out.append(json.loads(next(l for l in stdout.splitlines() if l.startswith('{'))))
  return out


def main(argv=None):
  args = parse_args(argv)
  if args.role:
    print(json.dumps(time_split(args) if args.role.startswith('split:') else child(args)), flush=True)
    return None
  cores = sorted(os.sched_getaffinity(0))
  if len(cores) < 2:
    raise SystemExit('pipeline_processes.py needs 2 cores (one per stage process)')
  def free_port() -> int:  # a fresh one per run: the last run's may linger in TIME_WAIT
    with socket.socket() as s:
      s.bind(('127.0.0.1', 0))
      return s.getsockname()[1]
  runs = [('bp', '1 process, 1 core', lambda: [launch(args, 'bp', cores[:1])], None),
          ('bp', '1 process, 2 cores', lambda: [launch(args, 'bp', cores[:2])], None)]
  splits = {}  # method -> its timed split (--split=timed), measured before any run starts
  for method in args.pipelines.split(','):
    if args.split == 'timed':
      splits[method] = result([launch(args, f'split:{method}', cores[:1])])[0]
      print(f'timed split for {method}: {splits[method]}', flush=True)
    name = f'{method} K=2' + (f' M={args.micro_batches}' if method in SYNCHRONOUS else '')
    runs.append((name, '2 processes, 1 core each',
                 lambda method=method, port=None: [
                     launch(args, f'stage:{i}:{port}:{method}', [cores[i]], splits.get(method, {}).get('split'))
                     for port in [free_port()] for i in range(2)], method))
  records = []
  for r in range(args.rounds):  # interleaved: a slow spell of the machine touches every run alike
    got_round = []
    for name, where, start, method in runs:  # one after another: every run has the machine to itself
      got = result(start())
      seconds, streamed = (max(g[k] for g in got) for k in ('seconds_per_iter', 'streamed_seconds_per_iter'))
      got_round.append({'model': args.model, 'batch': args.batch, 'run': name, 'where': where,
                        'seconds_per_iter': seconds, 'images_per_sec': round(args.batch / seconds, 1),
                        'streamed_seconds_per_iter': streamed,
                        'streamed_images_per_sec': round(args.batch / streamed, 1),
                        **({'split': splits[method]['split'] if method in splits else args.split} if method else {}),
                        **({'stage_busy_s': [g['stage_busy_s'] for g in got],  # a stage idles the rest of the period
                            'timed_seconds_per_iter': max(g['timed_seconds_per_iter'] for g in got),
                            'bubble_measured': bubble(got)}
                           if 'stage_busy_s' in got[0] else {}),
                        **({'round': r} if args.rounds > 1 else {})})
    for g in got_round:
      g['vs_bp_1_core'] = round(g['images_per_sec'] / got_round[0]['images_per_sec'], 3)
      g['streamed_vs_bp_1_core'] = round(g['streamed_images_per_sec'] / got_round[0]['streamed_images_per_sec'], 3)
      print(json.dumps(g), flush=True)
      if args.json_out:
        with open(args.json_out, 'a', encoding='utf-8') as f:
          f.write(json.dumps(g) + '\n')
    records.extend(got_round)
  print('\n| run | processes and cores | split | s/iter (median, waiting each) | images/s | vs BP on 1 core | '
        's/iter streamed | images/s | vs BP on 1 core | bubble (measured) |' + (' round |' if args.rounds > 1 else ''))
  print('|---|---|---|---|---|---|---|---|---|---|' + ('---|' if args.rounds > 1 else ''))
  for r in records:
    print(f"| {r['run']} | {r['where']} | {r.get('split', '-')} | {r['seconds_per_iter']:.4f} | {r['images_per_sec']:.1f} | "
          f"{r['vs_bp_1_core']:.3f} | {r['streamed_seconds_per_iter']:.4f} | {r['streamed_images_per_sec']:.1f} | "
          f"{r['streamed_vs_bp_1_core']:.3f} | {r.get('bubble_measured', '-')} |" + (f" {r['round']} |" if 'round' in r else ''))
  if args.rounds > 1:
    summary = across_rounds(records)
    print(json.dumps({'across_rounds': summary}), flush=True)
    if args.json_out:
      with open(args.json_out, 'a', encoding='utf-8') as f:
        f.write(json.dumps({'across_rounds': summary}) + '\n')
    print_across_rounds(summary)
  return records


def median_range(values: list[float], digits: int = 3) -> dict:
  return {'median': round(statistics.median(values), digits), 'min': round(min(values), digits),
          'max': round(max(values), digits)}


def across_rounds(records: list[dict]) -> dict:
  """Per run, the median images/s (waiting each iteration and streamed) and bubble across rounds; then the first
  pipeline against each other pipeline, round by round (both ran in the same round, minutes apart): its
  images/s over the other's, waiting and streamed, and what the measured bubbles predict for that ratio,
  (1 - bubble_first) / (1 - bubble_other) (a model: the stages' busy seconds alike), with the median of the
  measured ratio over the predicted one."""
  wheres = {}
  for r in records:
    wheres.setdefault(r['run'], set()).add(r.get('where'))
  label = lambda r: r['run'] if len(wheres[r['run']]) == 1 else f"{r['run']}, {r['where']}"  # BP on 1 core, on 2
  names = list(dict.fromkeys(label(r) for r in records))
  of = lambda name: [r for r in records if label(r) == name]
  runs = {}
  for name in names:
    rs = of(name)
    runs[name] = {'rounds': len(rs), 'images_per_sec': median_range([r['images_per_sec'] for r in rs], 1),
                  'streamed_images_per_sec': median_range([r['streamed_images_per_sec'] for r in rs], 1)}
    if all('bubble_measured' in r for r in rs):
      runs[name]['bubble_measured'] = median_range([r['bubble_measured'] for r in rs], 4)
  pipes = [n for n in names if 'bubble_measured' in runs[n]]
  ratios = {}
  for other in pipes[1:]:
    pairs = [(a, b) for a in of(pipes[0]) for b in of(other) if a.get('round') == b.get('round')]
    measured = [a['images_per_sec'] / b['images_per_sec'] for a, b in pairs]
    predicted = [(1 - a['bubble_measured']) / (1 - b['bubble_measured']) for a, b in pairs]
    ratios[f'{pipes[0]} / {other}'] = {
        'measured': median_range(measured), 'predicted_by_bubbles': median_range(predicted),
        'streamed': median_range([a['streamed_images_per_sec'] / b['streamed_images_per_sec'] for a, b in pairs]),
        'measured_over_predicted': median_range([m / p for m, p in zip(measured, predicted)])}
  return {'runs': runs, 'ratios': ratios}


def print_across_rounds(summary: dict) -> None:
  span = lambda x: f"{x['median']} [{x['min']}-{x['max']}]"
  print('\n| run | rounds | images/s, median [range] | streamed images/s | bubble (measured) |')
  print('|---|---|---|---|---|')
  for name, r in summary['runs'].items():
    print(f"| {name} | {r['rounds']} | {span(r['images_per_sec'])} | {span(r['streamed_images_per_sec'])} | "
          f"{span(r['bubble_measured']) if 'bubble_measured' in r else '-'} |")
  print('\n| ratio of images/s, per round | measured | streamed | predicted by the bubbles (a model) | measured / predicted |')
  print('|---|---|---|---|---|')
  for name, r in summary['ratios'].items():
    print(f"| {name} | {span(r['measured'])} | {span(r['streamed'])} | {span(r['predicted_by_bubbles'])} | "
          f"{span(r['measured_over_predicted'])} |")

if __name__ == '__main__':
  main()
