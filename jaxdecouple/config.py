"""The configuration schema: every field, its default, and the field checks run before any compute.

``get_default_config()`` is the single source of the fields (``configs/default.py`` returns it);
experiment files override it. ``validate(config)`` rejects unknown fields, wrong types and bad values
with one :class:`ConfigError` line naming the field and what is allowed. It knows no method: each method
checks its own sections (``Method.validate``), and ``jaxdecouple.methods.validate`` runs both.
"""
from __future__ import annotations

import math
from typing import Any

import ml_collections

from jaxdecouple import optim
from jaxdecouple.errors import fail


def get_default_config() -> ml_collections.ConfigDict:
  """BP on CIFAR-10 ResNet-56 with the FDG paper's recipe (300 epochs, decays at 150/225/275)."""
  c = ml_collections.ConfigDict()
  c.method = 'bp'              # see jaxdecouple.methods.METHODS (each checks its own section below)
  c.model = 'resnet56'         # see jaxdecouple.models.MODEL_HELP
  c.model_init = 'he'          # he (He fan-out convolutions) or torch (PyTorch's defaults, as the ResIST release)
  c.model_head_norm = True     # pre-activation nets: BN-ReLU before the pooling (False: the ResIST release's head)
  c.scan_blocks = 0            # runs of at least N identical blocks run as one scanned loop (0: never);
                               # ResNet-1202 compiles in seconds instead of minutes (docs/PERFORMANCE.md)
  c.dataset = 'cifar10'        # cifar10, cifar100, fashion_mnist (in memory); imagenet (streamed from JPEGs)
  c.seed = 0
  c.batch_size = 128
  c.num_epochs = 300
  c.max_steps = 0              # > 0: stop after this many steps (short runs, tests)
  c.eval_every_epochs = 1      # test loss/accuracy after every N epochs and at the end
  c.eval_batch_size = 1000
  c.log_every_steps = 100      # training metrics are fetched from the device this often
  c.checkpoint_every_steps = 1000  # 0: only at the end
  c.profile_every_steps = 500  # per-stage times and peak memory every N steps (0: never)
  c.keep_checkpoints = 2
  c.cpu_devices = 0            # > 0: split the host CPU into this many JAX devices (before JAX starts)
  c.split_backward = 'auto'    # forward and backward in two compiled calls: auto (on for CPU), on, off
  c.compute_dtype = 'float32'  # float32, or bfloat16: activations and convolutions in bfloat16; parameters,
                               # optimizer state, BatchNorm statistics and the loss in float32
  c.resume_changes = ''        # fields this run may change on resume although they change what is computed,
                               # comma-separated (e.g. 'optim.learning_rate' after a divergence)

  c.data = ml_collections.ConfigDict()
  c.data.source = 'auto'       # auto, idx, npz, tfds, folder (imagenet), synthetic (tests only)
  c.data.path = ''             # .npz with x_train, y_train, x_test, y_test (or the JPEG CIFAR-10 copy);
                               # imagenet: a folder with train/CLASS/*.JPEG and val/CLASS/*.JPEG
  c.data.idx_dir = ''          # Fashion-MNIST IDX files; '' = /usr/share/datasets/fashion-mnist
  c.data.tfds_data_dir = ''
  c.data.tfds_download = True
  c.data.tfds_manual_dir = ''  # imagenet: ILSVRC2012_img_train.tar and _val.tar, prepared by tfds (needs TensorFlow)
  c.data.image_size = 224      # imagenet: training crops and evaluation centre crops are this many pixels a side
  c.data.workers = 0           # imagenet: processes decoding JPEGs (0: one per core)
  c.data.prefetch = 2          # imagenet: batches decoded ahead of the step that needs them
  c.data.imagenet_v2 = ''      # imagenet: also evaluate on ImageNet-V2: 'all' or some of matched-frequency,
                               # threshold-0.7, topimages (comma-separated)
  c.data.imagenet_v2_dir = ''  # the folder holding the extracted ImageNet-V2 test sets; '': tensorflow-datasets
  c.data.holdout = 0.0         # (0, 1): this fraction of the training set (a fixed split) is evaluated in place of
                               # the test set, for tuning hyper-parameters (in-memory data sets)
  c.data.augment = True        # random crop (zero padding) + horizontal flip; imagenet: random-resized crop + flip
  c.data.crop_padding = 4
  c.data.flip = True
  c.data.normalization = 'default'  # 'adl': the ADL code's CIFAR-10 std
  c.data.synthetic_train_size = 512
  c.data.synthetic_test_size = 256

  c.optim = ml_collections.ConfigDict()  # per stage in pipelines, per worker in replicas (jaxdecouple/optim.py)
  c.optim.name = 'sgd'         # sgd (PyTorch's SGD, the papers'), adamw, lamb, lars, muon (optax)
  c.optim.learning_rate = 0.1
  c.optim.momentum = 0.9       # sgd, lars
  c.optim.weight_decay = 5e-4
  c.optim.nesterov = False      # sgd, lars, adamw, muon
  c.optim.b1 = 0.9             # adamw, lamb; muon's Adam (its non-matrix parameters)
  c.optim.b2 = 0.999           # adamw, lamb; muon's Adam
  c.optim.eps = 1e-8           # adamw, lamb, muon
  c.optim.trust_coefficient = 0.001  # lars
  c.optim.muon_beta = 0.95     # muon: momentum of the orthogonalised matrices
  c.optim.ns_steps = 5         # muon: Newton-Schulz iterations
  c.optim.milestones = (150, 225, 275)  # epochs at which lr *= decay_factor
  c.optim.decay_factor = 0.1
  c.optim.decay_steps = 0.0    # > 0: lr / sqrt(1 + t / decay_steps) at iteration t instead of milestones (the
                               # diminishing rate FDG's Theorem 1 assumes; milestones must be ())
  c.optim.warmup = 'none'      # none; constant (warmup_lr for warmup_epochs); linear (ADL)
  c.optim.warmup_epochs = 0.0
  c.optim.warmup_lr = 0.01
  c.optim.warmup_factor = 0.01  # linear warm-up starts at warmup_factor * learning_rate

  c.dp = ml_collections.ConfigDict()  # data parallel
  c.dp.num_devices = 0         # 0: every device; the batch must divide evenly over them

  c.pipeline = ml_collections.ConfigDict()  # the pipeline methods (fdg, adl, ddg, fr, dgl)
  c.pipeline.num_stages = 2    # K
  c.pipeline.beta = 1.0        # gradient shrinking; 1 = none
  c.pipeline.split = 'auto'    # auto (reference, else balanced), reference, balanced, or 's2b4,s3b0'
  c.pipeline.keep = 'vjp'      # vjp (saved forward), recompute (input + params; less memory); fr replays
  c.pipeline.num_devices = 0   # 0: one device per stage (as many as present); stages then share
  c.pipeline.accumulation = 1  # adl: M delayed backwards summed into one update
  c.pipeline.adl_mode = 'B'    # adl: B = update, then forward; A = forward with pre-update parameters
  c.pipeline.corrector = 'none' # delayed stages' staleness corrector: none, predict, dc, pipemare_lr, nesterov
  c.pipeline.dc_lambda = 0.04  # dc: lambda of DC-ASGD's g*g*(w_now - w_then) term
  c.pipeline.lr_anneal_epochs = 7.0  # pipemare_lr: epochs over which the per-stage division by delay fades
  c.pipeline.nesterov_gamma = 0.99   # nesterov: the look-ahead's momentum gamma (AsyncPP)
  c.pipeline.diagnose_every_steps = 0  # > 0: every N steps, each stage's applied gradient against BP's
                                       # (cosine, norm ratio) as kind "diagnose" lines; 0: off

  c.replica = ml_collections.ConfigDict()  # the replica methods (resist, localsgd, ensemble)
  c.replica.num_workers = 4    # S; batch_size is per worker, each worker shuffles the data on its own
  c.replica.local_steps = 50   # L local iterations per round, then averaging (and a new partition)
  c.replica.min_depth = 0      # resist: pad sub-networks to at least this many partitioned blocks
  c.replica.momentum = 'restart'   # restart (the release) or average (like the parameters)
  c.replica.batch_norm = 'batch'   # batch: batch statistics at train and test (the release); running
  c.replica.quantize_bits = 0  # 4..8: what a worker sends is quantised to this many bits; 0: off
  c.replica.sparsify = 0.0     # (0, 1): a worker sends only this fraction of each tensor (largest magnitude); 0: off
  c.replica.num_devices = 0    # 0: as many as divide num_workers; workers then share devices
  c.replica.warmup_steps = 0   # resist: local SGD (partitioned branches scaled) for this many steps first, a
                               # multiple of local_steps (the paper's section 2.6: a few epochs)
  c.replica.stats_every_steps = 0  # average the shared layers' BatchNorm statistics every this many steps (a
                                   # multiple of local_steps; 0: every round, the release; ImageNet: 1300 rounds)
  c.replica.test_time_scale = True  # resist: scale partitioned branches by 1/S at test time (False: A.1's ablation)
  c.replica.skip = 'gather'    # resist: how blocks a worker does not own are skipped: gather | cond
  c.replica.partition = 'third_section'  # resist: which blocks are dealt out: third_section (the paper's) or
  #   every_section (A.1's naive partition: every block that keeps its input's shape, each section on its own)
  c.replica.outer_lr = 1.0     # outer step on the round's average change (DiLoCo: lr 0.7, Nesterov momentum
  c.replica.outer_momentum = 0.0  # 0.9); lr 1 and momentum 0: plain averaging
  c.replica.outer_nesterov = True
  c.replica.compress = 'weights'  # what quantize_bits / sparsify compress: weights (A.5) or updates (the change)
  c.replica.error_feedback = True  # compress='updates': carry what was not sent into the next round
  c.replica.update_exchange = 'all_gather'  # compress='updates': all_gather, or two_stage (chunks all-to-all, then
                                            # their encoded means all-gathered: bytes constant in S; METHODS.md)

  c.distributed = ml_collections.ConfigDict()  # several processes (hosts) in one run
  c.distributed.coordinator = ''   # '': one process; 'auto': jax.distributed.initialize() detects
                                   # (TPU pods, SLURM, ...); or 'HOST:PORT' with the two fields below
  c.distributed.num_processes, c.distributed.process_id = 1, 0
  c.distributed.startup_timeout_s = 60.0  # how long a process waits for the others' configs at start-up
  c.distributed.heartbeat_timeout_s = 30.0  # a process silent this long is declared dead (JAX's default: 100)
  c.distributed.transfer_address = ''  # pipelines, resist: HOST:PORT where this process receives transfers; '':
  # its address toward the coordinator, port = the coordinator's + 1 + process_id (with 'auto': required)
  return c


MAX_EVAL_BATCH = 65536
MAX_CPU_DEVICES = 256


def set_fields(config, fields: dict) -> ml_collections.ConfigDict:
  """Sets dotted fields, e.g. {'pipeline.num_stages': 4, 'optim.learning_rate': 0.05}; returns config."""
  for key, value in fields.items():
    target = config
    *path, last = key.split('.')
    for part in path:
      target = target[part]
    target[last] = value
  return config


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
  _choice(config, 'dataset', sorted(data.DATASETS))
  _choice(config, 'data.source', data.SOURCES)
  _choice(config, 'data.normalization', ('default', 'adl'))
  _choice(config, 'split_backward', ('auto', 'on', 'off'))
  _choice(config, 'compute_dtype', ('float32', 'bfloat16'))
  _choice(config, 'optim.warmup', ('none', 'constant', 'linear'))
  for field in ('batch_size', 'num_epochs', 'eval_every_epochs', 'eval_batch_size', 'log_every_steps',
                'keep_checkpoints', 'optim.learning_rate', 'data.synthetic_train_size',
                'data.synthetic_test_size', 'data.image_size', 'data.prefetch'):
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
  if config.seed >= 2**63:
    fail('seed', f'must be below 2**63, got {config.seed}')
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
  d = config.distributed
  if d.coordinator not in ('', 'auto'):
    if ':' not in d.coordinator:
      fail('distributed.coordinator', f"must be '', 'auto' or HOST:PORT, got {d.coordinator!r}")
    if d.num_processes < 2:
      fail('distributed.num_processes', f'must be at least 2 with a coordinator, got {d.num_processes}')
    if not d.startup_timeout_s > 0:
      fail('distributed.startup_timeout_s', f'must be positive, got {d.startup_timeout_s}')
    if not d.heartbeat_timeout_s >= 1:
      fail('distributed.heartbeat_timeout_s', f'must be at least 1 (seconds), got {d.heartbeat_timeout_s}')
    if not 0 <= d.process_id < d.num_processes:
      fail('distributed.process_id', f'must be in [0, {d.num_processes}), got {d.process_id}')
  if d.transfer_address and (':' not in d.transfer_address or not d.transfer_address.rsplit(':', 1)[1].isdigit()):
    fail('distributed.transfer_address', f"must be '' (automatic) or HOST:PORT, got {d.transfer_address!r}")
  if d.coordinator and config.pipeline.diagnose_every_steps:
    fail('pipeline.diagnose_every_steps', 'compares stages with back-propagation on one device, so it runs in one '
         'process; leave it at 0 in a multi-process run')
