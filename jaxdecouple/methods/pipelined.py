"""Shared plumbing of the pipeline methods: the schedule, split and placement from the config, then the engine."""
from __future__ import annotations

import functools

from absl import logging
import jax
import numpy as np

from jaxdecouple.common import use_split_backward
from jaxdecouple.config import get_default_config
from jaxdecouple.errors import fail
from jaxdecouple.data import Batch, train_inputs
from jaxdecouple.methods.base import Method, Setup
from jaxdecouple.models import build_model
from jaxdecouple.pipeline import Pipeline, Schedule, choose_split
from jaxdecouple.pipeline import accounting as pipeline_accounting
from jaxdecouple.pipeline import timeline
from jaxdecouple.pipeline.correctors import CORRECTORS, Corrector
from jaxdecouple.pipeline.diagnose import Diagnosis
from jaxdecouple.pipeline.placement import is_local


# Optimizers whose step (nearly) does not change when every gradient of a stage is multiplied by one constant:
# Adam's m / sqrt(v), LAMB's on top of it, Muon's orthogonalisation and its Adam (up to eps); LARS's trust ratio
# divides by the gradient's norm (up to its weight-decay term: 0.2% of the step at 5e-4, tests/test_optimizers.py).
SCALE_FREE_OPTIMIZERS = ('adamw', 'lamb', 'lars', 'muon')
# each corrector's own setting: refused with another corrector, which would ignore it
CORRECTOR_FIELDS = {'dc_lambda': 'dc', 'lr_anneal_epochs': 'pipemare_lr', 'nesterov_gamma': 'nesterov',
                    'nesterov_lr_scale': 'nesterov'}


def beta_note(config) -> str | None:
  """A start-up warning when FDG's gradient shrinking cannot act: beta multiplies the gradients a stage receives,
  and a scale-free optimizer divides that factor out again. None when beta can act."""
  beta, name = config.pipeline.beta, config.optim.name
  if beta == 1 or name not in SCALE_FREE_OPTIMIZERS:
    return None
  return (f'pipeline.beta={beta:g} multiplies the gradients a stage receives, and optim.name={name} divides each '
          "step by its gradients' own scale: beta changes almost nothing here. FDG's shrinking acts through sgd; "
          'with this optimizer a smaller learning rate or a corrector is the lever')


class PipelineMethod(Method):
  """A method that is one configuration of the pipeline engine: its schedule and what a stage keeps."""
  keep: str | None = None  # what a stage keeps of a forward, when the method fixes it (else pipeline.keep)
  accumulates = False  # whether pipeline.accumulation and pipeline.adl_mode mean anything here
  synchronous = False  # a synchronous schedule (methods/synchronous.py): data parallelism splits its micro-batches
  pipelined = True
  transfers = True

  def schedule(self, num_stages: int) -> Schedule:
    """How data and gradients flow (jaxdecouple/pipeline/schedule.py); FDG's by default."""
    return Schedule(num_stages)

  @classmethod
  def validate(cls, config) -> None:
    super().validate(config)
    p = config.pipeline
    if p.num_stages < 1:
      fail('pipeline.num_stages', f'must be at least 1, got {p.num_stages}')
    if not 0 < p.beta <= 1:
      fail('pipeline.beta', f'must be in (0, 1], got {p.beta}')
    if cls.keep and p.keep not in ('vjp', cls.keep):  # a method that fixes what it keeps takes no other
      fail('pipeline.keep', f'{cls.name} always keeps {cls.keep!r}; leave pipeline.keep at its default (vjp)')
    if not cls.keep and p.keep not in ('vjp', 'recompute'):
      hint = " ('replay' is features replay: method 'fr')" if p.keep == 'replay' else ''
      fail('pipeline.keep', f'{p.keep!r} is not allowed for {cls.name}; choose vjp or recompute{hint}')
    if not cls.accumulates and (p.accumulation != 1 or p.adl_mode != 'B'):
      fail('pipeline.accumulation' if p.accumulation != 1 else 'pipeline.adl_mode',
           f"only method 'adl' accumulates gradients; {cls.name} needs the defaults "
           "(accumulation=1, adl_mode='B')")
    if p.num_devices < 0:
      fail('pipeline.num_devices', f'must be non-negative (0: one per stage), got {p.num_devices}')
    if p.data_parallel < 1:
      fail('pipeline.data_parallel', f'must be at least 1 (devices per stage), got {p.data_parallel}')
    if p.data_parallel > 1:
      split = config.batch_size // (p.micro_batches if cls.synchronous else 1)
      if split % p.data_parallel:
        fail('pipeline.data_parallel', f'{p.data_parallel} devices per stage do not divide the '
             + (f'micro-batch of {split} (batch_size {config.batch_size} / {p.micro_batches} micro-batches)'
                if cls.synchronous else f'batch of {split}') + '; choose D dividing it')
      for field, value, why in (('num_devices', p.num_devices, 'every stage has D devices of its own (K x D in '
                                 'all); leave pipeline.num_devices at 0'),
                                ('diagnose_every_steps', p.diagnose_every_steps, 'the diagnostics compare one '
                                 'device per stage with BP; leave it at 0 with data_parallel > 1')):
        if value:
          fail(f'pipeline.{field}', why)
    if p.corrector not in CORRECTORS:
      fail('pipeline.corrector', f'{p.corrector!r} is not allowed; choose one of: {", ".join(CORRECTORS)}')
    if cls.keep == 'replay' and p.corrector not in ('none', 'pipemare_lr'):
      fail('pipeline.corrector', f'{cls.name} replays its forward with its current parameters, so nothing is stale '
           "in them to predict or compensate; only 'pipemare_lr' applies")
    if p.corrector != 'none' and p.num_stages == 1:
      fail('pipeline.corrector', 'with pipeline.num_stages=1 no stage is delayed, so there is nothing to correct; '
           "use at least 2 stages, or leave it at 'none'")
    default = get_default_config().pipeline
    for field, owner in CORRECTOR_FIELDS.items():  # a setting of another corrector than the one chosen
      if p[field] != default[field] and p.corrector != owner:
        fail(f'pipeline.{field}', f"is a setting of corrector '{owner}', and pipeline.corrector={p.corrector!r} "
             f"ignores it: set pipeline.corrector={owner}, or leave it at {default[field]!r}")
    if not p.dc_lambda >= 0:
      fail('pipeline.dc_lambda', f'must be non-negative, got {p.dc_lambda}')
    if not p.lr_anneal_epochs > 0:
      fail('pipeline.lr_anneal_epochs', f'must be positive, got {p.lr_anneal_epochs}')
    if p.corrector == 'nesterov' and config.optim.name != 'sgd':
      fail('pipeline.corrector', f"'nesterov' is AsyncPP's update rule and replaces the optimizer on the delayed "
           f"stages; with optim.name={config.optim.name!r} use another corrector, or NAdamW itself "
           "(optim.name=adamw, optim.nesterov=true, optim.b1=0.99, optim.momentum_decay=0.004: PyTorch's NAdam, "
           "what AsyncPP's code runs)")
    if not 0 <= p.nesterov_gamma < 1:
      fail('pipeline.nesterov_gamma', f'must be in [0, 1), got {p.nesterov_gamma}')
    if not p.nesterov_lr_scale > 0:
      fail('pipeline.nesterov_lr_scale', f'must be positive (1: AsyncPP\'s eq. 10; 1 / (1 - optim.momentum): '
           f'SGD\'s steady step), got {p.nesterov_lr_scale}')
    blocks = len(build_model(config.model, 10).block_names)
    if p.num_stages > blocks:
      fail('pipeline.num_stages', f'{config.model} has {blocks} blocks, so at most {blocks} stages')

  def __init__(self, setup: Setup):
    super().__init__(setup)
    p = setup.config.pipeline
    available = list(setup.devices)
    n = p.num_devices or min(p.num_stages, len(available))
    if n > len(available):
      fail('pipeline.num_devices', f'{n} devices asked for but only {len(available)} present')
    self._devices = available[:n]
    if p.data_parallel > 1:  # K x D devices, stage k on the k-th D of them
      need = p.num_stages * p.data_parallel
      if need > len(available):
        fail('pipeline.data_parallel', f'{p.num_stages} stages x {p.data_parallel} devices = {need} devices, but only '
             f'{len(available)} are present; lower K or D, or add devices (--config.cpu_devices={need} on a CPU)')
      self._devices = available[:need]
    if jax.process_count() > 1:  # every process must drive a stage, or it would only wait
      D = p.data_parallel
      owners = {self._devices[k * D if D > 1 else k % n].process_index for k in range(p.num_stages)}
      if len(owners) < jax.process_count():
        idle = sorted(set(range(jax.process_count())) - owners)
        fail('pipeline.num_stages', f'{p.num_stages} stages on {n} devices ({len(available)} in all, '
             f'{jax.local_device_count()} per process) leave process(es) {idle} of {jax.process_count()} without '
             'a stage; use at least as many stages as processes, or fewer processes')
    self.pipeline: Pipeline | None = None  # built at init, when the input shape is known
    if (note := beta_note(setup.config)) and jax.process_index() == 0:
      logging.warning(note)

  def _build(self, example: Batch) -> Pipeline:
    p = self.setup.config.pipeline
    try:
      split = choose_split(self.setup.model, p.num_stages, self.setup.config.pipeline.split, example.images.shape[1:])
    except ValueError as e:
      fail('pipeline.split', str(e))
    s = self.setup
    corrector = Corrector(p.corrector, 0, 0, p.dc_lambda, max(1, round(p.lr_anneal_epochs * s.steps_per_epoch)),
                          p.nesterov_gamma, s.config.optim.weight_decay, p.nesterov_lr_scale)
    return Pipeline(s.model, split, self.schedule(p.num_stages), self._devices, keep=self.keep or p.keep,
                    beta=p.beta, optimizer=s.optimizer, lr=s.schedule,
                    inputs=lambda images, step: train_inputs(images, step, s.config.seed, s.preprocess),
                    split_backward=use_split_backward(s.config), corrector=corrector,
                    data_parallel=p.data_parallel)

  def train_batch(self, x, y, order, step: int) -> Batch:
    """Streamed images are read and decoded only by the process that owns stage 0's device: the others
    hold stage 0's arrays as shapes only, and the labels travel up with the activations."""
    if y is None and jax.process_count() > 1 and not is_local(self._devices[0]):
      return Batch(np.zeros((order.batch_size, *x.shape[1:]), x.dtype), np.zeros(order.batch_size, np.int32))
    return super().train_batch(x, y, order, step)

  def init(self, rng: jax.Array, example: Batch):
    self.pipeline = self._build(example)
    return self.pipeline.init(rng, example)

  def step(self, state, batch: Batch, step: int):
    return self.pipeline.step(state, batch, step)

  def profiled_step(self, state, batch: Batch, step: int):
    state, metrics, seconds, passes = pipeline_accounting.timed_step(self.pipeline, state, batch, step)
    profile = {f'stage{k}_seconds': round(s, 5) for k, s in seconds.items()}  # across processes: this one's
    profile.update({f'stage{k}_sends_mb': round(b / 1e6, 4)
                    for k, b in enumerate(self.pipeline.message_bytes)})
    if jax.process_count() == 1:  # the measured bubble needs every stage's times
      profile.update(timeline.summary(passes, self.pipeline.schedule.num_stages), timeline=passes)
    return state, metrics, profile

  @functools.cached_property
  def _diagnosis(self) -> Diagnosis:
    """Each stage's applied gradient against BP's, compiled once for this pipeline (pipeline/diagnose.py)."""
    return Diagnosis(self.pipeline)

  def diagnose(self, state, batch_of, step: int):
    return self._diagnosis(state, batch_of, step)

  def eval_variables(self, state):
    return self.pipeline.eval_variables(state)

  def describe(self, state) -> list[str]:
    return pipeline_accounting.describe(self.pipeline, state)
