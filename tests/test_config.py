"""Config checks: unknown fields, wrong types and bad values stop with one line naming the field."""
import glob
import importlib.util
import os
import sys

import pytest

from conftest import run_within, tiny_config
from jaxdecouple.methods import validate
from jaxdecouple.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize('field,value,message', [
    ('batch_size', 0, 'config.batch_size: must be positive'),
    ('optim.learning_rate', -0.1, 'config.optim.learning_rate: must be positive'),
    ('model', 'resnet7', 'config.model: unknown model'),
    ('dataset', 'mnist', 'config.dataset: .* choose one of: cifar10, cifar100, fashion_mnist, fortunes, imagenet, shapes, text, voc'),
    ('method', 'magic', 'config.method: .*choose one of: .*bp'),
    ('data.source', 'web', 'config.data.source'),
    ('optim.momentum', 1.5, r'config.optim.momentum: must be in \[0, 1\)'),
    ('optim.milestones', (3, 1), 'config.optim.milestones: must be non-negative epochs in increasing order'),
    ('optim.warmup', 'cosine', 'config.optim.warmup'),
    ('batch_size', 12.5, 'config.batch_size: must be an integer'),
    ('optim.nesterov', 'yes', 'config.optim.nesterov: must be true or false'),
    ('seed', 2**32 + 7, r'config.seed: must be below 2\*\*32 \(JAX.s random keys keep only a seed.s low 32 bits'),
])
def test_bad_values_name_the_field(field, value, message):
  c = tiny_config()
  c.unlock()
  target = c
  *path, last = field.split('.')
  for p in path:
    target = target[p]
  with target.ignore_type():
    target[last] = value
  with pytest.raises(ConfigError, match=message):
    validate(c)


def test_unknown_field_lists_the_real_ones():
  c = tiny_config()
  c.optim.lerning_rate = 0.1
  with pytest.raises(ConfigError, match='config.optim.lerning_rate: unknown field; .*learning_rate'):
    validate(c)


def test_npz_source_needs_a_path():
  with pytest.raises(ConfigError, match='config.data.path: is required'):
    validate(tiny_config(**{'data.source': 'npz'}))


@pytest.mark.parametrize('path', sorted(p for p in glob.glob(os.path.join(ROOT, 'configs', '*.py'))
                                         if not p.endswith('__init__.py')))
def test_every_config_file_is_valid_and_documents_its_command(path):
  spec = importlib.util.spec_from_file_location('cfg', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  validate(module.get_config())
  assert f'python main.py --config=configs/{os.path.basename(path)}' in module.__doc__


def run_main(*args):
  return run_within([sys.executable, 'main.py', *args], 120, cwd=ROOT, capture_output=True, text=True,
                    env={**os.environ, 'JAX_PLATFORMS': 'cpu'})


def test_cli_bad_value_stops_before_compute_with_one_line(tmp_path):
  result = run_main('--config=configs/quickstart.py', f'--workdir={tmp_path}', '--config.batch_size=0')
  assert result.returncode == 2
  errors = [line for line in result.stderr.splitlines() if line.startswith('error:')]
  assert errors == ['error: config.batch_size: must be positive, got 0']
  assert not os.path.exists(tmp_path / 'checkpoints')


@pytest.mark.parametrize('override,message', [
    ('--config.nope=1', 'error: --config.nope: unknown field; fields of config: batch_size,'),
    ('--config.optim.lerning_rate=1', 'error: --config.optim.lerning_rate: unknown field; fields of '
     'config.optim: b1, b2, decay_factor, decay_steps, eps, learning_rate,'),
    ('--config.batch_size=abc', "error: flag --config.batch_size=abc: invalid literal for int()"),
])
def test_cli_bad_override_is_one_line(override, message, tmp_path):
  result = run_main('--config=configs/quickstart.py', f'--workdir={tmp_path}', override)
  assert result.returncode == 2
  assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith(message)


@pytest.mark.parametrize('overrides,message', [
    ({'method': 'bp', 'distributed.coordinator': 'h:1', 'distributed.num_processes': 2},
     'config.distributed.coordinator: several processes run the pipeline and replica methods; bp runs in one'),
    ({'method': 'fdg', 'distributed.coordinator': 'auto'}, 'config.distributed.transfer_address: is required'),
    ({'method': 'fdg', 'distributed.coordinator': 'h:1', 'distributed.num_processes': 2,
      'distributed.transfer_address': 'nohost'}, 'config.distributed.transfer_address: must be'),
    ({'method': 'fdg', 'distributed.coordinator': 'h:1', 'distributed.num_processes': 2,
      'pipeline.diagnose_every_steps': 5}, 'config.pipeline.diagnose_every_steps: .* runs in one process'),
    ({'method': 'localsgd', 'distributed.coordinator': 'h:1', 'distributed.num_processes': 2,
      'distributed.startup_timeout_s': 0.0}, 'config.distributed.startup_timeout_s: must be positive'),
    ({'method': 'localsgd', 'distributed.coordinator': 'h:1', 'distributed.num_processes': 2,
      'distributed.data_timeout_s': -1.0}, 'config.distributed.data_timeout_s: must be positive'),
    ({'method': 'localsgd', 'distributed.coordinator': 'h:1', 'distributed.num_processes': 2,
      'distributed.stall_timeout_s': 2.0}, 'config.distributed.stall_timeout_s: must be 0 .never judged. or at least 5'),
])
def test_bad_multi_process_settings_name_the_field(overrides, message):
  with pytest.raises(ConfigError, match=message):
    validate(tiny_config(**overrides))


def test_pipeline_and_replica_methods_may_run_over_processes_and_bp_dp_may_not():
  """Every pipeline method and local SGD pass the checks of a 2-process run (they stop nowhere); BP and DP, one
  compiled step in one process, are refused with the line that says which methods run over processes."""
  over_two = lambda method: tiny_config(**{'method': method, 'distributed.coordinator': 'h:1',
                                           'distributed.num_processes': 2})
  for method in ('fdg', 'adl', 'ddg', 'fr', 'dgl', 'gpipe', '1f1b', 'zb_h1', 'localsgd'):
    assert validate(over_two(method)) is None, method
  for method in ('bp', 'dp'):
    with pytest.raises(ConfigError, match=f'config.distributed.coordinator: .*; {method} runs in one process'):
      validate(over_two(method))
