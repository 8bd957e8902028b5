"""The width-wise engine: workers, partitions, local rounds and averaging."""
from jaxdecouple.replica.engine import Replica, ReplicaSpec, ReplicaState, SLOTS, slot_apply
from jaxdecouple.replica.wire import compress
from jaxdecouple.replica.partition import draw_partition, partitioned_blocks, slice_sizes, test_time_scale

__all__ = ['Replica', 'ReplicaSpec', 'ReplicaState', 'SLOTS', 'compress', 'draw_partition', 'slot_apply',
           'partitioned_blocks', 'slice_sizes', 'test_time_scale']
