"""The staleness diagnosis: how far the gradient a stage applies is from plain back-propagation's.

A measurement beside training, not part of it: it reads the pipeline's state, updates nothing, waits for
the devices and costs about one forward and backward of the whole model per stage, so it lives apart from
the driver (``engine.py``) and runs only every ``pipeline.diagnose_every_steps`` steps.
"""
from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxdecouple.data import Batch

from jaxdecouple.pipeline.engine import Pipeline, PipelineState, Stage, StageState


def applied_gradients(stage: Stage, st: StageState, x, labels, step, slot: int):
  """The parameter gradient ``stage`` would apply at this iteration (times beta for a neighbour's),
  without updating anything."""
  if stage.source != 'neighbour':
    return stage.vjp(st.params, st.batch_stats, st.aux, stage.inputs(x, step), labels)[0](jnp.ones((), jnp.float32))[0]
  kept = st.ring[slot]
  if stage.keep != 'vjp':
    kept, _ = stage.recompute(kept, st.params, st.batch_stats)
  grads = stage.stash.unflatten(kept)(st.grad_inbox[0] * jnp.asarray(stage.beta, jnp.float32))[0]
  if stage.corrector is not None:  # what the update really takes (DC-ASGD's compensation)
    grads = stage.corrector.gradient(grads, st.params, st.corrector.then[slot] if st.corrector.then else ())
  return grads


class Diagnosis:
  """A pipeline's diagnosis, compiled once: BP's parameter gradients of the whole model on a batch, a
  stage's input from the stages below it (the forwards in training mode, as that micro-batch was
  augmented, nothing updated), and each stage's applied gradient."""

  def __init__(self, pipeline: Pipeline):
    self.pipeline = pipeline
    model, inputs, boundaries = pipeline.model, pipeline.inputs, pipeline.split.boundaries

    def bp_grads(variables, images, labels, step):
      def loss(params):
        logits, _ = model.apply({'params': params, 'batch_stats': variables['batch_stats']},
                                inputs(images, step), train=True)
        return model.loss(logits, labels)[0]
      return jax.grad(loss)(variables['params'])

    def below(variables, images, step, k):
      chain = model.chain.slice(0, boundaries[k - 1])
      return chain.apply(variables, inputs(images, step), train=True)[0]
    self.bp_grads, self.below = jax.jit(bp_grads), jax.jit(below, static_argnums=(3,))
    self.applied = [jax.jit(functools.partial(applied_gradients, stage), static_argnums=(4,))
                    for stage in pipeline.stages]

  def __call__(self, state: PipelineState, batch_of: Callable[[int], Batch], t: int) -> dict[str, float]:
    """Call before step t. For every stage that learns at iteration t: the cosine similarity and the
    norm ratio between the gradient it is about to apply (delayed and times beta, or from its own loss)
    and plain back-propagation's at every stage's current parameters on the same micro-batch."""
    p = self.pipeline
    s, out = p.schedule, {}
    variables = p.eval_variables(state)
    for k, (stage, st) in enumerate(zip(p.stages, state.stages)):
      m = s.backward_batch(k, t)
      if m is None or (not stage.delay and s.forward_batch(k, t) is None):
        continue
      batch = batch_of(m)
      images, labels = jax.device_put((batch.images, batch.labels), p.devices[0])
      if stage.delay or k == 0:
        x = images
      elif s.forward_locked:  # its input is made in this same iteration, with the current parameters
        x = self.below(variables, images, np.int32(m), k)
      else:
        x = st.inbox[0]
      mine = self.applied[k](st, jax.device_put(x, stage.device), jax.device_put(labels, stage.device),
                             np.int32(t), m % stage.delay if stage.delay else 0)
      full = self.bp_grads(variables, images, labels, np.int32(m))
      a, b = (jnp.concatenate([v.ravel() for v in jax.tree.leaves(g)])
              for g in jax.device_put((mine, {n: full[n] for n in mine}), p.devices[0]))
      cosine, ratio = jax.device_get((jnp.dot(a, b) / (jnp.linalg.norm(a) * jnp.linalg.norm(b)),
                                      jnp.linalg.norm(a) / jnp.linalg.norm(b)))
      out[f'stage{k}_cosine'], out[f'stage{k}_norm_ratio'] = round(float(cosine), 5), round(float(ratio), 5)
    return out
