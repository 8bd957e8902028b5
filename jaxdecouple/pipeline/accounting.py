"""What a pipeline tells about itself: its description for the log (stages, their devices, sizes, costs,
delays, messages, the schedule's table) and one iteration with each stage's own compute time measured.

Both read a pipeline and its state and change nothing, and the timing waits for the devices, which the
ordinary steps never do; so they live apart from the driver (``engine.py``).
"""
from __future__ import annotations

import jax

from jaxdecouple.data import Batch
from jaxdecouple.models import count_params
from jaxdecouple.pipeline import timeline
from jaxdecouple.pipeline.placement import is_local

from jaxdecouple.pipeline.engine import Pipeline, PipelineState


def copies(n: int) -> str:
  return f'{n} cop{"y" if n == 1 else "ies"}'


def same_devices(stage, following) -> str:
  """What the bytes line adds where two neighbouring stages sit on the same devices: nothing crosses there, the
  count is what the boundary carries."""
  return ' (on the same devices: nothing crosses)' if set(stage.where.devices) == set(following.where.devices) else ''


def describe(pipeline: Pipeline, state: PipelineState) -> list[str]:
  """The log's lines about the split, every stage and the schedule."""
  s = pipeline.schedule
  lines = [f'split ({pipeline.split.how}) into {s.num_stages} stages, keep={pipeline.keep}, beta={pipeline.beta}'
           + (f', accumulating {s.accumulation} backwards per update' if s.accumulation > 1 else '')
           + (', forward before update' if s.forward_first else '') + ':']
  costs = pipeline.split.stage_costs()
  total = sum(costs)
  for k, (stage, st) in enumerate(zip(pipeline.stages, state.stages)):
    names = stage.chain.names
    lines.append(
        f'  stage {k} on {stage.where}'
        + (f' (process {stage.device.process_index})' if jax.process_count() > 1 else '') + f': blocks {names[0]}..{names[-1]} ({len(names)}), '
        f'{count_params(st.params) / 1e6:.3f}M params, est. {costs[k] / 1e6:.1f} MFLOP/8 images '
        f'({100 * costs[k] / total:.0f}%), delay {s.delay(k)}, staleness {s.staleness(k):.2f} updates, '
        f'first update at iteration {s.first_update(k)}'
        + (f', sends {pipeline.message_bytes[k] / 1e6:.2f} MB/step to stage {k + 1}'
           + same_devices(stage, pipeline.stages[k + 1]) if k < s.last else '')
        + (f'; keeps {ring_bytes(st) / 1e6:.1f} MB for the {len(st.ring)} forwards in flight '
           f'({pipeline.keep}: {"their residuals" if pipeline.keep == "vjp" else "their inputs"})' if st.ring else '')
        + (f'; auxiliary head {count_params(st.aux.params) / 1e6:.3f}M params' if st.aux else '')
        + (f'; corrector {stage.corrector.kind} ({stage.corrector.settings()}staleness '
           f'{stage.corrector.staleness:g}) keeps '
           f'{corrector_bytes(st) / 1e6:.2f} MB, {copies(stage.corrector.copies())} of its parameters'
           if stage.corrector is not None else ''))
  if s.local_heads:
    extra = sum(count_params(st.aux.params) for st in state.stages if st.aux)
    model = sum(count_params(st.params) for st in state.stages)
    lines.append(f'  auxiliary heads: {extra / 1e6:.3f}M extra parameters ({100 * extra / model:.1f}% of the '
                 f'model\'s {model / 1e6:.3f}M); evaluation uses the real head')
  lines.append('  schedule (F<m>: forward of micro-batch m, B<m>: its backward, *: optimizer step):')
  lines.extend('    ' + line for line in s.table(2 * s.num_stages + s.accumulation).splitlines())
  return lines


def ring_bytes(st) -> int:
  """Bytes a stage keeps for the micro-batches whose gradients it still awaits (the delay slots: with keep=vjp
  each forward's residuals for its backward, with recompute or replay its input), counted from the arrays of
  its state: the memory FDG's delay costs a stage, beside its parameters."""
  return sum(x.nbytes for x in jax.tree.leaves(st.ring))


def corrector_bytes(st) -> int:
  """Bytes of what a stage's corrector keeps (its last step, the parameters forwards in flight met), counted
  from the arrays of its state."""
  return sum(x.nbytes for x in jax.tree.leaves(st.corrector))


def timed_step(pipeline, state: PipelineState, batch: Batch, t: int):
  """One iteration with each stage's calls timed (devices idle at the start; ``timeline.py``): when each call
  really started and ended. Returns (state, metrics, {stage: seconds busy}, passes) for the stages this
  process drives (all, in one process); ``passes`` is the measured timeline. Used every few hundred steps
  for the logs and by the benchmarks: it waits for the devices, so it is not how the ordinary steps run.
  Works for the asynchronous engine (one call per stage and iteration) and the synchronous one (a call per
  pass)."""
  jax.block_until_ready(state)
  (new_state, metrics), passes = timeline.measure(lambda record: pipeline.step(state, batch, t, record))
  passes = [p for p in passes if is_local(pipeline.devices[p['stage']])]  # across processes: this one's stages
  seconds = {}
  for p in passes:
    seconds[p['stage']] = seconds.get(p['stage'], 0.0) + p['end'] - p['start']
  return new_state, metrics, dict(sorted(seconds.items())), passes
