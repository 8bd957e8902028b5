"""FDG with K=2 stages on a small ViT (vit_small: 6 blocks of width 128, 4x4 patches, 1.2M parameters) on
CIFAR-10, beside the ResNet rows: does FDG's delayed gradient hold on attention blocks?

python main.py --config=configs/fdg_vit_cifar10.py --config.data.path=cifar10.npz

--config.method=bp for the baseline, --config.pipeline.num_stages=4 for K=4. Recipe:
jaxdecouple.recipes.vit_cifar (AdamW lr 1e-3, weight decay 0.05, batch 128, 30 epochs, crop and flip).
Measured: docs/METHODS.md "Transformers".
"""
from jaxdecouple.recipes import vit_cifar


def get_config():
  c = vit_cifar('fdg')
  c.pipeline.num_stages = 2
  return c
