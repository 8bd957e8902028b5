"""ResIST with an outer optimizer: S=4 workers on CIFAR-10, pre-activation ResNet-101, the ResIST release's
recipe (160 epochs); each round's end takes DiLoCo's outer Nesterov step (lr 0.7, momentum 0.9) on every
parameter's average change over its holders, a block's outer momentum travelling with the block.

python main.py --config=configs/resist_outer_preact101_c10.py --config.data.path=cifar10.npz
python main.py --config=configs/resist_outer_preact101_c10.py --config.data.path=cifar10.npz \\
    --config.replica.compress=updates --config.replica.quantize_bits=8   # shared layers' updates at 8 bits

Bytes per round: the moving blocks carry their outer momentum (parameters twice over), the shared layers'
all-reduce is unchanged. Measured by benchmarks/resist_round.py on this network: 0.474, 0.834 and 1.366 GB a
round at S = 2, 4, 8 against plain ResIST's 0.360, 0.664 and 1.177 (at S = 4, 0.63x local SGD's 1.326 instead
of 0.50x); with --config.replica.outer_momentum=0 (an outer lr alone) nothing more travels. Each worker stores
360.2 MB at S = 4 (anchor and outer momentum included) against plain ResIST's 180.1, still 0.54x local SGD with
the outer step (docs/PERFORMANCE.md, "The bytes that arrive"). Accuracy against plain ResIST and local SGD:
study cpu_cifar10_resist_outer (docs/STUDIES.md), on a small network at CPU scale.
"""
from jaxdecouple.recipes import resist_release


def get_config():
  c = resist_release('resist', 'cifar10', num_workers=4, num_epochs=160)
  c.replica.outer_lr, c.replica.outer_momentum = 0.7, 0.9
  return c
