"""GPU: the FDG paper's ResNet-56 rows (K = 2 and 4: BP, FDG, DGL) in a 30-epoch schedule."""
from jaxdecouple.papers import FDG, fdg_gap
from jaxdecouple.study.core import SEEDS, Claim, Run, Study
from jaxdecouple.study.definitions.common import CIFAR10_DATA, cifar10

TUNED = {2: 0.5, 4: 0.3}  # the paper's best beta at K = 2, and configs/fdg_resnet56_k4.py's at K = 4


def study() -> Study:
  runs = []
  for seed in SEEDS:
    for k, tuned in TUNED.items():
      for column, method, beta in (('BP', 'bp', 1.0), ('FDG beta=1', 'fdg', 1.0), ('FDG tuned beta', 'fdg', tuned),
                                   ('DGL', 'dgl', 1.0)):
        if method == 'bp' and k > 2:
          continue  # one BP run per seed, shown in both rows
        runs.append(Run(f'ResNet-56, K={k}', column, seed,
                        cifar10(method, k=k, beta=beta, warmup=k > 2 and method != 'bp'),
                        also_rows=('ResNet-56, K=4',) if method == 'bp' else ()))
  paper = {}
  for k, tuned in TUNED.items():
    row = f'ResNet-56, K={k}'
    paper.update({(row, c): FDG[(row, c)] for c in ('BP', 'FDG beta=1', 'DGL')})
    paper[(row, 'FDG tuned beta')] = FDG[(row, f'FDG beta={tuned}')]
  k2, k4 = 'ResNet-56, K=2', 'ResNet-56, K=4'
  claims = (Claim(f'FDG beta=1 at K=2 within 0.3 points of BP (the paper: {fdg_gap(k2, "FDG beta=1")})', 'FDG beta=1',
                  (k2,), 0.3),
            Claim(f'FDG tuned beta at K=2 within 0.3 points of BP (the paper: {fdg_gap(k2, "FDG beta=0.5")})',
                  'FDG tuned beta', (k2,), 0.3),
            Claim(f'FDG tuned beta at K=4 within 0.5 points of BP (the paper: {fdg_gap(k4, "FDG beta=0.3")})',
                  'FDG tuned beta', (k4,), 0.5),
            Claim(f"DGL's gap to BP grows with K (the paper: {fdg_gap(k2, 'DGL')} at K=2, {fdg_gap(k4, 'DGL')} at K=4)",
                  'DGL', (k2, k4)))
  return Study(
      'gpu_cifar10', 'GPU: CIFAR-10 ResNet-56, BP against FDG and DGL, shortened recipe', CIFAR10_DATA,
      "The FDG paper's recipe shortened to 30 epochs (lr 0.1, decays at epochs 15, 22, 28; K = 4 with "
      "the 3-epoch warm-up at lr 0.01); tuned beta is 0.5 at K = 2 (the paper's best) and 0.3 at K = 4 "
      "(configs/fdg_resnet56_k4.py); the paper's numbers are for 300 epochs",
      tuple(runs), paper, needs='--data_path to the CIFAR-10 .npz; a GPU', claims=claims)
