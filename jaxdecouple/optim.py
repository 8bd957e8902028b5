"""Optimizers from optax (SGD with PyTorch's semantics by default; AdamW, LAMB, LARS, Muon), milestone
decays and warm-up.

The learning rate is a pure function of the global iteration, passed into each update, rather than
of an optimizer's own step count: pipeline stages start updating at different iterations but must
all use the learning rate of the current iteration. So every optimizer is the optax chain of its
direction (built with learning rate 1) followed by ``scale_by_step_learning_rate``, which multiplies by
minus the step's rate given as an optax extra argument; optax applies the whole update
(``optax.apply_updates``). For SGD, AdamW, LAMB and Muon the rate enters optax's alias last and linearly, so
this is the alias with that rate (AdamW's decoupled weight decay included); optax's LARS applies the rate
before its momentum, this one after (PyTorch's convention): the same while the rate is constant. AdamW with
``nesterov`` is optax's NAdamW, or with ``momentum_decay`` > 0 PyTorch's NAdam (``scale_by_torch_nadam``).
"""
from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
from jax import lax
import jax.numpy as jnp
import optax
from optax import contrib

from jaxdecouple.errors import fail

WARMUPS = ('none', 'constant', 'linear')
OPTIMIZERS = ('sgd', 'adamw', 'lamb', 'lars', 'muon')
MUON_ENDS = ('muon', 'adam')  # optim.muon_ends: where Muon sends the kernels of the network's first and last blocks


class Optimizer(NamedTuple):
  """``update(grads, opt_state, params, lr) -> (params, opt_state)``: one optimizer step at rate ``lr``.

  SGD (the default): grad <- grad + weight_decay * param; buf <- momentum * buf + grad; param <- param - lr *
  buf (Nesterov: param <- param - lr * (grad + momentum * buf)), exactly torch.optim.SGD with dampening 0.
  """
  init: Callable[[Any], Any]
  update: Callable[..., tuple[Any, Any]]
  aux_head: 'Optimizer | None' = None  # a local auxiliary classifier's optimizer (DGL's; None: this one)

  @property
  def for_aux_head(self) -> 'Optimizer':
    """The optimizer of a stage's auxiliary classifier (DGL): this one, except with ``optim.muon_ends='adam'``,
    where a head is a classifier, an end of the network it trains, and goes wholly to Muon's Adam."""
    return self.aux_head if self.aux_head is not None else self


def scale_by_step_learning_rate() -> optax.GradientTransformationExtraArgs:
  """Multiplies the direction by ``-learning_rate``, the step's rate given as an extra argument."""
  def update(updates, state, params=None, *, learning_rate, **extra):
    del params, extra
    return jax.tree.map(lambda u: -learning_rate * u, updates), state
  return optax.GradientTransformationExtraArgs(lambda params: optax.EmptyState(), update)


def _stacked_axes(path) -> int:
  """Leading axes that stack several blocks' copies of a leaf: a scanned run ('first..last') or a ResIST
  worker's slots ('slots', 'slots_s1', ...)."""
  keys = [k.key for k in path if isinstance(k, jax.tree_util.DictKey) and isinstance(k.key, str)]
  return sum(1 for k in keys if '..' in k or k == 'slots' or k.startswith('slots_'))


def muon_dimensions(params, adam_blocks: frozenset[str] = frozenset()):
  """Muon orthogonalises the matrices a layer multiplies by: a kernel (dense (in, out), convolution (h, w, in,
  out)) as the (everything but out, out) matrix, stacked copies (a scanned run, a worker's slots) each on
  its own; every other leaf (biases, BatchNorm, embeddings) goes to Muon's Adam, and so does every leaf of the
  blocks named in ``adam_blocks`` (``optim.muon_ends='adam'``: the chain's first and last blocks, its stem or
  embedding and its classifier). Every optimizer here sees a tree keyed by block name at its top (a stage's,
  a replica worker's, BP's whole network), so a block is found by its name wherever the network is cut."""
  def dims(path, x):
    name = path[-1].key if path and isinstance(path[-1], jax.tree_util.DictKey) else None
    top = path[0].key if path and isinstance(path[0], jax.tree_util.DictKey) else None
    lead = _stacked_axes(path)
    if name != 'kernel' or x.ndim - lead < 2 or top in adam_blocks:
      return None
    return contrib.MuonDimensionNumbers(tuple(range(lead, x.ndim - 1)), x.ndim - 1)
  return jax.tree_util.tree_map_with_path(dims, params)


class TorchNAdamState(NamedTuple):
  count: jax.Array       # steps taken (int32)
  mu: Any                # first moment m
  nu: Any                # second moment v
  mu_product: jax.Array  # prod_{i <= t} mu_i (float32)


def scale_by_torch_nadam(b1: float, b2: float, eps: float, momentum_decay: float) -> optax.GradientTransformation:
  """PyTorch's NAdam direction (``torch.optim.NAdam``, its documented algorithm; Dozat, "Incorporating Nesterov
  Momentum into Adam", ICLR 2016 workshop, with the momentum schedule of Sutskever et al. 2013), learning rate
  1. At step t = 1, 2, ... with psi = ``momentum_decay``:

      mu_t = b1 (1 - 0.5 * 0.96^(t psi)),   mu_{t+1} likewise
      m_t = b1 m_{t-1} + (1 - b1) g_t,      v_t = b2 v_{t-1} + (1 - b2) g_t^2
      direction = [(1 - mu_t) g_t / (1 - prod_{i<=t} mu_i) + mu_{t+1} m_t / (1 - prod_{i<=t+1} mu_i)]
                  / (sqrt(v_t / (1 - b2^t)) + eps)

  Why beside optax's ``nadamw``: optax mixes the fresh gradient with the constant weight 1 - b1, PyTorch with
  1 - mu_t, and mu_t starts at b1 / 2 and reaches b1 only after thousands of steps (psi 0.004: mu is 0.57 b1 at
  step 1,000). AsyncPP's released code (PluralisResearch/AsyncPP, ``--optimizer nadamw --momentum 0.99``) runs
  PyTorch's; with b1 = 0.99 the two differ most: about half of PyTorch's early step is the fresh gradient,
  1% of optax's."""
  def init(params):
    zeros = lambda: jax.tree.map(jnp.zeros_like, params)
    return TorchNAdamState(jnp.zeros([], jnp.int32), zeros(), zeros(), jnp.ones([], jnp.float32))

  def update(updates, state, params=None):
    del params
    t = (state.count + 1).astype(jnp.float32)
    mu_now = b1 * (1.0 - 0.5 * 0.96 ** (t * momentum_decay))
    mu_next = b1 * (1.0 - 0.5 * 0.96 ** ((t + 1.0) * momentum_decay))
    product = state.mu_product * mu_now
    m = jax.tree.map(lambda m, g: b1 * m + (1.0 - b1) * g, state.mu, updates)
    v = jax.tree.map(lambda v, g: b2 * v + (1.0 - b2) * g * g, state.nu, updates)
    fresh, held = (1.0 - mu_now) / (1.0 - product), mu_next / (1.0 - product * mu_next)
    out = jax.tree.map(lambda g, m, v: (fresh * g + held * m) / (jnp.sqrt(v / (1.0 - b2 ** t)) + eps), updates, m, v)
    return out, TorchNAdamState(state.count + 1, m, v, product)

  return optax.GradientTransformation(init, update)


def direction(o, ends: tuple[str, ...] = (), aux_head: bool = False) -> list[optax.GradientTransformation]:
  """The optimizer's update direction with learning rate 1 (before the step's rate), from optax's own
  transforms and aliases. ``ends``: the names of the network's first and last blocks, which Muon leaves to its
  Adam with ``optim.muon_ends='adam'``; ``aux_head``: the direction of an auxiliary classifier (DGL's), every leaf of
  which that option sends to Muon's Adam (Muon's authors keep every classifier on AdamW)."""
  if o.name == 'sgd':  # torch.optim.SGD: L2 added to the gradient, then momentum
    return [optax.add_decayed_weights(o.weight_decay), optax.trace(decay=o.momentum, nesterov=o.nesterov)]
  if o.name == 'adamw' and o.get('momentum_decay', 0.0) > 0:  # PyTorch's NAdam, decoupled weight decay (AdamW's)
    return [scale_by_torch_nadam(o.b1, o.b2, o.eps, o.momentum_decay), optax.add_decayed_weights(o.weight_decay)]
  if o.name == 'adamw':
    tx = optax.adamw(1.0, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay, nesterov=o.nesterov)
  elif o.name == 'lamb':
    tx = optax.lamb(1.0, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay)
  elif o.name == 'lars':
    tx = optax.lars(1.0, weight_decay=o.weight_decay, trust_coefficient=o.trust_coefficient, momentum=o.momentum,
                    nesterov=o.nesterov)
  elif o.name == 'muon':
    ends_to_adam = o.get('muon_ends', 'muon') == 'adam'
    if ends_to_adam and not ends:  # a caller's slip, not a user's: never the default split in its place
      raise ValueError("optim.muon_ends='adam' needs the network's first and last block names (ends=...)")
    adam_blocks = frozenset(ends if ends_to_adam else ())
    dims = functools.partial(muon_dimensions, adam_blocks=adam_blocks)
    if aux_head and ends_to_adam:
      dims = lambda params: jax.tree.map(lambda _: None, params)
    tx = contrib.muon(1.0, ns_steps=o.ns_steps, beta=o.muon_beta, eps=o.eps, weight_decay=o.weight_decay,
                      nesterov=o.nesterov, adam_b1=o.b1, adam_b2=o.b2, adam_weight_decay=o.weight_decay,
                      muon_weight_dimension_numbers=dims)
  else:
    raise ValueError(f'unknown optimizer {o.name!r}; one of {", ".join(OPTIMIZERS)}')
  return [tx, optax.scale(-1.0)]  # the alias ends with -lr = -1: the step's rate adds the sign again


def validate(o) -> None:
  """The ``optim`` section's optimizer fields (the schedule's are config.py's): one line naming the field."""
  if o.name not in OPTIMIZERS:
    fail('optim.name', f'{o.name!r} is not allowed; choose one of: {", ".join(OPTIMIZERS)}')
  for field in ('momentum', 'b1', 'b2', 'muon_beta'):
    if not 0 <= o[field] < 1:
      fail(f'optim.{field}', f'must be in [0, 1), got {o[field]!r}')
  if o.decay_steps < 0 or (o.decay_steps and o.milestones):
    fail('optim.decay_steps', f'must be 0 (milestones) or positive with optim.milestones=() (the rate then falls '
         f'as 1 / sqrt(1 + t / decay_steps)), got {o.decay_steps} with milestones {tuple(o.milestones)}')
  for field in ('eps', 'trust_coefficient'):
    if not o[field] > 0:
      fail(f'optim.{field}', f'must be positive, got {o[field]!r}')
  if o.get('momentum_decay', 0.0) < 0:
    fail('optim.momentum_decay', f'must be at least 0 (0: optax\'s NAdamW; > 0: PyTorch\'s NAdam), got '
         f'{o.momentum_decay!r}')
  if o.get('momentum_decay', 0.0) > 0 and not (o.name == 'adamw' and o.nesterov):
    fail('optim.momentum_decay', f'is PyTorch\'s NAdam schedule: it needs optim.name=adamw and optim.nesterov=true, '
         f'got optim.name={o.name} and optim.nesterov={o.nesterov}; set optim.momentum_decay=0')
  if o.nesterov and o.name == 'lamb':
    fail('optim.nesterov', "optax's lamb has no Nesterov form (sgd, adamw, lars and muon do); leave it false with lamb")
  if o.get('muon_ends', 'muon') not in MUON_ENDS:
    fail('optim.muon_ends', f"{o.muon_ends!r} is not allowed; choose muon (every kernel, optax's default) or adam "
         "(the first and last blocks' kernels to Muon's Adam, as Muon's authors train)")
  if o.ns_steps < 1:
    fail('optim.ns_steps', f'must be at least 1 (Newton-Schulz iterations), got {o.ns_steps!r}')


# each optimizer's own hyper-parameters, as the start-up log names them (the schedule's are described apart)
HYPERPARAMETERS = {'sgd': ('momentum', 'nesterov'), 'adamw': ('b1', 'b2', 'eps', 'nesterov', 'momentum_decay'),
                   'lamb': ('b1', 'b2', 'eps'), 'lars': ('momentum', 'nesterov', 'trust_coefficient'),
                   'muon': ('muon_beta', 'ns_steps', 'nesterov', 'b1', 'b2', 'eps', 'muon_ends')}


def describe(o) -> str:
  """One start-up line: the optimizer with its own settings and weight decay, and the learning-rate schedule,
  so a run's log says what it trained with (the config file may set what the command line did not)."""
  own = ', '.join(f'{f} {o[f]}' for f in HYPERPARAMETERS[o.name] if f in o and (f != 'momentum_decay' or o[f]))
  if o.name == 'adamw' and o.get('momentum_decay', 0.0):
    own += " (PyTorch's NAdam)"
  if o.decay_steps:
    decay = f'lr {o.learning_rate} / sqrt(1 + t / {o.decay_steps})'
  elif o.milestones:
    decay = (f'lr {o.learning_rate}, x {o.decay_factor} at epoch{"s" if len(o.milestones) > 1 else ""} '
             f'{", ".join(str(m) for m in o.milestones)}')
  else:
    decay = f'lr {o.learning_rate} constant'
  warmup = {'none': '', 'constant': f'; warm-up at lr {o.warmup_lr} for {o.warmup_epochs} epochs',
            'linear': f'; warm-up from {o.warmup_factor} x lr over {o.warmup_epochs} epochs'}[o.warmup]
  return f'optimizer {o.name} ({own}, weight decay {o.weight_decay}); {decay}{warmup}'


def make_optimizer(optim_config, ends: tuple[str, ...] = ()) -> Optimizer:
  """``optim_config.name``'s optimizer; the step's learning rate is an argument of ``update``. ``ends``: the
  network's first and last block names (see ``direction``). Its ``for_aux_head`` trains auxiliary classifiers."""
  def build(aux_head: bool) -> Optimizer:
    tx = optax.chain(*direction(optim_config, ends, aux_head), scale_by_step_learning_rate())

    def update(grads, opt_state, params, lr):
      updates, opt_state = tx.update(grads, opt_state, params, learning_rate=jnp.asarray(lr, jnp.float32))
      return optax.apply_updates(params, updates), opt_state

    return Optimizer(tx.init, update)

  heads_apart = optim_config.name == 'muon' and optim_config.get('muon_ends', 'muon') == 'adam'
  return build(False)._replace(aux_head=build(True) if heads_apart else None)


def make_schedule(optim_config, steps_per_epoch: int) -> Callable[[jax.Array], jax.Array]:
  """Learning rate of global iteration ``step`` (a traced int is fine).

  Milestones are epochs at which the rate is multiplied by ``decay_factor``; or, with ``decay_steps`` > 0,
  the rate falls as lr / sqrt(1 + t / decay_steps) (a diminishing rate, as FDG's Theorem 1 assumes). Warm-up: 'constant'
  uses ``warmup_lr`` for the first ``warmup_epochs`` epochs (the FDG paper: 0.01 for 3 epochs);
  'linear' rises per iteration from ``warmup_factor * lr`` to ``lr`` over them (the ADL code).
  """
  base = optim_config.learning_rate
  boundaries = jnp.asarray([int(round(m * steps_per_epoch)) for m in optim_config.milestones] or [-1],
                           jnp.int32)
  has_milestones = bool(optim_config.milestones)
  warmup_steps = int(round(optim_config.warmup_epochs * steps_per_epoch))
  kind = optim_config.warmup
  decay_steps = float(optim_config.get('decay_steps', 0.0))

  def schedule(step):
    step = jnp.asarray(step, jnp.int32)
    if has_milestones:
      # lax.pow, as jnp's ** takes under jit: called eagerly, ** would read the exponent back to the host
      # (to specialise a concrete integer power), a wait for the device on every step that logs the rate
      passed = jnp.sum(step >= boundaries)
      lr = base * lax.pow(jnp.asarray(optim_config.decay_factor, jnp.float32), passed)
    else:
      lr = jnp.float32(base)
    if decay_steps:
      lr = base / jnp.sqrt(1.0 + step.astype(jnp.float32) / decay_steps)
    if kind == 'constant' and warmup_steps > 0:
      lr = jnp.where(step < warmup_steps, jnp.float32(optim_config.warmup_lr), lr)
    elif kind == 'linear' and warmup_steps > 0:
      start = optim_config.warmup_factor * base
      ramp = start + (base - start) * step.astype(jnp.float32) / warmup_steps
      lr = jnp.where(step < warmup_steps, ramp, lr)
    return jnp.asarray(lr, jnp.float32)

  return schedule
