"""How fast the streamed (ImageNet) loader decodes and augments JPEGs on this machine's cores.

  python benchmarks/loader.py --images=256 --workers=1,2

Writes ``--images`` ImageNet-sized JPEGs (sides drawn from 300-500 pixels, photo-like smooth content with
fine noise, quality 90: about ImageNet's average file size; ``--folder`` keeps them for a rerun), then
for each count of decoding processes times ``StreamImages.take`` on batches of ``--batch``: the training
transform (random-resized crop to 224 + flip, decoded at reduced size where the crop allows) and the
evaluation transform (resize to 256, centre 224), batches consumed through the prefetcher as training
consumes them; and, in this process on one core without a pool, the training transform with and without
reduced-size decoding (what a decode costs by itself, and what a plain decode-then-crop costs). Reports images/s and, from the
one-process rate, how many cores the host needs
to feed an accelerator at ``--target`` images/s (3,000: ResNet-50 in bfloat16 on one modern GPU).
Prints one JSON line per measurement, then a markdown table.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0], epilog=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--images', type=int, default=256, help='JPEGs to synthesise (decoded once per pass)')
  p.add_argument('--batch', type=int, default=64)
  p.add_argument('--size', type=int, default=224, help='output crop side')
  p.add_argument('--workers', default='1,2', help='comma-separated counts of decoding processes')
  p.add_argument('--passes', type=int, default=2, help='timed passes over the images (after one warm-up batch)')
  p.add_argument('--target', type=float, default=3000.0, help='images/s an accelerator consumes')
  p.add_argument('--folder', default='', help='where to write the JPEGs (kept); default: a temporary folder')
  p.add_argument('--json_out', default='', help='also append the JSON lines to this file')
  return p.parse_args(argv)


def write_images(folder: str, n: int, seed: int = 0) -> list[str]:
  from PIL import Image
  rng = np.random.default_rng(seed)
  os.makedirs(folder, exist_ok=True)
  paths = []
  for i in range(n):
    path = os.path.join(folder, f'{i:06d}.JPEG')
    paths.append(path)
    if os.path.exists(path):
      continue
    h, w = (int(v) for v in rng.integers(300, 501, size=2))
    yy, xx = np.mgrid[0:h, 0:w] / max(h, w)
    f = rng.uniform(2, 12, size=(3, 2))
    smooth = np.stack([np.sin(f[c, 0] * xx * 6.3 + f[c, 1] * yy * 6.3 + c) for c in range(3)], -1)
    pixels = np.clip(128 + 90 * smooth + rng.normal(0, 14, size=(h, w, 3)), 0, 255).astype(np.uint8)
    Image.fromarray(pixels).save(path, quality=90)
  return paths


def measure(paths: list[str], transform_name: str, workers: int, args) -> dict:
  from jaxdecouple.data import stream

  def read(i):
    with open(paths[i], 'rb') as f:
      return f.read(), 0

  files = stream.Files('bench', len(paths), read, lambda i: paths[i], 1)
  images = stream.StreamImages(files, args.size, transform_name != 'eval', workers)
  key = lambda step: (0, 0, step) if transform_name != 'eval' else None
  order = np.arange(len(paths))
  if transform_name in IN_PROCESS:  # this process, one core, no pool: what a decode costs by itself
    blobs = [read(i)[0] for i in order]
    f = IN_PROCESS[transform_name]
    start, count = time.perf_counter(), 0
    for p in range(args.passes):
      for i, data in enumerate(blobs):
        f(data, args.size, np.random.default_rng([p, i]))
        count += 1
    seconds = time.perf_counter() - start
  else:  # as training reads: batches through the prefetcher, decoded by the pool
    images.take(order[:args.batch], key(0))  # warm-up: processes started, files in the page cache
    starts = [a for _ in range(args.passes) for a in range(0, len(paths), args.batch)]
    prefetch = stream.Prefetcher(lambda b: images.take(order[starts[b]:starts[b] + args.batch], key(1 + b)),
                                 0, len(starts), 2)
    start, count = time.perf_counter(), 0
    for b in range(len(starts)):
      count += len(prefetch(b)[0])
    seconds = time.perf_counter() - start
    prefetch.close()
  return {'transform': transform_name, 'workers': workers, 'images': count, 'seconds': round(seconds, 3),
          'images_per_sec': round(count / seconds, 1), 'size': args.size}


def full_decode_transform(data: bytes, size: int, rng, flip: bool = True) -> np.ndarray:
  """The training transform without reduced-size decoding: every pixel decoded, then crop and resize
  (for comparison only)."""
  import io
  from PIL import Image
  from jaxdecouple.data import stream
  image = Image.open(io.BytesIO(data)).convert('RGB')
  x, y, cw, ch = stream.random_resized_box(rng, *image.size)
  image = image.resize((size, size), Image.BILINEAR, box=(x, y, x + cw, y + ch))
  if flip and rng.random() < 0.5:
    image = image.transpose(Image.FLIP_LEFT_RIGHT)
  return np.asarray(image, np.uint8)


def _in_process_train(data, size, rng):
  from jaxdecouple import jpeg
  return jpeg.transform(data, size, rng)


IN_PROCESS = {'train_in_process': _in_process_train, 'train_full_decode_in_process': full_decode_transform}


def main(argv=None) -> list[dict]:
  args = parse_args(argv)
  folder = args.folder or tempfile.mkdtemp(prefix='jaxdecouple-loader-')
  try:
    paths = write_images(folder, args.images)
    mean_kb = np.mean([os.path.getsize(p) for p in paths]) / 1024
    records = []
    for transform_name in ('train', 'eval', *IN_PROCESS):
      for workers in (int(w) for w in args.workers.split(',')) if transform_name not in IN_PROCESS else (0,):
        r = measure(paths, transform_name, workers, args)
        r['mean_file_kb'] = round(float(mean_kb), 1)
        records.append(r)
        print(json.dumps(r), flush=True)
        if args.json_out:
          with open(args.json_out, 'a', encoding='utf-8') as f:
            f.write(json.dumps(r) + '\n')
  finally:
    if not args.folder:
      shutil.rmtree(folder, ignore_errors=True)
  one = {r['transform']: r['images_per_sec'] for r in records if r['workers'] <= 1}
  print(f'\n{args.images} synthetic JPEGs, 300-500 px a side, {mean_kb:.0f} KB mean, crops of {args.size}; '
        f'{os.cpu_count()} cores here\n')
  print('| transform | decoding processes | images/s | cores for %g images/s (from 1 process) |' % args.target)
  print('|---|---|---|---|')
  for r in records:
    per_core = one.get(r['transform'])
    cores = math.ceil(args.target / per_core) if per_core else '-'
    print(f"| {r['transform']} | {r['workers'] or 'none (this process)'} | {r['images_per_sec']} | {cores} |")
  return records


if __name__ == '__main__':
  main()
