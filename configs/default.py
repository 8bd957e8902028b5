"""Every field and its default: BP, CIFAR-10 ResNet-56, the FDG paper's recipe.

python main.py --config=configs/default.py --config.data.path=cifar10.npz
"""
from jaxdecouple.config import get_default_config


def get_config():
  return get_default_config()
