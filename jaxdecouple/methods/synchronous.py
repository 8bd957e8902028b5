"""Synchronous pipelines: GPipe, 1F1B (PipeDream-Flush) and ZB-H1 (zero bubble), what a user would run instead
of an asynchronous pipeline. Each iteration splits the batch into ``pipeline.micro_batches`` = M micro-batches,
runs their forwards and backwards through the K stages in the schedule's order
(jaxdecouple/pipeline/sync_schedule.py) and ends with one optimizer step per stage: back-propagation with the
gradient accumulated over M micro-batches, BatchNorm's statistics per micro-batch. K = 1 or M = 1 is BP.
The schedules differ only in time and memory: GPipe keeps all M micro-batches' activations, 1F1B at most
K - k at stage k, ZB-H1 at most K and a third of 1F1B's bubble.
"""
from __future__ import annotations

from jaxdecouple.data import Batch, train_inputs
from jaxdecouple.errors import fail
from jaxdecouple.methods.pipelined import PipelineMethod
from jaxdecouple.models import count_params
from jaxdecouple.pipeline import choose_split
from jaxdecouple.pipeline.accounting import same_devices
from jaxdecouple.pipeline.sync_engine import SyncPipeline
from jaxdecouple.pipeline.sync_schedule import SyncSchedule


class SynchronousPipeline(PipelineMethod):
  """A synchronous schedule on the pipeline's stages (``kind`` is ``SyncSchedule``'s)."""
  kind: str
  synchronous = True

  @classmethod
  def validate(cls, config) -> None:
    super().validate(config)
    p = config.pipeline
    if p.micro_batches < 1:
      fail('pipeline.micro_batches', f'must be at least 1, got {p.micro_batches}')
    if config.batch_size % p.micro_batches:
      fail('pipeline.micro_batches', f'{p.micro_batches} does not divide batch_size={config.batch_size}; '
           'choose M dividing the batch (micro-batches of equal size)')
    for field, value, default in (('beta', p.beta, 1.0), ('keep', p.keep, 'vjp'), ('corrector', p.corrector, 'none'),
                                  ('diagnose_every_steps', p.diagnose_every_steps, 0)):
      if value != default:
        fail(f'pipeline.{field}', f'{cls.name} is synchronous: no gradient is delayed, so {value!r} has nothing '
             f'to act on; leave it at {default!r}')

  def _build(self, example: Batch) -> SyncPipeline:
    s, p = self.setup, self.setup.config.pipeline
    try:
      split = choose_split(s.model, p.num_stages, p.split, example.images.shape[1:])
    except ValueError as e:
      fail('pipeline.split', str(e))
    return SyncPipeline(s.model, split, SyncSchedule(self.kind, p.num_stages, p.micro_batches), self._devices,
                        optimizer=s.optimizer, lr=s.schedule,
                        inputs=lambda images, step: train_inputs(images, step, s.config.seed, s.preprocess),
                        data_parallel=p.data_parallel)

  def profiled_step(self, state, batch: Batch, step: int):
    """The asynchronous engine's profile (each stage's measured busy and idle seconds, the measured bubble,
    the timeline of every pass), the model's bubble beside it, and the activations each stage held."""
    state, metrics, profile = super().profiled_step(state, batch, step)
    profile['bubble_model'] = round(self.pipeline.schedule.bubble_model(), 4)
    profile.update({f'stage{k}_held_microbatches': h for k, h in enumerate(self.pipeline.held)})
    profile.update({f'stage{k}_held_mb': round(b / 1e6, 4) for k, b in enumerate(self.pipeline.held_bytes)})
    if self.pipeline.allreduce_bytes:  # inside a stage split over devices, per device and iteration
      profile.update({f'stage{k}_allreduce_mb': round(b / 1e6, 4)
                      for k, b in enumerate(self.pipeline.allreduce_bytes)})
    return state, metrics, profile

  def describe(self, state) -> list[str]:
    pipeline, s = self.pipeline, self.pipeline.schedule
    lines = [f'split ({pipeline.split.how}) into {s.num_stages} stages, {s.kind} schedule, {s.micro_batches} '
             f'micro-batches per iteration, one update per iteration; the model\'s bubble {s.bubble_model():.1%} '
             '(a model: passes of unit cost, F = 1, backward = 2)' + ':']
    for k, (stage, st) in enumerate(zip(pipeline.stages, state.stages)):
      names = stage.chain.names
      lines.append(f'  stage {k} on {stage.where}: blocks {names[0]}..{names[-1]} ({len(names)}), '
                   f'{count_params(st.params) / 1e6:.3f}M params, holds at most {s.held(k)} micro-batches\' '
                   'activations' + (f', sends {pipeline.message_bytes[k] / 1e6:.2f} MB per iteration to and from '
                                   f'stage {k + 1}' + same_devices(stage, pipeline.stages[k + 1]) if k < s.last else ''))
    lines.append('  schedule (F<m>: forward of micro-batch m, B<m>: its backward, W<m>: its weight gradient):')
    lines.extend('    ' + line for line in s.table().splitlines())
    return lines


class GPipe(SynchronousPipeline):
  name = kind = 'gpipe'


class OneFOneB(SynchronousPipeline):
  name = kind = '1f1b'


class ZeroBubbleH1(SynchronousPipeline):
  name = kind = 'zb_h1'
