"""FDG K=2 on CIFAR-100 resnet110, the FDG paper's recipe (300 epochs, 3-epoch warm-up at lr 0.01).

python main.py --config=configs/fdg_resnet110_c100.py --config.data.path=cifar100.npz

Paper: CIFAR-100 FDG 25.73% at beta 1, 25.43% at beta 0.5.
beta is the paper's best; --config.pipeline.beta=1.0 gives the no-shrinking column.

Data: an .npz with x_train, y_train, x_test, y_test of CIFAR-100 (100 classes; from the authors' archive:
`python -m jaxdecouple.data.cifar_archive cifar-100-python.tar.gz cifar100.npz`), or
tensorflow-datasets when it can download or has the data prepared.
"""
from jaxdecouple.recipes import fdg_paper


def get_config():
  return fdg_paper('fdg', 'resnet110', 'cifar100', num_stages=2, beta=0.5, warmup=True)
