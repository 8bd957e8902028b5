"""BP (one device) on Pascal VOC: the YOLO-v2-style detector of the ResIST paper's section 5 trained without
replicas, the reference beside its local SGD and ResIST rows (configs/resist_voc_s2.py, localsgd_voc_s2.py).

python main.py --config=configs/bp_voc.py --config.data.path=/data/VOCdevkit

The same recipe (recipes.resist_detection): 100 epochs, batch 10, no augmentation, lr warmed up over 30 epochs,
lowered at 60 and 90 (/ 10 here: ours, where the paper's factor was lost); the test loss per image and the VOC 2007
mAP at IoU 0.5.
"""
from jaxdecouple.recipes import resist_detection


def get_config():
  return resist_detection('bp')
