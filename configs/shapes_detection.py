"""Object detection on a CPU: the YOLO-v2-style detector cut down to `yolo_postact_tiny` on the generated `shapes`
data set (docs/DATA.md, "Detection"), with the recipe of the `cpu_shapes_detection` study (docs/STUDIES.md): the
ResIST paper's Pascal VOC experiment (section 5, Table 6) at CPU size, nothing to download: about 50 minutes a
run at S = 2 on one core of an AMD EPYC host (the study's runs).

python main.py --config=configs/shapes_detection.py
python main.py --config=configs/shapes_detection.py:localsgd,4 --workdir=workdirs/shapes_localsgd_s4

The argument is METHOD,S (default resist,2): METHOD resist or localsgd with S workers, or bp alone (one network).
5 epochs of 4,000 images, batch 32 per worker, lr 0.01 warmed up over the first 1.5 epochs and / 10 after epochs 3
and 4; the log reports the test loss (the paper's metric) and the VOC-style mAP (`test_map`).
"""
from jaxdecouple.study.definitions.cpu_shapes_detection import build

METHODS = ('resist', 'localsgd', 'bp')


def get_config(arg: str = 'resist,2'):
  parts = [p.strip() for p in arg.split(',')]
  if parts == ['bp']:
    return build('bp', 1)()
  if len(parts) != 2 or parts[0] not in METHODS[:2] or not parts[1].isdigit() or int(parts[1]) < 1:
    raise ValueError(f'configs/shapes_detection.py:{arg}: the argument is METHOD,S with METHOD resist or localsgd '
                     'and S a number of workers (e.g. localsgd,4), or bp')
  return build(parts[0], int(parts[1]))()
