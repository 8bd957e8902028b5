"""DDG (decoupled parallel back-propagation) K=2 on CIFAR-10 resnet56, the FDG paper's recipe (300 epochs).

python main.py --config=configs/ddg_resnet56.py --config.data.path=cifar10.npz

The FDG authors' README (test error, their rerun, marked * there; the paper's tables do not print it): DDG 6.63%
(K=2).
K=3 and K=4 (--config.pipeline.num_stages=3 or 4, with --config.optim.warmup=constant --config.optim.warmup_epochs=3 as the paper did): 6.50% and 6.61%.
"""
from jaxdecouple.recipes import fdg_paper


def get_config():
  return fdg_paper('ddg', 'resnet56', 'cifar10', num_stages=2, warmup=False)
