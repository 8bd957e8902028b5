"""Where streamed (too large for memory) image data sets come from: a folder of class folders, or
tensorflow-datasets (prepared array_record data, read without TensorFlow; or prepared from the manual-
download folder, which needs TensorFlow), plus the ImageNet-V2 test sets for evaluation.

Each source gives :class:`~jaxdecouple.data.stream.Files` (encoded images and their labels); nothing is
decoded here. Problems found by looking (no class folders, files that are not JPEGs, splits with other
classes, a missing folder) stop with one :class:`DataError` line before any compute.
"""
from __future__ import annotations

import importlib.util
import os

import numpy as np

from jaxdecouple.data import stream
from jaxdecouple.data.datasets import DATASETS, Dataset
from jaxdecouple.data.stream import JPEG_EXTENSIONS, Files
from jaxdecouple.errors import DataError

TRAIN_SPLITS = ('train',)
EVAL_SPLITS = ('val', 'validation')
# ImageNet-V2 (Recht et al., 2019): variant -> (metric prefix, folder its tarball extracts to, tfds config)
IMAGENET_V2 = {
    'matched-frequency': ('v2mf', 'imagenetv2-matched-frequency-format-val', 'matched-frequency'),
    'threshold-0.7': ('v2t07', 'imagenetv2-threshold0.7-format-val', 'threshold-0.7'),
    'topimages': ('v2ti', 'imagenetv2-top-images-format-val', 'topimages'),
}


def _read_file(path: str) -> bytes:
  with open(path, 'rb') as f:
    return f.read()


def scan_folder(root: str, classes: list[str] | None = None) -> tuple[list[str], list[str], np.ndarray]:
  """(class names, file paths, labels) of ``root/CLASS/*.jpg``. With ``classes`` (the training split's),
  the folder's classes must be among them, or be the integers 0..N-1 (ImageNet-V2's layout)."""
  if not os.path.isdir(root):
    raise DataError(f'{root} is not a folder')
  names = sorted(d for d in os.listdir(root) if not d.startswith('.'))
  folders = [d for d in names if os.path.isdir(os.path.join(root, d))]
  if not folders:
    raise DataError(f'{root} has no class folders: put each class\'s images in its own folder '
                    f'({root}/CLASS/IMAGE.JPEG)')
  stray = [d for d in names if d not in folders]
  if stray:
    raise DataError(f'{root} holds files beside its class folders ({stray[0]}...): every image must be in '
                    f'a class folder ({root}/CLASS/IMAGE.JPEG)')
  if classes is None:
    label_of = {c: i for i, c in enumerate(folders)}
  elif all(c in classes for c in folders):
    label_of = {c: classes.index(c) for c in folders}
  elif all(c.isdigit() and int(c) < len(classes) for c in folders):  # ImageNet-V2: folders 0..999
    label_of = {c: int(c) for c in folders}
  else:
    other = [c for c in folders if c not in classes]
    raise DataError(f'{root} has {len(folders)} class folders, {len(other)} of them ({other[0]}...) not among '
                    f'the {len(classes)} classes of the training split: the splits must have the same classes')
  paths, labels = [], []
  for c in folders:
    files = sorted(f for f in os.listdir(os.path.join(root, c)) if not f.startswith('.'))
    if not files:
      raise DataError(f'{os.path.join(root, c)} holds no images')
    wrong = [f for f in files if not f.lower().endswith(JPEG_EXTENSIONS)]
    if wrong:
      raise DataError(f'{os.path.join(root, c, wrong[0])} is not a JPEG file (.jpeg or .jpg): the loader reads '
                      'JPEG images only; convert or remove it')
    first = os.path.join(root, c, files[0])
    try:
      head = _read_file(first)[:3]
    except OSError as e:
      raise DataError(f'{first} cannot be read ({e.strerror}); check its permissions') from e
    if head != b'\xff\xd8\xff':
      raise DataError(f'{first} is not a JPEG image (it does not start with a JPEG marker); convert or remove it')
    paths += [os.path.join(root, c, f) for f in files]
    labels += [label_of[c]] * len(files)
  return folders, paths, np.asarray(labels, np.int32)


def _files_from(where: str, paths: list[str], labels: np.ndarray, num_classes: int) -> Files:
  return Files(where, len(paths), lambda i: (_read_file(paths[i]), int(labels[i])), lambda i: paths[i],
               num_classes)


def _split_dir(root: str, names: tuple[str, ...]) -> str:
  for n in names:
    if os.path.isdir(os.path.join(root, n)):
      return os.path.join(root, n)
  raise DataError(f'{root} has no {" or ".join(names)} folder: the layout is {root}/train/CLASS/*.JPEG and '
                  f'{root}/val/CLASS/*.JPEG')


def load_folder(root: str) -> tuple[Files, Files]:
  """``root/train/CLASS/*.JPEG`` and ``root/val/CLASS/*.JPEG`` (ImageNet's usual extracted layout)."""
  if not root:
    raise FileNotFoundError('no folder given (set data.path to a folder with train/ and val/)')
  if not os.path.exists(root):
    raise FileNotFoundError(f'data.path={root} does not exist')
  if not os.path.isdir(root):
    raise DataError(f'data.path={root} is a file: give the folder holding train/CLASS/*.JPEG and val/CLASS/*.JPEG')
  train_dir, val_dir = _split_dir(root, TRAIN_SPLITS), _split_dir(root, EVAL_SPLITS)
  classes, train_paths, train_labels = scan_folder(train_dir)
  val_classes, val_paths, val_labels = scan_folder(val_dir, classes)
  if len(val_classes) != len(classes):
    raise DataError(f'{val_dir} has {len(val_classes)} class folders but {train_dir} has {len(classes)}: the '
                    'splits must have the same classes')
  return (_files_from(train_dir, train_paths, train_labels, len(classes)),
          _files_from(val_dir, val_paths, val_labels, len(classes)))


def import_tfds():
  """tensorflow_datasets, or one line saying what is missing (it imports importlib_resources, which
  nothing installs with it any more)."""
  try:
    import tensorflow_datasets as tfds
  except ModuleNotFoundError as e:
    raise ModuleNotFoundError(f'tensorflow-datasets cannot be imported ({e}): pip install tensorflow-datasets '
                              'importlib_resources') from e
  return tfds


def _tfds_files(builder, split: str, num_classes: int | None = None) -> Files:
  tfds = import_tfds()
  formats = [str(getattr(f, 'value', f)) for f in (builder.info.file_format,) if f is not None]
  where = f'tfds:{builder.name}/{builder.builder_config.name + "/" if builder.builder_config else ""}{split}'
  if formats and 'array_record' not in formats[0] and importlib.util.find_spec('tensorflow') is None:
    raise DataError(f'{where} is prepared as {formats[0]} files, which only TensorFlow reads: pip install '
                    'tensorflow-cpu, or prepare it again with file_format=array_record (read without TensorFlow)')
  source = builder.as_data_source(split=split, decoders={'image': tfds.decode.SkipDecoding()})
  classes = num_classes or builder.info.features['label'].num_classes

  def read(i):
    record = source[i]
    return bytes(record['image']), int(record['label'])

  return Files(where, len(source), read, lambda i: f'record {i}', classes)


def load_tfds_stream(name: str, data_dir: str, manual_dir: str) -> tuple[Files, Files]:
  """tensorflow-datasets' ``name`` (imagenet2012): its prepared data in ``data_dir``, or prepared first
  from ``manual_dir`` (ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar; needs TensorFlow)."""
  tfds = import_tfds()
  builder = tfds.builder(name, data_dir=data_dir or None)
  if not builder.is_prepared():
    if not manual_dir:
      raise FileNotFoundError(f'{name} is not prepared in {builder.data_dir} (set data.tfds_data_dir to where it '
                              'is, or data.tfds_manual_dir to the folder with the downloaded archives)')
    if not os.path.isdir(manual_dir):
      raise DataError(f'data.tfds_manual_dir={manual_dir} does not exist: it must hold ILSVRC2012_img_train.tar '
                      'and ILSVRC2012_img_val.tar (from https://image-net.org/download-images)')
    missing = [f for f in ('ILSVRC2012_img_train.tar', 'ILSVRC2012_img_val.tar')
               if not os.path.exists(os.path.join(manual_dir, f))]
    if missing:
      raise DataError(f'data.tfds_manual_dir={manual_dir} lacks {" and ".join(missing)} (from '
                      'https://image-net.org/download-images)')
    if importlib.util.find_spec('tensorflow') is None:
      raise DataError(f'preparing {name} from {manual_dir} runs tensorflow-datasets\' builder, which needs '
                      'TensorFlow: pip install tensorflow-cpu; or extract the archives into train/CLASS/*.JPEG '
                      'and val/CLASS/*.JPEG and use --config.data.source=folder --config.data.path=FOLDER')
    builder.download_and_prepare(file_format='array_record',
                                 download_config=tfds.download.DownloadConfig(manual_dir=manual_dir))
  return _tfds_files(builder, 'train'), _tfds_files(builder, 'validation')


def load_imagenet_v2(variants: list[str], folder: str, data_dir: str, num_classes: int) -> dict[str, Files]:
  """The ImageNet-V2 test sets asked for: each from ``folder/<its tarball's folder>`` when a folder is
  given, else from tensorflow-datasets' prepared ``imagenet_v2/<variant>``. Keyed by metric prefix."""
  out = {}
  for v in variants:
    prefix, subfolder, config = IMAGENET_V2[v]
    if folder:
      path = os.path.join(folder, subfolder)
      if not os.path.isdir(path):
        raise DataError(f'ImageNet-V2 {v}: {path} does not exist (data.imagenet_v2_dir must hold the extracted '
                        f'{subfolder} folder; or leave data.imagenet_v2_dir empty to use tensorflow-datasets; '
                        "or --config.data.imagenet_v2='' to evaluate without ImageNet-V2)")
      _, paths, labels = scan_folder(path, [str(i) for i in range(num_classes)])
      out[prefix] = _files_from(path, paths, labels, num_classes)
    else:
      tfds = import_tfds()
      builder = tfds.builder(f'imagenet_v2/{config}', data_dir=data_dir or None)
      if not builder.is_prepared():
        raise DataError(f'ImageNet-V2 {v}: imagenet_v2/{config} is not prepared in {builder.data_dir}; set '
                        "data.imagenet_v2_dir to the folder holding the extracted test sets, or "
                        "--config.data.imagenet_v2='' to evaluate without ImageNet-V2")
      out[prefix] = _tfds_files(builder, 'test', num_classes)
  return out


def write_fake_folder(root: str, num_classes: int = 3, train_per_class: int = 8, val_per_class: int = 4,
                      sizes: tuple[int, int] = (40, 72), seed: int = 0, quality: int = 90) -> str:
  """Writes a small data set in the folder layout (``root/train/nXXXXXXXX/*.JPEG``, ``root/val/...``) for
  tests, benchmarks and trying the streamed path offline: each class a colour, each image that colour plus
  noise, sides drawn from ``sizes`` (so crops and resizes are exercised). Returns ``root``."""
  from PIL import Image  # noqa: PLC0415
  rng = np.random.default_rng(seed)
  colours = rng.integers(30, 226, size=(num_classes, 3))
  for split, per_class in (('train', train_per_class), ('val', val_per_class)):
    for c in range(num_classes):
      folder = os.path.join(root, split, f'n{c:08d}')
      os.makedirs(folder, exist_ok=True)
      for i in range(per_class):
        h, w = rng.integers(sizes[0], sizes[1] + 1, size=2)
        pixels = np.clip(colours[c] + rng.normal(0, 30, size=(h, w, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(os.path.join(folder, f'n{c:08d}_{i}.JPEG'), quality=quality)
  return root


def load_streamed(data_config, name: str) -> Dataset:
  """A data set read from JPEG files per batch: ``data.path`` (a folder with train/ and val/ class folders)
  when given, else tensorflow-datasets (prepared, or from ``data.tfds_manual_dir``)."""
  mean, std, tfds_name = DATASETS[name].mean, DATASETS[name].std, DATASETS[name].tfds_name
  source = data_config.source
  order = [source] if source != 'auto' else (['folder'] if data_config.path else ['tfds'])
  attempts = {
      'folder': lambda: load_folder(data_config.path),
      'tfds': lambda: load_tfds_stream(tfds_name, data_config.tfds_data_dir, data_config.tfds_manual_dir),
  }
  tried = []
  for s in order:
    try:
      train, test = attempts[s]()
      break
    except DataError:
      raise
    except Exception as e:  # not found / not installed: say what was tried
      tried.append(f'{s}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ""}'.rstrip(': '))
  else:
    raise DataError(f'no source could provide {name} (tried {"; ".join(tried)}). Give a folder with '
                    'train/CLASS/*.JPEG and val/CLASS/*.JPEG as --config.data.path=FOLDER, or tensorflow-datasets\' '
                    f'prepared {tfds_name} as --config.data.tfds_data_dir=DIR (or the manual-download folder as '
                    '--config.data.tfds_manual_dir=DIR)')
  variants = [v.strip() for v in data_config.imagenet_v2.split(',') if v.strip()]
  if variants == ['all']:
    variants = list(IMAGENET_V2)
  extra = load_imagenet_v2(variants, data_config.imagenet_v2_dir, data_config.tfds_data_dir,
                                    train.num_classes)
  size, workers = data_config.image_size, data_config.workers
  images = lambda files, training: stream.StreamImages(files, size, training, workers, flip=data_config.flip)
  return Dataset(name, images(train, data_config.augment), None, images(test, False), None,
                 num_classes=train.num_classes, mean=mean, std=std, source=s,
                 extra_tests={k: images(v, False) for k, v in extra.items()})
