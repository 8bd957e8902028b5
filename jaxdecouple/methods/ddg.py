"""DDG: decoupled parallel back-propagation (Huo et al.), the FDG paper's baseline.

The forward stays locked: micro-batch t goes through all stages in order during iteration t, with the
parameters each stage has before this iteration's update. The backward is decoupled: stage k
back-propagates, through the forward it kept, a gradient K-1-k iterations old, then updates.
"""
from jaxdecouple.methods.pipelined import PipelineMethod
from jaxdecouple.pipeline import Schedule


class DDG(PipelineMethod):
  name = 'ddg'

  def schedule(self, num_stages: int) -> Schedule:
    return Schedule(num_stages, forward_locked=True)
