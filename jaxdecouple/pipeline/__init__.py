"""Depth-wise engine: the schedule, stage splits, the stages' compiled steps and the driver."""
from jaxdecouple.pipeline.engine import KEEPS, Pipeline, PipelineState, StageState
from jaxdecouple.pipeline.schedule import Schedule
from jaxdecouple.pipeline.splits import REFERENCE_SPLITS, Split, balanced_boundaries, choose_split

__all__ = ['KEEPS', 'Pipeline', 'PipelineState', 'Schedule', 'StageState', 'REFERENCE_SPLITS', 'Split',
           'balanced_boundaries', 'choose_split']
