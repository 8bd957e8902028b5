"""FDG K=2 on CIFAR-10 resnet20, the FDG paper's recipe (300 epochs).

python main.py --config=configs/fdg_resnet20.py --config.data.path=cifar10.npz

Paper: FDG 7.92% at beta 1, 7.23% at beta 0.2.
beta is the paper's best; --config.pipeline.beta=1.0 gives the no-shrinking column.

Data: an .npz with x_train, y_train, x_test, y_test (or the JPEG-compressed CIFAR-10 copy), or
tensorflow-datasets when it can download or has the data prepared.
"""
from jaxdecouple.recipes import fdg_paper


def get_config():
  return fdg_paper('fdg', 'resnet20', 'cifar10', num_stages=2, beta=0.2, warmup=False)
