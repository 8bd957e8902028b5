"""The FDG paper's K = 2 and 4 comparisons on the CIFAR-10 JPEG copy with a network small enough that 2 CPU
cores train every run to the end of a scaled schedule."""
from jaxdecouple.papers import fdg_gap
from jaxdecouple.study.core import SEEDS, Claim, Run, Study
from jaxdecouple.study.definitions.common import CIFAR10_DATA, CIFAR10_FILE, cifar10

EPOCHS = 30
MILESTONES = tuple(int(round(f * EPOCHS)) for f in (0.5, 0.75, 0.92))


def build(method, k=2, beta=1.0, warmup=False, model='resnet8'):
  def b():
    c = cifar10(method, epochs=EPOCHS, k=k, beta=beta, warmup=warmup, model=model, milestones=MILESTONES)()
    if warmup:  # the paper's 3 of 300 epochs at lr 0.01, scaled to the schedule's length
      c.optim.warmup_epochs = 3.0 * EPOCHS / 300
    c.log_every_steps, c.checkpoint_every_steps = 100, 1000
    if method != 'bp':  # each stage's gradient against BP's, twice an epoch (the report draws them)
      c.pipeline.diagnose_every_steps = 195
    return c
  return b


def study() -> Study:
  k2, k4 = 'ResNet-8, K=2', 'ResNet-8, K=4'
  p2, p4 = 'ResNet-56, K=2', 'ResNet-56, K=4'
  runs = []
  for seed in SEEDS:  # the runs that need no pipeline diagnostics first
    runs += [Run(k2, 'BP', seed, build('bp'), also_rows=(k4,)), Run(k2, 'DGL', seed, build('dgl')),
             Run(k4, 'DGL', seed, build('dgl', k=4))]
  for seed in SEEDS:
    runs += [Run(k2, 'FDG beta=1', seed, build('fdg')), Run(k2, 'FDG beta=0.5', seed, build('fdg', beta=0.5)),
             Run(k4, 'FDG beta=0.3', seed, build('fdg', k=4, beta=0.3, warmup=True))]
  return Study(
      'cpu_cifar10_converged', 'CPU: CIFAR-10 ResNet-8 trained to the end of a scaled schedule, BP against FDG and '
      'DGL at K=2 and 4', CIFAR10_DATA,
      f"The FDG paper's recipe scaled to {EPOCHS} epochs: SGD lr 0.1, momentum 0.9, weight decay 5e-4, batch 128, "
      f'random crop with 4-pixel padding and flip, lr / 10 at epochs {", ".join(map(str, MILESTONES))} (50%, 75% '
      f'and 92% of the schedule, as 150, 225 and 275 are of 300); at K=4 FDG warms up at lr 0.01 for '
      f'{3.0 * EPOCHS / 300:g} epochs (the paper\'s 3 of 300, scaled), DGL does not. ResNet-8 (0.08M parameters) '
      "cut by the balanced split; beta 0.3 at K=4 is the paper's choice for ResNet-56 (configs/fdg_resnet56_k4.py). "
      "The paper's numbers are for ResNet-56 after 300 epochs: compare gaps, not errors",
      tuple(runs), needs=CIFAR10_FILE, column_order=('BP', 'FDG beta=1', 'FDG beta=0.5', 'FDG beta=0.3', 'DGL'),
      train_error=True, claims=(
          Claim(f'FDG beta=1 at K=2 within 0.3 points of BP (the paper, ResNet-56: {fdg_gap(p2, "FDG beta=1")})',
                'FDG beta=1', (k2,), 0.3),
          Claim(f'FDG beta=0.5 at K=2 within 0.3 points of BP (the paper, ResNet-56: {fdg_gap(p2, "FDG beta=0.5")})',
                'FDG beta=0.5', (k2,), 0.3),
          Claim(f'FDG beta=0.3 at K=4 within 0.5 points of BP (the paper, ResNet-56: {fdg_gap(p4, "FDG beta=0.3")})',
                'FDG beta=0.3', (k4,), 0.5),
          Claim(f"DGL's gap to BP grows with K (the FDG authors' README reruns, ResNet-56: {fdg_gap(p2, 'DGL')} at K=2, "
                f"{fdg_gap(p4, 'DGL')} at K=4)", 'DGL', (k2, k4))),
      reading=(
          'FDG misses the paper\'s margins on this network: +0.35 (beta 1) and +0.44 (beta 0.5) points behind BP '
          'at K=2 and +0.72 at K=4, where the paper\'s ResNet-56 has +0.01, -0.29 and -0.05. Every run has '
          'levelled off (the last 20% of the schedule moves its error by -0.12 to -0.29 points), so these are '
          'the gaps at the end of training, not of an unfinished one; the short-schedule gap on ResNet-20 '
          '(cpu_cifar10, 3 epochs) was several times larger.',
          'ResNet-8 underfits: BP\'s training error in the last epoch is 18.12% against 19.40% on the test set. '
          'FDG beta=1 trains to 18.31% and its test error exceeds its training error by 1.61 points against '
          'BP\'s 1.31: about half of its gap is optimisation lost to 2-step-stale gradients, half a wider '
          'difference between training and test. On a network that underfits, whatever slows optimisation '
          'shows on the test set; whether FDG\'s gap shrinks with depth, as the paper\'s does, is what '
          'cpu_cifar10_converged_why tests on ResNet-14.',
          'DGL\'s gap grows with K (+1.63 at K=2, +4.39 at K=4), as in the FDG authors\' reruns (their README: '
          '+0.58, +3.46), and its '
          'training error is the highest (20.09% and 23.45%): greedy local losses fit the whole network less '
          'well, the more so the more stages cut it.'))
