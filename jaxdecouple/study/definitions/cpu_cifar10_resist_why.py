"""Why ResIST trails local SGD by more than the paper's 0.4-0.55 points in cpu_cifar10_resist: in ResIST each
partitioned block is trained by one worker of S, so it sees 1/S of the images local SGD's blocks see in as
many epochs, and the paper trains 80 (S=2) to 160 (S=4) epochs where we train 8. If that is the cause, the
gap shrinks when the schedule is longer: S=2 again at 16 epochs (each ResIST block then sees as many images
as a local SGD block at 8). Shares cpu_cifar10_resist's workdir: its 8-epoch S=2 runs are shown again."""
from jaxdecouple.study.core import SEEDS, Claim, Run, Study
from jaxdecouple.study.definitions import cpu_cifar10_resist as main
from jaxdecouple.study.definitions.common import CIFAR10_DATA, CIFAR10_FILE


def study() -> Study:
  shown = {(r.row, r.column, r.seed): r for r in main.study().runs}
  row, longer = f'{main.MODEL}, S=2', f'{main.MODEL}, S=2, {2 * main.EPOCHS} epochs'
  runs = []
  for seed in SEEDS:
    runs += [shown[(row, column, seed)].shown_as(row) for column, _ in main.COLUMNS]
  for seed in SEEDS:
    runs += [Run(longer, column, seed, main.build(method, 2, epochs=2 * main.EPOCHS)) for column, method in main.COLUMNS]
  return Study(
      'cpu_cifar10_resist_why', 'CPU: CIFAR-10, does ResIST\'s gap to local SGD shrink with a longer schedule?',
      CIFAR10_DATA,
      f"cpu_cifar10_resist's recipe and workdir (its {main.EPOCHS}-epoch S=2 runs are shown again, not rerun), "
      f'and the same at {2 * main.EPOCHS} epochs (lr / 10 after 50% and 75% of them). In ResIST each of the 8 '
      'partitioned blocks is trained by one worker of S, so per epoch it sees 1/S of the images a local SGD '
      f'block sees: at {2 * main.EPOCHS} epochs and S=2 a ResIST block sees as many as a local SGD block at '
      f'{main.EPOCHS}. The paper trains 80 epochs at S=2 and 160 at S=4',
      tuple(runs), needs=CIFAR10_FILE, best_accuracy=True, train_error=True, claims=(
          Claim("ResIST's gap to local SGD at S=2 is smaller with the longer schedule", 'ResIST', (longer, row),
                baseline='local SGD'),
          Claim(f'ResIST at S=2 within 1.0 point of local SGD after {2 * main.EPOCHS} epochs (the paper\'s 6.1: "does '
                'not exceed 1%")', 'ResIST', (longer,), 1.0, baseline='local SGD')),
      reading=(
          'No: twice the schedule widens the gap, from +1.59 points at 8 epochs to +2.70 at 16 (paired, 3 seeds '
          'each). Both methods gain from the longer schedule, local SGD more (30.21% to 23.01%, ResIST 31.90% to '
          '25.44%). The explanation this study tested fails: at 16 epochs each ResIST block has seen as many images '
          'as a local SGD block at 8, and ResIST there (25.44%) is far better than local SGD at 8 epochs (30.21%), '
          'yet it still trails local SGD trained as long. What ResIST lacks on this network is not images per block.',
          'Its sub-networks train to a higher error, on a network that both methods underfit. In the last epoch ResIST\'s '
          'sub-networks train to 23.01% error against local SGD\'s networks\' 19.17% (30.89 against 27.47 at 8 '
          'epochs), and the test error stands only +1.99 (ResIST) and +3.84 (local SGD) points above the training '
          'error. Where a network underfits, a method that optimises less well loses test accuracy nearly one for '
          'one; ResIST wins back a little through the smaller difference (its tested network is the whole one, '
          'larger than the sub-networks trained). The paper\'s gaps of about half a point come from ResNet-101, '
          'far larger than this network, trained 80 to 160 epochs, where a network can overfit and training '
          'shallow sub-networks can pay as a regulariser; that regime is out of reach of 2 CPU cores, so this '
          'study neither confirms nor refutes the paper\'s gaps, and says what to expect on small networks and '
          'short schedules: ResIST costs accuracy there, more at 16 epochs than at 8.',
          'The wall-clock table does not compare the two methods\' speed: the 8-epoch row and ResIST seed 0 at 16 '
          'epochs ran on AMD EPYC hosts, the other 16-epoch runs on the Xeon, and runs started with --jobs=2 shared the two cores with '
          'another run whose load changed; one ResIST seed per row also never reaches the target, which is '
          'ResIST\'s own median. ResIST\'s saving is in memory and bytes per worker (measured in the ResIST '
          'section of docs/PERFORMANCE.md), not in seconds on one shared CPU.',))
