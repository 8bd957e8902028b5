"""Issue 42 item 0: why both our local SGD and our ResIST end 5-6 points below the ResIST release's at the same
epoch on the 4-epoch proxy recipe (test error after 4 epochs, one seed, release run on this machine: local SGD
33.87%, ResIST 35.88%; ours 38.12% and 41.67%). A side-by-side reading of the two codes (docs/METHODS.md) found
the recipe the same except the convolution initialisation (the release keeps PyTorch's default, whose weights are
1/sqrt(6) of He fan-out's for a 3x3 convolution), a BN-ReLU before the pooling that the release's head does not
have, and the test batch (100 images against 1000, with batch statistics at test time). Each is switched to the
release's in turn, 3 seeds, local SGD and ResIST at S=2; the target is each method within 1.5 points of the
release's figure."""
from jaxdecouple.config import set_fields
from jaxdecouple.study.core import SEEDS, Claim, Run, Study
from jaxdecouple.study.definitions import cpu_cifar10_resist as main
from jaxdecouple.study.definitions.common import CIFAR10_DATA, CIFAR10_FILE

EPOCHS = 4
RELEASE = {'local SGD': 33.87, 'ResIST': 35.88}  # the release's test error after 4 epochs (one seed, issue 42)
SETTINGS = (('ours', {}),
            ('torch init', {'model_init': 'torch'}),
            ('torch init, release head', {'model_init': 'torch', 'model_head_norm': False}),
            ('release init, head and test batch', {'model_init': 'torch', 'model_head_norm': False,
                                                   'eval_batch_size': 100}))


def build(method, overrides):
  base = main.build(method, 2, epochs=EPOCHS)

  return lambda: set_fields(base(), overrides)


def study() -> Study:
  row = f'{main.MODEL}, S=2, {EPOCHS} epochs'
  runs = tuple(Run(row, f'{column}, {name}', seed, build(method, overrides))
               for seed in SEEDS for name, overrides in SETTINGS for column, method in main.COLUMNS)
  return Study(
      'cpu_cifar10_resist_release', "CPU: CIFAR-10, the ResIST release's recipe difference by difference (issue 42 "
      'item 0)', CIFAR10_DATA,
      f"cpu_cifar10_resist's recipe (the release's: SGD lr 0.03 / 10 at 50% and 75%, momentum restarted every round, "
      f'batch 128 per worker, 50 local steps) for {EPOCHS} epochs at S=2 on {main.MODEL}; "ours" as the library runs '
      'it, then with the release\'s convolution and linear initialisation (PyTorch\'s defaults, model_init=torch), '
      'also without the BN-ReLU before the pooling (model_head_norm=False), also with test batches of 100 '
      '(eval_batch_size=100; BatchNorm uses batch statistics at test time). The release, run on this machine on the '
      f"same data: local SGD {RELEASE['local SGD']}%, ResIST {RELEASE['ResIST']}% test error after {EPOCHS} epochs "
      f"(one seed; ResIST {RELEASE['ResIST'] - RELEASE['local SGD']:+.2f} points behind its local SGD); the target: "
      'each within 1.5 points of it',
      runs, needs=CIFAR10_FILE, best_accuracy=True, train_error=True,
      baselines=('local SGD, ours',),
      claims=tuple(Claim(f"{column} with the release's initialisation, head and test batch within 1.5 points of the "
                         f"release's {RELEASE[column]}% (issue 42's target)", f'{column}, {SETTINGS[-1][0]}', (row,),
                         1.5, reference=RELEASE[column]) for column, _ in main.COLUMNS),
      reading=(
          "The initialisation is the difference. With PyTorch's default initialisation (the release's) and nothing "
          'else changed, local SGD ends 4 epochs at 33.00% test error and ResIST at 34.44% (medians of 3 seeds), '
          "against 38.86% and 41.02% with the library's He fan-out initialisation: -5.27 and -4.42 points against "
          "our local SGD. He fan-out's 3x3 convolution weights are about two and a half times PyTorch's default at equal widths; behind "
          'BatchNorm a layer\'s effective step scales with the inverse square of its weights, so early training '
          'moves about 6x slower at the same learning rate, which a 4-epoch schedule does not make up.',
          "The release's head (no BN-ReLU before the pooling) leaves local SGD where it was (32.90%) and costs "
          'ResIST (35.65% against 34.44%); the test batches of 100, with batch statistics at test time, read both '
          "a little worse (33.75% and 36.35%). With all three of the release's differences both methods meet "
          "the target: local SGD -0.12 points from the release's 33.87%, ResIST +0.47 from its 35.88% (the release "
          'ran one seed; ours 3).',
          'None of the three closes the gap between the methods: ResIST trails local SGD as built by +1.93 points, '
          "the release's by +2.01, and it trails in every setting here. The paper's ResIST configs now take all "
          "three (recipes.release_network, since the paper's figures come from the release's code and the paper "
          "names none of them); the library's default stays He fan-out (He et al.'s, as torchvision's ResNets; the "
          "FDG code, like the release, keeps PyTorch's defaults), and the CPU ResIST studies keep it, so their "
          "gaps stand as measured."))
