"""Pascal VOC detection data in memory, as YOLO-v2 trains on it: VOC 2007 + 2012 trainval for training, VOC
2007 test for testing (ResIST's Pascal VOC experiment follows YOLO-v2's protocol).

Two sources: the extracted VOCdevkit folder (``root/VOC2007/{JPEGImages,Annotations,ImageSets/Main}``), or
tensorflow-datasets' ``voc`` prepared offline as array_record files, read without TensorFlow. Either way:

- each image is resized to image_size x image_size (PIL bilinear, aspect ratio not kept, no letterboxing: as
  darknet's YOLO-v2 resizes) and held as uint8; 16,551 training images at 416 pixels take 8.6 GB;
- labels are float32 [N, max_boxes, 6] rows (class, x_min, y_min, x_max, y_max, difficult), padding class -1,
  box corners as fractions of the original image. From the XML's 1-based pixel corners, as darknet's
  scripts/voc_label.py converts them (centre - 1, width xmax - xmin): x_min = (xmin - 1) / W,
  x_max = (xmax - 1) / W, likewise y with H (tensorflow-datasets stores xmin / W, one pixel apart);
- training labels drop difficult objects (voc_label.py does), test labels keep them flagged difficult = 1 (the
  VOC devkit ignores detections matched to them);
- an image with more than max_boxes objects keeps its first max_boxes, counted in one logged warning.
"""
from __future__ import annotations

import concurrent.futures
import io
import os
import xml.etree.ElementTree as ET

import numpy as np
from absl import logging

from jaxdecouple.data.imagenet import import_tfds
from jaxdecouple.errors import DataError

VOC_CLASSES = ('aeroplane', 'bicycle', 'bird', 'boat', 'bottle', 'bus', 'car', 'cat', 'chair', 'cow', 'diningtable',
               'dog', 'horse', 'motorbike', 'person', 'pottedplant', 'sheep', 'sofa', 'train', 'tvmonitor')
TRAIN_SETS = (('2007', 'trainval'), ('2012', 'trainval'))
TEST_SETS = (('2007', 'test'),)
# label rows per image: VOC 2007's most objects in one image is 42; VOC 2012's (its trainval is trained on too) is
# not measured here (no copy), so room is left above it; an image with more keeps its first 64, in one warning line
MAX_BOXES = 64
TFDS_SPLITS = {'trainval': ('train', 'validation'), 'test': ('test',), 'train': ('train',), 'val': ('validation',)}
DECODE_THREADS = min(16, os.cpu_count() or 1)  # PIL decodes and resizes without holding the GIL


def _pack(rows: list, max_boxes: int) -> tuple[np.ndarray, bool]:
  """Label rows -> [max_boxes, 6] float32 padded with class -1; and whether rows were dropped."""
  out = np.zeros((max_boxes, 6), np.float32)
  out[:, 0] = -1
  kept = np.asarray(rows[:max_boxes], np.float32).reshape(-1, 6)
  out[:len(kept)] = kept
  return out, len(rows) > max_boxes


def _resized(source, size: int, name: str) -> tuple[np.ndarray, int, int]:
  """(uint8 [size, size, 3], original width, original height) of a JPEG file path or its bytes."""
  from PIL import Image  # noqa: PLC0415
  try:
    with Image.open(io.BytesIO(source) if isinstance(source, bytes) else source) as image:
      width, height = image.size
      pixels = np.asarray(image.convert('RGB').resize((size, size), Image.BILINEAR), np.uint8)
  except (OSError, ValueError) as e:
    raise DataError(f'{name} cannot be decoded as an image ({e}); replace or remove it') from e
  return pixels, width, height


def _annotation_rows(path: str, width: int, height: int, keep_difficult: bool) -> list:
  """Label rows (class, x_min, y_min, x_max, y_max, difficult) of one VOC XML annotation."""
  try:
    root = ET.parse(path).getroot()
  except (OSError, ET.ParseError) as e:
    raise DataError(f'{path} cannot be read as a VOC annotation ({e}); restore it from the VOC archive') from e
  rows = []
  for obj in root.iter('object'):
    name = (obj.findtext('name') or '').strip().lower()
    if name not in VOC_CLASSES:
      raise DataError(f'{path} has an object of class {name!r}, not one of the 20 VOC classes; fix the annotation')
    difficult = int((obj.findtext('difficult') or '0').strip() or 0)
    if difficult and not keep_difficult:
      continue
    box = obj.find('bndbox')
    try:
      xmin, ymin, xmax, ymax = (float(box.findtext(k)) for k in ('xmin', 'ymin', 'xmax', 'ymax'))
    except (AttributeError, TypeError, ValueError) as e:
      raise DataError(f'{path}: an object of class {name} lacks a numeric bndbox (xmin, ymin, xmax, ymax)') from e
    corners = np.clip([(xmin - 1) / width, (ymin - 1) / height, (xmax - 1) / width, (ymax - 1) / height], 0, 1)
    rows.append((VOC_CLASSES.index(name), *corners, float(difficult > 0)))
  return rows


def _year_dir(root: str, year: str) -> str:
  for candidate in (os.path.join(root, f'VOC{year}'), os.path.join(root, 'VOCdevkit', f'VOC{year}')):
    if os.path.isdir(candidate):
      return candidate
  return os.path.join(root, f'VOC{year}')


def _decode_all(count: int, read, size: int, max_boxes: int, where: str) -> tuple[np.ndarray, np.ndarray]:
  """Images and labels of ``read(i) -> (image source, name, rows from (width, height))``, on a thread pool."""
  x = np.empty((count, size, size, 3), np.uint8)
  y = np.empty((count, max_boxes, 6), np.float32)

  def one(i):
    source, name, rows_of = read(i)
    x[i], width, height = _resized(source, size, name)
    y[i], dropped = _pack(rows_of(width, height), max_boxes)
    return dropped

  with concurrent.futures.ThreadPoolExecutor(DECODE_THREADS) as pool:
    overflow = sum(pool.map(one, range(count)))
  if overflow:
    logging.warning('%s: %d images have more than %d objects; each keeps its first %d', where, overflow, max_boxes,
                    max_boxes)
  return x, y


def _folder_split(root: str, sets, size: int, max_boxes: int, keep_difficult: bool):
  """(x, y, sets read, sets missing) of the VOCdevkit ``sets`` ((year, image set) pairs) that exist."""
  read, missing, items = [], [], []
  for year, image_set in sets:
    folder = _year_dir(root, year)
    listing = os.path.join(folder, 'ImageSets', 'Main', f'{image_set}.txt')
    if not os.path.isfile(listing):
      missing.append(f'VOC{year}/{image_set}')
      continue
    with open(listing, encoding='utf-8') as f:
      ids = [line.split()[0] for line in f if line.strip()]
    items += [(folder, i) for i in ids]
    read.append(f'VOC{year}/{image_set} ({len(ids)} images)')

  def item(k):
    folder, image_id = items[k]
    image = os.path.join(folder, 'JPEGImages', f'{image_id}.jpg')
    annotation = os.path.join(folder, 'Annotations', f'{image_id}.xml')
    if not os.path.isfile(image) or not os.path.isfile(annotation):
      raise DataError(f'{folder}: image {image_id} is listed but {image if not os.path.isfile(image) else annotation} '
                      'is missing; extract the full VOC archive')
    return image, image, lambda w, h: _annotation_rows(annotation, w, h, keep_difficult)

  if not read:
    return None, None, read, missing
  return (*_decode_all(len(items), item, size, max_boxes, f'VOC folder {root}'), read, missing)


def _where(kind: str, train_read, test_read, missing) -> str:
  out = f'{kind}: train {", ".join(train_read)}; test {", ".join(test_read)}'
  return out + (f'; not found, skipped: {", ".join(missing)}' if missing else '')


def load_voc_folder(root: str, image_size: int, train_sets=TRAIN_SETS, test_sets=TEST_SETS,
                    max_boxes: int = MAX_BOXES) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, str]:
  """(x_train, y_train, x_test, y_test, where) from the extracted VOCdevkit folder ``root`` (holding VOC2007/,
  VOC2012/; or their parent). Requested sets whose year is missing are skipped and named in ``where``; none of
  the training (or test) sets present stops with a DataError."""
  splits = []
  for name, sets, keep_difficult in (('training', train_sets, False), ('test', test_sets, True)):
    x, y, read, missing = _folder_split(root, sets, image_size, max_boxes, keep_difficult)
    if not read:
      expected = ', '.join(f'{root}/VOC{year}/ImageSets/Main/{s}.txt' for year, s in sets)
      raise DataError(f'no {name} set found: expected {expected}; give the extracted VOCdevkit folder as root')
    splits.append((x, y, read, missing))
  (x_train, y_train, train_read, m1), (x_test, y_test, test_read, m2) = splits
  return x_train, y_train, x_test, y_test, _where(f'VOC folder {root}', train_read, test_read, m1 + m2)


def _labels_from_tfds_objects(objects, max_boxes: int, keep_difficult: bool) -> np.ndarray:
  """[max_boxes, 6] label rows from a tensorflow-datasets voc record's 'objects' ('bbox' [k, 4] as (ymin,
  xmin, ymax, xmax) fractions, 'label' [k], 'is_difficult' [k]); difficult objects dropped unless kept."""
  return _pack(_tfds_rows(objects, keep_difficult), max_boxes)[0]


def _tfds_rows(objects, keep_difficult: bool) -> list:
  boxes = np.asarray(objects['bbox'], np.float32).reshape(-1, 4)
  classes = np.asarray(objects['label']).reshape(-1)
  difficult = np.asarray(objects['is_difficult']).reshape(-1).astype(bool)
  return [(float(c), b[1], b[0], b[3], b[2], float(d)) for c, b, d in zip(classes, boxes, difficult)
          if keep_difficult or not d]


def _tfds_split(tfds, data_dir: str, sets, size: int, max_boxes: int, keep_difficult: bool):
  sources, read, missing = [], [], []
  for year, image_set in sets:
    builder = tfds.builder(f'voc/{year}', data_dir=data_dir or None)
    if not builder.is_prepared():
      missing.append(f'voc/{year} {image_set}')
      continue
    fmt = str(getattr(builder.info.file_format, 'value', builder.info.file_format))
    if 'array_record' not in fmt:
      raise DataError(f'tfds:voc/{year} is prepared as {fmt} files, which only TensorFlow reads: prepare it again '
                      'with file_format=array_record (read without TensorFlow)')
    before = len(sources)
    for split in TFDS_SPLITS[image_set]:
      source = builder.as_data_source(split=split, decoders={'image': tfds.decode.SkipDecoding()})
      sources += [(source, i, f'tfds:voc/{year}/{split} record {i}') for i in range(len(source))]
    read.append(f'voc/{year} {image_set} ({len(sources) - before} images)')

  def item(k):
    source, i, name = sources[k]
    record = source[i]
    return bytes(record['image']), name, lambda w, h: _tfds_rows(record['objects'], keep_difficult)

  if not read:
    return None, None, read, missing
  return (*_decode_all(len(sources), item, size, max_boxes, f'tfds voc in {data_dir}'), read, missing)


def load_voc_tfds(data_dir: str, image_size: int,
                  max_boxes: int = MAX_BOXES) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, str]:
  """(x_train, y_train, x_test, y_test, where) from tensorflow-datasets' ``voc`` (configs 2007 and 2012)
  prepared in ``data_dir`` as array_record files: train = 2007 + 2012 train and validation, test = 2007 test."""
  tfds = import_tfds()
  splits = []
  for name, sets, keep_difficult in (('training', TRAIN_SETS, False), ('test', TEST_SETS, True)):
    x, y, read, missing = _tfds_split(tfds, data_dir, sets, image_size, max_boxes, keep_difficult)
    if not read:
      raise DataError(f'no {name} set of tensorflow-datasets voc is prepared in {data_dir} (looked for '
                      f'{", ".join(missing)}): prepare voc/2007 and voc/2012 there with file_format=array_record')
    splits.append((x, y, read, missing))
  (x_train, y_train, train_read, m1), (x_test, y_test, test_read, m2) = splits
  return x_train, y_train, x_test, y_test, _where(f'tfds voc in {data_dir}', train_read, test_read, m1 + m2)


def write_fake_voc(root: str, years=('2007',), num_train: int = 6, num_test: int = 4, image_size=(50, 40),
                   seed: int = 0) -> str:
  """Writes a tiny VOCdevkit-format folder for tests: ``root/VOC{year}/`` with JPEGImages/ (width x height =
  image_size, a flat colour with each object's box filled), Annotations/ (1-3 objects each, 1-based pixel
  corners; every third image has a difficult object) and ImageSets/Main/{trainval,test}.txt. Returns root."""
  from PIL import Image  # noqa: PLC0415
  rng = np.random.default_rng(seed)
  width, height = image_size
  for year in years:
    folder = os.path.join(root, f'VOC{year}')
    for sub in ('JPEGImages', 'Annotations', os.path.join('ImageSets', 'Main')):
      os.makedirs(os.path.join(folder, sub), exist_ok=True)
    ids = {'trainval': [f'{year}_{k:06d}' for k in range(num_train)],
           'test': [f'{year}_{k:06d}' for k in range(num_train, num_train + num_test)]}
    for image_set, names in ids.items():
      with open(os.path.join(folder, 'ImageSets', 'Main', f'{image_set}.txt'), 'w', encoding='utf-8') as f:
        f.write(''.join(n + '\n' for n in names))
    for k, image_id in enumerate(ids['trainval'] + ids['test']):
      pixels = np.full((height, width, 3), rng.integers(0, 256, size=3), np.uint8)
      objects = []
      for o in range(int(rng.integers(1, 4))):
        xmin, ymin = int(rng.integers(1, width - 8)), int(rng.integers(1, height - 8))
        xmax, ymax = int(rng.integers(xmin + 4, width + 1)), int(rng.integers(ymin + 4, height + 1))
        pixels[ymin - 1:ymax, xmin - 1:xmax] = rng.integers(0, 256, size=3)
        difficult = int(k % 3 == 0 and o == 0)
        name = VOC_CLASSES[int(rng.integers(0, len(VOC_CLASSES)))]
        objects.append(f'<object><name>{name}</name><pose>Unspecified</pose><truncated>0</truncated>'
                       f'<difficult>{difficult}</difficult><bndbox><xmin>{xmin}</xmin><ymin>{ymin}</ymin>'
                       f'<xmax>{xmax}</xmax><ymax>{ymax}</ymax></bndbox></object>')
      Image.fromarray(pixels).save(os.path.join(folder, 'JPEGImages', f'{image_id}.jpg'), quality=95)
      with open(os.path.join(folder, 'Annotations', f'{image_id}.xml'), 'w', encoding='utf-8') as f:
        f.write(f'<annotation><folder>VOC{year}</folder><filename>{image_id}.jpg</filename><size><width>{width}'
                f'</width><height>{height}</height><depth>3</depth></size>{"".join(objects)}</annotation>')
  return root
