"""Training throughput of every method, side by side, in one process.

  python benchmarks/throughput.py --model=resnet56 --batch=128 --cpu_devices=2 \
      --runs=bp:1,fdg:2:1,fdg:2:2
  python benchmarks/throughput.py --model=preact101 --dataset=cifar100 --batch=32 --cpu_devices=4 \
      --runs=bp,localsgd:4:4,resist:4:4 --local_steps=10 --iters=20

Each run is METHOD:K:DEVICES (K and DEVICES default to 1):
- bp: K and DEVICES ignored (one device).
- dp: DEVICES is the number of devices the batch is sharded over (dp:1:2).
- pipeline methods (fdg, adl, ddg, fr, dgl, and the synchronous gpipe, 1f1b, zb_h1 with --micro_batches
  micro-batches per iteration): K stages on DEVICES devices (stages share devices when DEVICES < K); adl
  accumulates --accumulation gradients. DEVICES = K x D > K splits each stage over D devices
  (pipeline.data_parallel; e.g. 1f1b:2:4, fdg:2:4, dgl:2:4); the synchronous ones also report each stage's
  all-reduce bytes per iteration.
- replica methods (resist, localsgd, ensemble): K = S workers on DEVICES devices (workers share a device
  when DEVICES < S); --batch is per worker, so an iteration trains S x batch images, and the workers
  average every --local_steps iterations (the averaging's cost is in the mean, not in the median).
For every run: the median seconds per iteration over --iters timed iterations (after --warmup
iterations, which include compilation and the pipeline fill; every timed iteration waits for its
results) and their mean, images/s (from the median), the time ratio to the first run, the measured
speed-up over it (images/s against the first run's, on the devices present), and: for pipeline
methods each stage's time measured on idle devices, the bubble measured in those iterations (from when each
stage's calls really ended, jaxdecouple/pipeline/timeline.py; synchronous schedules add the model's beside it
and the micro-batches each stage held; --host_breakdown: the host's time per compiled call kind and the
driver's own, jaxdecouple/pipeline/host_calls.py), plus the speed-up that K devices would give if they were perfectly
overlapped (sum of stage times / max stage time; withheld, and the run marked host-bound, where the stages'
calls kept the devices busy for less than half of the timed iteration: then the host's dispatch set the pace,
and ``host_share`` says how much of the iteration the driver spent handing the calls over); for replica methods the time of one
worker's step (the iteration's time over the workers each device runs one after another). Peak device
memory is reported where the backend has it (GPUs), for a process that ran one run only (--isolate
runs each in its own process). On a noisy machine, --rounds=R interleaves the runs (every run built
and warmed first, then R rounds each timing every run in turn) and reports the median of the R
per-round ratios with their range. Prints one JSON line per run, then a markdown table.
Models: see jaxdecouple.models (the replica methods need a pre-activation ResNet, e.g. preact101,
preact_tiny; BP and the pipeline methods run it too).
--processes times a 2-process pipeline instead (each stage in its own single-core process), against BP on
one core and on two: benchmarks/pipeline_processes.py, docs/PERFORMANCE.md.
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
  p.add_argument('--micro_batches', type=int, default=4, help='gpipe, 1f1b, zb_h1: micro-batches per iteration')
  p.add_argument('--local_steps', type=int, default=50, help='replica methods: iterations between averagings')
  p.add_argument('--warmup', type=int, default=8, help='untimed iterations (compilation, pipeline fill); '
                 'lengthened to the pipeline fill plus an accumulation cycle, or a replica round, where longer')
  p.add_argument('--iters', type=int, default=10, help='timed iterations')
  p.add_argument('--rounds', type=int, default=1,
                 help='time the runs in R interleaved rounds of --iters iterations each (all runs built '
                 'first); the ratio to the first run is the median of the R per-round ratios')
  p.add_argument('--isolate', action='store_true',
                 help='run every run in a fresh process of its own: the only way to get each run\'s own '
                 'peak device memory (a process reports one high-water mark)')
  p.add_argument('--host_breakdown', action='store_true',
                 help='pipeline methods: also time every compiled call the driver makes (jaxdecouple/pipeline/'
                 'host_calls.py) over --iters iterations: host ms per iteration by call, and the driver\'s own')
  p.add_argument('--cpu_devices', type=int, default=0, help='split the host CPU into N JAX devices')
  p.add_argument('--json_out', default='', help='also append the JSON lines to this file')
  p.add_argument('--processes', action='store_true',
                 help='instead: FDG K=2 with each stage in its own single-core process (jax.distributed on '
                 'loopback) against BP in one process on one core and on two (benchmarks/pipeline_processes.py '
                 'with --model, --batch, --warmup, --iters, --json_out)')
  return p.parse_args(argv)


def _child_argv(args, run):
  """The command line that benchmarks one run alone (--isolate)."""
  skip = {'runs', 'isolate', 'json_out', 'rounds', 'processes'}
  flags = [f'--{k}' if v is True else f'--{k}={v}' for k, v in vars(args).items()
           if k not in skip and v is not False]  # a switch is given by its name alone, or left out
  return [sys.executable, os.path.abspath(__file__), *flags, f'--runs={run}']


def _isolated(args):
  """Each run in a fresh process of its own, so that its peak memory is its own. Each run's line is printed
  (and appended to --json_out) as soon as its process ends, so a session cut short keeps the runs it
  finished."""
  import subprocess
  records = []
  for run in args.runs.split(','):
    proc = subprocess.run(_child_argv(args, run), capture_output=True, text=True, check=False)
    if proc.returncode:
      raise SystemExit(f'throughput.py: the run {run!r} failed in its own process:\n{proc.stderr[-3000:]}')
    record = json.loads(next(l for l in proc.stdout.splitlines() if l.startswith('{')))
    records.append(record)
    record['ratio'] = round(record['seconds_per_iter'] / records[0]['seconds_per_iter'], 4)
    _emit(args, record, records[0])
  return records


def _emit(args, record: dict, first: dict) -> None:
  """Completes a run's record (its measured speed-up over the first run) and prints and saves its line."""
  images, first_images = record.get('images_per_iter', record['batch']), first.get('images_per_iter', first['batch'])
  record['measured_speedup'] = float(f"{images / first_images / record['ratio']:.4g}")  # from the time ratio
  print(json.dumps(record), flush=True)
  if args.json_out:
    with open(args.json_out, 'a', encoding='utf-8') as f:
      f.write(json.dumps(record) + '\n')


class _Run:
  """One METHOD:K:DEVICES run: built, initialised and warmed up (compiled, pipeline filled)."""

  def __init__(self, args, run):
    import jax
    from jaxdecouple.config import get_default_config
    from jaxdecouple.data import load_dataset
    from jaxdecouple.data.batches import TrainOrder
    from jaxdecouple.methods import METHODS
    from jaxdecouple.train import build_setup
    parts = run.split(':')
    self.method, self.k = parts[0], int(parts[1]) if len(parts) > 1 else 1
    self.n_dev = int(parts[2]) if len(parts) > 2 else 1
    c = get_default_config()
    c.method, c.model, c.dataset, c.batch_size = self.method, args.model, args.dataset, args.batch
    c.data.source = 'synthetic'
    c.data.synthetic_train_size = args.batch * 4 * max(self.k, 1)
    c.data.synthetic_test_size = 8
    c.pipeline.num_stages, c.pipeline.num_devices, c.pipeline.keep = self.k, self.n_dev, args.keep
    if self.method in ('fdg', 'adl', 'ddg', 'fr', 'dgl', 'gpipe', '1f1b', 'zb_h1') and self.n_dev > self.k:  # D per stage
      c.pipeline.data_parallel, c.pipeline.num_devices = self.n_dev // self.k, 0
    c.dp.num_devices = self.n_dev
    c.pipeline.accumulation = args.accumulation if self.method == 'adl' else 1
    c.pipeline.micro_batches = args.micro_batches
    c.replica.num_workers, c.replica.num_devices, c.replica.local_steps = self.k, self.n_dev, args.local_steps
    ds = load_dataset(c.data, c.dataset)
    self.m = METHODS[self.method](build_setup(c, ds))
    order = TrainOrder(len(ds.x_train), c.batch_size, c.seed)
    self.batch = lambda t: self.m.train_batch(ds.x_train, ds.y_train, order, t)
    self.state, self.t, self.times = self.m.init(jax.random.key(0), self.batch(0)), 0, []
    self.warmup = max(args.warmup, self.steady_from())
    for _ in range(self.warmup):
      self.step()
    jax.block_until_ready(self.state)

  def steady_from(self) -> int:
    """The first iteration from which every iteration runs programs already compiled: after a pipeline's
    fill and every stage's first update, a full accumulation cycle in (ADL), and a replica method's first
    round. A shorter --warmup is lengthened to it, so no timed iteration includes a compilation."""
    pipeline = getattr(self.m, 'pipeline', None)
    if pipeline is not None and hasattr(pipeline.schedule, 'micro_batches'):  # synchronous: nothing to fill
      return 2
    if pipeline is not None:
      s = pipeline.schedule
      return max(s.first_update(k) for k in range(s.num_stages)) + s.accumulation + 1
    engine = getattr(self.m, 'engine', None)
    if engine is not None and hasattr(engine, 'per_device'):
      return engine.spec.local_steps + 1
    return 1

  def step(self):
    self.state, _ = self.m.step(self.state, self.batch(self.t), self.t)
    self.t += 1

  def timed(self, iters: int) -> float:
    """Times ``iters`` iterations, each waiting for its results; returns their median."""
    import jax
    times = []
    for _ in range(iters):
      start = time.perf_counter()
      self.step()
      jax.block_until_ready(self.state)
      times.append(time.perf_counter() - start)
    self.times += times
    return statistics.median(times)

  def record(self, args) -> dict:
    import jax
    from jaxdecouple.pipeline.accounting import timed_step
    median = statistics.median(self.times)
    engine = getattr(self.m, 'engine', None)
    replica = engine is not None and hasattr(engine, 'per_device')
    images = args.batch * (self.k if replica else 1)
    record = {'model': args.model, 'batch': args.batch, 'method': self.method, 'stages': self.k,
              'devices': self.n_dev if self.method != 'bp' else 1, 'seconds_per_iter': round(median, 5),
              'mean_seconds_per_iter': round(statistics.mean(self.times), 5),
              'images_per_sec': round(images / median, 1), 'backend': jax.default_backend(),
              'device_kind': jax.devices()[0].device_kind, 'warmup': self.warmup}
    if replica:
      record['workers'], record['devices'] = self.k, int(engine.mesh.devices.size)
      record['images_per_iter'] = images
      record['worker_seconds'] = round(median / engine.per_device, 5)
    pipeline = getattr(self.m, 'pipeline', None)
    if pipeline is not None:
      from jaxdecouple.pipeline.timeline import summary
      stage_times, bubbles, spans, host = [], [], [], []
      for _ in range(3):
        self.state, _, st, passes = timed_step(pipeline, self.state, self.batch(self.t), self.t)
        stage_times.append(st)
        timed = summary(passes, pipeline.schedule.num_stages)
        bubbles.append(timed.get('bubble_measured', 0.0))
        spans.append(timed.get('span_s', 0.0))
        host.append(timed.get('host_share', 0.0))
        self.t += 1
      per_stage = [statistics.median(s[i] for s in stage_times) for i in sorted(stage_times[0])]
      record['stage_seconds'] = [round(s, 5) for s in per_stage]
      record['bubble_measured'] = round(statistics.median(bubbles), 4)
      record['host_share'] = round(statistics.median(host), 4)
      # The stages' calls, all of them, kept the devices busy for less than half of the timed iteration: the
      # host's dispatch set the pace (module docstring of pipeline/timeline.py), so the stage times say
      # nothing about K devices and no speed-up is predicted from them.
      host_bound = sum(per_stage) < 0.5 * statistics.median(spans)
      if hasattr(pipeline.schedule, 'micro_batches'):
        record['micro_batches'] = pipeline.schedule.micro_batches
        record['bubble_model'] = round(pipeline.schedule.bubble_model(), 4)
        record['held_microbatches'] = list(pipeline.held)
        record['held_mb'] = [round(b / 1e6, 3) for b in pipeline.held_bytes]  # per device
        record['data_parallel'] = len(pipeline.places[0].devices)
        record['sends_mb'] = [round(b / 1e6, 3) for b in pipeline.message_bytes]  # between stages, per iteration
        if pipeline.allreduce_bytes:  # inside each stage, per device and iteration (read from the compiled passes)
          record['allreduce_mb'] = [round(b / 1e6, 3) for b in pipeline.allreduce_bytes]
      if args.host_breakdown:
        from jaxdecouple.pipeline.host_calls import host_calls

        def one():
          self.step()
          return self.state
        record['host_calls'] = host_calls(pipeline, one, args.iters)
      if host_bound:
        record['host_bound'] = True
      else:
        record['predicted_speedup_on_k_devices'] = round(sum(per_stage) / max(per_stage), 3)
    return record


def main(argv=None):
  args = parse_args(argv)
  if args.processes:  # each process pinned before JAX starts: a script of its own runs them
    import subprocess
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'pipeline_processes.py')
    raise SystemExit(subprocess.call([sys.executable, script, f'--model={args.model}', f'--batch={args.batch}',
                                      f'--warmup={args.warmup}', f'--iters={args.iters}',
                                      *([f'--json_out={args.json_out}'] if args.json_out else [])]))
  runs = args.runs.split(',')
  if args.rounds < 1 or args.iters < 1:
    raise SystemExit('throughput.py: --rounds and --iters must be at least 1')
  if args.isolate and args.rounds > 1:
    raise SystemExit('throughput.py: --isolate times each run in its own process, so its runs cannot be '
                     'interleaved in rounds: drop --rounds, or drop --isolate')
  import jax
  if args.cpu_devices:
    jax.config.update('jax_num_cpu_devices', args.cpu_devices)
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

  if args.isolate:
    results = _isolated(args)
  else:
    built = [_Run(args, run) for run in runs]
    rounds = [[b.timed(args.iters) for b in built] for _ in range(args.rounds)]
    results = [b.record(args) for b in built]
    for i, r in enumerate(results):
      ratios = [row[i] / row[0] for row in rounds]
      r['ratio'] = round(statistics.median(ratios), 4)
      if args.rounds > 1:
        r['rounds'], r['ratio_range'] = args.rounds, [round(min(ratios), 4), round(max(ratios), 4)]
    stats = jax.devices()[0].memory_stats() or {}
    if 'peak_bytes_in_use' in stats and len(runs) == 1:  # a process-wide high-water mark
      results[0]['peak_memory_gb'] = round(stats['peak_bytes_in_use'] / 2**30, 3)
    for r in results:
      _emit(args, r, results[0])

  ranges = any('ratio_range' in r for r in results)
  memory = any('peak_memory_gb' in r for r in results)
  print(f'\n| method | K or S | devices | s/iter (median) | s/iter (mean) | images/s | '
        f'vs {results[0]["method"]} (time){" [min-max over rounds]" if ranges else ""} | '
        f'stage s / worker s | predicted K-device speed-up | measured speed-up (images/s) | bubble measured '
        '(model) |' + (' peak memory GB |' if memory else ''))
  print('|---|---|---|---|---|---|---|---|---|---|---|' + ('---|' if memory else ''))
  for r in results:
    parts = ", ".join(f"{s:.3f}" for s in r.get("stage_seconds", [])) or (
        f'{r["worker_seconds"]:.3f}' if 'worker_seconds' in r else '-')
    ratio = f'{r["ratio"]:.3f}' + (' [{:.3f}-{:.3f}]'.format(*r['ratio_range']) if 'ratio_range' in r else '')
    print(f'| {r["method"]} | {r["stages"]} | {r["devices"]} | {r["seconds_per_iter"]:.4f} | '
          f'{r["mean_seconds_per_iter"]:.4f} | {r["images_per_sec"]:.0f} | {ratio} | '
          f'{parts} | {"host-bound" if r.get("host_bound") else r.get("predicted_speedup_on_k_devices", "-")} | '
          f'{r["measured_speedup"]:.3f} | '
          f'{r.get("bubble_measured", "-")}' + (f' ({r["bubble_model"]})' if 'bubble_model' in r else '') + ' |'
          + (f' {r.get("peak_memory_gb", "-")} |' if memory else ''))
  broken_down = [r for r in results if 'host_calls' in r]
  if broken_down:  # --host_breakdown
    print('\n| method | K | host ms / iter | iteration ms | driver ms (outside calls) | calls: ms / iter '
          '(calls / iter, arrays / call) |\n|---|---|---|---|---|---|')
    for r in broken_down:
      h = r['host_calls']
      calls = '; '.join(f'{n} {c["ms"]:.2f} ({c["calls"]:g}, {c["arrays"]:g})' for n, c in h['calls'].items())
      print(f'| {r["method"]} | {r["stages"]} | {h["host_ms"]:.2f} | {h["iter_ms"]:.2f} | {h["other_ms"]:.2f} | '
            f'{calls} |')
  return results


if __name__ == '__main__':
  main()
