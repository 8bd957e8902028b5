"""Command line: python main.py --config=configs/quickstart.py [--workdir=DIR] [--config.FIELD=VALUE ...]"""
import sys

from absl import app, flags, logging
from ml_collections import config_flags

config_flags.DEFINE_config_file('config', None, 'Experiment config file (configs/*.py).', lock_config=True)
flags.DEFINE_string('workdir', None, 'Where metrics, checkpoints and TensorBoard files go; running '
                    'again with the same workdir resumes. Default: workdirs/<config file name>.')
flags.mark_flags_as_required(['config'])


def parse_flags(argv):
  """absl's flag parsing, with bad --config.FIELD overrides reported as one line (exit status 2)."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    message = str(e)
  except (AttributeError, KeyError) as e:  # ml_collections: an override names no field
    message = str(e)
    from jaxdecouple.config import get_default_config
    for arg in argv[1:]:
      if arg.startswith('--config.'):
        path = arg[len('--config.'):].split('=', 1)[0].split('.')
        node = get_default_config()
        for i, part in enumerate(path):
          if not hasattr(node, 'keys') or part not in node:
            where = 'config' + ''.join('.' + p for p in path[:i])
            allowed = ', '.join(sorted(node.keys())) if hasattr(node, 'keys') else '(none: not a group)'
            message = f'--config.{".".join(path)}: unknown field; fields of {where}: {allowed}'
            break
          node = node[part]
        else:
          continue
        break
  print(f'error: {message}', file=sys.stderr)
  sys.exit(2)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
  config = flags.FLAGS.config
  workdir = flags.FLAGS.workdir or f'workdirs/{flags.FLAGS["config"].config_filename.rsplit("/", 1)[-1][:-3]}'
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
    sys.exit(2)


if __name__ == '__main__':
  logging.set_verbosity(logging.INFO)
  app.run(main, flags_parser=parse_flags)
