"""ResIST with S=8 workers on CIFAR-10, pre-activation ResNet-101, the ResIST release's recipe (160 epochs).

python main.py --config=configs/resist_preact101_c10_s8.py --config.data.path=cifar10.npz

Paper (test accuracy): ResIST 91.45% (local SGD 92.0%, ResIST 91.45% at S=8).
Batch 128 per worker, 50 local iterations per round, lr 0.03 / 10 at 50% and 75% of the epochs.
Workers run one per device (fewer devices: several per device, same numbers).
The paper's S=8 traffic figure corresponds to --config.replica.min_depth=4.
"""
from jaxdecouple.recipes import resist_release


def get_config():
  return resist_release('resist', 'cifar10', num_workers=8, num_epochs=160)
