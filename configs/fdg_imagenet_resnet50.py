"""FDG with K=2 stages on ImageNet, ResNet-50 (torchvision's v1.5, 25.6M parameters), the standard recipe.

python main.py --config=configs/fdg_imagenet_resnet50.py --config.data.path=/data/imagenet   # train/CLASS/*.JPEG, val/CLASS/*.JPEG
  (or --config.data.tfds_data_dir=DIR for tensorflow-datasets' prepared imagenet2012)

K = 3 or 4: --config.pipeline.num_stages=4 (one device per stage; stages on other hosts:
docs/DISTRIBUTED.md). Batch 256, 90 epochs, lr 0.1 / 10 at epochs 30, 60 and 80, weight decay 1e-4,
bfloat16 compute, beta 1. The seeds carry no FDG figures on ImageNet to compare with; BP on the same
recipe: --config.method=bp (about 76% top-1 for ResNet-50 in the literature).
"""
from jaxdecouple.recipes import imagenet


def get_config():
  c = imagenet('fdg', 'imagenet_resnet50')
  c.pipeline.num_stages = 2
  c.pipeline.beta = 1.0
  return c
