"""DGL (decoupled greedy learning, auxiliary heads) K=2 on CIFAR-100 resnet18, the FDG paper's recipe (300 epochs).

python main.py --config=configs/dgl_resnet18_c100.py --config.data.path=cifar100.npz

The FDG authors' README (test error, their rerun, marked * there; the paper's tables do not print it): CIFAR-100 DGL
22.24% (K=2).
The auxiliary heads' extra parameters are logged at the start of the run.
"""
from jaxdecouple.recipes import fdg_paper


def get_config():
  return fdg_paper('dgl', 'resnet18', 'cifar100', num_stages=2, warmup=False)
