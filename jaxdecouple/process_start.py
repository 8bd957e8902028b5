"""Joining a multi-process run before JAX computes, bounded, with one line for what goes wrong.

``jax.distributed.initialize`` waits for every process in C++ and, past its own deadline, aborts the
interpreter (exit -6, "DEADLINE_EXCEEDED ... RegisterTask", after 300 s by default); a coordinator port in use
crashes it (exit -11). So the ports are tried first, and the join runs in a thread the main thread watches:
past ``distributed.startup_timeout_s`` (before JAX's own deadline) or on Ctrl-C it stops the process with one
line (exit 2, or 130 on Ctrl-C). ``transfer_address`` is where this process receives pipeline messages and
ResIST's blocks.
"""
from __future__ import annotations

import os
import socket
import sys
import threading
import types
import time

import jax
from absl import logging

from jaxdecouple.errors import ConfigError


def check_port_free(address: str, field: str, what: str) -> None:
  """Stops with one line if the port of ``address`` (HOST:PORT) is in use here by another program. Tried on
  every interface, as the coordinator listens ([::]:PORT): HOST may be a name this host is reached by."""
  port = address.rsplit(':', 1)[1]
  with socket.socket() as s:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind: a port left in TIME_WAIT is free
    try:
      s.bind(('', int(port)))
    except OSError as e:
      raise ConfigError(f'config.{field}: {address} ({what}) cannot be listened on: {e.strerror or e}; pick a free '
                        'port (or stop the program using it)') from None


def stop_now(line: str, code: int) -> None:
  """One line on stderr and out at once: JAX's join cannot be interrupted, and its deadline aborts."""
  logging.flush()
  print(f'error: {line}', file=sys.stderr, flush=True)
  sys.stdout.flush()
  os._exit(code)


def join_bounded(d, stopping: str = '') -> None:
  """``jax.distributed.initialize`` in a thread, watched: every process must join within
  ``d.startup_timeout_s``; Ctrl-C stops the wait. ``stopping``: the line of a process that joins only to tell
  the others why it stops (``stop_before_work``); a wait that ends early ends with that line."""
  # how soon JAX's coordination service declares a silent process dead and aborts the others: after our own
  # watch (liveness.py) has stopped them with a line, at distributed.heartbeat_timeout_s
  beat = int(round(2 * d.heartbeat_timeout_s)) + 10
  # JAX's own deadline comes after ours, so that ours (one line) is the one that fires
  kwargs = {'heartbeat_timeout_seconds': beat, 'initialization_timeout': int(d.startup_timeout_s) + 60}
  if d.coordinator != 'auto':
    kwargs.update(coordinator_address=d.coordinator, num_processes=d.num_processes, process_id=d.process_id)
  done, failed = threading.Event(), []

  def join():
    try:
      jax.distributed.initialize(**kwargs)
    except BaseException as e:  # noqa: BLE001  handed to the main thread
      failed.append(e)
    finally:
      done.set()
  logging.info('joining the run at %s as process %d of %d (waiting at most %g s for the others)', d.coordinator,
               d.process_id, d.num_processes, d.startup_timeout_s)
  threading.Thread(target=join, name='join-distributed', daemon=True).start()
  deadline = time.monotonic() + d.startup_timeout_s
  where = 'the coordinator' if d.coordinator == 'auto' else f'the coordinator at {d.coordinator}'
  try:
    while not done.wait(0.2):
      if time.monotonic() > deadline:
        if stopping:
          stop_now(stopping, 2)
        stop_now(f'config.distributed: not every one of the {d.num_processes} processes joined {where} within '
                 f'{d.startup_timeout_s:g} s (this is process {d.process_id}); start every process with the same '
                 '--config.distributed.coordinator and num_processes, or raise distributed.startup_timeout_s', 2)
  except KeyboardInterrupt:
    stop_now(f'{stopping + "; " if stopping else ""}interrupted while waiting for the other processes to join '
             f'{where}', 130)
  if failed:
    raise ConfigError(f'config.distributed: joining {where} failed: {str(failed[0]).splitlines()[0][:200]}') \
        from None


def transfer_address(d) -> str:
  """Where this process receives transfers (pipeline messages, ResIST's blocks) from other processes: ``d.transfer_address``, or this
  host's address on the route to the coordinator, port = the coordinator's + 1 + process id."""
  if d.transfer_address:
    return d.transfer_address
  host, port = d.coordinator.rsplit(':', 1)
  with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # no packet is sent: it only picks the route
    try:
      s.connect((host, int(port)))
      here = s.getsockname()[0]
    except OSError:
      here = socket.gethostbyname(socket.gethostname())
  return f'{here}:{int(port) + 1 + d.process_id}'


def start_processes(d, transfers: bool = False, stopping: str = '') -> None:
  """Joins a multi-process run (config.distributed) before JAX computes anything; on CPUs the
  collectives between processes go through gloo; pipeline stages in different processes send their
  messages, and ResIST its blocks, with JAX's cross-process transfers, which listen on ``transfer_address``."""
  if not d.coordinator or jax.distributed.is_initialized():
    return
  if jax.config.jax_platforms in (None, '', 'cpu'):
    jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  if transfers and (d.transfer_address or d.coordinator != 'auto'):  # with 'auto', only when given
    jax.config.update('jax_cross_host_transfer_socket_address', transfer_address(d))
  if d.coordinator != 'auto':
    if d.process_id == 0:
      check_port_free(d.coordinator, 'distributed.coordinator', "the coordinator's port (process 0 listens there)")
    if transfers:
      check_port_free(transfer_address(d), 'distributed.transfer_address',
                      f"process {d.process_id}'s transfer port (the coordinator's + 1 + process id by default)")
  join_bounded(d, stopping)
  logging.info('process %d of %d; %d local devices, %d in all', jax.process_index(), jax.process_count(),
               jax.local_device_count(), jax.device_count())


def stop_before_work(d, error) -> None:
  """A process of a multi-process run whose config fails its checks (``error``, a ConfigError) joins the run
  anyway when its ``distributed`` section holds, publishes its one line and leaves with the others once they
  have read it (``processes.stop_together``), so that they stop at once with that line (``agreement``:
  another process stopped, process N: ...) rather than after their start-up timeout with only "not every one
  joined". Its own line comes first, at once; the join is bounded as every join is. Where every process has
  the bad value, each does the same and all leave together. A process that cannot join (its ``distributed``
  section is the problem) stops alone."""
  from jaxdecouple.config_checks import validate_distributed
  from jaxdecouple.processes import stop_together
  if not d.coordinator:
    return
  try:
    validate_distributed(types.SimpleNamespace(distributed=d))
  except ConfigError:
    return
  logging.error('%s; telling the other processes before stopping (waiting at most %g s for them to join)', error,
                d.startup_timeout_s)
  try:
    start_processes(d, stopping=str(error))
  except ConfigError:  # the join itself failed: the others learn of it from their own timeout
    return
  stop_together(str(error))
