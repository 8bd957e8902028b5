"""What methods and engines share: the run's setup, and compiling a forward and its backward apart."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax

from jaxdecouple.data import Preprocess
from jaxdecouple.models import Model
from jaxdecouple.models.objectives import classification_loss  # noqa: F401  (engines import it from here)
from jaxdecouple.optim import Optimizer


@dataclasses.dataclass(frozen=True)
class Setup:
  """Everything a method needs to build its state and steps."""
  config: Any
  model: Model
  preprocess: Preprocess
  optimizer: Optimizer
  schedule: Callable[[jax.Array], jax.Array]
  steps_per_epoch: int
  devices: Sequence[jax.Device]


def use_split_backward(config) -> bool:
  """Whether to compile a training step's forward and backward as two calls (see ``vjp_call``)."""
  if config.split_backward == 'auto':
    return jax.default_backend() == 'cpu'
  return config.split_backward == 'on'


class VjpStash:
  """Carries a vjp closure from one jitted call to another as a flat tuple of arrays.

  ``flatten`` runs inside the forward's trace and records the closure's tree structure;
  ``unflatten`` rebuilds the closure inside the backward's trace.
  """

  def __init__(self):
    self.treedef = None

  def flatten(self, vjp_fn) -> tuple:
    leaves, self.treedef = jax.tree.flatten(vjp_fn)
    return tuple(leaves)

  def unflatten(self, leaves):
    return jax.tree.unflatten(self.treedef, leaves)


def vjp_call(make: Callable, use: Callable, split: bool, donate: Sequence[int] = (),
             static: Sequence[int] = ()) -> Callable:
  """``use(*make(*args), *args)``, compiled as one call or, with ``split``, as two.

  ``make(*args) -> (vjp_fn, aux)`` runs a forward and returns its vjp; ``use(vjp_fn, aux, *args)``
  applies a cotangent and does the rest (an update). XLA:CPU runs a forward and backward compiled
  together about 2x slower than the same two compiled apart (ResNet-56, batch 128, 2 cores: 2.55 s
  against 1.18 s; docs/PERFORMANCE.md), so on the CPU ``split`` compiles ``make`` alone, returning its
  vjp's residuals as arrays, and ``use`` alone; elsewhere one call is better. ``donate`` and ``static``
  are positions in ``args`` (donated to the call that uses them last). The result's ``calls`` is 1 or 2.
  """
  if not split:
    fused = jax.jit(lambda *args: use(*make(*args), *args), donate_argnums=tuple(donate),
                    static_argnums=tuple(static))
    call = lambda *args: fused(*args)
    call.calls = 1
    return call
  stash = VjpStash()

  def forward(*args):
    vjp_fn, aux = make(*args)
    return stash.flatten(vjp_fn), aux

  def backward(residuals, aux, *args):
    return use(stash.unflatten(residuals), aux, *args)

  forward = jax.jit(forward, static_argnums=tuple(static))
  backward = jax.jit(backward, donate_argnums=tuple(d + 2 for d in donate),
                     static_argnums=tuple(s + 2 for s in static))
  call = lambda *args: backward(*forward(*args), *args)
  call.calls = 2
  return call
