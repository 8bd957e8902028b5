"""CPU: Fashion-MNIST, every method side by side (ResNet-20 at K = 1, 2, 4; ResIST and local SGD at S = 2, 4)."""
from jaxdecouple.papers import FDG, fdg_gap
from jaxdecouple.study.core import SEEDS, Claim, Run, Study
from jaxdecouple.study.definitions.common import FMNIST_DATA, fmnist

PIPELINE = [('BP', 'bp', {}), ('FDG beta=1', 'fdg', {}), ('FDG beta=0.5', 'fdg', {'pipeline.beta': 0.5}),
            ('ADL M=2', 'adl', {'pipeline.accumulation': 2}), ('DDG', 'ddg', {}), ('FR', 'fr', {}),
            ('DGL', 'dgl', {})]


def study() -> Study:
  runs = []
  for seed in SEEDS:
    for k in (1, 2, 4):
      for column, method, fields in PIPELINE:
        if (method == 'bp' and k != 2) or (k == 1 and method != 'adl'):
          continue  # one BP run per seed, shown in every row; K = 1 only for ADL (accumulation, no delay)
        runs.append(Run(f'ResNet-20, K={k}', column, seed,
                        fmnist(method, 'resnet20', **{'pipeline.num_stages': k, **fields}),
                        also_rows=('ResNet-20, K=1', 'ResNet-20, K=4') if method == 'bp' else ()))
    for s in (2, 4):
      for column, method in (('local SGD', 'localsgd'), ('ResIST', 'resist')):
        runs.append(Run(f'preact_tiny, S={s}', column, seed, fmnist(
            method, 'preact_tiny', **{'replica.num_workers': s, 'replica.local_steps': 50,
                                      'optim.learning_rate': 0.05})))
  k2, k4 = 'ResNet-56, K=2', 'ResNet-56, K=4'
  return Study(
      'cpu_fmnist', 'CPU: Fashion-MNIST, every method side by side', FMNIST_DATA,
      'SGD lr 0.1 (ResIST and local SGD: 0.05), momentum 0.9, weight decay 5e-4, batch 128 (per worker for '
      'the replica methods), 3 epochs, lr / 10 for the last epoch, no warm-up (the FDG paper warms up for 3 '
      'of its 300 epochs at K = 3 and 4, the ADL code for 5); ResNet-20 cut into K stages by the '
      'balanced split; replica methods: 50 local steps per round; one BP run per seed, shown in every row; the '
      'K=1 row is ADL with one stage, which is BP with the gradients of M=2 batches summed into each step: '
      "accumulation's effect without the delay's",
      tuple(runs), column_order=(*(c for c, _, _ in PIPELINE), 'local SGD', 'ResIST'), claims=(
          Claim(f"DGL's gap to BP grows with K (the FDG paper, ResNet-56 on CIFAR-10: {fdg_gap(k2, 'DGL')} at K=2, "
                f"{fdg_gap(k4, 'DGL')} at K=4)", 'DGL', ('ResNet-20, K=2', 'ResNet-20, K=4')),
          Claim('FDG beta=1 at K=2 within 0.3 points of BP (our target for ResNet-56 on CIFAR-10, here on '
                'Fashion-MNIST)', 'FDG beta=1', ('ResNet-20, K=2',), 0.3),
          Claim("Gradient shrinking helps at K=4: FDG beta=0.5 no worse than beta=1 (the FDG paper's Table 4, "
                f"ResNet-56 at K=4: {FDG[(k4, 'FDG beta=0.3')]:.2f} with beta 0.3 against "
                f"{FDG[(k4, 'FDG beta=1')]:.2f})", 'FDG beta=0.5', ('ResNet-20, K=4',), 0.0,
                baseline='FDG beta=1')))
