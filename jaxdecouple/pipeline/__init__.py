"""Depth-wise engine: the schedule, stage splits, the stages' compiled steps and the driver."""
from jaxdecouple.pipeline.engine import Pipeline, PipelineState
from jaxdecouple.pipeline.schedule import Schedule
from jaxdecouple.pipeline.splits import (REFERENCE_SPLITS, Split, balanced_boundaries, block_seconds, choose_split,
                                         split_names, timed_split)
from jaxdecouple.pipeline.stage import KEEPS, AuxHeadState, StageState

__all__ = ['KEEPS', 'AuxHeadState', 'Pipeline', 'PipelineState', 'Schedule', 'StageState', 'REFERENCE_SPLITS',
           'Split', 'balanced_boundaries', 'block_seconds', 'choose_split', 'split_names', 'timed_split']
