"""FDG with K=2 stages on a small ViT (vit_small: 6 blocks of width 128, 4x4 patches, 1.2M parameters) on
CIFAR-10, beside the ResNet rows: does FDG's delayed gradient hold on attention blocks?

python main.py --config=configs/fdg_vit_cifar10.py --config.data.path=cifar10.npz

--config.method=bp for the baseline, --config.pipeline.num_stages=4 for K=4. Recipe:
jaxdecouple.recipes.vit_cifar (AdamW lr 1e-3, weight decay 0.05, batch 128, 30 epochs, crop and flip).
Measured (study cpu_gpt_async, docs/RESULTS.md; a smaller ViT, vit6_d64_p4, for 10 epochs; Xeon, 2 cores,
medians of 3 seeds): test error BP 35.94%, FDG K=2 44.53% (+9.02 points), K=4 57.94% (+21.66); with PyTorch's
NAdam at b1 0.99 (--config.optim.nesterov=true --config.optim.b1=0.99 --config.optim.momentum_decay=0.004)
FDG K=2 35.49%, BP's level, and K=4 41.67% (+6.16; one seed each).
"""
from jaxdecouple.recipes import vit_cifar


def get_config():
  c = vit_cifar('fdg')
  c.pipeline.num_stages = 2
  return c
