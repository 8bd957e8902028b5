"""FDG: fully decoupled training with delayed gradients (Zhuang et al., Algorithm I).

Stage k back-propagates a gradient 2(K-1-k) iterations old, shrunk by beta, then updates, then
forwards its new input; the last stage is plain SGD. K = 1 is back-propagation.
"""
from jaxdecouple.methods.pipelined import PipelineMethod
from jaxdecouple.pipeline import PipelineSpec


class FDG(PipelineMethod):
  name = 'fdg'

  def spec(self, num_stages: int) -> PipelineSpec:
    p = self.setup.config.pipeline
    delays = tuple(2 * (num_stages - 1 - k) for k in range(num_stages))
    return PipelineSpec(num_stages, delays, keep=p.keep, beta=p.beta)
