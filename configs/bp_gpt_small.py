"""BP on a byte-level GPT (8 blocks of width 128, 128 positions, 1.67M parameters) on the fortunes corpus: the
baseline of configs/fdg_gpt_small.py and configs/resist_gpt_small.py.

python main.py --config=configs/bp_gpt_small.py

Needs the corpus: apt-get install fortunes (README setup); any text file or folder instead with
--config.dataset=text --config.data.path=FILE. Held-out bits per byte (test_bits_per_byte) is the metric.
Recipe: jaxdecouple.recipes.gpt_bytes (AdamW lr 1e-3, b2 0.95, weight decay 0.1, batch 32 of 128 bytes,
4 epochs, warm-up over the first). Measured (study cpu_gpt_async, docs/RESULTS.md; 2 epochs, Xeon, 2 cores,
median of 3 seeds): held-out next-byte error 60.79%, 3.04 bits per byte.
"""
from jaxdecouple.recipes import gpt_bytes


def get_config():
  return gpt_bytes('bp')
