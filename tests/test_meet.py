"""``processes.meet``: every process waits for every other at the same point, through the coordinator's key-value
store, for a bounded time, and a process that never comes is named in one line. A fake key-value store stands
in for the coordinator (two real processes meeting: test_multiprocess.py's ResIST run, whose repartitions meet)."""
import pytest

from jaxdecouple import processes
from jaxdecouple.errors import ProcessError


class FakeStore:
  """The coordinator's key-value store as one process sees it: ``present`` keys are there; a missing one
  times out as the real client does (an exception after the deadline)."""

  def __init__(self, present=()):
    self.values, self.waits = dict.fromkeys(present, ''), []

  def key_value_set(self, key, value):
    self.values[key] = value

  def blocking_key_value_get(self, key, timeout_ms):
    self.waits.append((key, timeout_ms))
    if key not in self.values:
      raise RuntimeError(f'DEADLINE_EXCEEDED: {key}')
    return self.values[key]


@pytest.fixture
def as_process_0_of_2(monkeypatch):
  from jax._src import distributed
  monkeypatch.setattr(processes.jax, 'process_count', lambda: 2)
  monkeypatch.setattr(processes.jax, 'process_index', lambda: 0)
  monkeypatch.setattr(processes, '_MEETINGS', [0])

  def use(store):
    monkeypatch.setattr(distributed.global_state, 'client', store)
    return store
  return use


def test_every_process_posts_and_waits_for_the_others_within_the_bound(as_process_0_of_2):
  store = as_process_0_of_2(FakeStore(present=['jaxdecouple/meet/0/1', 'jaxdecouple/meet/1/1']))
  processes.meet('the transfers', timeout_s=2.5)
  processes.meet('the transfers', timeout_s=2.5)  # the next meeting has its own key
  assert {'jaxdecouple/meet/0/0', 'jaxdecouple/meet/1/0'} <= set(store.values)
  assert store.waits == [('jaxdecouple/meet/0/1', 2500), ('jaxdecouple/meet/1/1', 2500)]  # never its own key


def test_a_process_that_never_comes_is_named_in_one_line(as_process_0_of_2):
  as_process_0_of_2(FakeStore())
  with pytest.raises(ProcessError) as e:
    processes.meet("the repartition's transfers", timeout_s=1)
  line = str(e.value)
  assert '\n' not in line
  assert "process 1 did not finish the repartition's transfers within 1 s" in line and '--workdir' in line


def test_one_process_meets_nobody(monkeypatch):
  monkeypatch.setattr(processes, '_MEETINGS', [0])
  processes.meet('anything', timeout_s=0)  # no coordinator needed, and no key used
  assert processes._MEETINGS == [0]


class Exited(BaseException):
  """Stands in for the watch's ``os._exit``, which ends the process while the main thread waits."""


def test_a_wait_that_the_watchs_leaving_breaks_says_nothing_more(as_process_0_of_2, monkeypatch):
  """The watch (liveness.py) printed this process's one line on a peer's stall claim and leaves the
  coordination service with the others; the main thread, waiting in a meeting, then fails (the store is shut
  down). Before: that failure printed a second line, 'process 1 did not finish ...' (seen in CI). Now it waits,
  unpublished, for the watch to end the process; with no stop under way the same failure is this process's line."""
  as_process_0_of_2(FakeStore())
  slept = []

  def sleep(s):
    slept.append(s)
    raise Exited
  monkeypatch.setattr(processes.time, 'sleep', sleep)
  monkeypatch.setattr(processes, 'STOPPING', processes.threading.Event())
  monkeypatch.setattr(processes, 'tell_the_others', lambda line: pytest.fail(f'published a second line: {line}'))
  processes.STOPPING.set()
  with pytest.raises(Exited), processes.peers_watched(20.0):
    processes.meet('the transfers', timeout_s=0.1)
  assert slept == [processes.STOPPING_WAIT_S]

  told = []
  monkeypatch.setattr(processes, 'tell_the_others', told.append)
  processes.STOPPING.clear()
  with pytest.raises(ProcessError) as e, processes.peers_watched(20.0):
    processes.meet('the transfers', timeout_s=0.1)
  assert told == [str(e.value)] and 'process 1 did not finish the transfers' in told[0]
  assert slept == [processes.STOPPING_WAIT_S]  # no wait without a stop under way


@pytest.mark.parametrize('text', ['UNAVAILABLE: Connection reset by peer',
                                  'INTERNAL: -1 = recv() failed errno: 107 err: Transport endpoint is not connected',
                                  'INTERNAL: Gloo send() failed: Broken pipe'])
def test_a_transfer_whose_peer_died_becomes_one_line_naming_it(as_process_0_of_2, text):
  """Whatever words the runtime's error has when the other process died mid-transfer (gloo's, as seen in CI
  and here), the survivor stops with one line naming process 1. Before, the
  ENOTCONN of a fetch whose transfer had begun passed through as a traceback, and JAX's shutdown then
  aborted the process (-6) at its heartbeat timeout."""
  import jax
  as_process_0_of_2(FakeStore())
  with pytest.raises(ProcessError) as e, processes.peers_watched(20.0):
    raise jax.errors.JaxRuntimeError(text)
  line = str(e.value)
  assert '\n' not in line and line.startswith('process 1 stopped answering during a collective or transfer')
  assert '--workdir' in line


def test_a_runtime_error_of_this_process_passes_through_unchanged(as_process_0_of_2):
  import jax
  as_process_0_of_2(FakeStore())
  with pytest.raises(jax.errors.JaxRuntimeError, match='RESOURCE_EXHAUSTED'), processes.peers_watched(20.0):
    raise jax.errors.JaxRuntimeError('RESOURCE_EXHAUSTED: out of memory allocating 4 GiB')
