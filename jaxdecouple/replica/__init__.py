"""The width-wise engine: workers, partitions, local rounds and averaging."""
from jaxdecouple.models.slots import SLOTS, SlotGroup, slot_apply
from jaxdecouple.replica.accounting import describe, traffic_model
from jaxdecouple.replica.engine import Replica, ReplicaSpec
from jaxdecouple.replica.layout import Layout, ReplicaState, slot_count
from jaxdecouple.replica.partition import draw_partition, partitioned_blocks, slice_sizes, test_time_scale
from jaxdecouple.replica.wire import compress

__all__ = ['Layout', 'Replica', 'ReplicaSpec', 'ReplicaState', 'SLOTS', 'SlotGroup', 'compress', 'describe',
           'draw_partition', 'partitioned_blocks', 'slice_sizes', 'slot_apply', 'slot_count', 'test_time_scale',
           'traffic_model']
