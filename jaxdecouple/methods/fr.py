"""FR: features replay (Huo et al.), the FDG paper's baseline.

Forward-locked like DDG, with delay K-1-k, but a stage keeps only its old inputs: when the delayed
gradient arrives it replays the forward of that input with its current parameters (in training mode,
so BatchNorm statistics move again) and back-propagates through the replay.
"""
from jaxdecouple.methods.ddg import DDG


class FR(DDG):
  name = 'fr'
  keep = 'replay'  # always its inputs, replayed: pipeline.keep is refused
