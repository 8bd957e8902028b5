"""FDG with K=4 stages on a byte-level GPT (gpt_small: 8 blocks of width 128) on the fortunes corpus: the
asynchronous pipeline of AsyncPP's setting at CPU scale, against configs/bp_gpt_small.py.

python main.py --config=configs/fdg_gpt_small.py

The split is FLOP-balanced ('auto': a transformer has no reference split); stage k's gradients are 2(K-1-k)
iterations old. beta stays 1: FDG's shrinking multiplies the gradients, and AdamW divides that factor out again
(docs/CONFIGS.md; the start-up warns when beta < 1 meets such an optimizer). --config.method=1f1b runs the
synchronous pipeline on the same stages; AsyncPP's answer to the delay, PyTorch's NAdam with b1 0.99:
--config.optim.nesterov=true --config.optim.b1=0.99 --config.optim.momentum_decay=0.004.
Needs apt-get install fortunes.

Measured (study cpu_gpt_async, docs/RESULTS.md; 2 epochs rather than this config's 4, beta 0.5, which AdamW
divides out; Xeon, 2 cores, medians of 3 seeds): held-out next-byte error BP 60.79%, FDG 75.56% (+14.77 points),
FDG with PyTorch's NAdam b1 0.99 71.18% (+10.28; at AsyncPP's lr 3e-4 71.87%, one seed), 1F1B BP's to the digit. The delayed gradient costs this
transformer far more than a ResNet at K = 4 (+0.72 on ResNet-8).
"""
from jaxdecouple.recipes import gpt_bytes


def get_config():
  c = gpt_bytes('fdg')
  c.pipeline.num_stages = 4
  c.pipeline.beta = 1.0  # AdamW divides beta out (docstring)
  return c
