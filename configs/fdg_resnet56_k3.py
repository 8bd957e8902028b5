"""FDG K=3 on CIFAR-10 resnet56, the FDG paper's recipe (300 epochs, 3-epoch warm-up at lr 0.01).

python main.py --config=configs/fdg_resnet56_k3.py --config.data.path=cifar10.npz

Paper: FDG K=3: 6.40% at beta 1, 6.08% at beta 0.2 (Table 4).
beta is the paper's best; --config.pipeline.beta=1.0 gives the no-shrinking column.

Data: an .npz with x_train, y_train, x_test, y_test (or the JPEG-compressed CIFAR-10 copy), or
tensorflow-datasets when it can download or has the data prepared.
"""
from jaxdecouple.recipes import fdg_paper


def get_config():
  return fdg_paper('fdg', 'resnet56', 'cifar10', num_stages=3, beta=0.2, warmup=True)
