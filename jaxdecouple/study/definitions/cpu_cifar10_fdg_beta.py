"""FDG's gradient-shrinking sweep (the FDG paper's Figure 4a: ResNet-20 over beta, the bars that beat BP painted red;
K = 2 is our inference, from Table 2's ResNet-20 row, whose best is Figure 4a's beta 0.2) at CPU scale: ResNet-8 at
K = 2 on the CIFAR-10 JPEG copy with cpu_cifar10_converged's 30-epoch recipe, beta from 0.2 to 1. Shares that
study's workdir: its BP, beta 1 and beta 0.5 runs are shown again."""
from jaxdecouple.papers import FDG
from jaxdecouple.study.core import SEEDS, Claim, Run, Study, Sweep
from jaxdecouple.study.definitions import cpu_cifar10_converged as main
from jaxdecouple.study.definitions.common import CIFAR10_DATA, CIFAR10_FILE

ROW, PAPER_ROW = 'ResNet-8, K=2', 'ResNet-20, K=2'
NEW_BETAS = (0.2, 0.35, 0.7, 0.85)  # beside the shown runs' 0.5 and 1


def study() -> Study:
  shown = {(r.row, r.column, r.seed): r for r in main.study().runs}
  runs = []
  for seed in SEEDS:
    runs += [shown[(ROW, column, seed)].shown_as(ROW) for column in ('BP', 'FDG beta=1', 'FDG beta=0.5')]
  for seed in SEEDS:
    runs += [Run(ROW, f'FDG beta={beta:g}', seed, main.build('fdg', beta=beta)) for beta in NEW_BETAS]
  betas = sorted((*NEW_BETAS, 0.5, 1.0))
  paper = {(ROW, column): FDG[(PAPER_ROW, column)] for column in ('BP', 'FDG beta=1', 'FDG beta=0.2')}
  return Study(
      'cpu_cifar10_fdg_beta', "CPU: CIFAR-10 ResNet-8 at K=2, FDG's gradient shrinking over beta (the FDG paper's "
      'Figure 4a)', CIFAR10_DATA,
      f"cpu_cifar10_converged's recipe and workdir ({main.EPOCHS} epochs, its BP, beta 1 and beta 0.5 runs shown "
      f'again, not rerun) and FDG at beta {", ".join(f"{b:g}" for b in NEW_BETAS)}. The paper sweeps ResNet-20 over '
      'beta for 300 epochs and prints only its best and beta 1 as numbers (Table 2: 7.92% at beta 1, 7.23% at 0.2, '
      "BP 7.78%): compare the shape of the curve over beta, not errors",
      tuple(runs), needs=CIFAR10_FILE, column_order=('BP', *(f'FDG beta={b:g}' for b in betas)), paper=paper,
      sweep=Sweep('beta (gradient shrinking)', {(ROW, f'FDG beta={b:g}'): ('FDG', b) for b in betas}),
      reading=(
          "All 21 runs (2026-11-28, 3 seeds of every beta). The sweep is flat: from beta 0.2 to 1 the medians end "
          "between 19.84 and 20.03, their paired gaps to BP between +0.25 and +0.63, each beta's seeds spreading as "
          "far as the betas differ (beta 1's three end 19.75 to 20.00, BP's 19.30 to 19.68). Beta 0.2, the paper's "
          "best on ResNet-20 (-0.55 to BP there), ends 19.88 (+0.55), level with beta 1's 19.92 (+0.35): the "
          "paper's check reads missed, by a margin the seeds cover. No beta beats BP, so none would be painted red "
          'in Figure 4a; the smallest gap, beta 0.35\'s +0.25, is inside BP\'s own spread. On this shallow network, '
          "which underfits in 30 epochs, shrinking the delayed gradients neither helps nor, down to 0.2, costs: "
          "the paper's gain from tuning beta on ResNet-20 over 300 epochs (7.23% against 7.92% at beta 1) does not "
          'appear at this scale.',),
      # section 5.1 on Table 2: "By shrinking the delayed error gradients, the generalization abilities of these
      # ResNet-like networks are enhanced to even surpass their BP counterparts. In particular, the improvements in
      # ResNet-20 and WRN-28-10 are not trivial." (ResNet-20: 7.23% at beta 0.2 against 7.92% at beta 1)
      claims=(Claim("beta 0.2, the paper's best, beats beta=1 (5.1, Table 2: 0.69 points better on ResNet-20; the "
                    'table shows every beta)',
                    'FDG beta=0.2', (ROW,), 0.0, baseline='FDG beta=1'),
              # section 5.2: "the results for the proposed FDG are able to surpass the BP baseline with a small effort
              # of tuning the beta" (Figure 4a paints red the bars below BP): a claim that some tuned beta does. The
              # bar-by-bar checks are ours: which of our betas would be painted red (any one met bears 5.2 out)
              *(Claim(f'FDG at beta {b:g} beats BP (ours, bar by bar: would Figure 4a paint it red? 5.2: "a small '
                      'effort of tuning" surpasses BP)', f'FDG beta={b:g}', (ROW,), 0.0)
                for b in betas if b < 1)))
