"""Is ResIST's gap to local SGD a property of the small proxy's depth? (issue 42's target, missed on it)

On preact_tiny_s3_9 (8 partitioned blocks) ResIST with DiLoCo's outer step trails local SGD with its own by
+1.22 points at S=2 (16 epochs) and +3.04 at S=4 (8 epochs; cpu_cifar10_resist_outer), where the paper reports
about half a point on ResNet-101, whose third section deals out 22 blocks. At S=4 the proxy gives each
sub-network 2 partitioned blocks; the paper says "a minimum of five blocks partitioned to each sub-ResNet was
found to perform optimally" (section 2, Subnetwork Depth) and builds on ResNet-101 for that reason. This study
runs cpu_cifar10_resist_outer's S=4 row again on preact_tiny_s3_23, a proxy of the same widths whose third section
has ResNet-101's 22 partitioned blocks (5 or 6 per sub-network at S=4), everything else the same: the recipe,
8 epochs, and the outer step the outer study's tune picked for both methods (outer lr 1, momentum 0.5, fixed here
rather than tuned again). Its S=4 row on preact_tiny_s3_9 is shown beside, not rerun (shared workdir).

Two outcomes, both useful: the gap shrinks with depth (then the proxy's 8 blocks, not ResIST, hold the target
back), or it stays (then each block's share of the data, one worker's batches in four, is what it is, whatever
the depth). A local SGD run takes about 4.4 hours on one core of the slow AMD EPYC host (33 minutes an epoch:
4 workers' 26 blocks a step, against 12 on the shallow proxy), a ResIST run about half that (estimated)."""
from jaxdecouple.study.core import SEEDS, Claim, Run, Study
from jaxdecouple.study.definitions import cpu_cifar10_resist as main
from jaxdecouple.study.definitions import cpu_cifar10_resist_outer as outer
from jaxdecouple.study.definitions.common import CIFAR10_DATA, CIFAR10_FILE

MODEL = 'preact_tiny_s3_23'  # [1, 1, 23, 1], 8..64 channels: 22 partitioned blocks, as ResNet-101's third section
WORKERS = 4
PICKED = (1.0, 0.5)  # cpu_cifar10_resist_outer's tune: the lowest hold-out error for both methods
COLUMNS = (('local SGD + outer', 'localsgd'), ('ResIST + outer', 'resist'))
READING = (
    f'On {MODEL} (22 partitioned blocks, 5 or 6 per sub-network at S=4) local SGD + outer ends at 24.30% (22.74 to '
    '24.86 over 3 seeds) and ResIST + outer at 27.81% (26.46 to 27.97): ResIST trails by +3.51 points (the median '
    f'of the per-seed differences), against +3.04 on {main.MODEL}, whose sub-networks get 2 partitioned blocks '
    'each. Both checks are missed: the gap is not within 1.0 point, and it does not shrink to half; it is half a '
    'point larger, less than either method spreads over its three seeds.',
    'Depth changes little for either method: local SGD 24.30% against 23.65% on the shallow proxy, ResIST 27.81% '
    'against 27.00% (medians; best accuracies 76.03 and 72.59 against 75.73 and 72.93). Both have levelled off by '
    'the last epoch (its last 20% of epochs moves the error by -0.57 and -0.44 points). A deep local SGD run trains '
    '26 blocks a worker against ResIST\'s 9 or 10, and ResIST reaches the row\'s target sooner (5714 s of '
    'training against 6724, medians over runs on two AMD EPYC hosts, one about twice as fast as the other; one '
    'ResIST seed never reaches it and counts as the slowest), but ends worse.',
    "So the shallow proxy is not why ResIST misses issue 42's target here: what depth leaves as it is, each "
    'partitioned block trained on one worker\'s batches a round (a quarter of them at S=4), is. Whether the '
    "paper's half point needs its ResNet-101 trained for 80-160 epochs, these 8-epoch runs cannot say.",
)


def build(method, workers=WORKERS, model=MODEL, outer_step=PICKED):
  base = main.build(method, workers, model=model)

  def b():
    c = base()
    c.replica.outer_lr, c.replica.outer_momentum = outer_step
    return c
  return b


def study() -> Study:
  deep, shallow = f'{MODEL}, S={WORKERS}', f'{main.MODEL}, S={WORKERS}'
  shown = {(r.row, r.column, r.seed): r for r in outer.study().runs}
  runs = []
  for seed in SEEDS:
    runs += [Run(deep, column, seed, build(method)) for column, method in COLUMNS]
    runs += [shown[(shallow, column, seed)] for column, _ in COLUMNS]
  return Study(
      'cpu_cifar10_resist_depth', "CPU: CIFAR-10, ResIST's gap to local SGD on a proxy as deep as ResNet-101's "
      'third section', CIFAR10_DATA,
      f"cpu_cifar10_resist_outer's S={WORKERS} row (the release's recipe, {main.EPOCHS} epochs, L = 50, each round "
      f'ended by the outer step the tune picked, lr {PICKED[0]:g} and momentum {PICKED[1]:g}) on {MODEL}, whose third '
      f'section has 22 partitioned blocks (5 or 6 per sub-network; the paper: at least 5 "performs optimally"), '
      f'beside the same row on {main.MODEL} (8 partitioned blocks, 2 per sub-network; shown again, not rerun)',
      tuple(runs), needs=CIFAR10_FILE, best_accuracy=True, baselines=('local SGD + outer',), reading=READING,
      claims=(
          Claim(f'ResIST + outer within 1.0 point of local SGD + outer on {MODEL} (issue 42\'s target; on '
                f'{main.MODEL}: +3.04)', 'ResIST + outer', (deep,), 1.0, baseline='local SGD + outer'),
          Claim(f'ResIST\'s gap at most half as large on {MODEL} as on {main.MODEL}', 'ResIST + outer',
                (deep, shallow), baseline='local SGD + outer', factor=0.5)))
