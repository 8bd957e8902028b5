"""Four CPU devices for every test (set before JAX starts) and small shared helpers."""
import atexit
import collections
import functools
import os
import shutil
import sys
import tempfile

# The suite's programs are tiny and each runs a few steps: XLA:CPU's optimizing passes cost more than they save
# (docs/TESTING.md: a tiny FDG run's compile time fell from about 8.7 s to 2.8 s, the run from 13.7 s to 8.8 s).
# One LLVM module per program rather than parts compiled on threads, and XLA:CPU's default scheduler: a tiny
# FDG run's compile time 3.55 s -> 2.95 s (mean of 3, AMD EPYC, 2026-11-26); neither changes what is computed.
# Every process a test starts gets the same flags (processes compared bit for bit compile alike).
FAST_COMPILE_XLA_FLAGS = ('--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true '
                          '--xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=1 '
                          '--xla_cpu_enable_concurrency_optimized_scheduler=false')
os.environ.setdefault('JAX_NUM_CPU_DEVICES', '4')
os.environ.setdefault('XLA_FLAGS', '--xla_force_host_platform_device_count=4')
if 'xla_backend_optimization_level' not in os.environ['XLA_FLAGS']:  # a user's own choice is kept
  os.environ['XLA_FLAGS'] += ' ' + FAST_COMPILE_XLA_FLAGS
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

jax.config.update('jax_num_cpu_devices', 4)
# Many tests compile the same programs (same tiny model, new jit objects): a compilation cache for
# this session lets them share the executables. pytest-xdist's workers inherit the controller's
# environment, so the controller's folder is theirs too and a program compiled by one worker is
# reused by the other (JAX 0.10 writes an entry in place: a worker reading one the other is still writing gets
# a warning and compiles the program itself, never a damaged program). The process that makes the folder (the
# controller, or the only process without -n) removes it at exit: about 60 MB a run, left in /tmp before.
# A folder of your own in JAXDECOUPLE_TEST_XLA_CACHE is kept, and a rerun reuses its programs.
if 'JAXDECOUPLE_TEST_XLA_CACHE' not in os.environ:
  os.environ['JAXDECOUPLE_TEST_XLA_CACHE'] = tempfile.mkdtemp(prefix='jaxdecouple-tests-xla-')
  atexit.register(shutil.rmtree, os.environ['JAXDECOUPLE_TEST_XLA_CACHE'], ignore_errors=True)
jax.config.update('jax_compilation_cache_dir', os.environ['JAXDECOUPLE_TEST_XLA_CACHE'])
# the processes tests start (main.py, the notebook's kernel) use it too, not the user's own cache in ~/.cache
# (config.compilation_cache_dir='auto' takes JAX's folder when one is set; test_compilation_cache.py)
os.environ['JAX_COMPILATION_CACHE_DIR'] = os.environ['JAXDECOUPLE_TEST_XLA_CACHE']
jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)

from jaxdecouple.config import get_default_config, set_fields  # noqa: E402


def tiny_config(**overrides):
  """A few-second run: ResNet-8 on synthetic CIFAR-shaped data, batch 16, 8 steps per epoch (batch 16 rather
  than 32: a step takes about 0.1 s instead of 0.18 s on an AMD EPYC core with the flags above)."""
  c = get_default_config()
  c.model = 'resnet8'
  c.dataset = 'cifar10'
  c.data.source = 'synthetic'
  c.data.synthetic_train_size = 128
  c.data.synthetic_test_size = 64
  c.batch_size = 16
  c.eval_batch_size = 64
  c.num_epochs = 2
  c.optim.milestones = (1,)
  c.log_every_steps = 4
  c.checkpoint_every_steps = 0  # only at the end: a test that resumes mid-run sets its own
  return set_fields(c, overrides)


def assert_trees_equal(a, b, atol=0.0, rtol=0.0):
  la, ta = jax.tree.flatten(a)
  lb, tb = jax.tree.flatten(b)
  assert ta == tb, f'different structures:\n{ta}\n{tb}'
  for x, y in zip(la, lb):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=atol, rtol=rtol)


# Timeouts of the tests that start processes (2-process runs, main.py, the notebook) scale with the machine:
# on a loaded machine (a 2-core host running other work took 47 min for a suite of 9) a fixed limit fails a
# test for being slow, not for being wrong. The factor is measured once per session: the load average per core
# the tests may use, and the seconds a fixed pure-Python loop takes against those it took on an unloaded Xeon
# core (a slower CPU counts as load too); at least 1, at most 8, times JAXDECOUPLE_TEST_TIMEOUT_SCALE (default
# 1) for a user to raise it further. A limit still reached fails (never skips) with timed_out()'s line.
TIMEOUT_SCALE_ENV = 'JAXDECOUPLE_TEST_TIMEOUT_SCALE'
PROBE_REFERENCE_S = 0.135  # _probe() on an idle core of the 2-core Intel Xeon host of docs/TESTING.md (2026-11-25)
MAX_MEASURED_SCALE = 8.0


def _probe() -> float:
  """Wall seconds of a fixed pure-Python loop (one core; the median of three)."""
  import statistics
  import time
  times = []
  for _ in range(3):
    start, x = time.perf_counter(), 0
    for i in range(3_000_000):
      x += i * i % 7
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def _cores() -> int:
  return len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else (os.cpu_count() or 1)


def _load() -> float:
  return os.getloadavg()[0] if hasattr(os, 'getloadavg') else 0.0


def timeout_scale_from(load: float, cores: int, probe_s: float, user: str | None) -> float:
  """The factor for timeouts: max(1, load per core, probe against its reference), at most 8, times the user's
  JAXDECOUPLE_TEST_TIMEOUT_SCALE (a number >= 1; anything else is an error that says so)."""
  measured = min(max(1.0, load / max(cores, 1), probe_s / PROBE_REFERENCE_S), MAX_MEASURED_SCALE)
  try:
    extra = float(user) if user not in (None, '') else 1.0
  except ValueError:
    extra = 0.0
  if not extra >= 1.0:  # also NaN
    raise ValueError(f'{TIMEOUT_SCALE_ENV}={user!r}: give a number of at least 1 (the factor timeouts are raised by)')
  return measured * extra


@functools.lru_cache(maxsize=None)
def machine_load() -> dict:
  """What the session's timeouts were scaled by (measured once): load average, cores, probe seconds, factor."""
  load, cores, probe = _load(), _cores(), _probe()
  return {'load': load, 'cores': cores, 'probe_s': probe,
          'scale': timeout_scale_from(load, cores, probe, os.environ.get(TIMEOUT_SCALE_ENV))}


def scaled_timeout(seconds: float) -> float:
  """``seconds`` (a limit for an unloaded machine) scaled for this one: never less than ``seconds``."""
  return seconds * machine_load()['scale']


def timed_out_message(seconds: float, elapsed: float | None = None, what: str = '',
                      measured: dict | None = None) -> str:
  """The line a test fails with when a process outlives its scaled limit: the time, the factor and the load it
  was measured from (and the load now), and the setting to rerun with."""
  m = measured or machine_load()
  limit = seconds * m['scale']
  user = float(os.environ.get(TIMEOUT_SCALE_ENV) or 1)
  return (f'timed out after {elapsed if elapsed is not None else limit:.0f} s{f" {what}" if what else ""} '
          f'(a {seconds:g} s limit, timeout scaled x{m["scale"]:.2f} for a loaded machine: load {m["load"]:.2f} on '
          f'{m["cores"]} cores, a CPU probe of {m["probe_s"]:.3f} s against {PROBE_REFERENCE_S} s unloaded; load now '
          f'{_load():.2f}); the machine is loaded, rerun with {TIMEOUT_SCALE_ENV}={max(2.0, 2 * user):g}')


def timed_out(seconds: float, elapsed: float | None = None, what: str = '', log: str = ''):
  """Fails the test (not a skip) with timed_out_message(), and the processes' output when given."""
  pytest.fail(timed_out_message(seconds, elapsed, what) + (f'\n{log}' if log else ''), pytrace=False)


def start_logged(argv, log: str, separate_stderr: bool = False, **popen):
  """``subprocess.Popen`` with the output in files (``log``, and ``log + '.err'`` with ``separate_stderr``), never
  in a pipe. Two processes of one run read one after the other through pipes deadlock when the one read second
  writes more than a pipe holds (64 KiB) while the other waits for it in a collective: seen 2026-11-27, when
  process 1's asyncio warnings about a damaged checkpoint's futures filled its pipe and process 0 waited 600 s in
  the key-value store. ``communicate_within`` and ``logged_output`` read the files."""
  import subprocess
  out = open(log, 'w+', encoding='utf-8')
  err = open(log + '.err', 'w+', encoding='utf-8') if separate_stderr else None
  proc = subprocess.Popen(argv, stdout=out, stderr=err or subprocess.STDOUT, text=True, **popen)
  proc.logs = (out, err)
  return proc


def popen_with_ctrl_c(argv, **popen):
  """``subprocess.Popen`` whose process takes Ctrl-C (SIGINT) as a program started from a terminal does, even when
  this process ignores it (a background job of a shell, some CI runners): an ignored signal stays ignored across
  exec, a handled one is reset to the default. So when SIGINT is ignored here, a handler is put in place for the
  moment of the start and the old disposition restored after. Not with ``preexec_fn``, which did the same in the
  child: it makes Python fork by hand, and JAX warns at every fork of its multithreaded process (the suite's two
  warnings, gone)."""
  import signal
  import subprocess
  import threading
  if threading.current_thread() is not threading.main_thread():  # signal.signal works only there
    return subprocess.Popen(argv, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL), **popen)
  before = signal.getsignal(signal.SIGINT)
  if before is not signal.SIG_IGN:
    return subprocess.Popen(argv, **popen)
  signal.signal(signal.SIGINT, signal.default_int_handler)
  try:
    return subprocess.Popen(argv, **popen)
  finally:
    signal.signal(signal.SIGINT, before)


def logged_output(proc) -> tuple[str, str | None]:
  """What a ``start_logged`` process wrote so far: (output, its stderr when kept apart, else None)."""
  texts = []
  for f in proc.logs:
    if f is None:
      texts.append(None)
      continue
    f.flush()
    with open(f.name, encoding='utf-8', errors='replace') as again:
      texts.append(again.read())
  return texts[0], texts[1]


def communicate_within(proc, seconds: float, what: str = ''):
  """``proc.communicate()`` within the scaled limit (a ``start_logged`` process: waited for, its files read);
  past it the process is killed and the test fails with timed_out()'s line and the output so far."""
  import subprocess
  import time
  start = time.monotonic()
  try:
    if hasattr(proc, 'logs'):
      proc.wait(timeout=scaled_timeout(seconds))
      return logged_output(proc)
    return proc.communicate(timeout=scaled_timeout(seconds))
  except subprocess.TimeoutExpired:
    proc.kill()
    out = logged_output(proc)[0] if hasattr(proc, 'logs') else proc.communicate()[0]
    timed_out(seconds, time.monotonic() - start, what, (out or '')[-3000:] if isinstance(out, str) else '')


def wait_within(proc, seconds: float, what: str = '') -> int:
  """``proc.wait()`` within the scaled limit, else timed_out() (the process killed)."""
  import subprocess
  import time
  start = time.monotonic()
  try:
    return proc.wait(timeout=scaled_timeout(seconds))
  except subprocess.TimeoutExpired:
    proc.kill()
    proc.wait()
    timed_out(seconds, time.monotonic() - start, what)


def run_within(args, seconds: float, what: str = '', **kwargs):
  """``subprocess.run(args, timeout=...)`` within the scaled limit, else timed_out() (subprocess.run kills it)."""
  import subprocess
  import time
  start = time.monotonic()
  try:
    return subprocess.run(args, timeout=scaled_timeout(seconds), **kwargs)
  except subprocess.TimeoutExpired as e:
    out = e.stdout.decode(errors='replace') if isinstance(e.stdout, bytes) else (e.stdout or '')
    timed_out(seconds, time.monotonic() - start, what or f'running {" ".join(map(str, args))[:200]}', out[-3000:])


@pytest.fixture
def workdir(tmp_path):
  return str(tmp_path / 'run')


def assert_trees_close(a, b, tol):
  """Every leaf within ``tol`` of the reference, relative to that leaf's scale (at least 0.1).

  Float32 rounding differences between a jitted engine and an eager reference grow during training
  (BatchNorm at a high learning rate amplifies them); this keeps the comparison sharp (a real
  semantic change moves parameters by 1e-2 and more) without failing on that noise.
  """
  la, ta = jax.tree.flatten(a)
  lb, tb = jax.tree.flatten(b)
  assert ta == tb, f'different structures:\n{ta}\n{tb}'
  for path, x, y in zip(jax.tree_util.tree_flatten_with_path(b)[0], la, lb):
    x, y = np.asarray(x), np.asarray(y)
    scale = max(float(np.max(np.abs(y))), 0.1)
    err = float(np.max(np.abs(x - y)))
    assert err <= tol * scale, f'{jax.tree_util.keystr(path[0])}: max error {err:.3g} > {tol} x {scale:.3g}'


@functools.partial(jax.jit, static_argnums=0)
def _stage_forward(stage, params, x, stats):
  return stage.apply({'params': params, 'batch_stats': stats}, x, train=True)


def reference_objective(ds):
  """The mean loss the references minimise, written from each task's definition: softmax cross-entropy of
  integer labels, or for a detection data set (``ds.anchors``, fractions of the image) the YOLO-v2 region loss
  (jaxdecouple.detection.yolo, itself held to hand-computed values in test_detection_loss.py) with the anchors
  in cells of the outputs' grid."""
  import jax.numpy as jnp
  import optax
  if not ds.anchors:
    return lambda logits, labels: optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
  from jaxdecouple.detection import yolo_v2_loss
  return lambda out, labels: yolo_v2_loss(out, labels, jnp.asarray(ds.anchors) * out.shape[1], ds.num_classes)[0]


@jax.jit
def sgd_step(params, momentum, grads, lr):
  """Plain SGD as the papers' recipe: weight decay 5e-4 added to the gradient, momentum 0.9, no
  dampening."""
  grads = jax.tree.map(lambda g, p: g + 5e-4 * p, grads, params)
  momentum = jax.tree.map(lambda m, g: 0.9 * m + g, momentum, grads)
  return jax.tree.map(lambda p, m: p - lr * m, params, momentum), momentum


class SequentialStages:
  """Scaffolding shared by the sequential references of the pipeline methods: the run's data, the
  model cut into the config's stages with the same initial parameters, and a plain SGD step
  (weight decay 5e-4 added to the gradient, momentum 0.9, no dampening), written out here; or, given
  ``tx``, an optax optimizer built by the test itself (learning rate inside it), one state per stage."""

  def __init__(self, config, tx=None):
    import jax.numpy as jnp
    from jaxdecouple.data import TrainOrder, load_dataset, preprocess_for
    from jaxdecouple.models import build_model, subset
    from jaxdecouple.pipeline import choose_split
    self.config = config
    self.ds = load_dataset(config.data, config.dataset)
    self.model = model = build_model(config.model, self.ds.num_classes, anchors=self.ds.anchors)
    self.loss = reference_objective(self.ds)
    variables = model.init(jax.random.key(config.seed), jnp.zeros((1, *self.ds.image_shape)))
    k = config.pipeline.num_stages
    self.stages = model.cut(choose_split(model, k, config.pipeline.split, self.ds.image_shape).boundaries)
    self.params = [subset(variables, s.names)['params'] for s in self.stages]
    self.stats = [subset(variables, s.names).get('batch_stats', {}) for s in self.stages]
    self.momentum = [jax.tree.map(jnp.zeros_like, p) for p in self.params]
    self.tx = tx
    self.opt_states = [tx.init(p) for p in self.params] if tx is not None else None
    # optax's own update, compiled once per stage's shapes (eagerly, Muon's Newton-Schulz scan is traced every call)
    self.tx_update = jax.jit(tx.update) if tx is not None else None
    self.order = TrainOrder(len(self.ds.x_train), config.batch_size, config.seed)
    self.pre = preprocess_for(self.ds, config.data)

  def batch(self, t):
    """Micro-batch t: augmented inputs (keyed by t, as in training) and labels."""
    import jax.numpy as jnp
    from jaxdecouple.data import train_inputs
    idx = self.order.indices(t)
    return (train_inputs(jnp.asarray(self.ds.x_train[idx]), t, self.config.seed, self.pre),
            jnp.asarray(self.ds.y_train[idx]))

  def lr(self, t):
    c = self.config
    return c.optim.learning_rate * (0.1 if t >= c.optim.milestones[0] * self.order.steps_per_epoch else 1.0)

  def run(self, k, params, x, stats):
    """Stage k's forward in training mode: (output, new batch statistics). Jitted per stage only to
    keep the suite fast (one compilation instead of one per eager operation); differentiating
    through it is plain ``jax.vjp``/``jax.grad``."""
    return _stage_forward(self.stages[k], params, x, stats)

  def sgd(self, k, grads, lr):
    """Stage k's update: plain SGD at ``lr``, or the test's optax optimizer (its own learning rate)."""
    if self.tx is None:
      self.params[k], self.momentum[k] = sgd_step(self.params[k], self.momentum[k], grads, lr)
      return
    import optax
    updates, self.opt_states[k] = self.tx_update(grads, self.opt_states[k], self.params[k])
    self.params[k] = optax.apply_updates(self.params[k], updates)

  def variables(self):
    merged = {'params': {}, 'batch_stats': {}}
    for p, s in zip(self.params, self.stats):
      merged['params'].update(p)
      merged['batch_stats'].update(s)
    return merged


@pytest.fixture(scope='session')
def resist_run(tmp_path_factory):
  """ResIST with 4 workers on 4 CPU devices (tests/multiprocess_worker.replica_run_config), run once
  and shared by the tests that compare against it."""
  from multiprocess_worker import replica_run_config
  from jaxdecouple.train import train_and_evaluate
  return train_and_evaluate(replica_run_config(), str(tmp_path_factory.mktemp('resist') / 'run'))


@pytest.fixture(scope='session')
def resist_outer_run(tmp_path_factory):
  """The same run with DiLoCo's outer optimizer (outer lr 0.7, Nesterov momentum 0.9): what the two-process
  test compares against, itself checked against the sequential reference."""
  from multiprocess_worker import replica_run_config
  from jaxdecouple.train import train_and_evaluate
  return train_and_evaluate(replica_run_config(outer=True), str(tmp_path_factory.mktemp('resist_outer') / 'run'))


# The longest tests first: pytest-xdist hands tests out in collection order, and a minute-long test
# handed out last keeps one worker busy while the other has nothing left (about 30 s of the suite).
# These are also the tests marked slow: `pytest -m "not slow"` is the quick subset (docs/TESTING.md).
SLOW_FIRST = ('test_pipeline_processes.py', 'test_multiprocess.py', 'test_peer_loss.py', 'scanned_blocks', 'test_resist.py',
              'test_outer.py', 'test_benchmarks.py', 'test_transformers.py', 'test_process_start.py', 'test_notebook.py',
              'loads_the_first_runs_programs')


def pytest_configure(config):
  config.addinivalue_line('markers', 'slow: a test of the slow groups (processes, ResIST and outer-optimizer oracles, '
                          'benchmark scripts, transformers, the notebook, scanned blocks, the compilation cache\'s reload); '
                          'deselect with -m "not slow"')


def pytest_collection_modifyitems(items):
  rank = lambda item: next((i for i, s in enumerate(SLOW_FIRST) if s in item.nodeid), len(SLOW_FIRST))
  for item in items:
    if rank(item) < len(SLOW_FIRST):
      item.add_marker(pytest.mark.slow)
  items.sort(key=rank)  # stable: the order within each group is kept


# Where the suite's CPU goes: with JAXDECOUPLE_TEST_CPU_LOG=FILE each test appends one JSON line (its id, wall
# seconds, and the CPU seconds of its worker process plus the processes it started and waited for). Wall times
# of a parallel suite overstate the tests that start processes (they wait for a core the other worker holds);
# CPU seconds are what the 2 cores spend, so they say which cuts shorten the suite. The line also has the
# seconds JAX spent in this process tracing, lowering and compiling (jax.monitoring's events; compiling includes
# loading from the compilation cache) and ``rebuilt``: how many of the programs handed to XLA were identical to
# one this process had built before (a closure jitted again; docs/TESTING.md, "Where the time goes"), counted
# where this JAX has the internal hook it needs, else absent.
CPU_LOG_ENV = 'JAXDECOUPLE_TEST_CPU_LOG'
JAX_PHASES = {'jaxpr_trace_duration': 'trace_s', 'jaxpr_to_mlir_module_duration': 'lower_s',
              'backend_compile_duration': 'compile_s'}
_jax_seconds = collections.Counter()
_modules = {'seen': set(), 'rebuilt': 0, 'hooked': False}


def _cpu_seconds():
  import resource
  own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
  return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _count_jax_phase(event, seconds, **kwargs):
  phase = JAX_PHASES.get(event.rsplit('/', 1)[-1])
  if phase:
    _jax_seconds[phase] += seconds


def _listen_to_jax():
  """Once per process: jax.monitoring's durations, and (internal API, where present) each module's fingerprint."""
  if _modules['hooked']:
    return
  _modules['hooked'] = True
  jax.monitoring.register_event_duration_secs_listener(_count_jax_phase)
  import hashlib
  try:
    from jax._src import compiler  # internal: absent from some JAX, then no ``rebuilt``
  except ImportError:
    return
  build = getattr(compiler, 'compile_or_get_cached', None)
  if build is None:
    return

  def fingerprinted(backend, computation, *args, **kwargs):
    digest = hashlib.sha1(str(computation).encode()).digest()
    _modules['rebuilt'] += digest in _modules['seen']
    _modules['seen'].add(digest)
    return build(backend, computation, *args, **kwargs)
  compiler.compile_or_get_cached = fingerprinted
  _modules['counts'] = True


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
  path = os.environ.get(CPU_LOG_ENV)
  if not path:
    return (yield)
  import json
  import time
  _listen_to_jax()
  _jax_seconds.clear()
  rebuilt = _modules['rebuilt']
  wall, cpu = time.monotonic(), _cpu_seconds()
  try:
    return (yield)
  finally:
    line = {'test': item.nodeid, 'wall_s': round(time.monotonic() - wall, 2),
            'cpu_s': round(_cpu_seconds() - cpu, 2), **{k: round(_jax_seconds[k], 4) for k in JAX_PHASES.values()}}
    if _modules.get('counts'):
      line['rebuilt'] = _modules['rebuilt'] - rebuilt
    with open(path, 'a') as f:  # one short line per write: the workers' appends do not interleave
      f.write(json.dumps(line) + '\n')
