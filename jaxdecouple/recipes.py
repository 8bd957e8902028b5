"""The papers' recipes as config builders, so every experiment file is a few overrides."""
from __future__ import annotations

from jaxdecouple.config import get_default_config


def fdg_paper(method: str, model: str, dataset: str = 'cifar10', num_stages: int = 2, beta: float = 1.0,
              warmup: bool = False):
  """The FDG paper's recipe: SGD lr 0.1, momentum 0.9, weight decay 5e-4, batch 128, 300 epochs,
  lr / 10 at epochs 150, 225 and 275; optional warm-up at lr 0.01 for 3 epochs (ResNet-110, K = 3, 4).
  Random crop with 4-pixel zero padding and horizontal flip."""
  c = get_default_config()
  c.method = method
  c.model = model
  c.dataset = dataset
  c.batch_size = 128
  c.num_epochs = 300
  c.optim.learning_rate = 0.1
  c.optim.milestones = (150, 225, 275)
  if warmup:
    c.optim.warmup = 'constant'
    c.optim.warmup_epochs = 3.0
    c.optim.warmup_lr = 0.01
  c.pipeline.num_stages = num_stages
  c.pipeline.beta = beta
  c.pipeline.split = 'auto'
  c.log_every_steps = 100
  c.checkpoint_every_steps = 2000
  return c


def adl_paper(model: str, dataset: str = 'cifar10', num_stages: int = 3, accumulation: int = 2,
              mode: str = 'B', beta: float = 1.0):
  """The ADL code's recipe: the FDG paper's, with its per-iteration linear warm-up from 0.01 x lr
  to lr over 5 epochs, and its CIFAR-10 normalisation std (0.2470, 0.2435, 0.2616)."""
  c = fdg_paper('adl', model, dataset, num_stages, beta)
  c.optim.warmup = 'linear'
  c.optim.warmup_epochs = 5.0
  c.optim.warmup_factor = 0.01
  c.data.normalization = 'adl'
  c.pipeline.accumulation = accumulation
  c.pipeline.adl_mode = mode
  return c


def resist_release(method: str, dataset: str = 'cifar100', num_workers: int = 4, num_epochs: int = 160,
                   model: str = 'preact101'):
  """The ResIST release's recipe: pre-activation ResNet-101, batch 128 per worker, 50 local
  iterations per round, SGD lr 0.03 (momentum 0.9, weight decay 5e-4) divided by 10 after 50% and
  75% of the epochs, crop+flip, momentum restarted every round, BatchNorm with batch statistics at
  train and test time. The paper trains 80 epochs with 2 workers and 160 with 4 or 8."""
  c = get_default_config()
  c.method = method
  c.model = model
  c.dataset = dataset
  c.batch_size = 128
  c.num_epochs = num_epochs
  c.optim.learning_rate = 0.03
  c.optim.milestones = (num_epochs // 2, num_epochs * 3 // 4)
  c.replica.num_workers = num_workers
  c.replica.local_steps = 50
  c.replica.momentum = 'restart'
  c.replica.batch_norm = 'batch'
  c.log_every_steps = 100
  c.checkpoint_every_steps = 2000
  return c
