"""Whether cpu_cifar10's FDG deficit is early-training instability from the delay, as cpu_fmnist_why found at
K = 4: BP and FDG beta=1 again with a half-epoch linear warm-up. Shares cpu_cifar10's workdir."""
from jaxdecouple.config import set_fields
from jaxdecouple.study.core import SEEDS, Claim, Run, Study
from jaxdecouple.study.definitions import cpu_cifar10
from jaxdecouple.study.definitions.common import CIFAR10_DATA, CIFAR10_FILE, cifar10


def study() -> Study:
  main = {(r.column, r.seed): r for r in cpu_cifar10.study().runs}
  row, warm = 'ResNet-20, K=2', 'ResNet-20, K=2, warm-up'
  fields = {'optim.warmup': 'linear', 'optim.warmup_epochs': 0.5, 'optim.warmup_factor': 0.01}

  def warmed(method):
    def build():
      return set_fields(cifar10(method, epochs=3, model='resnet20', milestones=(2,))(), fields)
    return build
  runs = []
  for seed in SEEDS:
    runs += [main[('BP', seed)].shown_as(row), main[('FDG beta=1', seed)].shown_as(row),
             Run(warm, 'BP', seed, warmed('bp')), Run(warm, 'FDG beta=1', seed, warmed('fdg'))]
  return Study(
      'cpu_cifar10_why', 'CPU: CIFAR-10 ResNet-20, does a warm-up close FDG\'s gap in a short schedule?',
      CIFAR10_DATA,
      "cpu_cifar10's recipe and workdir (its BP and FDG beta=1 runs are shown again, not rerun); the warm-up "
      'row adds a linear warm-up from 0.01 x lr to lr over the first half epoch to BP and FDG alike, which '
      'cut FDG\'s gap at K=4 on Fashion-MNIST from +2.27 to +0.62 (cpu_fmnist_why)',
      tuple(runs), needs=CIFAR10_FILE,
      column_order=('BP', 'FDG beta=1'), claims=(
          Claim('With the warm-up, FDG beta=1 at K=2 within 0.5 points of BP (the warm-up closes the gap)',
                'FDG beta=1', (warm,), 0.5),
          Claim("FDG beta=1's gap to BP at K=2 is smaller with warm-up than without (by any amount)", 'FDG beta=1',
                (warm, row))))
