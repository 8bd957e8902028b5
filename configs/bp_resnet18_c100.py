"""BP on CIFAR-100 resnet18, the FDG paper's recipe (300 epochs): the baseline beside
configs/fdg_resnet18_c100.py.

python main.py --config=configs/bp_resnet18_c100.py --config.data.path=cifar100.npz

Paper (Table 3, BP rerun by the FDG authors): CIFAR-100 BP 22.35%.
Data: an .npz with x_train, y_train, x_test, y_test of CIFAR-100 (100 classes; from the authors' archive:
`python -m jaxdecouple.data.cifar_archive cifar-100-python.tar.gz cifar100.npz`), or tensorflow-datasets when it
can download or has the data prepared.
"""
from jaxdecouple.recipes import fdg_paper


def get_config():
  return fdg_paper('bp', 'resnet18', 'cifar100', num_stages=1, beta=1.0, warmup=False)
