"""ADL (accumulated decoupled learning) K=3, M=2 on CIFAR-10 resnet56, the ADL code's recipe.

python main.py --config=configs/adl_resnet56.py --config.data.path=cifar10.npz

FDG's pipeline (delays 2(K-1-k)) with each stage summing M = 2 delayed gradients per update, mode B
(update, then forward). 300 epochs, lr 0.1 decayed x0.1 at 150/225/275, per-iteration linear warm-up
from 0.001 to 0.1 over 5 epochs, the ADL code's CIFAR-10 normalisation. K = 3 is the ADL code's default
split; its default M is 1 (= FDG), so M = 2 is our choice. The SPEC carries no ADL numbers to compare.
Other settings: --config.pipeline.num_stages=2 or 4, --config.pipeline.accumulation=4,
--config.pipeline.adl_mode=A. The log's first lines give each stage's staleness in updates.
"""
from jaxdecouple.recipes import adl_paper


def get_config():
  return adl_paper('resnet56', 'cifar10', num_stages=3, accumulation=2)
