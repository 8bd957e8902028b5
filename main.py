"""Command line: python main.py --config=configs/quickstart.py [--workdir=DIR] [--config.FIELD=VALUE ...]"""
import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from jaxdecouple.command_line import parse_flags, workdir_of

config_flags.DEFINE_config_file('config', None, 'Experiment config file (configs/*.py).', lock_config=True)
flags.DEFINE_string('workdir', None, 'Where metrics, checkpoints and TensorBoard files go; running '
                    'again with the same workdir resumes. Default: workdirs/<config file name>.')
flags.mark_flags_as_required(['config'])

__all__ = ['main', 'parse_flags']


def main(argv):
  del argv  # parse_flags refused any positional argument
  config = flags.FLAGS.config
  workdir = workdir_of(flags.FLAGS.workdir, flags.FLAGS['config'].config_filename)
  # JAX must learn how many CPU devices to make before it first runs anything.
  import jax
  if config.get('cpu_devices', 0) > 0:
    jax.config.update('jax_num_cpu_devices', config.cpu_devices)
  from jaxdecouple.errors import JaxDecoupleError
  from jaxdecouple.train import train_and_evaluate
  from jaxdecouple.writers import quiet_library_logs
  quiet_library_logs()
  try:
    train_and_evaluate(config, workdir)
  except JaxDecoupleError as e:
    logging.flush()
    print(f'error: {e}', file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    # Not sys.exit: a checkpoint write that failed leaves orbax's background threads waiting for ever,
    # and the interpreter would wait for them at exit. Everything worth keeping is on disk by now.
    os._exit(getattr(e, 'exit_code', 2))


if __name__ == '__main__':
  logging.set_verbosity(logging.INFO)
  app.run(main, flags_parser=parse_flags)
