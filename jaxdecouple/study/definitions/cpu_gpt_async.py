"""Issue 41 item 5: AsyncPP's setting (asynchronous pipelines on transformers) scaled to two CPU cores. An 8-block
byte-level GPT (gpt_small: width 128, 1.67M parameters) on the fortunes corpus, 2 epochs: BP, a synchronous
pipeline (1F1B, M = 4), FDG, FDG with AsyncPP's Nesterov look-ahead as its released code runs it with AdamW
(PyTorch's NAdam with b1 0.99 and its momentum schedule, psi 0.004: optim.momentum_decay; the library's `nesterov`
corrector replaces the optimizer, so it is SGD's) and DGL at K = 4, and local SGD and ResIST at S = 2; and a ViT row
on CIFAR-10 (vit6_d64_p4, 10 epochs): BP against FDG at K = 2 and 4. 3 seeds each; and FDG with PyTorch's NAdam
on the ViT, one seed. Does FDG's delayed gradient, which trails BP by +0.72 points at K = 4 on a CNN, hold on
attention blocks?

The column 'FDG NAdamW b1 0.99 (optax)' (seed 0 only) is optax's NAdamW, which keeps b1 = 0.99 from the first
step: the study's first reading of "what AsyncPP's code runs" until a look at that code (2026-11-27) found
PyTorch's NAdam, whose look-ahead weight mu_t starts at b1 / 2. Kept as run, beside the column that replaced it.

FDG's beta is 0.5 here, but AdamW divides a gradient's scale out again (docs/CONFIGS.md): these FDG runs are, to
within Adam's eps, beta 1. The last run asks whether AsyncPP's own rate (3e-4) closes what PyTorch's NAdam leaves
of the gap at BP's 1e-3."""
from jaxdecouple.study.core import SEEDS, Run, Study
from jaxdecouple.study.definitions.common import CIFAR10_DATA, CIFAR10_FILE

GPT, GPT_EPOCHS, K, S = 'gpt_small', 2, 4, 2
VIT, VIT_EPOCHS = 'vit6_d64_p4', 10
# optax's NAdamW; its run's folder keeps the name it was made under, before '(optax)' told it from PyTorch's
OPTAX_NADAMW, OPTAX_NADAMW_KEY = 'FDG NAdamW b1 0.99 (optax)', 'gpt-8-gpt-small-k-4-s-2__fdg-nadamw-b1-0.99__seed0'
NADAM, NADAM_FIELDS = 'FDG NAdam b1 0.99 (PyTorch)', {'optim.nesterov': True, 'optim.b1': 0.99,
                                                       'optim.momentum_decay': 0.004}
# AsyncPP's code runs its NAdam at lr 3e-4, the columns above at BP's 1e-3: does the rate explain what is left of
# the gap (PyTorch's NAdam FDG levelled off near loss 2.5 once the warm-up reached 1e-3)? One seed, last in the order.
NADAM_SLOW, NADAM_SLOW_FIELDS = 'FDG NAdam b1 0.99 (PyTorch), lr 3e-4', {**NADAM_FIELDS, 'optim.learning_rate': 3e-4}
GPT_COLUMNS = (('BP', 'bp', {}), ('1F1B', '1f1b', {}), ('FDG', 'fdg', {}),
               (OPTAX_NADAMW, 'fdg', {'optim.nesterov': True, 'optim.b1': 0.99}), (NADAM, 'fdg', NADAM_FIELDS),
               ('DGL', 'dgl', {}), ('local SGD', 'localsgd', {}), ('ResIST', 'resist', {}))
ONE_SEED = (OPTAX_NADAMW,)  # superseded (module docstring): its seed-0 run stays in the table


def gpt(method: str, fields: dict):
  """recipes.gpt_bytes for GPT_EPOCHS epochs; pipelines K = 4 (FDG beta 0.5), replicas S = 2 with L = 20."""
  def build():
    from jaxdecouple.config import set_fields
    from jaxdecouple.recipes import gpt_bytes
    c = gpt_bytes(method, GPT, GPT_EPOCHS)
    c.pipeline.num_stages, c.pipeline.beta, c.pipeline.micro_batches = K, 0.5 if method == 'fdg' else 1.0, 4
    c.replica.num_workers, c.replica.local_steps = S, 20
    c.log_every_steps, c.checkpoint_every_steps, c.eval_batch_size = 50, 250, 500
    return set_fields(c, fields)
  return build


def vit(method: str, k: int, fields: dict | None = None):
  """recipes.vit_cifar on the small ViT for VIT_EPOCHS epochs (FDG with beta 1 and K stages)."""
  def build():
    from jaxdecouple.config import set_fields
    from jaxdecouple.recipes import vit_cifar
    c = vit_cifar(method, VIT, VIT_EPOCHS)
    c.pipeline.num_stages, c.data.source, c.checkpoint_every_steps = k, 'npz', 500
    return set_fields(c, fields or {})
  return build


def study() -> Study:
  row, vit2, vit4 = f'GPT-8 ({GPT}), K={K} / S={S}', f'ViT ({VIT}), K=2', f'ViT ({VIT}), K=4'
  runs = []
  for seed in SEEDS:
    runs += [Run(row, column, seed, gpt(method, fields), key=OPTAX_NADAMW_KEY if column == OPTAX_NADAMW else '')
             for column, method, fields in GPT_COLUMNS if seed == SEEDS[0] or column not in ONE_SEED]
    runs += [Run(vit2, 'BP', seed, vit('bp', 1), also_rows=(vit4,)), Run(vit2, 'FDG', seed, vit('fdg', 2)),
             Run(vit4, 'FDG', seed, vit('fdg', 4))]
  # Does AsyncPP's optimizer rescue FDG on the ViT as on the GPT? One seed each, last in the order, so the
  # 3-seed cells above finish first.
  runs += [Run(row, NADAM, SEEDS[0], vit('fdg', k, NADAM_FIELDS))
           for row, k in ((vit2, 2), (vit4, 4))]
  runs += [Run(row, NADAM_SLOW, SEEDS[0], gpt('fdg', NADAM_SLOW_FIELDS))]
  return Study(
      'cpu_gpt_async', 'CPU: asynchronous and synchronous pipelines and ResIST on a byte-level GPT; a ViT on CIFAR-10',
      'the fortunes corpus (apt-get install fortunes: 2.6 MB of English text, the last 10% held out, windows of 128 '
      f'bytes) for the GPT row; {CIFAR10_DATA} for the ViT rows',
      f'GPT: jaxdecouple.recipes.gpt_bytes (AdamW lr 1e-3, b2 0.95, weight decay 0.1, batch 32, linear warm-up over '
      f'the first epoch, lr / 10 after 80%) for {GPT_EPOCHS} epochs; K={K} stages on a FLOP-balanced split (FDG beta '
      f'0.5, which AdamW divides out again; 1F1B with 4 micro-batches; AsyncPP\'s look-ahead as PyTorch\'s NAdam with b1 0.99 and momentum decay '
      f'0.004, as its released code runs it; '
      f'optax\'s NAdamW with b1 0.99 throughout beside it, one seed; PyTorch\'s NAdam at AsyncPP\'s lr 3e-4, one seed), '
      f'S={S} workers of batch 32 with 20 '
      f'local steps. The table\'s error is the next-byte error on the held-out text; the bits per byte are in '
      f'their own table. ViT: recipes.vit_cifar (AdamW lr 1e-3, weight decay 0.05, batch 128, crop and flip) for '
      f'{VIT_EPOCHS} epochs, FDG with beta 1',
      tuple(runs), needs=CIFAR10_FILE + ' (the ViT rows); the GPT rows read the installed fortunes corpus',
      column_order=(*(c for c, _, _ in GPT_COLUMNS), NADAM_SLOW), train_error=True, reading=READING)


# Typed by hand from the tables of all 34 runs (tests/test_study.py holds every figure quoted to them).
READING = (
    '1F1B gives BP\'s numbers to the digit on the GPT (60.79%, 3.040 bits per byte, 3 seeds): a synchronous '
    'pipeline is back-propagation with the gradient summed over its micro-batches, and a GPT has no BatchNorm '
    'that would tell the micro-batches apart.',
    'FDG at K=4 trails BP by +14.77 points (75.56%, 4.047 bits per byte), far more than FDG at K=4 on '
    'the CIFAR ResNets (cpu_cifar10_converged). Its training error is as high as its test error (77.27 against BP\'s 62.82): the delayed '
    'gradient slows the optimisation itself. FDG\'s own remedy cannot act here: beta multiplies the gradient a '
    'stage receives, and AdamW divides a constant factor out again.',
    'AsyncPP\'s answer, PyTorch\'s NAdam at b1 0.99 as its released code runs it, narrows the gap to +10.28 '
    '(71.18%) but does not close it in these 2 epochs. optax\'s NAdamW at the same b1, which gives each fresh '
    'gradient a weight of 1 - b1 from the first step, does worse than plain FDG (+23.48, one seed) and no longer '
    'moved over the last 20% of its steps (+0.00). AsyncPP\'s own rate does not close more: PyTorch\'s NAdam at '
    '3e-4 ends at 71.87% (+11.08, one seed), so at this length the rate is not what holds it behind BP.',
    'Without a stale gradient the decoupled methods lose far less: DGL, whose stages learn from local heads, '
    '+2.59; local SGD at S=2 +4.16 and ResIST +5.82, with 20 local steps a round.',
    'On the ViT (CIFAR-10, 10 epochs) plain FDG under AdamW trails BP as on the GPT: +9.02 points at K=2 and '
    '+21.66 at K=4 (3 seeds). There AsyncPP\'s optimizer closes the gap: PyTorch\'s NAdam at b1 0.99 reaches '
    '35.49% at K=2, -0.02 against BP\'s seed 0, and cuts K=4\'s gap from +21.66 to +6.16 (41.67%; one seed each). '
    'On the GPT the '
    'same optimizer left +10.28 after 2 epochs: 10 epochs at a falling loss may give its long momentum the time '
    'the GPT\'s 1,132 steps did not, a reading to test rather than a finding.',
    'Every GPT run but optax\'s NAdamW was still improving when its 2 epochs ended (the last 20% of the steps '
    'moved the error by -2.44 to -7.09 points): these compare early training, not converged models. The seconds '
    'tables mix runs that shared the cores with other studies at different times (BP\'s time to the target ranges '
    'from 457 to 4582 s): compare them within one run, not across columns.',
)
