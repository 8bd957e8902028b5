"""ResIST against local SGD on the CIFAR-10 JPEG copy, on a pre-activation ResNet with 8 partitioned blocks."""
from jaxdecouple.papers import RESIST, resist_gap
from jaxdecouple.study.core import SEEDS, Claim, Run, Study
from jaxdecouple.study.definitions.common import CIFAR10_DATA, CIFAR10_FILE

EPOCHS, MODEL = 8, 'preact_tiny_s3_9'
COLUMNS = (('local SGD', 'localsgd'), ('ResIST', 'resist'))


def build(method, workers, epochs=EPOCHS, model=MODEL):
  def b():
    from jaxdecouple.recipes import resist_release
    # the library's network (He fan-out, BN-ReLU head, test batches of 1000), as these studies' runs were made
    c = resist_release(method, 'cifar10', workers, epochs, model, release_net=False)
    c.data.source, c.log_every_steps, c.checkpoint_every_steps = 'npz', 100, 500
    return c
  return b


def study() -> Study:
  runs = tuple(Run(f'{MODEL}, S={s}', column, seed, build(method, s))
               for seed in SEEDS for s in (2, 4) for column, method in COLUMNS)
  paper = {(f'{MODEL}, S={s}', c): 100 - RESIST[('cifar10', s)][c] for s in (2, 4) for c, _ in COLUMNS}
  return Study(
      'cpu_cifar10_resist', 'CPU: CIFAR-10, ResIST against local SGD on a small pre-activation ResNet', CIFAR10_DATA,
      f"The ResIST release's recipe (SGD lr 0.03, momentum 0.9 restarted every round, weight decay 5e-4, batch 128 "
      f'per worker, 50 local steps per round, crop and flip, BatchNorm with batch statistics at test time, lr / 10 '
      f'after 50% and 75% of the epochs) for {EPOCHS} epochs, each worker going through the whole training set '
      f'once per epoch in its own order; {MODEL}: a pre-activation ResNet [1, 1, 9, 1] with 8..64 channels, '
      "whose third section has 8 partitioned blocks (4 per sub-network at S=2, 2 at S=4; no minimum depth, as in "
      "the release's CIFAR recipe, where the paper's section 2.6 found at least 5 blocks a sub-network best). The "
      "paper's numbers are its best test accuracy, mean of 3 trials (as 100 - accuracy; the best-accuracy table "
      'below sets ours the same way), for ResNet-101 after 80 (S=2) and 160 (S=4) epochs: compare gaps, not errors',
      # section 6.1: "ResIST achieves comparable test accuracy in all cases ... the performance gap between the two
      # method does not exceed 1% in any experimental setting"
      runs, paper, needs=CIFAR10_FILE, best_accuracy=True, claims=tuple(
          Claim(f'ResIST at S={s} within 1.0 point of local SGD (6.1: "does not exceed 1%"; ResNet-101: '
                f'{resist_gap("cifar10", s)})', 'ResIST', (f'{MODEL}, S={s}',), 1.0, baseline='local SGD')
          for s in (2, 4)),
      reading=(
          'ResIST trails local SGD by +1.59 points at S=2 and +4.34 at S=4, against the paper\'s +0.41 and '
          '+0.55; the paper\'s own measure says the same (best accuracy 67.99% against 70.15% at S=2, 66.97% '
          'against 71.39% at S=4). Every run has levelled off within its schedule.',
          'The gap grows from S=2 to S=4. Two things shrink with S here: the images each partitioned block sees '
          'per epoch (1/S of a local SGD block\'s) and the blocks a sub-network holds (4, then 2, with no minimum '
          'depth); cpu_cifar10_resist_why finds the first not to be what ResIST lacks at S=2. The paper trains 10 '
          '(S=2) to 20 (S=4) times as many epochs as these runs.'))
