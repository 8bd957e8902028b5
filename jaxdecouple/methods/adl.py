"""ADL: accumulated decoupled learning (Zhuang et al., ICML 2021).

FDG's pipeline and delays, plus gradient accumulation: every stage still back-propagates one delayed
gradient per iteration but sums M of them (counting from its own first gradient) into one optimizer
step, with the learning rate not divided by M. Staleness measured in updates drops from about d_k
to about d_k / M. Mode B (default): update, then forward the new micro-batch; mode A: forward with
the pre-update parameters. M = 1 in mode B is FDG.
"""
from jaxdecouple.errors import fail
from jaxdecouple.methods.pipelined import PipelineMethod
from jaxdecouple.pipeline import Schedule


class ADL(PipelineMethod):
  name = 'adl'
  accumulates = True

  @classmethod
  def validate(cls, config) -> None:
    super().validate(config)
    p = config.pipeline
    if p.accumulation < 1:
      fail('pipeline.accumulation', f'must be at least 1 (backwards summed per update), got {p.accumulation}')
    if p.adl_mode not in ('A', 'B'):
      fail('pipeline.adl_mode', f"{p.adl_mode!r} is not allowed; choose A (forward before the update) "
           "or B (update, then forward)")

  def schedule(self, num_stages: int) -> Schedule:
    p = self.setup.config.pipeline
    return Schedule(num_stages, accumulation=p.accumulation, forward_first=p.adl_mode == 'A')
