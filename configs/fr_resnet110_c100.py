"""FR (features replay) K=2 on CIFAR-100 resnet110, the FDG paper's recipe (300 epochs, 3-epoch warm-up at lr 0.01).

python main.py --config=configs/fr_resnet110_c100.py --config.data.path=cifar100.npz

The FDG authors' README (test error, their rerun, marked * there; the paper's tables do not print it): CIFAR-100 FR
26.31% (K=2).
"""
from jaxdecouple.recipes import fdg_paper


def get_config():
  return fdg_paper('fr', 'resnet110', 'cifar100', num_stages=2, warmup=True)
