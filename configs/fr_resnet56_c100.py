"""FR (features replay) K=2 on CIFAR-100 resnet56, the FDG paper's recipe (300 epochs).

python main.py --config=configs/fr_resnet56_c100.py --config.data.path=cifar100.npz

The FDG authors' README (test error, their rerun, marked * there; the paper's tables do not print it): CIFAR-100 FR
28.39% (K=2).
"""
from jaxdecouple.recipes import fdg_paper


def get_config():
  return fdg_paper('fr', 'resnet56', 'cifar100', num_stages=2, warmup=False)
