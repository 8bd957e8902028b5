"""ResIST against local SGD on object detection, at CPU scale: the ResIST paper's Pascal VOC experiment (section 5,
Table 6) with its detector (a post-activation ResNet and YOLO-v2's detection layer) cut down to ``postact_tiny``
and VOC replaced by the generated shapes (data/shapes.py), so the detection path trains for real here."""
from jaxdecouple.papers import RESIST_DETECTION
from jaxdecouple.study.core import SEEDS, Claim, Run, Study

EPOCHS, MODEL, BATCH, IMAGES = 5, 'yolo_postact_tiny', 32, 4000
COLUMNS = (('local SGD', 'localsgd'), ('ResIST', 'resist'))


def build(method, workers, epochs=EPOCHS):
  def b():
    from jaxdecouple.recipes import resist_detection
    c = resist_detection(method, workers, 'shapes', MODEL, num_epochs=epochs, batch_size=BATCH)
    # the paper's schedule shape scaled to whole epochs: warm-up over 30%, lr / 10 at 60% and (round(4.5) = 4) 80%
    c.optim.learning_rate = 0.01
    c.optim.warmup_epochs = 0.3 * epochs
    c.optim.milestones = (round(0.6 * epochs), round(0.9 * epochs))
    c.eval_batch_size = 250
    c.data.detection_train_size = IMAGES
    c.log_every_steps, c.checkpoint_every_steps = 50, 250
    return c
  return b


def study() -> Study:
  runs = tuple(Run(f'{MODEL}, S={s}', column, seed, build(method, s))
               for seed in SEEDS for s in (2, 4) for column, method in COLUMNS)
  paper = {(f'{MODEL}, S={s}', c): RESIST_DETECTION[(c, s)]['test loss'] for s in (2, 4) for c, _ in COLUMNS}
  return Study(
      'cpu_shapes_detection', 'CPU: object detection on generated shapes, ResIST against local SGD', (
          f'shapes: {IMAGES} training and 1000 test images of 64 x 64, each with 1-4 squares, circles and triangles on a '
          'smooth background (data/shapes.py, generated from seed 0), boxes and classes exact'),
      f'The ResIST paper\'s detection recipe (recipes.resist_detection: no augmentation, batch {BATCH} per worker '
      'here against its 10, 50 local steps per round, momentum restarted, batch statistics) for '
      f'{EPOCHS} epochs: SGD lr 0.01, warmed up linearly from a tenth over the first 30% of the epochs, / 10 after '
      f'epochs 3 and 4 (the paper: 30, 60 and 90 of 100); {MODEL}: a post-activation ResNet [1, 1, 6, 1] of 8..64 channels '
      '(5 partitioned blocks) whose 8 x 8 map feeds a 1x1 convolution of 3 anchors x (5 + 3 classes). The main '
      'table\'s "error" is 100 - mAP (VOC 2007, IoU 0.5); the paper\'s metric, the best test loss, is in its own '
      "table with Table 6's VOC losses beside it (another data set: compare the sign of the gap, not the losses)",
      runs, detection=True, paper_loss=paper, claims=(
          # section 6.3: "ResIST achieves a lower test loss in comparison to local SGD for the experiment with two
          # machines" (Table 6: 5.99 against 6.15); at four, "slightly worse ... comparable", a difference in test
          # loss that "never exceeds a value of one", a bound in the loss's units that has no counterpart in mAP
          Claim('ResIST no worse than local SGD at S=2 (Table 6: a lower test loss, 5.99 against 6.15; checked here '
                'on 100 - mAP, the best test losses are in their own table)', 'ResIST', (f'{MODEL}, S=2',), 0.0,
                baseline='local SGD'),),
      paper_seconds={(f'{MODEL}, S={s}', c): RESIST_DETECTION[(c, s)]['seconds'] for s in (2, 4) for c, _ in COLUMNS},
      paper_speedup={(f'{MODEL}, S={s}', c): RESIST_DETECTION[(c, s)]['speed-up'] for s in (2, 4) for c, _ in COLUMNS
                     if 'speed-up' in RESIST_DETECTION[(c, s)]},
      reading=(
          'ResIST trails local SGD on every accuracy measure here: +9.58 points of error (100 - mAP) at S=2 and +7.12 at '
          'S=4, a best test loss of 3.145 against 2.500 at S=2 and 3.141 against 2.346 at S=4 (mAP 53.18% against '
          "62.76%, 55.88% against 67.68%). The paper's Table 6 has ResIST ahead at S=2 (5.99 against 6.15) and "
          'behind at S=4 (6.69 against 6.22): the sign at S=4 agrees, the one at S=2 does not. The median run had '
          'levelled off (the last 20% of the schedule moved the error by at most 0.32 points).',
          'As on CIFAR-10 (cpu_cifar10_resist), each partitioned block is trained by one worker of S, so in a '
          'given number of epochs it sees 1/S of the images a local SGD block sees; these runs train 5 epochs '
          'where the paper trains 100, so the gap measures ResIST on a short schedule, and on generated shapes '
          'rather than VOC.'))
