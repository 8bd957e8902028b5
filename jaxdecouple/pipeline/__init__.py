"""Depth-wise engine: stage splits, placement, ring buffers, per-stage steps and the lock-step driver."""
from jaxdecouple.pipeline.engine import KEEPS, Pipeline, PipelineSpec, PipelineState, StageState
from jaxdecouple.pipeline.splits import REFERENCE_SPLITS, Split, balanced_boundaries, choose_split

__all__ = ['KEEPS', 'Pipeline', 'PipelineSpec', 'PipelineState', 'StageState', 'REFERENCE_SPLITS',
           'Split', 'balanced_boundaries', 'choose_split']
