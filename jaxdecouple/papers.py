"""The papers' numbers, written once: the studies' tables and claims read them, and a test holds every
config docstring's quoted figures to them.

FDG: Zhuang et al., "Fully decoupled neural network learning using delayed gradients" (the SPEC's
table: test error %, CIFAR-10 unless the row says CIFAR-100, 300 epochs; DDG, DGL and FR rerun by the
FDG authors). ResIST: Dun et al., test accuracy %, pre-activation ResNet-101.
"""
from __future__ import annotations

# (row, column) -> test error %. Rows: 'ResNet-56, K=2' or 'CIFAR-100 ResNet-56, K=2'; columns: 'BP',
# 'DDG', 'DGL', 'FR', 'FDG beta=1' and 'FDG beta=B' for the paper's best beta B.
FDG: dict[tuple[str, str], float] = {}
for _row, _cells in {
    'ResNet-20, K=2': {'BP': 7.78, 'FDG beta=1': 7.92, 'FDG beta=0.2': 7.23},
    'ResNet-56, K=2': {'BP': 6.19, 'DDG': 6.63, 'DGL': 6.77, 'FR': 6.07, 'FDG beta=1': 6.20, 'FDG beta=0.5': 5.90},
    'ResNet-110, K=2': {'BP': 5.79, 'DDG': 6.26, 'DGL': 6.26, 'FR': 5.76, 'FDG beta=1': 5.79, 'FDG beta=0.5': 5.73},
    'ResNet-18, K=2': {'BP': 4.87, 'DDG': 5.00, 'DGL': 5.21, 'FR': 4.80, 'FDG beta=1': 4.82, 'FDG beta=0.8': 4.79},
    'WRN-28-10, K=2': {'BP': 4.01, 'FDG beta=1': 4.13, 'FDG beta=0.7': 3.85},
    'ResNet-1202, K=2': {'BP': 7.93, 'BP rerun': 5.53, 'FDG beta=1': 5.50, 'FDG beta=0.7': 5.49},
    'ResNet-56, K=3': {'BP': 6.19, 'DDG': 6.50, 'DGL': 8.88, 'FR': 6.33, 'FDG beta=1': 6.40, 'FDG beta=0.2': 6.08},
    'ResNet-56, K=4': {'BP': 6.19, 'DDG': 6.61, 'DGL': 9.65, 'FR': 6.48, 'FDG beta=1': 6.83, 'FDG beta=0.3': 6.14},
    'CIFAR-100 ResNet-56, K=2': {'BP': 27.68, 'DDG': 28.44, 'DGL': 29.51, 'FR': 28.39, 'FDG beta=1': 27.87,
                                 'FDG beta=0.4': 27.49},
    'CIFAR-100 ResNet-110, K=2': {'BP': 25.82, 'DDG': 27.16, 'DGL': 26.80, 'FR': 26.31, 'FDG beta=1': 25.73,
                                  'FDG beta=0.5': 25.43},
    'CIFAR-100 ResNet-18, K=2': {'BP': 22.35, 'DDG': 22.74, 'DGL': 22.24, 'FR': 22.88, 'FDG beta=1': 22.78,
                                 'FDG beta=0.5': 22.18},
    'CIFAR-100 WRN-28-10, K=2': {'BP': 19.6, 'FDG beta=1': 20.28, 'FDG beta=0.6': 19.08},
}.items():
  FDG.update({(_row, column): error for column, error in _cells.items()})

# (dataset, S) -> test accuracy % of local SGD and ResIST (80 epochs at S = 2, 160 at S = 4 and 8).
RESIST: dict[tuple[str, int], dict[str, float]] = {
    ('cifar10', 2): {'local SGD': 92.36, 'ResIST': 91.95},
    ('cifar10', 4): {'local SGD': 92.90, 'ResIST': 92.35},
    ('cifar10', 8): {'local SGD': 92.00, 'ResIST': 91.45},
    ('cifar100', 2): {'local SGD': 70.67, 'ResIST': 70.06},
    ('cifar100', 4): {'local SGD': 71.51, 'ResIST': 71.30},
    ('cifar100', 8): {'local SGD': 69.64, 'ResIST': 70.26},
}


def fdg_gap(row: str, column: str, baseline: str = 'BP') -> str:
  """The FDG paper's gap of ``column`` to ``baseline`` in ``row``, in points, as the reports write it."""
  return f'{FDG[(row, column)] - FDG[(row, baseline)]:+.2f}'


def resist_gap(dataset: str, workers: int) -> str:
  """ResIST's test error minus local SGD's in the ResIST paper, in points."""
  r = RESIST[(dataset, workers)]
  return f'{r["local SGD"] - r["ResIST"]:+.2f}'


# ResIST paper Table 3: ImageNet, ResNet-101, 90 epochs; top-1 accuracy % on the ImageNet validation set
# ('ImageNet') and the three ImageNet-V2 test sets (MF: matched frequency, T-0.7: threshold 0.7, TI: top
# images), and the training hours. (method, S) -> column -> figure.
RESIST_IMAGENET: dict[tuple[str, int], dict[str, float]] = {
    ('local SGD', 2): {'ImageNet': 73.32, 'MF': 60.72, 'T-0.7': 69.47, 'TI': 75.48, 'hours': 48.61},
    ('local SGD', 4): {'ImageNet': 72.66, 'MF': 59.88, 'T-0.7': 68.34, 'TI': 74.27, 'hours': 29.29},
    ('ResIST', 2): {'ImageNet': 71.60, 'MF': 58.92, 'T-0.7': 67.51, 'TI': 73.56, 'hours': 36.79},
    ('ResIST', 4): {'ImageNet': 70.74, 'MF': 57.56, 'T-0.7': 66.46, 'TI': 72.65, 'hours': 22.37},
}


# ResIST paper Table 8: deeper pre-activation ResNets (A.4; our preact152 and preact200), 80 epochs, 100 local
# iterations per round; test accuracy % (mean of 3 trials) and seconds of training.
# (dataset, S, model) -> {'local SGD': acc, 'ResIST': acc, 'local SGD s': time, 'ResIST s': time}.
RESIST_DEEPER: dict[tuple[str, int, str], dict[str, float]] = {
    ('cifar10', 2, 'preact152'): {'local SGD': 92.27, 'ResIST': 92.01, 'local SGD s': 3512, 'ResIST s': 2215},
    ('cifar10', 2, 'preact200'): {'local SGD': 92.31, 'ResIST': 92.10, 'local SGD s': 4575, 'ResIST s': 2380},
    ('cifar10', 4, 'preact152'): {'local SGD': 91.39, 'ResIST': 90.67, 'local SGD s': 3598, 'ResIST s': 1054},
    ('cifar10', 4, 'preact200'): {'local SGD': 91.35, 'ResIST': 90.27, 'local SGD s': 4357, 'ResIST s': 1161},
    ('cifar100', 2, 'preact152'): {'local SGD': 70.50, 'ResIST': 70.32, 'local SGD s': 3528, 'ResIST s': 2291},
    ('cifar100', 2, 'preact200'): {'local SGD': 71.05, 'ResIST': 70.71, 'local SGD s': 4639, 'ResIST s': 2202},
    ('cifar100', 4, 'preact152'): {'local SGD': 68.39, 'ResIST': 67.27, 'local SGD s': 3518, 'ResIST s': 1164},
    ('cifar100', 4, 'preact200'): {'local SGD': 69.05, 'ResIST': 67.62, 'local SGD s': 4391, 'ResIST s': 1195},
}


# ResIST paper Table 9: ResIST with every communicated parameter quantised to b bits (ResNet-101, 4 GPUs as its
# Figure 8), test accuracy %; A.5 adds 71.25% on CIFAR-100 when each round keeps 25% of the weights.
RESIST_QUANTIZED: dict[str, dict[int, float]] = {
    'cifar10': {8: 92.14, 7: 92.26, 6: 91.91, 5: 91.35, 4: 76.33},
    'cifar100': {8: 71.38, 7: 72.15, 6: 71.37, 5: 68.29, 4: 40.48},
}
RESIST_SPARSE_CIFAR100 = 71.25

# ResIST paper Table 7 (A.2): ensembles of independently trained shallow sub-ResNets against ResIST (ResNet-101),
# test accuracy % by the number of sub-ResNets. (dataset, S) -> {'ensemble': acc, 'ResIST': acc}.
RESIST_ENSEMBLE: dict[tuple[str, int], dict[str, float]] = {
    ('cifar10', 2): {'ensemble': 92.27, 'ResIST': 91.95}, ('cifar10', 4): {'ensemble': 92.56, 'ResIST': 92.35},
    ('cifar10', 8): {'ensemble': 90.67, 'ResIST': 91.45}, ('cifar100', 2): {'ensemble': 72.08, 'ResIST': 70.06},
    ('cifar100', 4): {'ensemble': 72.12, 'ResIST': 71.30}, ('cifar100', 8): {'ensemble': 67.98, 'ResIST': 70.26},
}


# ResIST paper Table 6: Pascal VOC object detection (a YOLO-v2-style detector on a post-activation ResNet-101,
# 100 epochs): the best test loss (mean and its +- over trials), the training seconds (+-) and ResIST's speed-up
# over local SGD. (method, S) -> column -> figure.
RESIST_DETECTION: dict[tuple[str, int], dict[str, float]] = {
    ('local SGD', 2): {'test loss': 6.15, 'loss +-': 0.03, 'seconds': 39621, 'seconds +-': 9.12},
    ('local SGD', 4): {'test loss': 6.22, 'loss +-': 0.06, 'seconds': 16840, 'seconds +-': 0.11},
    ('ResIST', 2): {'test loss': 5.99, 'loss +-': 0.01, 'seconds': 24058, 'seconds +-': 3.22, 'speed-up': 1.64},
    ('ResIST', 4): {'test loss': 6.69, 'loss +-': 0.17, 'seconds': 11264, 'seconds +-': 49.38, 'speed-up': 1.49},
}


# Where the FDG paper's Table 3 and the authors' README (whose figures FDG holds) disagree: the paper's own.
FDG_PAPER_TABLE3 = {('CIFAR-100 ResNet-56, K=2', 'FDG beta=0.8'): 27.70,
                    ('CIFAR-100 WRN-28-10, K=2', 'BP [WRN paper]'): 19.2}


def quoted() -> set[float]:
  """Every figure above, as a config docstring may quote it (test error, or accuracy for ResIST)."""
  return (set(FDG.values()) | set(FDG_PAPER_TABLE3.values()) | {a for r in RESIST.values() for a in r.values()}
          | {a for r in RESIST_IMAGENET.values() for a in r.values()}
          | {a for r in RESIST_DEEPER.values() for a in r.values()}
          | {a for r in RESIST_QUANTIZED.values() for a in r.values()} | {RESIST_SPARSE_CIFAR100}
          | {a for r in RESIST_DETECTION.values() for a in r.values()}
          | {a for r in RESIST_ENSEMBLE.values() for a in r.values()})
