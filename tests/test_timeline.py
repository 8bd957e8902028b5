"""The measured timeline (jaxdecouple/pipeline/timeline.py): its summary against a hand count, and the
host's share of an iteration read off real calls whose dispatch the test slows down on purpose."""
import time

import jax
import jax.numpy as jnp
import pytest

from jaxdecouple.pipeline import timeline


def test_summary_against_a_hand_count():
  passes = [{'stage': 0, 'label': 'F0', 'start': 1.0, 'end': 2.0, 'dispatched': 1.1},
            {'stage': 1, 'label': 'F0', 'start': 2.0, 'end': 4.0, 'dispatched': 1.5},
            {'stage': 0, 'label': 'B0', 'start': 4.0, 'end': 4.5, 'dispatched': 3.0}]
  out = timeline.summary(passes, 2)
  # span 1.0 -> 4.5 = 3.5; stage 0 busy 1.5, stage 1 busy 2.0; bubble 1 - 3.5 / (2 x 3.5) = 0.5;
  # the last dispatch returned at 3.0, 2.0 s into the span: host share 2 / 3.5
  assert out['span_s'] == 3.5 and out['stage0_busy_s'] == 1.5 and out['stage1_idle_s'] == 1.5
  assert out['bubble_measured'] == 0.5 and out['host_share'] == round(2 / 3.5, 4)


def test_a_slow_host_shows_as_host_share_and_idle_devices():
  """Two calls on one device with 0.3 s of host work between their dispatches: the device computes for
  milliseconds, so the measured bubble is large and the host's share of the span near 1; without the pause
  the host's share is what dispatching took."""
  f = jax.jit(lambda x: jnp.tanh(x @ x))
  x = jnp.ones((64, 64))
  jax.block_until_ready(f(x))  # compiled

  def iteration(record, pause):
    y = f(x)
    record(0, 'cpu', 'a', y, x)
    time.sleep(pause)
    z = f(y)
    record(1, 'cpu', 'b', z, y)
    return z

  _, slow = timeline.measure(lambda record: iteration(record, 0.3))
  out = timeline.summary(slow, 2)
  assert all(p['end'] >= p['dispatched'] >= 0 for p in slow)
  assert out['span_s'] >= 0.3 and out['host_share'] > 0.9
  assert out['stage0_busy_s'] + out['stage1_busy_s'] < 0.5 * out['span_s']  # what throughput.py calls host-bound
  _, fast = timeline.measure(lambda record: iteration(record, 0.0))
  assert timeline.summary(fast, 2)['span_s'] < out['span_s'] - 0.25
