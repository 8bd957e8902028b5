"""Byte-level text: a corpus read as bytes and cut into next-byte prediction examples.

``dataset='fortunes'`` is the plain-text files of the Debian package ``fortunes`` (``apt-get install fortunes``:
about 2.6 MB of English prose, verse and dialogue in /usr/share/games/fortunes, installed by the README's setup,
nothing downloaded at run time); ``dataset='text'`` is any text file, or folder of text files, given as
``data.path``. A folder's files are read in sorted name order (links and the fortune index files ``*.dat``,
``*.u8`` are passed over) and joined by a newline.

The split is deterministic: the last ``HELD_OUT`` of the bytes is the held-out (test) part, the rest the
training part, so no window of one part overlaps the other. Each part is cut into consecutive, non-overlapping
windows of ``data.sequence_length`` T bytes: example i is bytes [iT, iT + T) and its labels the next bytes
[iT + 1, iT + T + 1), so every byte but a part's first is a target exactly once. Inputs are uint8 [N, T] (as
images are uint8 pixels) and labels int32 [N, T]; the model's logits are [N, T, 256], and the test loss in
nats per byte gives the bits per byte (``test_bits_per_byte``, loss / ln 2).
"""
from __future__ import annotations

import hashlib
import os

import numpy as np

from jaxdecouple.errors import DataError

TEXT_DATASETS = ('fortunes', 'text')
FORTUNES_DIR = '/usr/share/games/fortunes'
HELD_OUT = 0.1
VOCAB = 256
SKIPPED_SUFFIXES = ('.dat', '.u8')


def read_corpus(path: str) -> bytes:
  """The bytes of a text file, or of a folder's text files joined by newlines (sorted by name)."""
  if os.path.isfile(path):
    with open(path, 'rb') as f:
      return f.read()
  names = sorted(n for n in os.listdir(path) if not n.endswith(SKIPPED_SUFFIXES) and not n.startswith('.')
                 and os.path.isfile(os.path.join(path, n)) and not os.path.islink(os.path.join(path, n)))
  parts = []
  for n in names:
    with open(os.path.join(path, n), 'rb') as f:
      parts.append(f.read())
  return b'\n'.join(parts)


def windows(data: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
  """Consecutive non-overlapping windows of ``length`` bytes and their next bytes: ([N, T] uint8, [N, T] int32)."""
  n = (len(data) - 1) // length
  x = data[:n * length].reshape(n, length)
  y = data[1:n * length + 1].reshape(n, length).astype(np.int32)
  return np.ascontiguousarray(x), y


def split(corpus: bytes, length: int, where: str) -> tuple[np.ndarray, ...]:
  """x_train, y_train, x_test, y_test from a corpus: the last HELD_OUT of its bytes held out."""
  data = np.frombuffer(corpus, np.uint8)
  cut = int(len(data) * (1 - HELD_OUT))
  train, test = data[:cut], data[cut:]
  if len(test) <= length:
    need = int((length + 1) / HELD_OUT) + 1
    raise DataError(f'{where} holds {len(data)} bytes: too few for data.sequence_length={length} (its held-out '
                    f'{HELD_OUT:.0%} must hold one window: at least {need} bytes); give more text or a shorter sequence')
  return (*windows(train, length), *windows(test, length))


def synthetic_text(num_bytes: int, seed: int = 0) -> bytes:
  """Learnable made-up text for tests: words of a small random vocabulary, drawn by a fixed bigram rule with
  noise, so a model can learn both the spelling and the word order."""
  rng = np.random.default_rng(seed)
  letters = np.frombuffer(b'abcdefghijklmnopqrstuvwxyz', np.uint8)
  words = [bytes(rng.choice(letters, rng.integers(2, 7))) for _ in range(32)]
  follow = rng.integers(0, len(words), size=(len(words), 2))
  out, w = [], 0
  while sum(map(len, out)) < num_bytes:
    out.append(words[w] + (b'.\n' if rng.random() < 0.1 else b' '))
    w = follow[w, rng.integers(0, 2)] if rng.random() < 0.9 else rng.integers(0, len(words))
  return b''.join(out)[:num_bytes]


def load_text(data_config, name: str) -> tuple[tuple[np.ndarray, ...], str]:
  """The four arrays of a text data set and where they came from. Raises DataError naming what is missing."""
  length = data_config.sequence_length
  if data_config.source == 'synthetic':
    size = (data_config.synthetic_train_size + data_config.synthetic_test_size) * (length + 1)
    return split(synthetic_text(size), length, 'the synthetic text'), 'synthetic'
  if data_config.source != 'auto':
    raise DataError(f"data.source={data_config.source!r} does not read text; {name} is read from files: use 'auto', "
                    "or 'synthetic' for tests")
  path = data_config.path or (FORTUNES_DIR if name == 'fortunes' else '')
  if not path:
    raise DataError("dataset=text reads data.path (a text file or a folder of text files); give "
                    "--config.data.path=FILE, or use dataset=fortunes (apt-get install fortunes)")
  if not os.path.exists(path):
    hint = ('install the corpus with `apt-get install fortunes` (Debian/Ubuntu), or give a text file or folder as '
            '--config.data.path') if path == FORTUNES_DIR else 'give an existing text file or folder'
    raise DataError(f'data.path={path} does not exist; {hint}')
  try:
    corpus = read_corpus(path)
  except OSError as e:
    raise DataError(f'data.path={path} cannot be read ({type(e).__name__}: {e})') from e
  # the corpus named by its size and digest in the run's log: another release of the package splits differently
  digest = hashlib.sha256(corpus).hexdigest()[:12]
  return split(corpus, length, f'data.path={path}'), f"{path} ({len(corpus):,} bytes, sha256 {digest})"

