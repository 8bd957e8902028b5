"""The field checks run before any compute: ``validate(config)`` rejects unknown fields, wrong types and bad
values with one :class:`ConfigError` line naming the field and what is allowed. It knows no method: each
method checks its own sections (``Method.validate``), and ``jaxdecouple.methods.validate`` runs both."""
from __future__ import annotations

import math
from typing import Any

import ml_collections

from jaxdecouple import optim
from jaxdecouple.config import get_default_config
from jaxdecouple.errors import fail

MAX_EVAL_BATCH = 65536
MAX_CPU_DEVICES = 256


def _check_types(config, default, prefix: str = ''):
  for key in config.keys():
    field = prefix + key
    if key not in default:
      allowed = ', '.join(sorted(default.keys()))
      fail(field, f'unknown field; fields here are: {allowed}')
    value, want = config[key], default[key]
    if isinstance(want, ml_collections.ConfigDict):
      if not isinstance(value, (ml_collections.ConfigDict, dict)):
        fail(field, f'must be a group of fields, got {type(value).__name__}')
      _check_types(value, want, field + '.')
    elif isinstance(want, bool):
      if not isinstance(value, bool):
        fail(field, f'must be true or false, got {value!r}')
    elif isinstance(want, int):
      if isinstance(value, bool) or not isinstance(value, int):
        fail(field, f'must be an integer, got {value!r}')
    elif isinstance(want, float):
      if isinstance(value, bool) or not isinstance(value, (int, float)):
        fail(field, f'must be a number, got {value!r}')
      if not math.isfinite(value):
        fail(field, f'must be finite, got {value!r}')
    elif isinstance(want, str):
      if not isinstance(value, str):
        fail(field, f'must be a string, got {value!r}')
    elif isinstance(want, (tuple, list)):
      if not isinstance(value, (tuple, list)) or not all(
          isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        fail(field, f'must be a list of numbers, got {value!r}')
      if not all(math.isfinite(v) for v in value):
        fail(field, f'must hold finite numbers, got {value!r}')


def _fields(config, prefix: str = '') -> list[str]:
  out = []
  for key, value in config.items():
    out += _fields(value, f'{prefix}{key}.') if isinstance(value, ml_collections.ConfigDict) else [prefix + key]
  return out


def _choice(config, field: str, allowed):
  value = _get(config, field)
  if value not in allowed:
    fail(field, f'{value!r} is not allowed; choose one of: {", ".join(map(str, allowed))}')


def _get(config, field: str) -> Any:
  for part in field.split('.'):
    config = config[part]
  return config


def _positive(config, field: str, allow_zero: bool = False):
  value = _get(config, field)
  if value < 0 or (value == 0 and not allow_zero):
    fail(field, f'must be {"non-negative" if allow_zero else "positive"}, got {value!r}')


def _check_model_input(config) -> None:
  """The model reads what the data set holds (bytes or images; a ViT's patches tile the image; a GPT has a
  position for every byte of a sequence)."""
  from jaxdecouple import data, models
  tokens = config.dataset in data.TEXT_DATASETS
  detecting = config.dataset in data.DETECTION_DATASETS
  if detecting != config.model.startswith(models.DETECTION_PREFIX):
    fail('model', f'{config.model} and dataset={config.dataset}: a detection data set (shapes, voc) trains a '
         'yolo_ network (e.g. yolo_postact_tiny), and a yolo_ network trains on a detection data set')
  if detecting:
    shape = data.DETECTION_DATASETS[config.dataset].image_shape
    shape = (config.data.image_size, config.data.image_size, 3) if config.dataset == 'voc' else shape
  elif tokens:
    _positive(config, 'data.sequence_length')
    shape = (config.data.sequence_length,)
  else:
    shape = data.DATASETS[config.dataset].image_shape
    if config.dataset in data.STREAMED:
      shape = (config.data.image_size, config.data.image_size, shape[-1])
  try:
    models.check_input(models.build_model(config.model, 10), shape, tokens)
  except ValueError as e:
    fail('model' if 'sequence_length' not in str(e) else 'data.sequence_length', str(e))


def validate(config) -> None:
  """Checks every field; raises ConfigError with one line naming the field and what is allowed. The method's
  name and sections are the method's to check (``jaxdecouple.methods.validate``)."""
  from jaxdecouple import data, models  # the registries

  _check_types(config, get_default_config())
  try:
    models.build_model(config.model, 10)
  except ValueError as e:
    fail('model', str(e))
  _choice(config, 'model_init', ('he', 'torch'))
  if config.model_init == 'torch' and config.scan_blocks:
    fail('model_init', "torch initialises each array by its own fan-in, and scanned blocks stack theirs into one "
         'array; leave scan_blocks at 0 with it')
  if not config.model_head_norm:
    try:
      models.build_model(config.model, 10, head_norm=False)
    except ValueError as e:
      fail('model_head_norm', str(e))
  _choice(config, 'dataset', sorted((*data.DATASETS, *data.TEXT_DATASETS, *data.DETECTION_DATASETS)))
  _check_model_input(config)
  _choice(config, 'data.source', data.SOURCES)
  _choice(config, 'data.normalization', ('default', 'adl'))
  _choice(config, 'split_backward', ('auto', 'on', 'off'))
  _choice(config, 'compute_dtype', ('float32', 'bfloat16'))
  _choice(config, 'optim.warmup', ('none', 'constant', 'linear'))
  for field in ('batch_size', 'num_epochs', 'eval_every_epochs', 'eval_batch_size', 'log_every_steps',
                'keep_checkpoints', 'optim.learning_rate', 'data.synthetic_train_size',
                'data.synthetic_test_size', 'data.detection_train_size', 'data.detection_test_size',
                'data.image_size', 'data.prefetch'):
    _positive(config, field)
  for field in ('max_steps', 'scan_blocks', 'checkpoint_every_steps', 'profile_every_steps', 'cpu_devices', 'seed', 'optim.weight_decay',
                'optim.warmup_epochs', 'data.crop_padding', 'data.workers'):
    _positive(config, field, allow_zero=True)
  optim.validate(config.optim)
  if config.scan_blocks and config.optim.name in ('lamb', 'lars'):
    fail('optim.name', f'{config.optim.name} scales each parameter array by its own trust ratio, and scan_blocks '
         'stacks a run of blocks into one array: leave scan_blocks at 0 with it')
  if not 0 < config.optim.decay_factor <= 1:
    fail('optim.decay_factor', f'must be in (0, 1], got {config.optim.decay_factor!r}')
  if config.optim.warmup != 'none' and config.optim.warmup_epochs <= 0:
    fail('optim.warmup_epochs', f'must be positive when optim.warmup={config.optim.warmup!r}')
  if config.optim.warmup == 'constant':
    _positive(config, 'optim.warmup_lr')
  if config.optim.warmup == 'linear' and not 0 < config.optim.warmup_factor <= 1:
    fail('optim.warmup_factor', f'must be in (0, 1], got {config.optim.warmup_factor!r}')
  milestones = list(config.optim.milestones)
  if any(m < 0 for m in milestones) or milestones != sorted(milestones):
    fail('optim.milestones', f'must be non-negative epochs in increasing order, got {milestones}')
  if milestones and milestones[-1] > config.num_epochs:
    fail('optim.milestones', f'{milestones} go beyond num_epochs={config.num_epochs}, so the learning rate would '
         'not decay there; give epochs within the run (scale them with num_epochs) or () for no decay')
  if config.optim.warmup_epochs > config.num_epochs:
    fail('optim.warmup_epochs', f'{config.optim.warmup_epochs} is longer than the run (num_epochs='
         f'{config.num_epochs})')
  if config.seed >= 2**32:  # jax.random.key keeps a seed's low 32 bits (without x64): 2**32 + 7 would be 7 again
    fail('seed', "must be below 2**32 (JAX's random keys keep only a seed's low 32 bits, so a larger one would "
         f"repeat a smaller one's initialisation and augmentation), got {config.seed}")
  if config.eval_batch_size > MAX_EVAL_BATCH:
    fail('eval_batch_size', f'{config.eval_batch_size} is more than {MAX_EVAL_BATCH}; the test set is evaluated '
         'in batches of at most its own size anyway (larger ones are only padding)')
  if config.cpu_devices > MAX_CPU_DEVICES:
    fail('cpu_devices', f'{config.cpu_devices} is more than {MAX_CPU_DEVICES} (thousands crash XLA); one device per '
         'pipeline stage or replica worker is enough, and workers and stages can share one')
  known = set(_fields(get_default_config()))
  for field in filter(None, (f.strip() for f in config.resume_changes.split(','))):
    if field not in known:
      fail('resume_changes', f'{field!r} is not a config field (give dotted names, e.g. optim.learning_rate)')
  _positive(config, 'pipeline.diagnose_every_steps', allow_zero=True)
  data.validate(config)
  validate_distributed(config)
  if config.distributed.coordinator and config.pipeline.diagnose_every_steps:
    fail('pipeline.diagnose_every_steps', 'compares stages with back-propagation on one device, so it runs in one '
         'process; leave it at 0 in a multi-process run')


def validate_distributed(config) -> None:
  """The ``distributed`` section alone: whether this process can join its run. A process whose other fields
  fail still joins when these hold, to tell the others why it stops (``process_start.stop_before_work``)."""
  d = config.distributed
  if d.coordinator not in ('', 'auto'):
    if ':' not in d.coordinator:
      fail('distributed.coordinator', f"must be '', 'auto' or HOST:PORT, got {d.coordinator!r}")
    if d.num_processes < 2:
      fail('distributed.num_processes', f'must be at least 2 with a coordinator, got {d.num_processes}')
    if not d.startup_timeout_s > 0:
      fail('distributed.startup_timeout_s', f'must be positive, got {d.startup_timeout_s}')
    if not d.data_timeout_s > 0:
      fail('distributed.data_timeout_s', f'must be positive, got {d.data_timeout_s}')
    if not d.heartbeat_timeout_s >= 1:
      fail('distributed.heartbeat_timeout_s', f'must be at least 1 (seconds), got {d.heartbeat_timeout_s}')
    if not (d.stall_timeout_s == 0 or d.stall_timeout_s >= 5):
      fail('distributed.stall_timeout_s', f'must be 0 (never judged) or at least 5 (seconds), got {d.stall_timeout_s}')
    if not 0 <= d.process_id < d.num_processes:
      fail('distributed.process_id', f'must be in [0, {d.num_processes}), got {d.process_id}')
  if d.transfer_address and (':' not in d.transfer_address or not d.transfer_address.rsplit(':', 1)[1].isdigit()):
    fail('distributed.transfer_address', f"must be '' (automatic) or HOST:PORT, got {d.transfer_address!r}")
