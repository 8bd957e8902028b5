"""ResIST with an outer optimizer: S=4 workers on CIFAR-10, pre-activation ResNet-101, the ResIST release's
recipe (160 epochs); each round's end takes DiLoCo's outer Nesterov step (lr 0.7, momentum 0.9) on every
parameter's average change over its holders, a block's outer momentum travelling with the block.

python main.py --config=configs/resist_outer_preact101_c10.py --config.data.path=cifar10.npz
python main.py --config=configs/resist_outer_preact101_c10.py --config.data.path=cifar10.npz \\
    --config.replica.compress=updates --config.replica.quantize_bits=8   # shared layers' updates at 8 bits

Bytes per round: the moving blocks carry their outer momentum (parameters twice over), the shared layers'
all-reduce is unchanged (measured: docs/PERFORMANCE.md, "outer optimizer"). Accuracy against plain
ResIST and local SGD: study cpu_cifar10_resist_outer (docs/STUDIES.md).
"""
from jaxdecouple.recipes import resist_release


def get_config():
  c = resist_release('resist', 'cifar10', num_workers=4, num_epochs=160)
  c.replica.outer_lr, c.replica.outer_momentum = 0.7, 0.9
  return c
