"""One process of tests/test_pipeline_processes.py: joins a 2-process run and trains pipeline methods with
their stages spread over the processes, saving each run's final model.

  python pipeline_process_worker.py PROCESS_ID PORT DEVICES WORKDIR OUT RUN [RUN ...]

WORKDIR may hold '{process}', replaced by the process id (each process its own workdir path).

PROCESS_ID -1 runs the same alone, in one process with DEVICES devices: the reference (XLA:CPU's numbers
depend on how many devices a process splits the cores into, so the reference is a process too).

RUN is NAME:METHOD:K:STEPS[:ckpt=N][:die=P@S][:stall=P@S][:stall_s=T][:dp=D] (K: stages, or ResIST's workers;
dp: devices per stage; ckpt: a checkpoint every N steps, else only at the end; die: process P kills itself right
after its checkpoint at step S is written, as a crashed machine would; stall: process P's main thread waits for
ever right after that checkpoint, as a deadlock in its own code would, its other threads running on; stall_s:
distributed.stall_timeout_s). A NAME ending in _stream trains on streamed JPEGs (dataset
imagenet) from the folder in $STREAM_FOLDER. A run that stops on one of the library's errors prints its one
line and leaves with ``os._exit``, as main.py does."""
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402


def pipeline_config(method: str, k: int, steps: int, stream: bool = False, every: int = 0):
  """The run both sides compare (conftest is not imported here: it would ask for 4 CPU devices)."""
  from jaxdecouple.config import get_default_config
  c = get_default_config()
  c.method, c.model, c.dataset, c.max_steps = method, 'resnet8', 'cifar10', steps
  c.data.source, c.data.synthetic_train_size, c.data.synthetic_test_size = 'synthetic', 256, 64
  c.batch_size, c.eval_batch_size, c.num_epochs, c.optim.milestones = 16, 64, 2, (1,)
  c.log_every_steps, c.checkpoint_every_steps = 2, every
  c.pipeline.num_stages, c.optim.learning_rate = k, 0.05
  c.pipeline.beta = 1.0 if method in ('dgl', 'gpipe', '1f1b', 'zb_h1') else 0.5
  if method == 'adl':
    c.pipeline.accumulation = 2
  if method == 'resist':  # k workers, one per device, a round every 2 steps
    c.model, c.replica.num_workers, c.replica.local_steps, c.optim.learning_rate = 'preact_tiny', k, 2, 0.005
  if stream:
    c.dataset, c.data.source, c.data.path = 'imagenet', 'folder', os.environ['STREAM_FOLDER']
    c.data.image_size, c.batch_size, c.eval_batch_size, c.data.workers = 16, 8, 8, 1
  return c


def count_training_images() -> dict:
  """Counts the streamed training images this process decodes (``counts['images']``)."""
  from jaxdecouple.data.stream import StreamImages
  counts, take = {'images': 0}, StreamImages.take

  def counting_take(self, indices, key=None):
    if self.train:
      counts['images'] += np.asarray(indices).size
    return take(self, indices, key)
  StreamImages.take = counting_take
  return counts


def die():
  """As a crashed machine: gone at once."""
  os.kill(os.getpid(), signal.SIGKILL)


def deadlock():
  """As a deadlock in the process's own code: the calling thread waits for ever, the others run on."""
  import threading
  lock = threading.Lock()
  lock.acquire()
  lock.acquire()


AFTER_CHECKPOINT = {'die': die, 'stall': deadlock}  # RUN options: what process P does after its step S


def after_checkpoint(option: str, process_id: int, action) -> None:
  """With ``option`` 'P@S', this process (if it is P) runs ``action`` right after its checkpoint of step S is
  written."""
  from jaxdecouple.checkpoint import Checkpointer
  who, _, when = option.partition('@')
  if int(who) != process_id:
    return
  at, save = int(when), Checkpointer.save

  def save_then(self, step, state):
    save(self, step, state)
    if step == at:
      self.wait()
      action()
  Checkpointer.save = save_then


def main(process_id: int, port: int, workdir: str, out: str, runs: list[str]):
  from jaxdecouple.train import train_and_evaluate
  workdir = workdir.replace('{process}', str(process_id))  # each process its own path, as two hosts may have
  counts = count_training_images()
  for spec in runs:
    counts['images'] = 0
    name, method, k, steps, *extra = spec.split(':')
    options = dict(e.split('=') for e in extra)
    for option, action in AFTER_CHECKPOINT.items():
      if option in options:
        after_checkpoint(options[option], process_id, action)
    config = pipeline_config(method, int(k), int(steps), stream=name.endswith('_stream'),
                             every=int(options.get('ckpt', 0)))
    config.pipeline.data_parallel = int(options.get('dp', 1))
    if 'stall_s' in options:
      config.distributed.stall_timeout_s = float(options['stall_s'])
    if process_id >= 0:
      config.distributed.coordinator = f'127.0.0.1:{port}'
      config.distributed.num_processes, config.distributed.process_id = 2, process_id
    result = train_and_evaluate(config, os.path.join(workdir, name))
    leaves = jax.tree_util.tree_flatten_with_path(result.variables)[0]
    np.savez(f'{out}_{name}.npz', **{jax.tree_util.keystr(p): np.asarray(x) for p, x in leaves},
             __step__=np.array(result.step),  # a run stopped before its first evaluation has no accuracy
             __accuracy__=np.array(result.last_eval['test_accuracy'] if result.last_eval else np.nan),
             __decoded__=np.array(counts['images']))  # streamed training images this process decoded
  print('worker done', flush=True)


if __name__ == '__main__':
  jax.config.update('jax_num_cpu_devices', int(sys.argv[3]))  # before JAX starts
  from jaxdecouple.errors import JaxDecoupleError
  try:
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[4], sys.argv[5], sys.argv[6:])
  except JaxDecoupleError as e:  # as main.py does: one line, and out at once (docs/DISTRIBUTED.md, "library")
    print(f'error: {e}', file=sys.stderr, flush=True)
    os._exit(getattr(e, 'exit_code', 2))
