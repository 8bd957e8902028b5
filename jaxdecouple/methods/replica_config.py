"""The ``replica`` config section of the width-wise methods: its checks and the engine spec it builds.

As a config section that builds its own object (levanter's ``optim/config.py``): ``validate`` refuses a
bad field with one line before any compute, ``spec`` turns the section into the ``ReplicaSpec`` the
engine is built from, so the engine never sees a config.
"""
from __future__ import annotations

import jax

from jaxdecouple.errors import fail
from jaxdecouple.models import build_model
from jaxdecouple.models.slots import SKIPS
from jaxdecouple.replica import ReplicaSpec
from jaxdecouple.replica.engine import worker_devices
from jaxdecouple.replica.partition import SCOPES, partitioned_groups


def validate(config, name: str, partition: bool, average: bool) -> None:
  """Checks ``config.replica`` for method ``name`` (``partition``: it deals blocks out; ``average``: it
  averages at all)."""
  r = config.replica
  if r.num_workers < 1:
    fail('replica.num_workers', f'must be at least 1, got {r.num_workers}')
  if r.local_steps < 1:
    fail('replica.local_steps', f'must be at least 1, got {r.local_steps}')
  if r.momentum not in ('restart', 'average'):
    fail('replica.momentum', f"{r.momentum!r} is not allowed; choose restart or average")
  if r.batch_norm not in ('batch', 'running'):
    fail('replica.batch_norm', f"{r.batch_norm!r} is not allowed; choose batch or running")
  if r.quantize_bits and not 4 <= r.quantize_bits <= 8:
    fail('replica.quantize_bits', f'must be 0 (off) or 4..8, got {r.quantize_bits}')
  if not 0 <= r.sparsify < 1:
    fail('replica.sparsify', f'must be in [0, 1) (fraction kept; 0 = off), got {r.sparsify}')
  if r.skip not in SKIPS:
    fail('replica.skip', f"{r.skip!r} is not allowed; choose gather (default, fast everywhere) or cond")
  if r.warmup_steps and (not partition or not average):
    fail('replica.warmup_steps', f'is a local SGD warm-up before ResIST; {name} has none (leave it at 0)')
  if r.warmup_steps < 0 or (r.local_steps >= 1 and r.warmup_steps % r.local_steps):
    fail('replica.warmup_steps', f'must be 0 (none) or a multiple of replica.local_steps ({r.local_steps}), '
         f'got {r.warmup_steps}')
  if r.warmup_steps and config.max_steps and r.warmup_steps >= config.max_steps:
    fail('replica.warmup_steps', f'{r.warmup_steps} is not shorter than the run (max_steps {config.max_steps}): '
         'ResIST would never start; run longer or set --config.replica.warmup_steps=0 (no warm-up)')
  if r.stats_every_steps < 0 or (r.local_steps >= 1 and r.stats_every_steps % r.local_steps):
    fail('replica.stats_every_steps', f'must be 0 (every round) or a multiple of replica.local_steps '
         f'({r.local_steps}), got {r.stats_every_steps}')
  if r.min_depth < 0:
    fail('replica.min_depth', f'must be non-negative, got {r.min_depth}')
  if r.num_devices < 0:
    fail('replica.num_devices', f'must be non-negative (0: as many as useful), got {r.num_devices}')
  if r.num_devices and r.num_workers % r.num_devices:
    fail('replica.num_devices', f'{r.num_devices} does not divide the {r.num_workers} workers (each device runs '
         f'as many); use one of {", ".join(str(n) for n in range(1, r.num_workers + 1) if r.num_workers % n == 0)}'
         ', or 0 for as many as divide them')
  if r.partition not in SCOPES:
    fail('replica.partition', f"{r.partition!r} is not allowed; choose {' or '.join(SCOPES)}")
  if r.partition != 'third_section' and not partition:
    fail('replica.partition', f'{name} partitions nothing (leave it at third_section)')
  if r.partition == 'every_section' and r.min_depth:
    fail('replica.min_depth', "the naive partition (replica.partition='every_section') deals every section out "
         'on its own, as the paper\'s A.1 does, without a minimum depth; leave replica.min_depth at 0')
  if not 0 < r.outer_lr <= 10:
    fail('replica.outer_lr', f'must be in (0, 10] (1: plain averaging; DiLoCo uses 0.7), got {r.outer_lr}')
  if not 0 <= r.outer_momentum < 1:
    fail('replica.outer_momentum', f'must be in [0, 1) (0: none; DiLoCo uses 0.9), got {r.outer_momentum}')
  if not average and (r.outer_lr != 1 or r.outer_momentum):
    fail('replica.outer_lr', f'{name} never averages, so it has no outer step (leave outer_lr 1, outer_momentum 0)')
  if not average and not r.outer_nesterov:
    fail('replica.outer_nesterov', f'{name} never averages, so it has no outer step (leave it at True)')
  if average and not r.outer_nesterov and not r.outer_momentum:
    fail('replica.outer_nesterov', 'chooses between Nesterov and plain outer momentum, and replica.outer_momentum '
         'is 0: set an outer momentum (DiLoCo: 0.9) or leave outer_nesterov at True')
  if r.compress not in ('weights', 'updates'):
    fail('replica.compress', f"{r.compress!r} is not allowed; choose weights (the paper's A.5) or updates")
  if r.compress == 'updates' and not average:
    fail('replica.compress', f'{name} never averages, so it sends no updates (leave it at weights)')
  if r.compress == 'updates' and not (r.quantize_bits or r.sparsify):
    fail('replica.compress', "'updates' compresses with replica.quantize_bits and/or replica.sparsify; set one "
         'of them (for example replica.sparsify=0.25)')
  if r.worker_speeds and (len(r.worker_speeds) != r.num_workers or min(r.worker_speeds) <= 0):
    fail('replica.worker_speeds', f'needs one positive relative speed per worker ({r.num_workers}; 1: as measured, '
         f'0.5: half speed), got {tuple(r.worker_speeds)}')
  if r.worker_speeds and not average:
    fail('replica.worker_speeds', f'{name} never averages, so no round waits for a slow worker (leave it empty)')
  if r.update_exchange not in ('all_gather', 'two_stage'):
    fail('replica.update_exchange', f"{r.update_exchange!r} is not allowed; choose all_gather or two_stage")
  if r.update_exchange == 'two_stage' and r.compress != 'updates':
    fail('replica.update_exchange', "two_stage exchanges compressed updates; set replica.compress='updates' (and "
         'replica.quantize_bits or replica.sparsify)')
  if (r.outer_lr != 1 or r.outer_momentum) and (r.quantize_bits or r.sparsify) and r.compress == 'weights':
    fail('replica.compress', "an outer optimizer steps on the round's change, so what it compresses is that change: "
         "set replica.compress='updates' (or drop replica.quantize_bits / replica.sparsify)")
  if not average and (r.quantize_bits or r.sparsify):
    fail('replica.quantize_bits' if r.quantize_bits else 'replica.sparsify',
         f'{name} never averages, so it sends nothing to compress (leave quantize_bits and sparsify at 0)')
  if not r.error_feedback and r.compress != 'updates':
    fail('replica.error_feedback', "carries what a compressed update did not send into the next round; it acts with "
         "replica.compress='updates' only (set that, or leave it at True)")
  o = config.optim
  if partition and o.name in ('lamb', 'lars'):
    fail('optim.name', f'{o.name} scales each parameter array by its own trust ratio, and a {name} worker stacks its '
         'blocks in slots (one array for several blocks): use sgd, adamw or muon')
  if partition and average and r.warmup_steps and r.momentum == 'average' and o.name == 'muon':
    fail('replica.momentum', "muon's state cannot be carried from the local SGD warm-up into ResIST's slots; "
         "use replica.momentum='restart' (the paper's) with muon")
  if partition:
    try:
      groups = partitioned_groups(build_model(config.model, 10), r.partition)
      blocks = len(groups[0])
    except ValueError as e:
      fail('replica.partition' if r.partition != 'third_section' and 'every_section' in str(e) else 'model', str(e))
    # (the naive partition: a section with fewer blocks than workers leaves some workers without one)
    if r.partition == 'third_section' and r.num_workers > blocks and r.min_depth == 0:
      fail('replica.num_workers', f'{config.model} has {blocks} partitioned blocks, fewer than the '
           f'{r.num_workers} workers; use at most {blocks} workers or set replica.min_depth')
    if r.min_depth > blocks:
      fail('replica.min_depth', f'{config.model} has only {blocks} partitioned blocks, got {r.min_depth}')


def spec(config, partition: bool, average: bool, redraw: bool) -> ReplicaSpec:
  """The engine's spec from the (validated) config."""
  r = config.replica
  return ReplicaSpec(r.num_workers, r.local_steps, partition=partition, seed=config.seed,
                     batch_size=config.batch_size, average=average, redraw=redraw, min_depth=r.min_depth,
                     momentum=r.momentum, batch_norm=r.batch_norm, quantize_bits=r.quantize_bits,
                     sparsify=r.sparsify, skip=r.skip, test_time_scale=r.test_time_scale,
                     stats_every=max(1, r.stats_every_steps // r.local_steps),
                     scope=r.partition if partition else 'third_section', outer_lr=r.outer_lr,
                     outer_momentum=r.outer_momentum, outer_nesterov=r.outer_nesterov, compress=r.compress,
                     error_feedback=r.error_feedback, update_exchange=r.update_exchange)


def devices(section, available):
  """The devices the workers are spread over: ``replica.num_devices`` of them (0: all present)."""
  n = section.num_devices or len(available)
  if n > len(available):
    fail('replica.num_devices', f'{n} devices asked for but only {len(available)} present')
  if section.num_devices and jax.process_count() > 1:  # as many from every process
    available = [d for p in range(jax.process_count()) for d in [d for d in available if d.process_index == p][
        :n // jax.process_count()]]
  try:
    return worker_devices(list(available[:n]), section.num_workers)
  except ValueError as e:
    fail('replica.num_workers', str(e))
