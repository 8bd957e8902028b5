"""FDG: fully decoupled training with delayed gradients (Zhuang et al., Algorithm I).

Stage k back-propagates a gradient 2(K-1-k) iterations old, shrunk by beta, then updates, then
forwards its new input; the last stage is plain SGD. K = 1 is back-propagation. That is the pipeline
engine's schedule with nothing changed (jaxdecouple/pipeline/schedule.py derives the delays).
"""
from jaxdecouple.methods.pipelined import PipelineMethod


class FDG(PipelineMethod):
  name = 'fdg'
