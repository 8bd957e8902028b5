"""ResIST with S=2 workers on a byte-level GPT (gpt_small: 8 blocks of width 128) on the fortunes corpus: each
worker stores and trains the shared layers (embeddings, the first block, the head) and its half of the other
7 blocks for L local steps, then the shared layers are averaged and each block sent to its next owner.

python main.py --config=configs/resist_gpt_small.py

Batch 32 per worker, L = 20. --config.method=localsgd runs local SGD on the same recipe (every block on every
worker). The partitioned blocks' residual branches are scaled by 1/S at test time, as ResIST's ResNets'.
Needs apt-get install fortunes. Measured (study cpu_gpt_async, docs/RESULTS.md; 2 epochs, Xeon, 2 cores, medians
of 3 seeds): held-out next-byte error ResIST 66.73%, local SGD 64.95%, BP 60.79%.
"""
from jaxdecouple.recipes import gpt_bytes


def get_config():
  c = gpt_bytes('resist')
  c.replica.num_workers = 2
  c.replica.local_steps = 20
  return c
