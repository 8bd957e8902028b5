"""JAX's persistent compilation cache for training runs: a program XLA compiled once is loaded from disk by every
later run and every resume of the same shape (model, method, batch, devices, JAX release), not compiled again.

Why: a resume after a preemption, or the next seed of a study, compiles exactly the programs the run before it
compiled. On the 2-core AMD EPYC host (2026-11-29) ResIST with its outer optimizer on ``preact_tiny_s3_9``, 4 workers
on one CPU device, took 38.3 s to its first step with an empty cache and 10.7 s with the cache the first run left
(tracing and lowering are not cached: JAX caches XLA's compilation only); the deep proxy ``preact_tiny_s3_23``'s
runs took 67-122 s to their first step on a quiet core and 360-752 s beside the test suite, and 17.9 s (ResIST) and
42.7 s (local SGD) resumed with a warm cache (docs/PERFORMANCE.md). The same thing peers do (MaxText's ``jax_cache_dir``,
torax's docs): the cache is JAX's own (``jax_compilation_cache_dir``), whose key holds the program, the compile
options, the devices it runs on and the JAX and XLA releases, so a changed program is compiled afresh, never
wrongly reused.

``config.compilation_cache_dir``:
- ``auto`` (the default): the folder JAX was already given (the ``JAX_COMPILATION_CACHE_DIR`` environment
  variable, or ``jax.config``) if any, else ``$XDG_CACHE_HOME/jaxdecouple/xla`` (``~/.cache/jaxdecouple/xla``);
- a folder: that one (made if missing);
- ``''``: no cache for this process.

JAX keeps programs that took at least ``jax_persistent_cache_min_compile_time_secs`` (1 s unless set) to compile;
the cache is never trimmed: remove the folder to empty it. JAX reads and writes it in place: a process killed
while it wrote an entry leaves it cut short, and JAX then warns ("Error reading persistent compilation cache
entry") and compiles that program again, never running a damaged one. JAX opens the cache once per process: a
second run in the same process (a notebook, a study's runs) that names another folder switches JAX to it.
"""
from __future__ import annotations

import os
import threading

import jax
from absl import logging

from jaxdecouple.errors import fail

AUTO = 'auto'
HIT, MISS = '/jax/compilation_cache/cache_hits', '/jax/compilation_cache/cache_misses'


def default_folder() -> str:
  """``$XDG_CACHE_HOME/jaxdecouple/xla``, or ``~/.cache/jaxdecouple/xla`` without it."""
  base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
  return os.path.join(base, 'jaxdecouple', 'xla')


def choose_folder(setting: str, jax_folder: str | None) -> tuple[str | None, str]:
  """(the folder a run's cache goes to or None for none, why) from ``config.compilation_cache_dir`` and the
  folder JAX already has (``jax_folder``, None when unset)."""
  if setting == '':
    return None, "config.compilation_cache_dir=''"
  if setting == AUTO:
    if jax_folder:
      return jax_folder, 'JAX_COMPILATION_CACHE_DIR or jax.config, set before the run'
    return default_folder(), 'the default'
  return os.path.expanduser(setting), 'config.compilation_cache_dir'


class Counts:
  """Programs loaded from the cache and compiled (missed), counted from JAX's own events since ``reset``."""

  def __init__(self):
    self.loaded = self.compiled = 0
    self._lock = threading.Lock()
    jax.monitoring.register_event_listener(self._event)

  def _event(self, event: str, **_):
    if event in (HIT, MISS):
      with self._lock:
        if event == HIT:
          self.loaded += 1
        else:
          self.compiled += 1

  def reset(self):
    with self._lock:
      self.loaded = self.compiled = 0

  def summary(self) -> str:
    """``N programs loaded from the compilation cache, M compiled`` (or '' when the cache saw none)."""
    if not self.loaded and not self.compiled:
      return ''
    programs = 'program' if self.loaded == 1 else 'programs'
    return f'{self.loaded} {programs} loaded from the compilation cache, {self.compiled} compiled'


_COUNTS: Counts | None = None


def counts() -> Counts:
  """The process's one listener (JAX has no way to remove one: registered once)."""
  global _COUNTS
  if _COUNTS is None:
    _COUNTS = Counts()
  return _COUNTS


def _size_mb(folder: str) -> float:
  try:
    return sum(e.stat().st_size for e in os.scandir(folder) if e.is_file()) / 1e6
  except OSError:
    return 0.0


def use_compilation_cache(setting: str) -> str | None:
  """Points JAX's persistent compilation cache at the folder ``setting`` chooses (before the run's first
  compilation), logs where and how large it is, and starts counting loads and compilations. Returns the folder
  in use, or None. An explicit folder that cannot be made or written stops the run with one line; the default
  folder unwritable only warns (the run goes on without a cache)."""
  from jax.experimental.compilation_cache import compilation_cache as cc
  current, enabled = jax.config.jax_compilation_cache_dir, jax.config.jax_enable_compilation_cache
  folder, why = choose_folder(setting, current)
  counts().reset()
  if folder is not None:
    try:
      os.makedirs(folder, exist_ok=True)
      error = None if os.access(folder, os.W_OK | os.X_OK) else 'no write permission'
    except OSError as e:
      error = e.strerror or str(e)
    if error:
      reason = f'{folder} cannot be written ({error})'
      if setting != AUTO:
        fail('compilation_cache_dir', f"{reason}; give a folder you can write, or '' for no cache")
      logging.warning('compilation cache: none: %s; set --config.compilation_cache_dir to a folder you can write',
                      reason)
      folder = None
  if folder is None:
    if enabled:  # JAX may have opened it for an earlier run of this process: closed (public reset_cache)
      cc.reset_cache()
      jax.config.update('jax_enable_compilation_cache', False)
    if setting == '':  # (an unwritable default has had its warning)
      logging.info("compilation cache: none (config.compilation_cache_dir=''): every program is compiled")
    return None
  if folder != current or not enabled:  # a folder other than the one JAX has open (an earlier run's) takes over
    cc.reset_cache()
    jax.config.update('jax_compilation_cache_dir', folder)
    jax.config.update('jax_enable_compilation_cache', True)
  logging.info("compilation cache: %s (%s; %.0f MB): programs compiled once are loaded by later runs and resumes; "
               "--config.compilation_cache_dir='' turns it off", folder, why, _size_mb(folder))
  return folder
