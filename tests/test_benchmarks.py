"""The benchmark scripts run and report consistent records (their figures live in docs/PERFORMANCE.md)."""
import importlib.util
import json
import os
import subprocess
import sys

import jax
import pytest

from jaxdecouple.models import build_model
from jaxdecouple.pipeline import choose_split

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load(name):
  spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, 'benchmarks', f'{name}.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_throughput_reports_every_kind_of_method(capsys):
  records = load('throughput').main(['--model=preact_tiny', '--batch=8', '--warmup=2', '--iters=1',
                                     '--local_steps=2', '--runs=bp,fdg:2:2,resist:2:2,1f1b:2:2', '--rounds=2',
                                     '--micro_batches=2', '--host_breakdown'])
  assert [r['method'] for r in records] == ['bp', 'fdg', 'resist', '1f1b']
  assert records[0]['ratio'] == 1 and records[0]['ratio_range'] == [1, 1]
  for r in records:  # the ratio is the median of the two rounds' ratios, inside their range
    low, high = r['ratio_range']
    assert r['rounds'] == 2 and low <= r['ratio'] <= high
  assert records[1]['measured_speedup'] == pytest.approx(1 / records[1]['ratio'], rel=2e-3)
  assert records[2]['measured_speedup'] == pytest.approx(2 / records[2]['ratio'], rel=2e-3)  # 2 x 8 images
  for r in records:
    images = r.get('images_per_iter', 8)
    assert r['seconds_per_iter'] > 0 and r['images_per_sec'] == pytest.approx(images / r['seconds_per_iter'], rel=0.02)
  fdg, resist = records[1], records[2]
  assert len(fdg['stage_seconds']) == 2 and 0 <= fdg['host_share'] <= 1
  # a speed-up is predicted from the stage times only where they kept the devices busy (timeline.py)
  assert fdg['predicted_speedup_on_k_devices'] >= 1 if not fdg.get('host_bound') else \
      'predicted_speedup_on_k_devices' not in fdg
  assert resist['images_per_iter'] == 16 and resist['workers'] == 2 and resist['devices'] == 2
  assert resist['worker_seconds'] == resist['seconds_per_iter']  # one worker per device
  # --warmup=2 lengthened so that nothing timed compiles: FDG K = 2 fills for 2 iterations, stage 0 first
  # updates at iteration 2, one more for the steady state; ResIST's first round ends after 2 local steps
  assert [r['warmup'] for r in records] == [2, 4, 3, 2]
  sync = records[3]  # measured bubble beside the model's (K = 2, M = 2: 1/3), the micro-batches each stage held
  assert sync['micro_batches'] == 2 and sync['bubble_model'] == round(1 / 3, 4) and 0 <= sync['bubble_measured'] < 1
  assert sync['held_microbatches'] == [2, 1] and len(sync['held_mb']) == 2 and 0 <= fdg['bubble_measured'] < 1
  # --host_breakdown: the driver's compiled calls counted as the schedule makes them, per iteration: 1F1B
  # with K = 2, M = 2 runs 4 forwards, 4 backwards, 2 packings (each stage's parameters, statistics and zero
  # gradient sum, once an iteration) and 2 updates, and one call each to prepare the batch, cut its labels and
  # average the logged metrics; FDG one call per stage (its last stage's forward and backward are one
  # vjp_call); their host time within the iteration's
  for r, want in ((sync, {'forward': 4, 'backward': 4, 'apply': 2, 'pack': 2, 'prepare': 1, 'cut_labels': 1,
                          'summarise': 1}),
                  (fdg, {'iterate': 1, 'learn': 1})):
    h = r['host_calls']
    assert {name: c['calls'] for name, c in h['calls'].items()} == want, h
    assert 0 < h['host_ms'] <= h['iter_ms'] and h['other_ms'] <= h['host_ms']
    assert sum(c['ms'] for c in h['calls'].values()) <= h['host_ms'] + 1e-3
  assert sync['host_calls']['calls']['forward']['arrays'] > sync['host_calls']['calls']['prepare']['arrays']
  assert 'host_calls' not in records[0] and 'host_calls' not in resist  # pipelines only
  out = capsys.readouterr().out
  assert '| 1f1b | 2 |' in out.split('driver ms (outside calls)')[1]
  assert '| resist | 2 | 2 |' in out and 'predicted K-device speed-up' in out
  assert 'min-max over rounds' in out


def test_throughput_isolates_runs_in_their_own_processes(monkeypatch, capsys):
  """Each run goes to a child process with the same flags (checked by parsing the child's command
  line back); the records come from the children's JSON lines. The children are faked here: a real
  one is this same main() with one run, which the test above runs."""
  import subprocess
  import types
  module = load('throughput')
  with pytest.raises(SystemExit, match='cannot be interleaved'):
    module.main(['--isolate', '--rounds=2'])
  children, printed_before = [], []

  def fake_run(argv, **kw):
    args = module.parse_args(argv[2:])
    children.append(args)
    printed_before.append(capsys.readouterr().out)  # what the parent had printed when this child started
    record = {'method': args.runs.split(':')[0], 'stages': 1, 'devices': 1, 'batch': args.batch,
              'seconds_per_iter': 0.5 * len(children), 'mean_seconds_per_iter': 0.5, 'images_per_sec': 1.0}
    return types.SimpleNamespace(returncode=0, stdout='log line\n' + json.dumps(record) + '\n| table |', stderr='')
  monkeypatch.setattr(subprocess, 'run', fake_run)
  records = module.main(['--model=preact_tiny', '--batch=4', '--warmup=1', '--iters=3', '--keep=recompute',
                         '--isolate', '--runs=bp,fdg:2:1'])
  assert [a.runs for a in children] == ['bp', 'fdg:2:1']
  for a in children:  # every flag reached the child; --isolate itself did not
    assert (a.model, a.batch, a.warmup, a.iters, a.keep, a.isolate) == ('preact_tiny', 4, 1, 3, 'recompute', False)
    assert a.host_breakdown is False  # a switch left off stays off (it was passed as '--host_breakdown=False')
  assert [r['ratio'] for r in records] == [1, 2] and [r['measured_speedup'] for r in records] == [1, 0.5]
  assert '| fdg | 1 | 1 |' in capsys.readouterr().out
  # each run's line comes as its process ends: a session cut short keeps the runs it finished
  assert json.loads(printed_before[1].strip().splitlines()[-1])['method'] == 'bp'
  children.clear()
  module.main(['--model=preact_tiny', '--isolate', '--host_breakdown', '--runs=fdg:2:1'])
  assert [a.host_breakdown for a in children] == [True]  # a switch given reaches the child by its name


def test_resist_worker_benchmark_times_each_sub_network(capsys):
  records = load('resist_worker').main(['--model=preact_tiny', '--batch=8', '--workers=2', '--warmup=1',
                                        '--iters=1', '--rounds=2', '--speeds=1,0.5', '--local_steps=10',
                                        '--exchange_s=0.5'])  # --with_cond: test_resist checks cond
  records, model = records[:-2], records[-2:]
  # a straggler at half speed: the round waits for it (a model from the measured steps, labelled so)
  steps = {r['run']: r['seconds'] for r in records}
  resist_steps = [steps['worker 0 of 2, slots'], steps['worker 1 of 2, slots']]
  slow = max(10 * resist_steps[0], 20 * resist_steps[1])
  assert model[0]['method'] == 'resist' and model[0]['model'] is True
  assert model[0]['round_s'] == pytest.approx(slow + 0.5, abs=2e-3)
  assert model[0]['round_s_all_full_speed'] == pytest.approx(10 * max(resist_steps) + 0.5, abs=2e-3)
  full = records[0]['seconds']
  assert model[1]['round_s'] == pytest.approx(20 * full + 0.5, abs=2e-3)
  assert model[1]['idle_fraction'] == pytest.approx(10 * full / (2 * (20 * full + 0.5)), abs=2e-3)
  assert records[0]['ratio'] == 1 and records[0]['ratio_range'] == [1, 1]  # the full step: the baseline
  for r in records:
    assert r['ratio_range'][0] <= r['ratio'] <= r['ratio_range'][1] and r['seconds'] > 0
  out = capsys.readouterr().out
  assert 'min-max over rounds' in out
  assert out.count(', slots |') == 2
  assert '| full model (local SGD step, no skipping) | 5 | 5 |' in out
  assert '| full model through the slots (one per block) | 5 | 5 |' in out
  assert '| worker 1 of 2, slots | 2 | 3 |' in out  # 5 blocks, S = 2: slots of 3, one dropped
  # one block's time measured as (full - shared layers alone) / blocks: the full step is then exactly 1
  assert '| shared layers only (partitioned blocks removed) | 0 | 0 |' in out
  full, shared = records[0], records[1]
  assert full['time_share_ratio'] == pytest.approx(1.0, abs=1e-3)
  assert shared['time_share_ratio'] == shared['ratio'] and shared['flop_ratio'] < 1
  assert 'take' in out and 'of the full step\'s time' in out


def test_torch_reference_says_pytorch_is_missing(capsys, monkeypatch):
  """benchmarks/torch_reference.py is an optional comparison that needs PyTorch, which the project does not
  install: without it (here made missing, wherever torch is) it stops with exit 2 and one line naming the fix."""
  module = load('torch_reference')
  monkeypatch.setitem(sys.modules, 'torch', None)  # import torch raises ImportError
  assert module.main(['--depth=8', '--batch=4', '--warmup=1', '--iters=1']) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith('PyTorch is not installed') and 'pip install torch' in err and '\n' not in err


def test_conv_layers_times_one_layer_per_section():
  rows = load('conv_layers').main(['--batch=2', '--iters=1', '--no_torch'])
  assert [r['layer'] for r in rows] == ['32x32, 16 -> 16', '16x16, 32 -> 32', '8x8, 64 -> 64',
                                        '32x32, 16 -> 32, stride 2']
  for r in rows:
    assert min(r['jax_forward_ms'], r['jax_input_grad_ms'], r['jax_weight_grad_ms']) > 0
  # Every stride-1 section does the same FLOPs: 2 * batch * H * W * 9 * C_in * C_out.
  assert [r['forward_gflop'] for r in rows] == [round(2 * 2 * 9 * 32 * 32 * 16 * 16 / 1e9, 4)] * 3 + [
      round(2 * 2 * 9 * 16 * 16 * 16 * 32 / 1e9, 4)]


def test_gpu_session_commands_parse():
  """benchmarks/gpu_session.sh runs only on a lent GPU machine, whose minutes are few: every benchmark
  command in it must take its flags, name known methods and models, and leave its results in $OUT."""
  import shlex
  from jaxdecouple.methods import METHODS
  from jaxdecouple.models import build_model
  with open(os.path.join(ROOT, 'benchmarks', 'gpu_session.sh'), encoding='utf-8') as f:
    script = f.read().replace('\\\n', ' ')
  commands = [line.split('benchmarks/', 1)[1] for line in script.splitlines()
              if line.strip().startswith('$PY benchmarks/')]
  assert len(commands) >= 6, commands
  for command in commands:
    for layout in ('', '--channels_last'):
      name, *argv = shlex.split(command.replace('$layout', layout).replace('"$OUT', '"/tmp/out'))
      args = load(name[:-len('.py')]).parse_args(argv)
      assert args.json_out.startswith('/tmp/out/'), command
      for run in (getattr(args, 'runs', '') or '').split(','):
        if run:
          assert run.split(':')[0] in METHODS, run
      if getattr(args, 'model', None):
        build_model(args.model, 10)


def test_loader_benchmark_reports_each_transform(tmp_path, capsys):
  records = load('loader').main(['--images=6', '--batch=4', '--passes=1', '--workers=1', '--size=32',
                                 f'--folder={tmp_path}'])
  assert [r['transform'] for r in records] == ['train', 'eval', 'train_in_process', 'train_full_decode_in_process']
  for r in records:
    assert r['images'] == 6 and r['images_per_sec'] == pytest.approx(6 / r['seconds'], rel=0.1)  # seconds rounded to ms
  assert len(os.listdir(tmp_path)) == 6  # --folder keeps the JPEGs for a rerun
  assert '| train | 1 |' in capsys.readouterr().out


def test_resist_round_benchmark_sets_resist_beside_local_sgd(capsys):
  records = load('resist_round').main(['--model=preact_tiny', '--batch=8', '--local_steps=2', '--workers=2',
                                       '--rounds=1'])
  resist, local = records
  assert (resist['method'], local['method']) == ('resist', 'localsgd') and resist['devices'] == 2
  assert local['sent_mb'] == 0 and resist['sent_mb'] > 0  # local SGD moves nothing but its all-reduce
  assert resist['collective_mb'] < local['collective_mb'] and resist['moved_mb'] < local['moved_mb']
  assert resist['stored_mb'] < local['stored_mb']
  assert all(r['local_step_s'] > 0 and r['round_s'] > 0 for r in records)
  assert '| 2 | localsgd |' in capsys.readouterr().out
  # 8 bits on the wire: the blocks and the shared layers' exchange carry codes, not float32
  resist8, local8 = load('resist_round').main(['--model=preact_tiny', '--batch=8', '--local_steps=2', '--workers=2',
                                               '--rounds=1', '--quantize_bits=8'])
  assert resist8['quantize_bits'] == local8['quantize_bits'] == 8
  assert 0 < resist8['sent_mb'] < resist['sent_mb'] and resist8['collective_mb'] < resist['collective_mb']
  assert local8['collective_mb'] < local['collective_mb'] and resist8['stored_mb'] == resist['stored_mb']
  assert '8-bit codes on the wire' in capsys.readouterr().out
  with pytest.raises(SystemExit, match='replica.quantize_bits: must be 0'):  # checked as training checks it
    load('resist_round').main(['--model=preact_tiny', '--workers=2', '--quantize_bits=9'])


def test_bytes_per_iteration_counts_each_method_from_what_moves(capsys, tmp_path):
  """The ResIST paper's Figure 4 counted: data parallelism's all-reduces read from its compiled step are its
  gradient, BatchNorm's statistics twice (forward and backward) and the mean loss and accuracy; ResIST moves
  less than local SGD; GPipe's messages are the pipeline's own."""
  import jax
  import numpy as np
  records = load('bytes_per_iteration').main(['--model=preact_tiny', '--workers=2', '--batch=4', '--local_steps=5',
                                              '--micro_batches=2', f'--figure={tmp_path / "bytes.png"}'])
  assert os.path.getsize(tmp_path / 'bytes.png') > 0
  by = {r['method']: r for r in records}
  assert list(by) == ['resist', 'localsgd', 'dp', 'gpipe']
  assert 0 < by['resist']['per_iteration_mb'] < by['localsgd']['per_iteration_mb']
  assert by['resist']['per_round_mb'] == pytest.approx(5 * by['resist']['per_iteration_mb'], rel=1e-2)
  from jaxdecouple.models import build_model
  model = build_model('preact_tiny', 10)
  variables = model.init(jax.random.key(0), np.zeros((1, 32, 32, 3), np.float32))
  params = sum(x.nbytes for x in jax.tree.leaves(variables['params']))
  stats = sum(x.nbytes for x in jax.tree.leaves(variables.get('batch_stats', {})))
  assert by['dp']['per_iteration_mb'] == round((params + 2 * stats + 8) / 1e6, 4)
  assert by['gpipe']['per_iteration_mb'] > 0 and by['gpipe']['busiest_boundary_mb'] >= by['gpipe']['per_iteration_mb']
  assert '| dp |' in capsys.readouterr().out


def test_block_times_prints_the_split_that_balances_measured_seconds(capsys):
  summary = load('block_times').main(['--model=resnet8', '--stages=2', '--batch=2', '--repeats=1'])
  lines = [json.loads(l) for l in capsys.readouterr().out.splitlines() if l.startswith('{')]
  blocks = [l for l in lines if 'block' in l]
  assert [b['block'] for b in blocks] == list(build_model('resnet8', 10).block_names)
  timed = summary['splits']['timed']
  # the timed split is the best contiguous cut of the printed block times (an exhaustive check for K = 2)
  ms = [b['ms'] for b in blocks]
  best = min(max(sum(ms[:i]), sum(ms[i:])) for i in range(1, len(ms)))
  assert max(timed['stage_ms']) == pytest.approx(best, abs=0.01)
  assert timed['largest_over_mean'] <= summary['splits']['flop_balanced']['largest_over_mean'] + 1e-9
  assert sum(timed['stage_ms']) == pytest.approx(sum(ms), abs=0.05)


@pytest.mark.parametrize('method,timed_batch', [('fdg', 8), ('1f1b', 2)])
def test_pipeline_processes_times_each_methods_split_at_its_call_batch(method, timed_batch):
  # --split=timed: a child pinned to one core measures the split at the batch one stage call processes (the
  # batch for FDG, a micro-batch for 1F1B) and names blocks that pipeline.split accepts
  out = subprocess.run([sys.executable, os.path.join(ROOT, 'benchmarks', 'pipeline_processes.py'), '--model=resnet8',
                        '--batch=8', '--micro_batches=4', f'--role=split:{method}'],
                       capture_output=True, text=True, timeout=300, env={**os.environ, 'JAX_PLATFORMS': 'cpu'})
  assert out.returncode == 0, out.stderr[-2000:]
  got = json.loads(next(l for l in out.stdout.splitlines() if l.startswith('{')))
  assert got['timed_batch'] == timed_batch and len(got['stage_seconds']) == 2 and min(got['stage_seconds']) > 0
  model = build_model('resnet8', 10)
  assert choose_split(model, 2, got['split'], (32, 32, 3)).how == 'explicit'


def test_pipeline_processes_compares_pipelines_round_by_round():
  # --rounds: FDG against each other pipeline within each round (the two ran minutes apart), beside the ratio
  # the measured bubbles predict; medians across rounds. Records made here, the ratios worked out by hand.
  rec = lambda run, ips, streamed, bubble, r, where='2 processes': {
      'run': run, 'where': where, 'images_per_sec': ips, 'streamed_images_per_sec': streamed, 'round': r,
      **({'bubble_measured': bubble} if bubble is not None else {})}
  records = []
  for r, (bp, fdg, other) in enumerate([((70.0, 70.0, None), (120.0, 110.0, 0.10), (100.0, 100.0, 0.25)),
                                        ((60.0, 60.0, None), (130.0, 120.0, 0.20), (130.0, 100.0, 0.20)),
                                        ((80.0, 80.0, None), (90.0, 99.0, 0.40), (100.0, 90.0, 0.25))]):
    records += [rec('bp', *bp, r, where='1 core'), rec('bp', 2 * bp[0], 2 * bp[1], None, r, where='2 cores'),
                rec('fdg K=2', *fdg, r), rec('1f1b K=2 M=4', *other, r)]
  summary = load('pipeline_processes').across_rounds(records)
  assert list(summary['runs']) == ['bp, 1 core', 'bp, 2 cores', 'fdg K=2', '1f1b K=2 M=4']  # BP's two kept apart
  assert summary['runs']['bp, 2 cores']['images_per_sec'] == {'median': 140.0, 'min': 120.0, 'max': 160.0}
  assert summary['runs']['fdg K=2']['images_per_sec'] == {'median': 120.0, 'min': 90.0, 'max': 130.0}
  assert 'bubble_measured' not in summary['runs']['bp, 1 core'] and summary['runs']['bp, 1 core']['rounds'] == 3
  assert summary['runs']['1f1b K=2 M=4']['bubble_measured'] == {'median': 0.25, 'min': 0.2, 'max': 0.25}
  ratio = summary['ratios']['fdg K=2 / 1f1b K=2 M=4']
  assert list(summary['ratios']) == ['fdg K=2 / 1f1b K=2 M=4']
  # per round: measured 1.2, 1.0, 0.9; predicted (0.9/0.75, 0.8/0.8, 0.6/0.75) = 1.2, 1.0, 0.8; streamed 1.1, 1.2, 1.1
  assert ratio['measured'] == {'median': 1.0, 'min': 0.9, 'max': 1.2}
  assert ratio['predicted_by_bubbles'] == {'median': 1.0, 'min': 0.8, 'max': 1.2}
  assert ratio['streamed'] == {'median': 1.1, 'min': 1.1, 'max': 1.2}
  assert ratio['measured_over_predicted'] == {'median': 1.0, 'min': 1.0, 'max': 1.125}


def test_pipeline_processes_runs_each_method_at_its_timed_split():
  # The whole path a user runs: each method's split timed in a child, then BP (1 core, 2 cores), FDG and 1F1B over
  # 2 processes, one round (--rounds' interleaving and medians are test_pipeline_processes_compares_pipelines_round_
  # by_round's, on records made there: two rounds here cost about 25 CPU seconds more and checked no more of it).
  out = subprocess.run([sys.executable, os.path.join(ROOT, 'benchmarks', 'pipeline_processes.py'), '--model=resnet8',
                        '--batch=8', '--warmup=3', '--iters=2', '--pipelines=fdg,1f1b', '--micro_batches=2',
                        '--split=timed'],
                       capture_output=True, text=True, timeout=600, env={**os.environ, 'JAX_PLATFORMS': 'cpu'})
  assert out.returncode == 0, out.stderr[-3000:]
  runs = [json.loads(l) for l in out.stdout.splitlines() if l.startswith('{')]
  assert [(r['run'], r['where']) for r in runs] == [('bp', '1 process, 1 core'), ('bp', '1 process, 2 cores'),
                                                    ('fdg K=2', '2 processes, 1 core each'),
                                                    ('1f1b K=2 M=2', '2 processes, 1 core each')]
  model = build_model('resnet8', 10)
  for r in runs[2:4]:
    assert choose_split(model, 2, r['split'], (32, 32, 3)).how == 'explicit' and 0 <= r['bubble_measured'] < 1
    assert len(r['stage_busy_s']) == 2 and min(r['stage_busy_s']) > 0
    assert max(r['stage_busy_s']) <= r['timed_seconds_per_iter']  # busy and period from the same iterations
    assert abs(r['bubble_measured'] - (1 - sum(r['stage_busy_s']) / 2 / r['timed_seconds_per_iter'])) <= 1e-4
  for r in runs:  # each run's figures against BP on one core, from the printed images/s
    assert r['images_per_sec'] == round(8 / r['seconds_per_iter'], 1)
    assert r['vs_bp_1_core'] == round(r['images_per_sec'] / runs[0]['images_per_sec'], 3)
  assert 'round' not in runs[0] and 'across_rounds' not in out.stdout


def test_dispatch_depth_reports_the_calls_that_returned_before_the_first_wait(capsys):
  out = load('dispatch_depth').main(['--calls=48', '--size=200'])
  printed = json.loads(next(l for l in capsys.readouterr().out.splitlines() if l.startswith('{')))
  assert printed == out and out['calls'] == 48 and out['one_call_ms'] > 0
  # XLA:CPU's client takes about 32 computations before a dispatch waits (jaxlib 0.10, an idle core); a loaded
  # machine can slow any one dispatch past the threshold, so the count is reported, and only its bounds asserted
  assert 0 <= out['returned_at_once'] <= 48
  assert (out['median_dispatch_ms_after'] is None) == (out['returned_at_once'] == 48)


def test_compile_time_measures_a_cold_then_a_warm_compilation_cache(capsys, monkeypatch):
  """--cache: two fresh processes per run, the first with an empty cache folder, the second with what it left;
  the second loads every program the first compiled (the tiny programs qualify: no minimum compile time) and
  compiles none."""
  monkeypatch.setenv('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0')
  records = load('compile_time').main(['--models=resnet8', '--runs=bp', '--scan_blocks=0', '--cache', '--batch=4',
                                       '--steps=1', '--cpu_devices=1'])
  cold, warm = records
  assert (cold['cache'], warm['cache']) == ('cold', 'warm')
  assert cold['loaded'] == 0 and cold['compiled'] > 0, cold
  assert warm['loaded'] == cold['compiled'] and warm['compiled'] == 0, warm
  assert '| resnet8 | bp | 0 |' in capsys.readouterr().out
