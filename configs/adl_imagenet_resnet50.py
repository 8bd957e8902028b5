"""ADL with K=4 stages and M=2 accumulated gradients on ImageNet, ResNet-50, the standard recipe.

python main.py --config=configs/adl_imagenet_resnet50.py --config.data.path=/data/imagenet   # train/CLASS/*.JPEG, val/CLASS/*.JPEG
  (or --config.data.tfds_data_dir=DIR for tensorflow-datasets' prepared imagenet2012)

K = 2 or 3: --config.pipeline.num_stages=2. FDG's pipeline with each stage summing M = 2 delayed gradients
per update (mode B), plus the ADL code's linear warm-up from 0.01 x lr over 5 epochs. Batch 256, 90 epochs,
lr 0.1 / 10 at epochs 30, 60 and 80, weight decay 1e-4, bfloat16 compute. The ADL paper reports ImageNet
results, but its seed here is the abstract only: no figures to compare with.
"""
from jaxdecouple.recipes import imagenet


def get_config():
  c = imagenet('adl', 'imagenet_resnet50')
  c.pipeline.num_stages = 4
  c.pipeline.accumulation = 2
  c.pipeline.adl_mode = 'B'
  c.optim.warmup = 'linear'
  c.optim.warmup_epochs = 5.0
  c.optim.warmup_factor = 0.01
  return c
