"""The ResIST paper's Table 9 on this machine: ResIST with what travels compressed on the wire (every
communicated parameter quantised to 8, 6, 5 or 4 bits, or only its largest 25% sent), beside
cpu_cifar10_resist's uncompressed ResIST runs at S=4 (shown again, not rerun; shared workdir). The paper
(ResNet-101, 4 GPUs): accuracy holds down to 6 bits (92.35% uncompressed, 91.91% at 6), slips at 5 (91.35%)
and collapses at 4 (76.33%). One seed per setting (Table 9 reports one figure per cell)."""
from jaxdecouple.papers import RESIST, RESIST_QUANTIZED
from jaxdecouple.study.core import SEEDS, Claim, Run, Study
from jaxdecouple.study.definitions import cpu_cifar10_resist as main
from jaxdecouple.study.definitions.common import CIFAR10_DATA, CIFAR10_FILE

WORKERS = 4
SETTINGS = (('8-bit', {'replica.quantize_bits': 8}), ('6-bit', {'replica.quantize_bits': 6}),
            ('5-bit', {'replica.quantize_bits': 5}), ('4-bit', {'replica.quantize_bits': 4}),
            ('25% kept', {'replica.sparsify': 0.25}))


def build(overrides):
  base = main.build('resist', WORKERS)

  def b():
    c = base()
    for field, value in overrides.items():
      section, name = field.split('.')
      c[section][name] = value
    return c
  return b


def study() -> Study:
  row = f'{main.MODEL}, S={WORKERS}'
  shown = {(r.row, r.column, r.seed): r for r in main.study().runs}
  runs = [shown[(row, 'ResIST', seed)].shown_as(row) for seed in SEEDS]
  runs += [Run(row, f'ResIST {name}', SEEDS[0], build(overrides)) for name, overrides in SETTINGS]
  paper = {(row, 'ResIST'): 100 - RESIST[('cifar10', WORKERS)]['ResIST'],
           **{(row, f'ResIST {b}-bit'): 100 - RESIST_QUANTIZED['cifar10'][b] for b in (8, 6, 5, 4)}}
  return Study(
      'cpu_cifar10_resist_compressed', "CPU: CIFAR-10, ResIST with compression on the wire (the paper's Table 9)",
      CIFAR10_DATA,
      f"cpu_cifar10_resist's recipe at S={WORKERS} ({main.EPOCHS} epochs, {main.MODEL}; its 3 uncompressed ResIST "
      'runs are shown again, not rerun), with every parameter a worker sends (shared layers into the all-gather, '
      'blocks to their next owners) quantised to b bits (codes plus a float32 grid per tensor), or only the 25% '
      'largest in magnitude sent (values plus int32 indices); one seed per setting. The paper\'s numbers are for '
      'ResNet-101 after 160 epochs: compare the drop from uncompressed, not errors',
      tuple(runs), paper, needs=CIFAR10_FILE, best_accuracy=True, baselines=('ResIST',),
      column_order=('ResIST', *(f'ResIST {name}' for name, _ in SETTINGS)), claims=(
          Claim('6-bit ResIST within 0.5 points of uncompressed ResIST (the paper: '
                f'{RESIST["cifar10", WORKERS]["ResIST"] - RESIST_QUANTIZED["cifar10"][6]:+.2f})',
                'ResIST 6-bit', (row,), 0.5, baseline='ResIST'),
          Claim('8-bit ResIST within 0.5 points of uncompressed ResIST (the paper: '
                f'{RESIST["cifar10", WORKERS]["ResIST"] - RESIST_QUANTIZED["cifar10"][8]:+.2f})',
                'ResIST 8-bit', (row,), 0.5, baseline='ResIST')))
