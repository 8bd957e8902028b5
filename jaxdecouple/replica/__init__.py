"""The width-wise engine: workers, partitions, local rounds and averaging."""
from jaxdecouple.replica.engine import Replica, ReplicaSpec, ReplicaState, compress, masked_apply
from jaxdecouple.replica.partition import draw_partition, partitioned_blocks, slice_sizes, test_time_scale

__all__ = ['Replica', 'ReplicaSpec', 'ReplicaState', 'compress', 'draw_partition', 'masked_apply',
           'partitioned_blocks', 'slice_sizes', 'test_time_scale']
