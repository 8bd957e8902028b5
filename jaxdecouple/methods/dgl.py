"""DGL: decoupled greedy learning (Belilovsky et al.), the FDG and ADL papers' baseline.

Each stage but the last trains on the loss of its own auxiliary classifier (``models.AuxHead``, the
ADL code's head); stage inputs are detached, so no gradient crosses a stage boundary and nothing is
delayed. Stages are pipelined: stage k works on micro-batch t-k, the output stage k-1 produced one
iteration earlier. The auxiliary heads' parameters are the price of the method (logged at start);
evaluation runs the real network with its real head.
"""
from jaxdecouple.errors import fail
from jaxdecouple.methods.pipelined import PipelineMethod
from jaxdecouple.pipeline import Schedule


class DGL(PipelineMethod):
  name = 'dgl'

  @classmethod
  def validate(cls, config) -> None:
    super().validate(config)
    if config.pipeline.beta != 1.0:
      fail('pipeline.beta', f'DGL sends no gradient between stages, so beta has nothing to shrink; '
           f'leave it at 1.0 (got {config.pipeline.beta})')
    if config.pipeline.corrector != 'none':
      fail('pipeline.corrector', "DGL's stages learn from their own heads without delay, so nothing is stale to "
           "correct; leave it at 'none'")

  def schedule(self, num_stages: int) -> Schedule:
    return Schedule(num_stages, local_heads=True)
