"""The streamed (ImageNet) data path on a tiny ImageNet-format folder the tests write: transforms against
their definitions, sources (folder, the real tensorflow-datasets module over files written here, ImageNet-V2
folders), top-5, a damaged image mid-epoch, every method a few steps, and exact resume mid-epoch."""
import io
import json
import math
import os
import shutil

import numpy as np
import pytest
from PIL import Image

from conftest import assert_trees_equal, tiny_config
from jaxdecouple.data import imagenet, stream
from jaxdecouple.errors import DataError
from jaxdecouple.evaluate import Evaluator
from jaxdecouple.train import train_and_evaluate


@pytest.fixture(scope='module')
def folder(tmp_path_factory):
  """3 classes, 8 training and 4 validation JPEGs each, 40-72 pixels a side."""
  return imagenet.write_fake_folder(str(tmp_path_factory.mktemp('imagenet') / 'data'))


def streamed_config(root, **overrides):
  kw = {'dataset': 'imagenet', 'data.source': 'folder', 'data.path': root, 'data.image_size': 16,
        'batch_size': 8, 'eval_batch_size': 12, 'num_epochs': 2, 'optim.milestones': (), 'log_every_steps': 1,
        'checkpoint_every_steps': 2, 'data.workers': 2, 'profile_every_steps': 0}
  return tiny_config(**{**kw, **overrides})


def records(workdir, kind):
  with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
    return [r for r in map(json.loads, f) if r['kind'] == kind]


def jpeg(pixels, quality=95):
  b = io.BytesIO()
  Image.fromarray(pixels).save(b, 'JPEG', quality=quality)
  return b.getvalue()


# --- transforms ---------------------------------------------------------------------------------

def test_random_resized_box_follows_its_definition():
  rng = np.random.default_rng(0)
  for w, h in [(500, 375), (64, 200), (1000, 40), (7, 7)]:
    for _ in range(200):
      x, y, cw, ch = stream.random_resized_box(rng, w, h)
      assert 0 <= x and 0 <= y and x + cw <= w and y + ch <= h and cw > 0 and ch > 0
      if (cw, ch) != (w, h) and x == (w - cw) / 2 and y == (h - ch) / 2:
        continue  # the fallback: centre crop clamped to the aspect range
      # the sides are sqrt(area * aspect) and sqrt(area / aspect) for an area in [8%, 100%] and an aspect in
      # [3/4, 4/3], each rounded to a whole pixel: within half a pixel of sides that meet both ranges
      assert (cw - 0.5) * (ch - 0.5) <= w * h and (cw + 0.5) * (ch + 0.5) >= 0.08 * w * h
      assert (cw - 0.5) / (ch + 0.5) <= 4 / 3 and (cw + 0.5) / (ch - 0.5) >= 3 / 4
  # large images always succeed in 10 tries: areas cover the range, aspects too
  boxes = np.array([stream.random_resized_box(rng, 1000, 1000) for _ in range(2000)])
  areas = boxes[:, 2] * boxes[:, 3] / 1e6
  assert areas.min() < 0.1 and areas.max() > 0.95
  # the fallback for an image outside the aspect range: the centre, at the extreme aspect
  assert stream.random_resized_box(np.random.default_rng(1), 1000, 10) == (493.5, 0.0, 13.0, 10.0)
  x, y, cw, ch = stream.center_box(500, 300)
  assert (cw, ch) == (300 * 224 / 256, 300 * 224 / 256) and x == (500 - cw) / 2 and y == (300 - ch) / 2


def test_evaluation_transform_is_resize_then_centre_crop():
  """Reference: decode in full, resize the shorter side to 256/224 of the output, take the centre."""
  rng = np.random.default_rng(0)
  yy, xx = np.mgrid[0:300, 0:420]
  pixels = np.stack([xx * 255 // 420, yy * 255 // 300, (xx + yy) % 256], -1).astype(np.uint8)
  pixels = np.clip(pixels + rng.normal(0, 3, pixels.shape), 0, 255).astype(np.uint8)
  data = jpeg(pixels)
  for size in (224, 64):
    got = stream.transform(data, size, None).astype(np.float64)
    full = Image.open(io.BytesIO(data)).convert('RGB')
    short = round(size * 256 / 224)
    resized = full.resize((round(420 * short / 300), short), Image.BILINEAR)
    left, top = (resized.size[0] - size) // 2, (short - size) // 2
    want = np.asarray(resized.crop((left, top, left + size, top + size)), np.float64)
    assert got.shape == (size, size, 3)
    assert np.abs(got - want).mean() < 4, np.abs(got - want).mean()  # reduced-size decoding and half pixels


def test_training_transform_is_keyed_and_flips():
  data = jpeg(np.tile(np.arange(64, dtype=np.uint8)[None, :, None] * 4, (48, 1, 3)))  # brighter to the right
  a = stream.transform(data, 16, np.random.default_rng([1, 0, 5, 0]))
  b = stream.transform(data, 16, np.random.default_rng([1, 0, 5, 0]))
  np.testing.assert_array_equal(a, b)
  flips = []
  for k in range(40):
    x = stream.transform(data, 16, np.random.default_rng([1, 0, k, 0])).astype(int)
    flips.append(x[:, 0].mean() > x[:, -1].mean())  # left brighter than right: flipped
  assert 8 < sum(flips) < 32


def test_stream_batches_are_a_function_of_the_key(folder):
  train, _ = imagenet.load_folder(folder)
  images = stream.StreamImages(train, 16, True, workers=2)
  x1, y1 = images.take([3, 0, 17, 23], (0, 0, 9))
  x2, y2 = stream.StreamImages(train, 16, True, workers=1).take([3, 0, 17, 23], (0, 0, 9))
  np.testing.assert_array_equal(x1, x2)
  np.testing.assert_array_equal(y1, [0, 0, 2, 2])
  assert not np.array_equal(x1, images.take([3, 0, 17, 23], (0, 1, 9))[0])  # another stream, other crops
  with pytest.raises(ValueError, match='need a key'):
    images.take([0])


def test_prefetcher_returns_what_the_function_returns():
  calls = []

  def batch_of(step):
    calls.append(step)
    return step * 10

  p = stream.Prefetcher(batch_of, 3, 9, 2)
  assert [p(s) for s in range(3, 9)] == [30, 40, 50, 60, 70, 80]
  p.close()
  assert sorted(calls) == list(range(3, 9))


# --- sources ------------------------------------------------------------------------------------

def test_folder_source(folder):
  train, val = imagenet.load_folder(folder)
  assert (len(train), len(val), train.num_classes) == (24, 12, 3)
  data, label = train.read(9)
  assert data[:3] == b'\xff\xd8\xff' and label == 1
  assert train.name(9).endswith(os.path.join('n00000001', 'n00000001_1.JPEG'))


@pytest.mark.parametrize('damage, message', [
    ('flat', 'has no class folders'),
    ('png', 'is not a JPEG file'),
    ('text-as-jpeg', 'is not a JPEG image'),
    ('other-class', 'not among the 3 classes'),
    ('fewer-classes', 'has 2 class folders but'),
    ('no-val', 'has no val or validation folder'),
    ('empty-class', 'holds no images'),
])
def test_folder_layouts_that_are_refused(folder, tmp_path, damage, message):
  root = str(tmp_path / 'data')
  shutil.copytree(folder, root)
  cls = os.path.join(root, 'train', 'n00000000')
  if damage == 'flat':
    for c in os.listdir(os.path.join(root, 'train')):
      shutil.rmtree(os.path.join(root, 'train', c))
  elif damage == 'png':
    Image.new('RGB', (8, 8)).save(os.path.join(cls, 'z.png'))
  elif damage == 'text-as-jpeg':
    with open(os.path.join(cls, '0.JPEG'), 'w', encoding='utf-8') as f:
      f.write('not an image')
  elif damage == 'other-class':
    os.rename(os.path.join(root, 'val', 'n00000002'), os.path.join(root, 'val', 'n99999999'))
  elif damage == 'fewer-classes':
    shutil.rmtree(os.path.join(root, 'val', 'n00000002'))
  elif damage == 'no-val':
    shutil.rmtree(os.path.join(root, 'val'))
  elif damage == 'empty-class':
    os.makedirs(os.path.join(root, 'train', 'n00000009'))
  with pytest.raises(DataError, match=message):
    imagenet.load_folder(root)


def test_real_tfds_imagenet2012_over_files_written_here(tmp_path, monkeypatch):
  """tensorflow-datasets' own imagenet2012 builder reads data prepared here (array_record files, no
  TensorFlow): a subclass generates the examples from JPEGs the test writes instead of the archives."""
  tfds = imagenet.import_tfds()
  from tensorflow_datasets.core import registered
  real = tfds.builder_cls('imagenet2012')

  def examples(n):
    for i in range(n):
      label = [5, 17, 999][i % 3]
      yield f'im{i}.JPEG', {'image': io.BytesIO(jpeg(np.full((30 + i, 40, 3), label % 256, np.uint8))),
                            'label': label, 'file_name': f'im{i}.JPEG'}

  with registered.skip_registration():
    class Written(real):  # noqa: D401  (same name, version and features as the real builder)
      name = 'imagenet2012'

      def _split_generators(self, dl_manager):
        return {'train': examples(9), 'validation': examples(6)}

      def _generate_examples(self):  # never called: the split generators above yield the examples
        raise NotImplementedError

  data_dir = str(tmp_path / 'tfds')
  Written(data_dir=data_dir, file_format='array_record').download_and_prepare()
  real_v2 = tfds.builder_cls('imagenet_v2')
  with registered.skip_registration():
    class WrittenV2(real_v2):  # the ImageNet-V2 test set, matched frequency, likewise
      name = 'imagenet_v2'

      def _split_generators(self, dl_manager):
        return {'test': examples(4)}

      def _generate_examples(self):
        raise NotImplementedError

  WrittenV2(config='matched-frequency', data_dir=data_dir, file_format='array_record').download_and_prepare()
  v2 = imagenet.load_imagenet_v2(['matched-frequency'], '', data_dir, 1000)
  assert list(v2) == ['v2mf'] and len(v2['v2mf']) == 4 and v2['v2mf'].read(3)[1] == 5
  with pytest.raises(DataError, match='imagenet_v2/topimages is not prepared'):
    imagenet.load_imagenet_v2(['topimages'], '', data_dir, 1000)
  train, val = imagenet.load_tfds_stream('imagenet2012', data_dir, '')
  assert (len(train), len(val), train.num_classes) == (9, 6, 1000)
  assert sorted({train.read(i)[1] for i in range(9)}) == [5, 17, 999]
  assert train.read(0)[0][:3] == b'\xff\xd8\xff'
  # and through the training loop
  c = streamed_config('', **{'data.source': 'tfds', 'data.tfds_data_dir': data_dir, 'batch_size': 3,
                             'eval_batch_size': 3, 'max_steps': 3, 'num_epochs': 1})
  result = train_and_evaluate(c, str(tmp_path / 'run'))
  assert 'test_top5_accuracy' in result.last_eval and result.last_eval['step'] == 3


def test_tfrecord_data_without_tensorflow_says_so_in_one_line(monkeypatch):
  import importlib.util
  import types
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, 'find_spec', lambda name, *a: None if name == 'tensorflow' else real(name, *a))
  builder = types.SimpleNamespace(name='imagenet2012', builder_config=None,
                                  info=types.SimpleNamespace(file_format='tfrecord'))
  with pytest.raises(DataError, match='prepared as tfrecord files, which only TensorFlow reads: pip install'):
    imagenet._tfds_files(builder, 'train')


def test_tfds_manual_download_folder_messages(tmp_path, monkeypatch):
  with pytest.raises(DataError, match='does not exist'):
    imagenet.load_tfds_stream('imagenet2012', str(tmp_path / 'empty'), str(tmp_path / 'none'))
  manual = tmp_path / 'manual'
  manual.mkdir()
  with pytest.raises(DataError, match='lacks ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar'):
    imagenet.load_tfds_stream('imagenet2012', str(tmp_path / 'empty'), str(manual))
  (manual / 'ILSVRC2012_img_train.tar').write_bytes(b'')
  (manual / 'ILSVRC2012_img_val.tar').write_bytes(b'')
  import importlib.util
  real = importlib.util.find_spec  # as on a machine without TensorFlow (this one, CI)
  monkeypatch.setattr(importlib.util, 'find_spec', lambda name, *a: None if name == 'tensorflow' else real(name, *a))
  with pytest.raises(DataError, match='needs TensorFlow: pip install tensorflow-cpu'):
    imagenet.load_tfds_stream('imagenet2012', str(tmp_path / 'empty'), str(manual))
  with pytest.raises(FileNotFoundError, match='not prepared'):
    imagenet.load_tfds_stream('imagenet2012', str(tmp_path / 'empty'), '')


# --- evaluation ---------------------------------------------------------------------------------

def test_evaluator_top1_top5_against_numpy():
  import jax
  rng = np.random.default_rng(0)
  n, classes = 37, 120
  table = rng.normal(size=(n, classes)).astype(np.float32)
  labels = rng.integers(0, classes, n).astype(np.int32)
  images = np.arange(n, dtype=np.uint8)[:, None, None, None] * np.ones((1, 2, 2, 1), np.uint8)
  predict = lambda variables, x: variables['params']['table'][jax.numpy.round(x[:, 0, 0, 0]).astype(np.int32)]
  from jaxdecouple.data import Preprocess
  pre = Preprocess((0.0,), (1 / 255,))  # normalize(x) = x: the pixel is the row of the table
  ev = Evaluator(predict, pre, 8, jax.devices()[0], num_classes=classes)
  out = ev({'params': {'table': table}}, images, labels)
  top5 = np.argsort(-table, axis=1)[:, :5]
  log_p = table - np.log(np.exp(table).sum(1, keepdims=True))
  assert out['test_accuracy'] == pytest.approx(np.mean(table.argmax(1) == labels))
  assert out['test_top5_accuracy'] == pytest.approx(np.mean((top5 == labels[:, None]).any(1)))
  assert out['test_loss'] == pytest.approx(-log_p[np.arange(n), labels].mean(), rel=1e-5)
  assert 'test_top5_accuracy' not in Evaluator(predict, pre, 8, jax.devices()[0], num_classes=10)(
      {'params': {'table': table}}, images, labels)


# --- training -----------------------------------------------------------------------------------

# bp: the tfds, ImageNet-V2 and damaged-image tests; fdg and resist: the resume tests below. ADL reads its
# data as FDG does (it is FDG with accumulation) and FR as DDG does (they differ only in the replay): both
# train from a folder across processes in tests/test_pipeline_processes.py.
@pytest.mark.parametrize('method', ['dp', 'ddg', 'dgl', 'localsgd', 'ensemble'])
def test_every_method_runs_from_a_folder(folder, tmp_path, method):
  """Each method's step takes streamed batches and its evaluation the streamed test set (a run, not an oracle:
  each method's numbers are held to its reference on in-memory data, and the streams' exactness to resume)."""
  kw = {'method': method, 'max_steps': 3, 'num_epochs': 1, 'pipeline.num_stages': 2, 'replica.num_workers': 2,
        'replica.local_steps': 2, 'dp.num_devices': 2}
  if method == 'ensemble':
    kw['model'] = 'preact_tiny'
  result = train_and_evaluate(streamed_config(folder, **kw), str(tmp_path / 'run'))
  assert result.step == 3
  e = result.last_eval
  assert 0 <= e['test_accuracy'] <= 1 and np.isfinite(e['test_loss'])
  assert all(np.isfinite(r['train_loss']) for r in records(str(tmp_path / 'run'), 'train'))


def test_streamed_resume_mid_epoch_is_exact(folder, tmp_path):
  """Killed after step 4 of a 3-step epoch (mid-epoch 2), resumed: the same parameters as one run."""
  kw = {'method': 'fdg', 'num_epochs': 3, 'max_steps': 0, 'checkpoint_every_steps': 2}
  whole = train_and_evaluate(streamed_config(folder, **kw), str(tmp_path / 'whole'))
  part = str(tmp_path / 'part')
  train_and_evaluate(streamed_config(folder, **{**kw, 'max_steps': 4}), part)
  resumed = train_and_evaluate(streamed_config(folder, **kw), part)
  assert resumed.step == whole.step == 9
  assert_trees_equal(resumed.variables, whole.variables)
  assert records(part, 'eval')[-1]['test_accuracy'] == whole.last_eval['test_accuracy']


def test_replica_streams_resume_exactly(folder, tmp_path):
  kw = {'method': 'resist', 'model': 'preact_tiny', 'replica.num_workers': 2, 'replica.local_steps': 2,
        'num_epochs': 1, 'max_steps': 0, 'batch_size': 4}  # 6 steps, killed after 4
  whole = train_and_evaluate(streamed_config(folder, **kw), str(tmp_path / 'whole'))
  part = str(tmp_path / 'part')
  train_and_evaluate(streamed_config(folder, **{**kw, 'max_steps': 4}), part)
  resumed = train_and_evaluate(streamed_config(folder, **kw), part)
  assert_trees_equal(resumed.variables, whole.variables)


def test_damaged_image_mid_epoch_is_skipped_and_counted(folder, tmp_path):
  root = str(tmp_path / 'data')
  shutil.copytree(folder, root)
  train, _ = imagenet.load_folder(root)  # the scan accepts it: only the first file of a class is opened
  victim = train.name(5)
  with open(victim, 'r+b') as f:  # a JPEG header, then garbage
    f.seek(20)
    f.write(os.urandom(400))
  images = stream.StreamImages(train, 16, True, workers=1)
  x, y = images.take([5, 6], (0, 0, 0))
  assert images.skipped == 1 and images.damaged == {5}
  np.testing.assert_array_equal(y, [0, 0])
  np.testing.assert_array_equal(x[0], images.take([6], (0, 0, 0))[0][0])  # the next image took its place
  workdir = str(tmp_path / 'run')
  result = train_and_evaluate(streamed_config(root, num_epochs=1, max_steps=0), workdir)
  assert result.step == 3
  assert max(r.get('skipped_images', 0) for r in records(workdir, 'train')) == 1  # each epoch reads it once


def test_imagenet_v2_test_sets_from_folders(folder, tmp_path):
  """ImageNet-V2's layout (class folders 0..N-1), evaluated beside the validation set: each variant here holds
  the validation images themselves (class c's in folder c), so each must score what the validation set scores,
  which shows the folders were read with the right labels and the same evaluation. (Top-5 accuracy is reported
  from 100 classes on; these have 3.)"""
  v2 = tmp_path / 'v2'
  for variant, (_, sub, _) in imagenet.IMAGENET_V2.items():
    for c in range(3):
      shutil.copytree(os.path.join(folder, 'val', f'n{c:08d}'), v2 / sub / str(c))
  workdir = str(tmp_path / 'run')
  result = train_and_evaluate(streamed_config(folder, max_steps=3, num_epochs=1,
                                              **{'data.imagenet_v2': 'all', 'data.imagenet_v2_dir': str(v2)}),
                              workdir)
  e = result.last_eval
  assert 0 < e['test_loss'] and math.isfinite(e['test_loss'])
  for prefix in ('v2mf', 'v2t07', 'v2ti'):
    assert e[f'{prefix}_accuracy'] == e['test_accuracy']  # a count over the same 12 images
    assert e[f'{prefix}_loss'] == pytest.approx(e['test_loss'], rel=1e-5)  # (summed in another order, maybe)
  with pytest.raises(DataError, match='imagenetv2-top-images-format-val does not exist'):
    shutil.rmtree(v2 / 'imagenetv2-top-images-format-val')
    imagenet.load_imagenet_v2(['topimages'], str(v2), '', 3)


def test_imagenet_configs_are_the_papers_recipes():
  """Every ImageNet config streams imagenet in bfloat16 (each is validated by test_config; the streamed
  ResIST path trains in test_replica_streams_resume_exactly)."""
  import glob
  import importlib.util
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  configs = {}
  for path in sorted(glob.glob(os.path.join(root, 'configs', '*imagenet*.py'))):
    spec = importlib.util.spec_from_file_location('cfg', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    configs[os.path.basename(path)] = c = module.get_config()
    assert (c.dataset, c.compute_dtype, c.data.image_size) == ('imagenet', 'bfloat16', 224), path
  assert len(configs) == 6
  c = configs['resist_imagenet_s2.py']
  assert (c.replica.num_workers, c.replica.min_depth, c.batch_size, c.num_epochs) == (2, 10, 256, 90)
  assert (c.replica.batch_norm, c.data.imagenet_v2, c.optim.milestones) == ('running', 'all', (30, 60))
  assert configs['adl_imagenet_resnet50.py'].pipeline.accumulation == 2


def test_a_replica_process_decodes_only_its_own_workers(folder, monkeypatch):
  """Under jax.distributed each process supplies only its devices' shards, so it decodes only the rows of
  the workers placed there: with workers 2 and 3 on another process's devices, their rows stay empty and
  the others are what one process decodes."""
  import types
  from jaxdecouple.data import TrainOrder, load_dataset
  from jaxdecouple.methods import METHODS
  from jaxdecouple.train import build_setup
  c = streamed_config(folder, method='localsgd', **{'replica.num_workers': 4, 'batch_size': 4})
  dataset = load_dataset(c.data, c.dataset)
  method = METHODS['localsgd'](build_setup(c, dataset))
  order = TrainOrder(len(dataset.x_train), 4, c.seed)
  whole = method.train_batch(dataset.x_train, None, order, 5)
  engine = method.engine
  fake = np.array([types.SimpleNamespace(process_index=p) for p in (0, 0, 1, 1)])  # 2 processes x 2 devices
  monkeypatch.setattr(engine, 'devices', list(fake))
  monkeypatch.setattr(engine, 'per_device', 1)
  mine = method.train_batch(dataset.x_train, None, order, 5)
  np.testing.assert_array_equal(mine.images[:2], whole.images[:2])
  np.testing.assert_array_equal(mine.labels[:2], whole.labels[:2])
  assert not mine.images[2:].any() and not mine.labels[2:].any()
  assert not np.array_equal(whole.images[0], whole.images[1])  # each worker its own shuffle and crops


def test_a_dead_decoding_process_stops_with_one_line(folder, monkeypatch):
  import concurrent.futures.process

  class Broken:
    def map(self, *a, **k):
      raise concurrent.futures.process.BrokenProcessPool('A process in the process pool was terminated abruptly')

  train, _ = imagenet.load_folder(folder)
  monkeypatch.setattr(stream, 'decode_pool', lambda workers: Broken())
  with pytest.raises(DataError, match='a JPEG decoding process died .* lower data.workers'):
    stream.StreamImages(train, 16, True, workers=2).take([0, 1], (0, 0, 0))


def _decoders(parent: int) -> list[int]:
  """The live decoding processes ``parent`` spawned (multiprocessing's spawned children) and its resource
  tracker, if it started one, from /proc."""
  out = []
  for pid in filter(str.isdigit, os.listdir('/proc')):
    try:
      with open(f'/proc/{pid}/stat', encoding='utf-8') as f:
        fields = f.read().rsplit(')', 1)[1].split()
      with open(f'/proc/{pid}/cmdline', 'rb') as f:
        cmdline = f.read()
    except OSError:
      continue
    if int(fields[1]) == parent and fields[0] != 'Z' and (b'spawn_main' in cmdline or b'resource_tracker' in cmdline):
      out.append(int(pid))
  return out


def _alive(pid: int) -> bool:
  try:
    with open(f'/proc/{pid}/stat', encoding='utf-8') as f:
      return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
  except OSError:
    return False


def test_a_group_signal_saves_and_no_decoder_outlives_its_run(folder, tmp_path):
  """main.py on the folder with 2 decoding processes. A SIGTERM to the run's whole process group (what a
  scheduler or a terminal's Ctrl-C sends) reaches the training process alone (the decoders have groups of
  their own; before, it killed them and the run died with a traceback and no checkpoint): it saves and exits
  0, and its decoders are gone with it. Then a kill -9 of a second run: its decoders and multiprocessing's
  resource tracker, orphaned, exit within seconds (before: alive 300 s later). (main.py's exit on an error,
  ``os._exit``, runs no exit path either: what holds for kill -9 holds for it.)"""
  import signal
  import subprocess
  import sys
  import time
  from conftest import FAST_COMPILE_XLA_FLAGS, communicate_within, scaled_timeout
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

  def launch(workdir):
    argv = [sys.executable, 'main.py', '--config=configs/quickstart.py', '--config.method=bp', '--config.cpu_devices=1',
            '--config.dataset=imagenet', '--config.data.source=folder', f'--config.data.path={folder}',
            '--config.data.image_size=16', '--config.data.workers=2', '--config.batch_size=8',
            '--config.eval_batch_size=12', '--config.num_epochs=1000', '--config.optim.milestones=()',
            '--config.log_every_steps=1', '--config.checkpoint_every_steps=100000', f'--workdir={workdir}']
    proc = subprocess.Popen(argv, cwd=root, env={**os.environ, 'JAX_PLATFORMS': 'cpu', 'XLA_FLAGS': FAST_COMPILE_XLA_FLAGS},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline, lines = time.monotonic() + scaled_timeout(120), []
    for line in proc.stdout:  # until it trains, its decoders started
      lines.append(line)
      if 'step 3/' in line and _decoders(proc.pid):
        return proc, _decoders(proc.pid), lines
      assert time.monotonic() < deadline, ''.join(lines)[-3000:]
    raise AssertionError('the run ended before training:\n' + ''.join(lines)[-3000:])

  workdir = tmp_path / 'term'
  proc, decoders, lines = launch(workdir)
  try:
    os.killpg(proc.pid, signal.SIGTERM)  # the group: the training process and whatever shares its group
    out = communicate_within(proc, 120, 'waiting for the signalled run to save and stop')[0]
  finally:
    proc.kill()
  assert proc.returncode == 0 and 'Traceback' not in out, (''.join(lines) + out)[-3000:]
  assert any(n.isdigit() for n in os.listdir(workdir / 'checkpoints')), os.listdir(workdir / 'checkpoints')
  deadline = time.monotonic() + scaled_timeout(10)
  while any(map(_alive, decoders)) and time.monotonic() < deadline:
    time.sleep(0.2)
  assert not any(map(_alive, decoders)), f'decoders {decoders} outlived their run'

  proc, decoders, _ = launch(tmp_path / 'killed')
  proc.kill()  # kill -9: no exit path of its own runs
  proc.communicate()
  deadline = time.monotonic() + scaled_timeout(10)
  while any(map(_alive, decoders)) and time.monotonic() < deadline:
    time.sleep(0.2)
  assert not any(map(_alive, decoders)), f'orphaned decoders {decoders} still alive'
