"""The one interface every training method implements; train.py knows nothing else about a method.

A method's state is a pytree of arrays with a structure fixed at ``init`` (ring buffers pre-filled),
so checkpoints can save and restore it as it is. The global step is kept by the training loop and
passed to ``step`` as a host integer: methods may branch on it in Python (e.g. pipeline fill)
without ever reading a value back from a device.
"""
from __future__ import annotations

import abc
from typing import Any, ClassVar

import jax

from jaxdecouple.common import Setup, classification_loss  # noqa: F401  (part of this interface)
from jaxdecouple.data import Batch
from jaxdecouple.config import get_default_config
from jaxdecouple.errors import fail

# replica fields that change what a worker sends or how a round's average is applied: a method without the
# replica engine refuses them rather than ignoring them (its other replica fields are harmless sizes)
REPLICA_EXCHANGE_FIELDS = ('outer_lr', 'outer_momentum', 'outer_nesterov', 'compress', 'quantize_bits', 'sparsify',
                           'error_feedback', 'update_exchange', 'worker_speeds')


class Method(abc.ABC):
  name: ClassVar[str]
  scans_blocks: ClassVar[bool] = True  # whether config.scan_blocks applies (the replica engine unrolls)
  pipelined: ClassVar[bool] = False  # a configuration of the pipeline engine (stages on devices)
  transfers: ClassVar[bool] = False  # sends arrays between devices of different processes (jax.device_put)
  replicated: ClassVar[bool] = False  # a configuration of the replica engine (workers that average)

  def __init__(self, setup: Setup):
    self.setup = setup

  @classmethod
  def validate(cls, config) -> None:
    """This method's own config checks (its sections; raise ConfigError with ``errors.fail``), before any
    compute. Subclasses add theirs and call this one."""
    d = config.distributed
    if d.coordinator == 'auto' and cls.transfers and not d.transfer_address:
      fail('distributed.transfer_address', f"is required with coordinator='auto' for {cls.name}: HOST:PORT where "
           "this process receives what the other processes send it")
    if config.pipeline.corrector != 'none' and not cls.pipelined:
      fail('pipeline.corrector', f'corrects the staleness of a pipeline stage\'s gradient; {cls.name} has no '
           "delayed stage (use a pipeline method with delays, or leave it at 'none')")
    if config.pipeline.diagnose_every_steps and not cls.pipelined:
      fail('pipeline.diagnose_every_steps', f'compares a pipeline stage\'s gradient with back-propagation\'s; '
           f'{cls.name} has no stages (use a pipeline method, or leave it at 0)')
    if not cls.replicated:  # what only the replica engine reads would otherwise be ignored without a word
      default = get_default_config().replica
      for field in REPLICA_EXCHANGE_FIELDS:
        if config.replica[field] != default[field]:
          fail(f'replica.{field}', f'sets how replica workers (resist, localsgd) exchange their rounds; {cls.name} '
               f'has no workers or rounds, so it would be ignored: leave it at {default[field]!r}')

  @abc.abstractmethod
  def init(self, rng: jax.Array, example: Batch) -> Any:
    """The initial state, placed on its devices."""

  def state_at(self, initial: Any, step: int) -> Any:
    """A state shaped as this method's state at ``step`` (what a checkpoint of that step restores into);
    ``initial`` is the state ``init`` gave. The same for every step unless a method changes layout
    (ResIST after a local SGD warm-up)."""
    return initial

  @abc.abstractmethod
  def step(self, state: Any, batch: Batch, step: int) -> tuple[Any, dict[str, jax.Array]]:
    """One training iteration. Metrics are device scalars (read back only every few steps)."""

  @abc.abstractmethod
  def eval_variables(self, state: Any) -> dict[str, Any]:
    """The whole network as one Flax variable dict, for evaluation."""

  def train_batch(self, x, y, order, step: int) -> Batch:
    """The host batch of a step; replica methods stack one batch per worker from their own orders."""
    return order.batch(x, y, step)

  def predict_fn(self):
    """``(variables, images) -> logits`` for evaluation, jit-able, with ``eval_variables``' output.
    Default: the model in evaluation mode (running BatchNorm statistics), as a hashable ``Predict``, so runs of
    one network share the evaluator's program."""
    return self.setup.model.predict(train=False)

  # True when predictions depend on the batch (BatchNorm with batch statistics at test time): the
  # evaluator then never pads a batch.
  eval_uses_batch_statistics: bool = False

  def profiled_step(self, state: Any, batch: Batch, step: int) -> tuple[Any, dict, dict]:
    """``step`` plus what it cost (e.g. seconds per stage); may wait for the devices, so the loop
    calls it only every ``profile_every_steps`` steps. Default: no breakdown."""
    state, metrics = self.step(state, batch, step)
    return state, metrics, {}

  def diagnose(self, state: Any, batch_of, step: int) -> dict[str, float]:
    """Called before ``step`` every ``pipeline.diagnose_every_steps`` steps; ``batch_of(m)`` is the host
    batch of step m. Returns figures for a ``kind: "diagnose"`` line (pipeline methods: each stage's
    gradient against back-propagation's). Default: none."""
    return {}

  def describe(self, state: Any) -> list[str]:
    """Lines logged once at start (split, devices, delays, parameter counts...)."""
    return []
