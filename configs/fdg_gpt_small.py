"""FDG with K=4 stages on a byte-level GPT (gpt_small: 8 blocks of width 128) on the fortunes corpus: the
asynchronous pipeline of AsyncPP's setting at CPU scale, against configs/bp_gpt_small.py.

python main.py --config=configs/fdg_gpt_small.py

The split is FLOP-balanced ('auto': a transformer has no reference split). beta 0.5 shrinks the delayed
gradients (stage k's are 2(K-1-k) iterations old); --config.pipeline.corrector=predict adds weight prediction,
--config.method=1f1b the synchronous pipeline on the same stages. Needs apt-get install fortunes.
Measured: docs/METHODS.md "Transformers".
"""
from jaxdecouple.recipes import gpt_bytes


def get_config():
  c = gpt_bytes('fdg')
  c.pipeline.num_stages = 4
  c.pipeline.beta = 0.5
  return c
