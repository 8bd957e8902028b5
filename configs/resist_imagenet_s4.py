"""ResIST with S=4 workers on ImageNet, pre-activation ResNet-101, the ResIST paper's ImageNet recipe.

python main.py --config=configs/resist_imagenet_s4.py --config.data.path=/data/imagenet   # train/CLASS/*.JPEG, val/CLASS/*.JPEG
  (or --config.data.tfds_data_dir=DIR for tensorflow-datasets' prepared imagenet2012; ImageNet-V2 from
  --config.data.imagenet_v2_dir=DIR holding the extracted test sets, else tensorflow-datasets)

Paper (Table 3, top-1 accuracy): ImageNet 70.74%, ImageNet-V2 MF 57.56%, T-0.7 66.46%, TI 72.65%
(local SGD at S=4: 72.66%), 22.37 hours on 4 machines.
Batch 256 per worker, 90 epochs, lr 0.1 / 10 at epochs 30 and 60, bfloat16 compute, 50 local iterations
per round (the paper's ImageNet value of L is lost from its text; 50 is the release's), minimum depth 10.
As the paper: the shared layers' running BatchNorm statistics are averaged every 1300 rounds
(replica.stats_every_steps), and a local-SGD warm-up runs before ResIST starts (replica.warmup_steps, the
paper's "a few epochs": 25,000 steps, about 5 epochs; --config.replica.warmup_steps=0 turns it off).
Workers run one per device (fewer devices: several per device, same numbers); several hosts:
docs/DISTRIBUTED.md.
"""
from jaxdecouple.recipes import resist_imagenet


def get_config():
  return resist_imagenet('resist', num_workers=4)
