"""What a replica run stores and sends, for the start-up log: measured figures and the paper's model.

Measured: the bytes resident on each device (``Replica.resident_bytes``, from the arrays' shards) and
each round's traffic (``Replica.last_traffic``, from the arrays handed to the transfers and collectives).
Beside them, labelled a model, the ResIST paper's Table 1 count of a round's bytes.
"""
from __future__ import annotations

import jax
import numpy as np

from jaxdecouple.replica.engine import Replica
from jaxdecouple.replica.layout import ReplicaState


def traffic_model(engine: Replica, params, round_index: int, bytes_per_param: float = 4.0) -> dict[str, float]:
  """A model (a formula, not a measurement) of the bytes of one round as the paper's Table 1 counts
  them: each worker sends what it trained (shared layers and its blocks of this round) and receives
  its network for the next round; everything for local SGD. Every parameter is counted at
  ``bytes_per_param`` (float32), or at the A.5 codec's rate where it travels encoded, the same rate
  both ways (what is received is what was sent): with compressed weights every parameter, with
  compressed updates the shared layers only (a block changing owner travels whole, outer.py). With outer
  momentum a block's momentum travels with it, one float32 more per block parameter each way; with the SGD
  momentum averaged (``momentum='average'``) it is averaged as its parameters are, one float32 more per
  parameter, shared or not. The measured figures: ``last_traffic``."""
  spec, layout = engine.spec, engine.layout
  shared, blocks = layout.parameter_counts(params)
  sizes = np.array([blocks[n] for n in layout.partitioned], np.float64)
  now, nxt = layout.membership(round_index), layout.membership(round_index + 1)
  if not layout.partitioned:
    now = nxt = np.zeros((spec.num_workers, 0), bool)
  encoded = bytes_per_param * (spec.quantize_bits / 32 if spec.quantize_bits else 1.0)
  if spec.sparsify:  # the kept values and their int32 indices
    encoded = spec.sparsify * (encoded + 4)
  shared_rate = encoded if spec.compresses else bytes_per_param
  block_rate = encoded if spec.compresses and spec.compress == 'weights' else bytes_per_param
  if spec.outer_momentum and spec.average:  # the block's outer momentum rides along, float32
    block_rate += bytes_per_param
  if spec.momentum == 'average' and spec.average:  # SGD's momentum too, averaged like its parameter, float32
    shared_rate += bytes_per_param
    block_rate += bytes_per_param
  sent = [shared * shared_rate + float(sizes @ now[w]) * block_rate for w in range(spec.num_workers)]
  received = [shared * shared_rate + float(sizes @ nxt[w]) * block_rate for w in range(spec.num_workers)]
  return {'sent_per_worker': float(np.mean(sent)), 'received_per_worker': float(np.mean(received)),
          'total': float(np.sum(sent) + np.sum(received))}


def describe(engine: Replica, state: ReplicaState) -> list[str]:
  """Lines for the start-up log: workers and devices, the partition, what each device stores (measured)
  and a round's bytes (the paper's count, labelled a model; the measured ones are logged each round)."""
  s, layout = engine.spec, engine.layout
  network = layout.network_shapes(state.params)
  shared, blocks = layout.parameter_counts(network)
  devices = engine.mesh.devices.size
  lines = [f'{s.num_workers} workers on {devices} device{"s" if devices > 1 else ""} ({engine.per_device} per device), '
           f'{s.local_steps} local iterations per round, batch {s.batch_size} per worker, '
           f'momentum {s.momentum}, BatchNorm {s.batch_norm} statistics'
           + (f' (the shared layers\' running statistics averaged every {s.stats_every} rounds)' if s.stats_every > 1
              else '')]
  if s.average and (s.outer_lr != 1 or s.outer_momentum):
    lines.append(f'  outer step (DiLoCo) at the end of each round: lr {s.outer_lr}, momentum {s.outer_momentum}'
                 f'{" (Nesterov)" if s.outer_nesterov and s.outer_momentum else ""}')
  if s.compresses:
    codec = ' and '.join(([f'{s.quantize_bits}-bit'] if s.quantize_bits else [])
                         + ([f'the largest {s.sparsify:g} kept'] if s.sparsify else []))
    lines.append(f'  compressed updates of the shared layers: {codec}, error feedback '
                 f'{"on" if s.error_feedback else "off"}, exchanged by {s.update_exchange}' if s.compress == 'updates'
                 else f'  compressed weights (the paper\'s A.5): {codec}')
  if layout.partitioned:
    groups = ', '.join(f'{g.names[0]}..{g.names[-1]}' if len(g.names) > 1 else g.names[0] for g in layout.groups)
    slots = ' + '.join(str(g.slots) for g in layout.groups)
    line = (f'  partitioned: {len(layout.partitioned)} blocks ({groups}, {sum(blocks.values()) / 1e6:.2f}M params); '
            f'shared: {shared / 1e6:.2f}M params; each worker holds the shared layers and {slots} block slots')
    if isinstance(state.membership, jax.Array) and state.membership.is_fully_addressable:
      sizes = np.asarray(jax.device_get(state.membership)).sum(axis=1)
      line += f'; blocks per worker this round: {", ".join(map(str, sizes))}'
    lines.append(line)
  held = engine.resident_bytes(state)
  kept = {'anchor': 'anchor', 'momentum': 'outer momentum', 'error': 'unsent error'}
  outer = ''.join(f', {name}' for key, name in kept.items() if key in state.outer)
  lines.append(f'  stored on each of this process\'s devices (parameters, statistics, momentum{outer}; measured): '
               + ', '.join(f'{d}: {b / 1e6:.1f} MB' for d, b in held.items()))
  if s.average:
    model = traffic_model(engine, network, 0)
    full = 2 * (shared + sum(blocks.values())) * 4 * s.num_workers
    how = (' as encoded on the wire' if s.compresses else '') + (
        ', blocks with their outer momentum' if s.outer_momentum and layout.partitioned else '')
    lines.append(f'  communication per round, model (Table 1\'s count{how}): {model["total"] / 1e9:.3f} GB for all '
                 f'workers ({model["sent_per_worker"] / 1e6:.1f} MB sent, {model["received_per_worker"] / 1e6:.1f} '
                 f'MB received per worker; local SGD: {full / 1e9:.3f} GB); measured figures are logged each '
                 'round as sent_mb, received_mb, all_reduce_mb, collective_received_mb')
  return lines
