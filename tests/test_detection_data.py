"""Detection data: the generated shapes (determinism, label format, boxes tight to the pixels drawn, found here
by fitting the background plane), and Pascal VOC read from a VOCdevkit folder the test writes (boxes against
the XML, difficult objects) and from tensorflow-datasets' own voc builder over records prepared here."""
import io
import os
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from PIL import Image

from jaxdecouple.data import voc
from jaxdecouple.data.shapes import MAX_BOXES, SHAPES_CLASSES, shapes_detection
from jaxdecouple.errors import DataError


@pytest.fixture(scope='module')
def shapes():
  return shapes_detection(40, 10, seed=3)


def test_shapes_deterministic(shapes):
  again = shapes_detection(40, 10, seed=3)
  for a, b in zip(shapes, again):
    np.testing.assert_array_equal(a, b)
  other = shapes_detection(40, 10, seed=4)
  assert not np.array_equal(shapes[0], other[0])
  assert not np.array_equal(shapes[0][:10], shapes[2])  # test images are not the first training ones


def test_shapes_label_format(shapes):
  x_train, y_train, x_test, y_test = shapes
  assert x_train.shape == (40, 64, 64, 3) and x_train.dtype == np.uint8 and x_test.shape == (10, 64, 64, 3)
  assert y_train.shape == (40, MAX_BOXES, 6) and y_train.dtype == np.float32 and y_test.shape == (10, MAX_BOXES, 6)
  for y in (y_train, y_test):
    real = y[..., 0] >= 0
    assert set(np.unique(y[..., 0])) <= {-1.0, *range(len(SHAPES_CLASSES))}
    assert np.all((real.sum(1) >= 1) & (real.sum(1) <= 4))
    assert np.all(real[:, :-1] >= real[:, 1:])  # real rows first
    assert np.all(y[~real][:, 1:] == 0) and np.all(y[..., 5] == 0)
    boxes = y[real][:, 1:5]
    assert np.all((boxes >= 0) & (boxes <= 1)) and np.all(boxes[:, 2:] > boxes[:, :2])
    sides = boxes[:, 2:] - boxes[:, :2]
    assert sides.min() >= 5 / 64 and sides.max() <= 1.0  # about 1/6 to 1/2 of the image (triangles: 4/3 of it)
    for rows in y[..., 1:5]:
      rows = rows[:int((rows.sum(1) > 0).sum())]
      for i in range(len(rows)):
        for j in range(i):
          iw = max(0, min(rows[i, 2], rows[j, 2]) - max(rows[i, 0], rows[j, 0]))
          ih = max(0, min(rows[i, 3], rows[j, 3]) - max(rows[i, 1], rows[j, 1]))
          union = np.prod(rows[i, 2:] - rows[i, :2]) + np.prod(rows[j, 2:] - rows[j, :2]) - iw * ih
          assert iw * ih / union < 0.3


def test_shapes_boxes_tight_to_the_drawn_pixels(shapes):
  """The background is a plane in (x, y) per channel plus noise of sd 3: fitted on the pixels outside the boxes,
  the pixels far from it (> 20 grey levels in some channel) are the shapes. None lies outside the boxes, and
  each box has such a pixel on each of its four edges (its box is tight)."""
  x_train, y_train, _, _ = shapes
  size = x_train.shape[1]
  ys, xs = np.mgrid[:size, :size]
  design = np.stack([np.ones(size * size), xs.ravel(), ys.ravel()], 1)
  for image, labels in zip(x_train, y_train):
    boxes = np.rint(labels[labels[:, 0] >= 0, 1:5] * size).astype(int)
    inside = np.zeros((size, size), bool)
    for x0, y0, x1, y1 in boxes:
      inside[y0:y1, x0:x1] = True
    pixels = image.reshape(-1, 3).astype(np.float64)
    outside = ~inside.ravel()
    coefficients = np.linalg.lstsq(design[outside], pixels[outside], rcond=None)[0]
    shape = (np.abs(pixels - design @ coefficients).max(1) > 20).reshape(size, size)
    assert not np.any(shape & ~inside)
    for x0, y0, x1, y1 in boxes:
      assert shape[y0, x0:x1].any() and shape[y1 - 1, x0:x1].any()
      assert shape[y0:y1, x0].any() and shape[y0:y1, x1 - 1].any()


def xml_rows(path, keep_difficult):
  """This test's reading of a VOC annotation: (class, corners - 1 over width / height, difficult)."""
  root = ET.parse(path).getroot()
  width, height = float(root.findtext('size/width')), float(root.findtext('size/height'))
  rows = []
  for obj in root.findall('object'):
    difficult = obj.findtext('difficult') == '1'
    if difficult and not keep_difficult:
      continue
    b = {k: float(obj.findtext(f'bndbox/{k}')) for k in ('xmin', 'ymin', 'xmax', 'ymax')}
    rows.append((voc.VOC_CLASSES.index(obj.findtext('name')), (b['xmin'] - 1) / width, (b['ymin'] - 1) / height,
                 (b['xmax'] - 1) / width, (b['ymax'] - 1) / height, float(difficult)))
  return rows


def ids_of(root, year, image_set):
  with open(os.path.join(root, f'VOC{year}', 'ImageSets', 'Main', f'{image_set}.txt')) as f:
    return f.read().split()


def test_voc_folder_round_trip(tmp_path):
  root = voc.write_fake_voc(str(tmp_path / 'VOCdevkit'), years=('2007',), num_train=6, num_test=4)
  x_train, y_train, x_test, y_test, where = voc.load_voc_folder(root, 32)
  assert x_train.shape == (6, 32, 32, 3) and x_test.shape == (4, 32, 32, 3) and x_train.dtype == np.uint8
  assert y_train.shape == (6, voc.MAX_BOXES, 6) and y_test.shape == (4, voc.MAX_BOXES, 6) and y_train.dtype == np.float32
  assert 'VOC2007/trainval (6 images)' in where and 'not found, skipped: VOC2012/trainval' in where
  dropped = kept_flagged = boxes_seen = 0
  for (x, y, image_set, keep) in ((x_train, y_train, 'trainval', False), (x_test, y_test, 'test', True)):
    for k, image_id in enumerate(ids_of(root, '2007', image_set)):
      annotation = os.path.join(root, 'VOC2007', 'Annotations', f'{image_id}.xml')
      rows = xml_rows(annotation, keep)
      np.testing.assert_allclose(y[k, :len(rows)], np.reshape(rows, (-1, 6)), atol=1e-6)
      assert np.all(y[k, len(rows):, 0] == -1)
      dropped += len(xml_rows(annotation, True)) - len(rows)
      kept_flagged += sum(r[5] for r in rows)
      jpeg = Image.open(os.path.join(root, 'VOC2007', 'JPEGImages', f'{image_id}.jpg')).convert('RGB')
      assert jpeg.size == (50, 40)
      np.testing.assert_allclose(x[k].mean((0, 1)), np.asarray(jpeg, np.float64).mean((0, 1)), atol=8)
      # the image and its boxes were resized alike: inside the last object's box (drawn over the others), a
      # pixel in from its edges, the resized image has the colour that box was filled with
      _, x0, y0, x1, y1, _ = xml_rows(annotation, True)[-1]
      rows_in = slice(int(np.ceil(y0 * 32)) + 1, int(np.floor(y1 * 32)) - 1)
      cols_in = slice(int(np.ceil(x0 * 32)) + 1, int(np.floor(x1 * 32)) - 1)
      inside = x[k][rows_in, cols_in].reshape(-1, 3).astype(np.float64)
      if len(inside):
        fill = np.asarray(jpeg, np.float64)[int((y0 + y1) / 2 * 40), int((x0 + x1) / 2 * 50)]
        assert np.abs(inside - fill).max() <= 16, (image_id, np.abs(inside - fill).max())
        boxes_seen += 1
  assert boxes_seen >= 6
  assert dropped >= 2 and kept_flagged >= 1  # difficult objects: dropped from training, flagged in the test


def test_voc_folder_two_years_and_overflow(tmp_path):
  root = voc.write_fake_voc(str(tmp_path / 'VOCdevkit'), years=('2007', '2012'), num_train=3, num_test=2)
  x_train, y_train, x_test, y_test, where = voc.load_voc_folder(root, 16, max_boxes=1)
  assert len(x_train) == 6 and len(x_test) == 2 and 'skipped' not in where
  first = xml_rows(os.path.join(root, 'VOC2012', 'Annotations', f'{ids_of(root, "2012", "trainval")[0]}.xml'),
                   False)
  np.testing.assert_allclose(y_train[3, 0], first[0], atol=1e-6)  # 2012's first image follows 2007's three


def test_voc_folder_missing_says_where_in_one_line(tmp_path):
  with pytest.raises(DataError, match='absent/VOC2007/ImageSets/Main/trainval.txt') as e:
    voc.load_voc_folder(str(tmp_path / 'absent'), 32)
  assert '\n' not in str(e.value)
  root = voc.write_fake_voc(str(tmp_path / 'only2012'), years=('2012',))
  with pytest.raises(DataError, match='no test set found'):
    voc.load_voc_folder(root, 32)


def test_labels_from_tfds_objects():
  objects = {'bbox': np.array([[0.1, 0.2, 0.5, 0.6], [0.0, 0.3, 1.0, 0.9]], np.float32),  # (ymin, xmin, ymax, xmax)
             'label': np.array([3, 14]), 'is_difficult': np.array([False, True])}
  train = voc._labels_from_tfds_objects(objects, 4, keep_difficult=False)
  np.testing.assert_allclose(train, [[3, 0.2, 0.1, 0.6, 0.5, 0], [-1, 0, 0, 0, 0, 0], [-1, 0, 0, 0, 0, 0],
                                     [-1, 0, 0, 0, 0, 0]], atol=1e-7)
  test = voc._labels_from_tfds_objects(objects, 4, keep_difficult=True)
  np.testing.assert_allclose(test[:2], [[3, 0.2, 0.1, 0.6, 0.5, 0], [14, 0.3, 0.0, 0.9, 1.0, 1]], atol=1e-7)
  assert voc._labels_from_tfds_objects(objects, 1, keep_difficult=True).shape == (1, 6)
  empty = {'bbox': np.zeros((0, 4), np.float32), 'label': np.zeros(0, np.int64), 'is_difficult': np.zeros(0, bool)}
  assert np.all(voc._labels_from_tfds_objects(empty, 2, keep_difficult=True)[:, 0] == -1)


def test_real_tfds_voc_over_records_written_here(tmp_path):
  """tensorflow-datasets' own voc builder (config 2007) prepared here as array_record, without TensorFlow: its
  examples generated from the fake VOCdevkit instead of the archives, then read back by load_voc_tfds."""
  from tensorflow_datasets.core import registered
  tfds = voc.import_tfds()
  root = voc.write_fake_voc(str(tmp_path / 'VOCdevkit'), num_train=3, num_test=2)

  def examples(image_set):
    for image_id in ids_of(root, '2007', image_set):
      rows = xml_rows(os.path.join(root, 'VOC2007', 'Annotations', f'{image_id}.xml'), True)
      with open(os.path.join(root, 'VOC2007', 'JPEGImages', f'{image_id}.jpg'), 'rb') as f:
        image = io.BytesIO(f.read())
      objects = [{'label': int(c), 'bbox': tfds.features.BBox(y0, x0, y1, x1), 'pose': 'unspecified',
                  'is_truncated': False, 'is_difficult': bool(d)} for c, x0, y0, x1, y1, d in rows]
      yield image_id, {'image': image, 'image/filename': f'{image_id}.jpg', 'objects': objects,
                       'labels': sorted({o['label'] for o in objects}), 'labels_no_difficult': []}

  real = tfds.builder_cls('voc')  # imported (registered) before registration is skipped
  with registered.skip_registration():
    class Written(real):
      name = 'voc'

      def _split_generators(self, dl_manager):
        return {'train': examples('trainval'), 'validation': examples('trainval'), 'test': examples('test')}

      def _generate_examples(self):  # abstract in tensorflow-datasets; never called: the splits above yield the examples
        raise NotImplementedError('the splits come from _split_generators')

  data_dir = str(tmp_path / 'tfds')
  Written(config='2007', data_dir=data_dir, file_format='array_record').download_and_prepare()
  x_train, y_train, x_test, y_test, where = voc.load_voc_tfds(data_dir, 24)
  assert x_train.shape == (6, 24, 24, 3) and x_test.shape == (2, 24, 24, 3)
  assert 'voc/2007 trainval (6 images)' in where and 'voc/2012 trainval' in where  # 2012: not prepared, skipped
  assert np.all(y_train[..., 5] == 0) and np.any(y_test[..., 5] == 1)
  # tfds orders examples by a hash of their keys: compare each image's rows, (ymin, xmin, ...) back to (x_min, ...)
  expected = sorted(tuple(np.round(xml_rows(os.path.join(root, 'VOC2007', 'Annotations', f'{i}.xml'), True), 5)
                          .ravel()) for i in ids_of(root, '2007', 'test'))
  got = sorted(tuple(np.round(y[y[:, 0] >= 0].astype(np.float64), 5).ravel()) for y in y_test)
  np.testing.assert_allclose(np.concatenate(got), np.concatenate(expected), atol=2e-5)
  assert [len(g) for g in got] == [len(e) for e in expected]
  with pytest.raises(DataError, match='no training set of tensorflow-datasets voc'):
    voc.load_voc_tfds(str(tmp_path / 'empty'), 24)
