"""DDG: decoupled parallel back-propagation (Huo et al.), the FDG paper's baseline.

The forward stays locked: micro-batch t goes through all stages in order during iteration t, with the
parameters each stage has before this iteration's update. The backward is decoupled: stage k
back-propagates, through the forward it kept, a gradient K-1-k iterations old, then updates.
"""
from jaxdecouple.methods.pipelined import PipelineMethod
from jaxdecouple.pipeline import PipelineSpec


class DDG(PipelineMethod):
  name = 'ddg'

  def spec(self, num_stages: int) -> PipelineSpec:
    p = self.setup.config.pipeline
    delays = tuple(num_stages - 1 - k for k in range(num_stages))
    return PipelineSpec(num_stages, delays, keep=p.keep, beta=p.beta, forward_locked=True)
