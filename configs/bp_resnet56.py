"""BP on CIFAR-10 resnet56, the FDG paper's recipe (300 epochs).

python main.py --config=configs/bp_resnet56.py --config.data.path=cifar10.npz

Paper: BP rerun 6.19%.
Data: an .npz with x_train, y_train, x_test, y_test (or the JPEG-compressed CIFAR-10 copy), or
tensorflow-datasets when it can download or has the data prepared.
"""
from jaxdecouple.recipes import fdg_paper


def get_config():
  return fdg_paper('bp', 'resnet56', 'cifar10', num_stages=1, beta=1.0, warmup=False)
