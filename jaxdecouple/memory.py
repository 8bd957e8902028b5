"""Peak device memory, where the backend counts it."""
from __future__ import annotations


def peak_memory(devices) -> dict[str, float]:
  """Peak bytes in use per device, where the backend reports it (GPUs and TPUs; not the CPU)."""
  out = {}
  for d in devices:
    try:
      stats = d.memory_stats() or {}
    except Exception:  # some backends raise instead of returning None
      stats = {}
    if 'peak_bytes_in_use' in stats:
      out[f'peak_memory_gb_{d.platform}{d.id}'] = round(stats['peak_bytes_in_use'] / 2**30, 3)
  return out
