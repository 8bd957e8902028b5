"""Quickstart: a short real run on Fashion-MNIST (BP, ResNet-8, 3 epochs, a few minutes on 2 CPU cores).

python main.py --config=configs/quickstart.py

Data: the IDX files of the Debian package dataset-fashion-mnist, else tensorflow-datasets.
"""
from jaxdecouple.config import get_default_config


def get_config():
  c = get_default_config()
  c.method = 'bp'
  c.model = 'resnet8'
  c.dataset = 'fashion_mnist'
  c.num_epochs = 3
  c.optim.milestones = (2,)
  c.optim.learning_rate = 0.1
  c.log_every_steps = 50
  c.checkpoint_every_steps = 500
  return c
