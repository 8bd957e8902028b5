"""FR (features replay) K=2 on CIFAR-100 resnet18, the FDG paper's recipe (300 epochs).

python main.py --config=configs/fr_resnet18_c100.py --config.data.path=cifar100.npz

The FDG authors' README (test error, their rerun, marked * there; the paper's tables do not print it): CIFAR-100 FR
22.88% (K=2).
"""
from jaxdecouple.recipes import fdg_paper


def get_config():
  return fdg_paper('fr', 'resnet18', 'cifar100', num_stages=2, warmup=False)
