"""ResIST or local SGD on the ResIST paper's deeper ResNets (its A.4, Table 8): one file for the table's cells.

python main.py --config=configs/resist_deeper.py --config.data.path=cifar10.npz
python main.py --config=configs/resist_deeper.py:localsgd,preact200,cifar100,2 --config.data.path=cifar100.npz

The argument is METHOD,MODEL,DATASET,S (default resist,preact152,cifar10,4): METHOD resist or localsgd,
MODEL preact152 ([3, 4, 40, 3]) or preact200 ([3, 4, 56, 3]), DATASET cifar10 or cifar100, S 2 or 4.
The release's recipe (batch 128 per worker, lr 0.03 / 10 at 50% and 75% of the epochs) with Table 8's
80 epochs and 100 local iterations per round.

Paper (test accuracy, local SGD / ResIST): CIFAR-10 S=2 ResNet-152 92.27% / 92.01%, ResNet-200 92.31% /
92.10%; S=4 ResNet-152 91.39% / 90.67%, ResNet-200 91.35% / 90.27%. CIFAR-100 S=2 ResNet-152 70.50% /
70.32%, ResNet-200 71.05% / 70.71%; S=4 ResNet-152 68.39% / 67.27%, ResNet-200 69.05% / 67.62%.
"""
from jaxdecouple.papers import RESIST_DEEPER
from jaxdecouple.recipes import resist_release

METHODS = ('resist', 'localsgd')


def get_config(arg: str = 'resist,preact152,cifar10,4'):
  parts = [p.strip() for p in arg.split(',')]
  if len(parts) != 4:
    raise ValueError(f'configs/resist_deeper.py:{arg}: the argument is METHOD,MODEL,DATASET,S, e.g. '
                     'resist,preact200,cifar100,4')
  method, model, dataset, workers = parts
  cells = sorted({(d, s, m) for d, s, m in RESIST_DEEPER})
  if method not in METHODS or not workers.isdigit() or (dataset, int(workers), model) not in RESIST_DEEPER:
    raise ValueError(f'configs/resist_deeper.py:{arg}: METHOD is one of {", ".join(METHODS)}; Table 8 has '
                     f'(DATASET, S, MODEL) = {", ".join(f"{d},{s},{m}" for d, s, m in cells)}')
  c = resist_release(method, dataset, num_workers=int(workers), num_epochs=80, model=model)
  c.replica.local_steps = 100
  return c
