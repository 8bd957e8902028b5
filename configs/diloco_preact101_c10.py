"""Local SGD with DiLoCo's outer optimizer: S=4 workers on CIFAR-10, pre-activation ResNet-101, the ResIST
release's recipe (160 epochs) with each round ended by an outer Nesterov step (lr 0.7, momentum 0.9) on
the round's average change instead of plain averaging.

python main.py --config=configs/diloco_preact101_c10.py --config.data.path=cifar10.npz

DiLoCo (arXiv:2311.08105): outer lr 0.7, Nesterov momentum 0.9, the settings here. Bytes per round are
local SGD's (the outer momentum of the shared layers is computed alike on every worker and never travels):
measured by benchmarks/resist_round.py on this network, 0.663, 1.326 and 2.652 GB a round at S = 2, 4, 8, with
or without the outer step. Each worker stores one more copy of the network for the anchor and one for the
outer momentum: 662.5 MB per worker against plain local SGD's 331.3 (docs/PERFORMANCE.md, "The bytes that
arrive").

Accuracy, measured at CPU scale only (study cpu_cifar10_resist_outer, docs/RESULTS.md: preact_tiny_s3_9 on the
CIFAR-10 JPEG copy, the release's recipe cut short, test error, medians of 3 seeds): at S = 2 and 16 epochs local
SGD goes from 23.01% to 20.39% with an outer step, and at S = 4 and 8 epochs from 28.71% to 23.65%. That study's hold-out tune preferred outer lr 1, momentum 0.5
(25.82% hold-out error) to DiLoCo's 0.7/0.9 (26.24%) on that network; this config keeps DiLoCo's published
setting, not yet run at this size (--config.replica.outer_lr=1 --config.replica.outer_momentum=0.5 for the tune's).
"""
from jaxdecouple.recipes import resist_release


def get_config():
  c = resist_release('localsgd', 'cifar10', num_workers=4, num_epochs=160)
  c.replica.outer_lr, c.replica.outer_momentum = 0.7, 0.9
  return c
