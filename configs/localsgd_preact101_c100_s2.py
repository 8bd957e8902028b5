"""Local SGD with S=2 workers on CIFAR-100, pre-activation ResNet-101, the ResIST release's recipe (80 epochs).

python main.py --config=configs/localsgd_preact101_c100_s2.py --config.data.path=cifar100.npz

Paper (test accuracy): Local SGD 70.67% (ResIST 70.06% at S=2).
Batch 128 per worker, 50 local iterations per round, lr 0.03 / 10 at 50% and 75% of the epochs.
Workers run one per device (fewer devices: several per device, same numbers).
"""
from jaxdecouple.recipes import resist_release


def get_config():
  return resist_release('localsgd', 'cifar100', num_workers=2, num_epochs=80)
