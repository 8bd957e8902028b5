"""The configuration schema: every field and its default.

``get_default_config()`` is the single source of the fields (``configs/default.py`` returns it);
experiment files override it, or ``set_fields`` with dotted names. The checks of every field before any
compute are ``config_checks.validate``.
"""
from __future__ import annotations

import ml_collections


def get_default_config() -> ml_collections.ConfigDict:
  """BP on CIFAR-10 ResNet-56 with the FDG paper's recipe (300 epochs, decays at 150/225/275)."""
  c = ml_collections.ConfigDict()
  c.method = 'bp'              # see jaxdecouple.methods.METHODS (each checks its own section below)
  c.model = 'resnet56'         # see jaxdecouple.models.MODEL_HELP
  c.model_init = 'he'          # he (He fan-out convolutions) or torch (PyTorch's defaults, as both papers' codes)
  c.model_head_norm = True     # pre-activation nets: BN-ReLU before the pooling (False: the ResIST release's head)
  c.scan_blocks = 0            # runs of at least N identical blocks run as one scanned loop (0: never);
                               # ResNet-1202 compiles in seconds instead of minutes (docs/PERFORMANCE.md)
  c.dataset = 'cifar10'        # cifar10, cifar100, fashion_mnist (in memory); imagenet (streamed from JPEGs);
                               # fortunes, text (byte-level text, data/text.py); shapes, voc (detection,
                               # data/detection.py: with a yolo_ model)
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
  c.compilation_cache_dir = 'auto'  # XLA's compiled programs kept on disk for later runs and resumes: auto
                               # (JAX_COMPILATION_CACHE_DIR if set, else $XDG_CACHE_HOME or ~/.cache, then
                               # jaxdecouple/xla), a folder, or '' for none (jaxdecouple/compilation_cache.py)
  c.split_backward = 'auto'    # forward and backward in two compiled calls: auto (on for CPU), on, off
  c.compute_dtype = 'float32'  # float32, or bfloat16: activations and convolutions in bfloat16; parameters,
                               # optimizer state, BatchNorm statistics and the loss in float32
  c.resume_changes = ''        # fields this run may change on resume although they change what is computed,
                               # comma-separated (e.g. 'optim.learning_rate' after a divergence)

  c.data = ml_collections.ConfigDict()
  c.data.source = 'auto'       # auto, idx, npz, tfds, folder (imagenet, voc), synthetic (tests only)
  c.data.path = ''             # .npz with x_train, y_train, x_test, y_test (or the JPEG CIFAR-10 copy);
                               # imagenet: a folder with train/CLASS/*.JPEG and val/CLASS/*.JPEG;
                               # voc: the extracted VOCdevkit folder (docs/DATA.md)
  c.data.idx_dir = ''          # Fashion-MNIST IDX files; '' = /usr/share/datasets/fashion-mnist
  c.data.tfds_data_dir = ''
  c.data.tfds_download = True
  c.data.tfds_manual_dir = ''  # imagenet: ILSVRC2012_img_train.tar and _val.tar, prepared by tfds (needs TensorFlow)
  c.data.image_size = 224      # imagenet: training crops and evaluation centre crops are this many pixels a side;
                               # voc: images are resized to this many pixels a side
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
  c.data.sequence_length = 128  # fortunes, text: bytes per example (the model predicts each next byte)
  c.data.synthetic_train_size = 512
  c.data.synthetic_test_size = 256
  c.data.detection_train_size = 6000  # shapes (generated detection data, data/shapes.py): training images
  c.data.detection_test_size = 1000   # and test images, drawn from
  c.data.detection_seed = 0           # this seed (the data set's, not the run's)

  c.optim = ml_collections.ConfigDict()  # per stage in pipelines, per worker in replicas (jaxdecouple/optim.py)
  c.optim.name = 'sgd'         # sgd (PyTorch's SGD, the papers'), adamw, lamb, lars, muon (optax)
  c.optim.learning_rate = 0.1
  c.optim.momentum = 0.9       # sgd, lars
  c.optim.weight_decay = 5e-4
  c.optim.nesterov = False      # sgd, lars, adamw, muon
  c.optim.b1 = 0.9             # adamw, lamb; muon's Adam (its non-matrix parameters)
  c.optim.b2 = 0.999           # adamw, lamb; muon's Adam
  c.optim.eps = 1e-8           # adamw, lamb, muon
  c.optim.momentum_decay = 0.0  # adamw with nesterov: > 0 is PyTorch's NAdam (its momentum schedule, psi; torch's
  #                              default 0.004, what AsyncPP's code runs); 0 is optax's NAdamW (b1 throughout)
  c.optim.trust_coefficient = 0.001  # lars
  c.optim.muon_beta = 0.95     # muon: momentum of the orthogonalised matrices
  c.optim.ns_steps = 5         # muon: Newton-Schulz iterations
  c.optim.muon_ends = 'muon'   # muon: the first and last blocks' kernels (stem or patch embedding, classifier) to
  #                              Muon (optax's default, every kernel) or to Muon's Adam ('adam', as Muon's authors
  #                              train: only hidden layers orthogonalised; DGL's auxiliary classifiers to Adam too)
  c.optim.milestones = (150, 225, 275)  # epochs at which lr *= decay_factor
  c.optim.decay_factor = 0.1
  c.optim.decay_steps = 0.0    # > 0: lr / sqrt(1 + t / decay_steps) at iteration t instead of milestones (the
                               # diminishing rate FDG's Theorem 1 assumes, with momentum 0, weight decay 0 and
                               # no warm-up: its plain SGD; milestones must be ())
  c.optim.warmup = 'none'      # none; constant (warmup_lr for warmup_epochs); linear (ADL)
  c.optim.warmup_epochs = 0.0
  c.optim.warmup_lr = 0.01
  c.optim.warmup_factor = 0.01  # linear warm-up starts at warmup_factor * learning_rate

  c.dp = ml_collections.ConfigDict()  # data parallel
  c.dp.num_devices = 0         # 0: every device; the batch must divide evenly over them

  c.pipeline = ml_collections.ConfigDict()  # the pipeline methods (fdg, adl, ddg, fr, dgl, gpipe, 1f1b, zb_h1)
  c.pipeline.num_stages = 2    # K
  c.pipeline.beta = 1.0        # gradient shrinking; 1 = none
  c.pipeline.split = 'auto'    # auto (reference, else balanced), reference, balanced, or 's2b4,s3b0'
  c.pipeline.keep = 'vjp'      # vjp (saved forward), recompute (input + params; less memory); fr replays
  c.pipeline.num_devices = 0   # 0: one device per stage (as many as present); stages then share
  c.pipeline.micro_batches = 4  # gpipe, 1f1b, zb_h1: M micro-batches per iteration (M divides batch_size)
  c.pipeline.data_parallel = 1  # every pipeline method: D devices per stage, each (micro-)batch split over them
  c.pipeline.accumulation = 1  # adl: M delayed backwards summed into one update
  c.pipeline.adl_mode = 'B'    # adl: B = update, then forward; A = forward with pre-update parameters
  c.pipeline.corrector = 'none' # delayed stages' staleness corrector: none, predict, dc, pipemare_lr, nesterov
  c.pipeline.dc_lambda = 0.04  # dc: lambda of DC-ASGD's g*g*(w_now - w_then) term
  c.pipeline.lr_anneal_epochs = 7.0  # pipemare_lr: epochs over which the per-stage division by delay fades
  c.pipeline.nesterov_gamma = 0.99   # nesterov: the look-ahead's momentum gamma (AsyncPP)
  c.pipeline.nesterov_lr_scale = 1.0  # nesterov: its rate times this (eq. 10: 1; 1 / (1 - optim.momentum): SGD's step)
  c.pipeline.diagnose_every_steps = 0  # > 0: every N steps, each stage's applied gradient against BP's
                                       # (cosine, norm ratio) as kind "diagnose" lines; 0: off

  c.replica = ml_collections.ConfigDict()  # the replica methods (resist, localsgd, ensemble)
  c.replica.num_workers = 4    # S; batch_size is per worker, each worker shuffles the data on its own
  c.replica.local_steps = 50   # L local iterations per round, then averaging (and a new partition)
  c.replica.min_depth = 0      # resist: pad sub-networks to at least this many partitioned blocks
  c.replica.momentum = 'restart'   # restart (the release) or average (like the parameters)
  c.replica.batch_norm = 'batch'   # batch: batch statistics at train and test (the release); running: the
                                   # running statistics at test time (averaged as stats_every_steps says)
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
  c.replica.worker_speeds = ()  # stragglers, simulated: one relative speed per worker (e.g. 1,1,1,0.5); each round
  # is then timed for real and logged beside the model of a round that waits for its slowest (replica/stragglers.py)

  c.distributed = ml_collections.ConfigDict()  # several processes (hosts) in one run
  c.distributed.coordinator = ''   # '': one process; 'auto': jax.distributed.initialize() detects
                                   # (TPU pods, SLURM, ...); or 'HOST:PORT' with the two fields below
  c.distributed.num_processes, c.distributed.process_id = 1, 0
  c.distributed.startup_timeout_s = 30.0  # how long a process waits for the others to join and show their configs
  c.distributed.data_timeout_s = 600.0  # how long a process waits for the others to load their data (a host may
  # decode a data set for minutes; a peer that fails says why at once, and a dead one misses its heartbeats)
  c.distributed.heartbeat_timeout_s = 30.0  # a peer silent this long stops the others with a line (liveness.py)
  c.distributed.stall_timeout_s = 1800.0  # a process whose main thread marks no progress (a step, an evaluation,
  # a checkpoint) this long stops every process with a line naming where it is (liveness.py); 0: never. Raise it
  # above the longest first compilation, evaluation or checkpoint of the run
  c.distributed.transfer_address = ''  # pipelines, resist: HOST:PORT where this process receives transfers; '':
  # its address toward the coordinator, port = the coordinator's + 1 + process_id (with 'auto': required)
  return c


def set_fields(config, fields: dict) -> ml_collections.ConfigDict:
  """Sets dotted fields, e.g. {'pipeline.num_stages': 4, 'optim.learning_rate': 0.05}; returns config."""
  for key, value in fields.items():
    target = config
    *path, last = key.split('.')
    for part in path:
      target = target[part]
    target[last] = value
  return config
