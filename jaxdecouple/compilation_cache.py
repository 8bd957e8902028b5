"""JAX's persistent compilation cache for training runs: a program XLA compiled once is loaded from disk by every
later run and every resume of the same shape (model, method, batch, devices, JAX release), not compiled again.

Why: a resume after a preemption, or the next seed of a study, compiles exactly the programs the run before it
compiled. On the 2-core AMD EPYC host (2026-11-29) ResIST with its outer optimizer on ``preact_tiny_s3_9``, 4 workers
on one CPU device, took 38.3 s to its first step with an empty cache and 10.7 s with the cache the first run left
(``benchmarks/compile_time.py --cache``: start-up 24.3 s against 7.1 s; tracing and lowering are not cached: JAX
caches XLA's compilation only); the deep proxy ``preact_tiny_s3_23``'s runs took 67-122 s to their first step on a
quiet core and 360-752 s beside the test suite, and 17.9 s (ResIST) and 42.7 s (local SGD) resumed with a warm
cache (docs/PERFORMANCE.md). The same thing peers do (MaxText's ``jax_cache_dir``, torax's docs): the cache is
JAX's own (``jax_compilation_cache_dir``), whose key holds the program, the compile options, the devices it runs on
and the JAX and XLA releases, so a changed program is compiled afresh, never wrongly reused.

``config.compilation_cache_dir``:
- ``auto`` (the default): the folder JAX was given before the first run of this process (the
  ``JAX_COMPILATION_CACHE_DIR`` environment variable, or ``jax.config``) if any, else
  ``$XDG_CACHE_HOME/jaxdecouple/xla`` (``~/.cache/jaxdecouple/xla``); none where JAX's cache was turned off before
  the first run (``JAX_ENABLE_COMPILATION_CACHE=false``, or ``jax.config``): a user's choice is kept;
- a folder: that one (made if missing; a relative one from the working directory, ``file://`` read as a plain
  path); a remote one (``gs://...``) is handed to JAX as it is;
- ``''``: no cache for this run (JAX's cache stays off in the process until a later run turns it on).

What JAX does with it (jax 0.10, read in its source): it keeps programs that took at least
``jax_persistent_cache_min_compile_time_secs`` (1 s unless set) to compile; in a multi-process run only process 0
writes entries (the others load them when they share its folder: a network folder, or processes of one host; a
pipeline's later stages, which process 0 never compiles, are compiled at every start); the folder is never
trimmed: remove it to empty it. Entries are written in place, not renamed into place: one cut short by a process
killed while writing it stays so, and every later run warns ("Error reading persistent compilation cache entry")
and compiles that program again, never running a damaged one, until the folder is removed.
"""
from __future__ import annotations

import os
import threading

import jax
from absl import logging

from jaxdecouple.errors import fail

AUTO = 'auto'
REQUEST, HIT = '/jax/compilation_cache/compile_requests_use_cache', '/jax/compilation_cache/cache_hits'
_BEFORE: dict = {}  # JAX's folder as it was before this module first changed it (what 'auto' means)


def _remote(folder: str) -> bool:
  return '://' in folder and not folder.startswith('file://')


def _absolute(folder: str) -> str:
  """A local folder made absolute (``~`` expanded, a ``file://`` prefix dropped: JAX reads the folder as a plain
  path), so that a notebook changing directory between runs keeps its cache; a remote one as it is."""
  if _remote(folder):
    return folder
  return os.path.abspath(os.path.expanduser(folder[len('file://'):] if folder.startswith('file://') else folder))


def default_folder() -> str:
  """``$XDG_CACHE_HOME/jaxdecouple/xla``, or ``~/.cache/jaxdecouple/xla`` without it."""
  base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
  return os.path.join(base, 'jaxdecouple', 'xla')


def choose_folder(setting: str, jax_folder: str | None, jax_enabled: bool = True) -> tuple[str | None, str]:
  """(the folder a run's cache goes to or None for none, why) from ``config.compilation_cache_dir``, the folder
  JAX already has (``jax_folder``, None when unset) and whether JAX's cache was on (``jax_enabled``; both as they
  were before this process's first run)."""
  if setting == '':
    return None, "config.compilation_cache_dir=''"
  if setting == AUTO:
    if not jax_enabled:
      return None, 'JAX_ENABLE_COMPILATION_CACHE=false or jax.config, set before the first run'
    if jax_folder:
      return _absolute(jax_folder), 'JAX_COMPILATION_CACHE_DIR or jax.config, set before the first run'
    return default_folder(), 'the default'
  return _absolute(setting), 'config.compilation_cache_dir'


class Counts:
  """Programs JAX looked up in the cache since ``reset``: ``loaded`` from it, ``compiled`` (looked up and missed;
  whether it was then saved is JAX's rule above), counted from JAX's own events."""

  def __init__(self):
    self.requests = self.loaded = 0
    self._lock = threading.Lock()
    jax.monitoring.register_event_listener(self._event)

  def _event(self, event: str, **_):
    if event in (REQUEST, HIT):
      with self._lock:
        if event == REQUEST:
          self.requests += 1
        else:
          self.loaded += 1

  @property
  def compiled(self) -> int:
    return self.requests - self.loaded

  def reset(self):
    with self._lock:
      self.requests = self.loaded = 0

  def summary(self) -> str:
    """``N programs loaded from the compilation cache, M compiled`` (or '' when no program was looked up)."""
    if not self.requests:
      return ''
    programs = 'program' if self.loaded == 1 else 'programs'
    return f'{self.loaded} {programs} loaded from the compilation cache, {self.compiled} compiled'


_COUNTS: Counts | None = None


def counts() -> Counts:
  """The process's one listener, registered once (with jax.monitoring.clear_event_listeners it counts no more)."""
  global _COUNTS
  if _COUNTS is None:
    _COUNTS = Counts()
  return _COUNTS


def _size_mb(folder: str) -> float:
  if _remote(folder):
    return 0.0
  try:
    return sum(e.stat().st_size for e in os.scandir(folder) if e.is_file()) / 1e6
  except OSError:
    return 0.0


def use_compilation_cache(setting: str) -> str | None:
  """Points JAX's persistent compilation cache at the folder ``setting`` chooses (before the run's first
  compilation), logs where and how large it is, and zeroes the counts of programs loaded and compiled. Returns
  the folder in use, or None. An explicit local folder that cannot be made or written stops the run with one line;
  the default one unwritable only warns (the run goes on without a cache)."""
  from jax.experimental.compilation_cache import compilation_cache as cc
  if not _BEFORE:
    _BEFORE.update(folder=jax.config.jax_compilation_cache_dir, enabled=jax.config.jax_enable_compilation_cache)
  folder, why = choose_folder(setting, _BEFORE['folder'], _BEFORE.get('enabled', True))
  counts().reset()
  error = None
  if folder is not None and not _remote(folder):
    try:
      os.makedirs(folder, exist_ok=True)
      if not os.access(folder, os.W_OK | os.X_OK):
        error = 'no write permission'
    except OSError as e:
      error = e.strerror or str(e)
  if error:
    reason = f'{folder} cannot be written ({error})'
    if setting != AUTO:
      fail('compilation_cache_dir', f"{reason}; give a folder you can write, or '' for no cache")
    logging.warning('compilation cache: none: %s; set --config.compilation_cache_dir to a folder you can write',
                    reason)
    folder = None
  cc.reset_cache()  # whatever JAX had open (an earlier run's folder) is closed; the next compilation opens this one
  if folder is None:
    jax.config.update('jax_enable_compilation_cache', False)
    if setting == '' or not _BEFORE.get('enabled', True):
      logging.info('compilation cache: none (%s): every program is compiled', why)
    return None
  jax.config.update('jax_compilation_cache_dir', folder)
  jax.config.update('jax_enable_compilation_cache', True)
  logging.info("compilation cache: %s (%s; %.0f MB): programs compiled once are loaded by later runs and resumes; "
               "--config.compilation_cache_dir='' turns it off", folder, why, _size_mb(folder))
  return folder
