"""Quickstart: FDG with K = 2 stages on 2 CPU devices, ResNet-8 on Fashion-MNIST, 3 epochs.

python main.py --config=configs/quickstart.py

About 100 s on 2 idle CPU cores, about 0.90-0.91 test accuracy (docs/PERFORMANCE.md). Data: the IDX files of the Debian package
dataset-fashion-mnist, else tensorflow-datasets. Augmentation is off: for 3 epochs on Fashion-MNIST
random crops cost more accuracy than they give (0.88 with them). --config.method=bp runs plain
back-propagation on the same recipe for comparison (give it its own --workdir, e.g. workdirs/quickstart_bp:
a workdir resumes one run, and refuses a config that computes something else).
"""
from jaxdecouple.config import get_default_config


def get_config():
  c = get_default_config()
  c.method = 'fdg'
  c.pipeline.num_stages = 2
  c.pipeline.beta = 1.0
  c.cpu_devices = 2            # two JAX devices on the host CPU, one per stage
  c.model = 'resnet8'
  c.dataset = 'fashion_mnist'
  c.data.augment = False
  c.num_epochs = 3
  c.optim.milestones = (2,)
  c.optim.learning_rate = 0.1
  c.log_every_steps = 50
  c.checkpoint_every_steps = 500
  c.profile_every_steps = 400
  return c
