"""ResIST with S=2 workers on Pascal VOC: a YOLO-v2-style detector on a post-activation ResNet-101 (the ResIST
paper's section 5, Table 6).

python main.py --config=configs/resist_voc_s2.py --config.data.path=/data/VOCdevkit
(or --config.data.source=tfds --config.data.tfds_data_dir=DIR with tensorflow-datasets' voc prepared there)

Paper, Table 6 (best test loss; training seconds on 2 machines): local SGD 6.15, 39621 s; ResIST 5.99, 24058 s (a
1.64x speed-up). 100 epochs, batch 10 (per worker: our reading), no augmentation, lr warmed up over 30 epochs, lowered
at 60 and 90 (/ 10 here: the factor, the rates and the warm-up's shape are ours where the paper's text lost them;
recipes.resist_detection says which). The test loss is the YOLO-v2 loss per image; test_map (VOC 2007 mAP at IoU 0.5)
is logged beside it.
"""
from jaxdecouple.recipes import resist_detection


def get_config():
  return resist_detection('resist', num_workers=2)
