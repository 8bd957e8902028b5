"""ResIST's repartition as real transfers: each partitioned block goes from the worker(s) that trained
it to the worker(s) that own it next round, and nothing else of the partitioned section moves.

A worker keeps its blocks in fixed slots; packed, each slot is one row (the block's parameters,
BatchNorm statistics and, when momentum is averaged, its momentum). The plan is computed on the host
from the two rounds' partitions, which every process derives from (seed, round) alone: for each pair of
devices, the rows one must send the other (each row once, even when two of the receiver's workers need
it). ``run`` sends them with ``jax.device_put`` (between processes: JAX's cross-process
transfer), then each device assembles its new slots from its own rows and those it received, averaging a
block over its previous owners when a minimum depth let several workers hold it. The bytes reported are
those of the arrays handed to ``jax.device_put`` between two different devices.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxdecouple.processes import meet


@dataclasses.dataclass(frozen=True)
class Plan:
  """One repartition. ``messages``: (source device, destination device, source rows), source rows
  as indices into the source device's rows. ``gather[d]``: for each row of device d's new slots, the
  indices of its copies in ``concat(own rows, received rows in message order)`` (padded with 0);
  ``counts[d]``: how many of them to average (0: an empty slot, zero)."""
  messages: tuple[tuple[int, int, tuple[int, ...]], ...]
  gather: np.ndarray   # (devices, rows per device, most owners of a block) int32
  counts: np.ndarray   # (devices, rows per device) int32


def slot_blocks(member: np.ndarray) -> list[np.ndarray]:
  """Each worker's partitioned blocks in slot order (chain order)."""
  return [np.flatnonzero(row) for row in member]


def plan(now: np.ndarray, nxt: np.ndarray, slots: int, per_device: int, coded: bool = False) -> Plan:
  """The transfers that take the partition ``now`` (S, P) to ``nxt``, workers ``per_device`` to a
  device, ``slots`` slots each. With ``coded`` (compression on the wire) a block that changes worker
  arrives through the codec even when both workers share a device (so placement never changes the
  numbers): a device's incoming rows are then its own rows, the same rows through the codec, then
  the received ones."""
  workers = now.shape[0]
  devices = workers // per_device
  rows = per_device * slots
  dev = lambda w: w // per_device
  local_row = lambda w, j: (w % per_device) * slots + j
  held = slot_blocks(now)
  where = {}  # block -> [(worker, slot)] that trained it this round
  for w, blocks in enumerate(held):
    for j, b in enumerate(blocks):
      where.setdefault(int(b), []).append((w, j))
  owners = max((len(v) for v in where.values()), default=1)
  wanted = [dict() for _ in range(devices)]  # destination -> {source device: [rows]}
  sources = [[[] for _ in range(rows)] for _ in range(devices)]  # (kind, device, row)
  for w2, blocks in enumerate(slot_blocks(nxt)):
    d = dev(w2)
    for j2, b in enumerate(blocks):
      for w, j in where[int(b)]:
        s, r = dev(w), local_row(w, j)
        if s != d:
          rows_from = wanted[d].setdefault(s, [])
          if r not in rows_from:
            rows_from.append(r)
        sources[d][local_row(w2, j2)].append((s, r + rows if coded and s == d and w != w2 else r))
  messages = []
  gather = np.zeros((devices, rows, owners), np.int32)
  counts = np.zeros((devices, rows), np.int32)
  for d in range(devices):
    offset, position = rows * (2 if coded else 1), {}
    for s in sorted(wanted[d]):
      messages.append((s, d, tuple(wanted[d][s])))
      for k, r in enumerate(wanted[d][s]):
        position[s, r] = offset + k
      offset += len(wanted[d][s])
    for i, copies in enumerate(sources[d]):
      counts[d, i] = len(copies)
      for k, (s, r) in enumerate(copies):
        gather[d, i, k] = r if s == d else position[s, r]
  return Plan(tuple(messages), gather, counts)


@jax.jit
def gather_mean(rows: jax.Array, index: jax.Array, count: jax.Array) -> jax.Array:
  """``out[i] = mean(rows[index[i, :count[i]]])``, zero where ``count[i]`` is 0. A block's copies are
  summed in owner order; one copy passes through bit-exact (selected, never multiplied by a weight)."""
  picked = rows[index]  # (n, owners, R)
  keep = (jnp.arange(index.shape[1]) < count[:, None])[..., None]
  total = jnp.sum(jnp.where(keep, picked, 0.0), axis=1)
  return jnp.where(count[:, None] > 0, total / jnp.maximum(count, 1)[:, None].astype(rows.dtype), 0.0)


@jax.jit
def _take(rows: jax.Array, index: jax.Array) -> jax.Array:
  return rows[index]


def _nothing_here(shape, dtype, device):
  """An array of ``shape`` on another process's ``device``: what this process names in a transfer it
  takes part in without holding the data."""
  return jax.make_array_from_single_device_arrays(shape, jax.sharding.SingleDeviceSharding(device), [],
                                                  dtype=dtype)


def run(rows: jax.Array, route: Plan, devices, codec=None) -> tuple[jax.Array, np.ndarray, np.ndarray]:
  """Carries out ``route`` on ``rows`` (global, one block per row, sharded over ``devices`` in order).
  With a ``codec`` (``wire.Codec``) the rows travel encoded (uint8) and are decoded where they arrive.
  Returns the new rows (same sharding) and the bytes each device sent and received."""
  local = {s.device: s.data for s in rows.addressable_shards}
  encode, decode, round_trip = codec.jitted if codec else (None, None, None)
  width, dtype = (codec.encoded_width, jnp.uint8) if codec else (rows.shape[1], rows.dtype)
  received = {d: [] for d in local}
  sent = np.zeros(len(devices), np.int64)
  got = np.zeros(len(devices), np.int64)
  for s, d, index in route.messages:
    src, dst = devices[s], devices[d]
    nbytes = len(index) * width * np.dtype(dtype).itemsize  # counted by every process: the plan is global
    sent[s] += nbytes
    got[d] += nbytes
    if src in local:
      piece = _take(local[src], jax.device_put(np.asarray(index, np.int32), src))
      piece = encode(piece) if codec else piece
    else:
      piece = _nothing_here((len(index), width), dtype, src)
    moved = jax.device_put(piece, dst)
    if dst in local:
      if src not in local:  # from another process: wait for it here, or a later program that donates
        moved.block_until_ready()  # the state can block for good (seen with gloo on CPU)
      received[dst].append(decode(moved) if codec else moved)
  out = []
  for shard in rows.addressable_shards:
    d = devices.index(shard.device)
    own = [shard.data, round_trip(shard.data)] if codec else [shard.data]
    incoming = jnp.concatenate([*own, *received[shard.device]])
    out.append(gather_mean(incoming, jax.device_put(route.gather[d], shard.device),
                           jax.device_put(route.counts[d], shard.device)))
  new = jax.make_array_from_single_device_arrays(rows.shape, rows.sharding, out)
  if any(devices[s].process_index != devices[d].process_index for s, d, _ in route.messages):
    meet('the repartition\'s transfers')  # no process starts its next program before every send arrived
  return new, sent, got
