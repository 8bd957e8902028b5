"""FR: features replay (Huo et al.), the FDG paper's baseline.

Forward-locked like DDG, with delay K-1-k, but a stage keeps only its old inputs: when the delayed
gradient arrives it replays the forward of that input with its current parameters (in training mode,
so BatchNorm statistics move again) and back-propagates through the replay.
"""
from jaxdecouple.methods.pipelined import PipelineMethod
from jaxdecouple.pipeline import PipelineSpec


class FR(PipelineMethod):
  name = 'fr'
  allowed_keeps = ('vjp', 'recompute', 'replay')  # ignored: FR always keeps its inputs and replays

  def spec(self, num_stages: int) -> PipelineSpec:
    delays = tuple(num_stages - 1 - k for k in range(num_stages))
    return PipelineSpec(num_stages, delays, keep='replay', beta=self.setup.config.pipeline.beta,
                        forward_locked=True)
