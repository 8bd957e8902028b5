"""DDG (decoupled parallel back-propagation) K=2 on CIFAR-10 resnet110, the FDG paper's recipe (300 epochs, 3-epoch warm-up at lr 0.01).

python main.py --config=configs/ddg_resnet110.py --config.data.path=cifar10.npz

The FDG authors' README (test error, their rerun, marked * there; the paper's tables do not print it): DDG 6.26%
(K=2).
"""
from jaxdecouple.recipes import fdg_paper


def get_config():
  return fdg_paper('ddg', 'resnet110', 'cifar10', num_stages=2, warmup=True)
