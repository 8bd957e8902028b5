"""The command line's flags in: the --config file checked before absl loads it, and bad flags as one line.

main.py defines the flags (--config, --workdir) and hands the parsed config to ``train_and_evaluate``;
this module turns what absl and ml_collections would print as a traceback (a config file that does not
load, an override naming no field, a stray argument) into one ``error:`` line and exit status 2.
"""
from __future__ import annotations

import importlib.util
import os
import sys

import ml_collections
from absl import flags

from jaxdecouple.config import get_default_config


def config_path(argv) -> str | None:
  """The value of --config in argv (``--config=FILE`` or ``--config FILE``), or None."""
  for i, arg in enumerate(argv[1:], 1):
    if arg.startswith('--config='):
      return arg[len('--config='):]
    if arg == '--config' and i + 1 < len(argv):
      return argv[i + 1]
  return None


def check_config_file(path: str | None) -> str | None:
  """Why the config file cannot give a config (one line), or None when it can."""
  if path is None:
    return '--config is required: python main.py --config=configs/quickstart.py [--config.FIELD=VALUE ...]'
  path, _, arg = path.partition('.py:')  # ml_collections' FILE.py:ARG form passes ARG to get_config
  path, args = (path + '.py', (arg,)) if _ else (path, ())
  if not path.endswith('.py') or not os.path.isfile(path):
    return (f'--config={path}: no such file' if not os.path.exists(path) else
            f'--config={path}: not a Python config file') + ' (the configs are in configs/*.py)'
  try:
    spec = importlib.util.spec_from_file_location('jaxdecouple_config_file', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
  except SyntaxError as e:
    return f'--config={path}: syntax error at line {e.lineno}: {e.msg}'
  except Exception as e:  # noqa: BLE001  whatever the file raises while loading
    return f'--config={path}: loading it raised {type(e).__name__}: {e}'
  if not callable(getattr(module, 'get_config', None)):
    return f'--config={path}: defines no get_config() function returning the config'
  try:
    config = module.get_config(*args)
  except Exception as e:  # noqa: BLE001
    return f'--config={path}: get_config() raised {type(e).__name__}: {e}'
  if not isinstance(config, ml_collections.ConfigDict):
    return (f'--config={path}: get_config() returned a {type(config).__name__}, not an ml_collections.ConfigDict '
            '(start from jaxdecouple.config.get_default_config())')
  return None


def parse_flags(argv):
  """absl's flag parsing, with a bad config file, bad --config.FIELD overrides and stray arguments
  reported as one line (exit status 2)."""
  if not any(a in ('--help', '-h', '--helpfull', '-?') for a in argv[1:]):
    problem = check_config_file(config_path(argv))
    if problem:
      print(f'error: {problem}', file=sys.stderr)
      sys.exit(2)
  try:
    rest = flags.FLAGS(argv)
    if len(rest) > 1:
      message = (f'unexpected argument{"s" * (len(rest) > 2)} {" ".join(rest[1:])}: every setting is a flag, '
                 'e.g. --workdir=DIR or --config.FIELD=VALUE')
    else:
      return rest
  except flags.Error as e:
    message = str(e)
  except (AttributeError, KeyError) as e:  # ml_collections: an override names no field
    message = str(e)
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


def workdir_of(workdir: str | None, config_filename: str) -> str:
  """--workdir, or workdirs/<config file name> when it is left out; an empty one stops with one line."""
  if workdir is None:
    return f'workdirs/{config_filename.rsplit("/", 1)[-1][:-3]}'
  if not workdir.strip():
    print('error: --workdir is empty: give a folder, or leave the flag out for workdirs/<config name>',
          file=sys.stderr)
    sys.exit(2)
  return workdir
