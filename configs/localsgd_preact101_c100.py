"""Local SGD with S=4 workers on CIFAR-100, pre-activation ResNet-101, the ResIST release's recipe (160 epochs).

python main.py --config=configs/localsgd_preact101_c100.py --config.data.path=cifar100.npz

Paper (test accuracy): Local SGD 71.51% (local SGD 71.51%, ResIST 71.3% at S=4).
Batch 128 per worker, 50 local iterations per round, lr 0.03 / 10 at 50% and 75% of the epochs.
Workers run one per device (fewer devices: several per device, same numbers).
"""
from jaxdecouple.recipes import resist_release


def get_config():
  return resist_release('localsgd', 'cifar100', num_workers=4, num_epochs=160)
