"""Every command the README and the guides under docs/ show parses, so the docs cannot rot.

A command is any ``python main.py ...``, ``python -m jaxdecouple.study ...`` or ``python benchmarks/X.py ...``
in a fenced code block (``\\`` continuations joined, ``#`` comments dropped) or in inline code. Checked without
running anything: the config file exists and its ``get_config`` gives a config (``FILE.py:ARG`` included),
every ``--config.FIELD=VALUE`` names a field of ``get_default_config()`` and its value has the field's type,
main.py gets only the flags it defines; the study exists and the study CLI defines every flag given; a
benchmark script exists and defines every flag given (its argparse / absl definitions read from its text).
Also: every ``--config.FIELD`` written anywhere in the docs is a field, every relative link and every
``configs/`` or ``benchmarks/`` path named exists, the configs guide names every config file, and the
architecture map names every module and benchmark script.
Placeholders (``DIR``, ``FILE.npz``, ``NAME``, ``<...>``) stand for any value.
"""
from __future__ import annotations

import ast
import functools
import glob
import importlib.util
import os
import re
import shlex

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ['README.md'] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, 'docs', '*.md')))
MAIN_FLAGS = {'config', 'workdir'}  # main.py's own; --config.FIELD overrides are checked against the schema
HELP = {'help', 'helpfull', 'h'}
_PLACEHOLDER = re.compile(r'[A-Z][A-Z0-9_]*')  # DIR, FILE, NAME, N, FOLDER, HOST ...
_COMMAND = re.compile(r'\bpython3?\s+(main\.py|-m\s+jaxdecouple\.study|benchmarks/)')


def is_placeholder(value: str) -> bool:
  """DIR, FILE.npz, studies/NAME, configs/X.py, <name>, ...: a value the reader fills in."""
  if not value or '<' in value or '...' in value or 'PLACEHOLDER' in value or '$' in value:
    return True
  base = os.path.basename(value.rstrip('/'))
  return bool(_PLACEHOLDER.fullmatch(base.split('.', 1)[0]))


# ---------------------------------------------------------------------------------------------- extraction

def _fences(text: str):
  """(code blocks, prose with the code blocks blanked), line numbers kept."""
  blocks, prose, block, start = [], [], None, 0
  for n, line in enumerate(text.split('\n'), 1):
    if line.lstrip().startswith('```'):
      if block is None:
        block, start = [], n + 1
      else:
        blocks.append((start, block))
        block = None
      prose.append('')
    elif block is not None:
      block.append(line)
      prose.append('')
    else:
      prose.append(line)
  return blocks, '\n'.join(prose)


def _shell_lines(start: int, lines: list[str]):
  """A code block's logical lines: continuations joined; (first line number, text)."""
  out, buf, first = [], '', None
  for n, line in enumerate(lines, start):
    if first is None:
      first = n
    if line.rstrip().endswith('\\'):
      buf += line.rstrip()[:-1] + ' '
      continue
    out.append((first, buf + line))
    buf, first = '', None
  if buf:
    out.append((first, buf))
  return out


def _segments(line: str):
  """The simple commands of one shell line (split at ; && || | &), redirections dropped."""
  line = re.sub(r'<[^<>\n]+>', 'PLACEHOLDER', line)  # <config file name>
  line = re.sub(r'\s\d?>>?\s*&?\s*\S+', ' ', line)  # > file, 2>&1
  line = line.replace('[', ' ').replace(']', ' ')  # [--workdir=DIR]: optional
  lexer = shlex.shlex(line, posix=True, punctuation_chars=';&|')
  lexer.whitespace_split = True
  lexer.commenters = '#'
  try:
    tokens = list(lexer)
  except ValueError:  # an unbalanced quote: not shell
    return []
  segment = []
  for token in tokens:
    if token and set(token) <= set(';&|'):
      yield segment
      segment = []
    elif token != '...':
      segment.append(token)
  yield segment


def _command(tokens):
  """(kind, script, args) for a python command of ours in a simple command's tokens, else None."""
  for i, token in enumerate(tokens):
    if token in ('python', 'python3') or token.endswith(('/python', '/python3')):
      rest = tokens[i + 1:]
      if rest[:1] == ['main.py']:
        return 'main', 'main.py', rest[1:]
      if rest[:2] == ['-m', 'jaxdecouple.study']:
        return 'study', 'jaxdecouple/study/cli.py', rest[2:]
      if rest and rest[0].startswith('benchmarks/'):
        return 'benchmark', rest[0], rest[1:]
  return None


def commands_in(text: str, source: str = 'text'):
  """Every command of ours shown in a markdown text: (where, kind, script, args)."""
  blocks, prose = _fences(text)
  found = []
  for start, lines in blocks:
    for n, line in _shell_lines(start, lines):
      if _COMMAND.search(line):
        for segment in _segments(line):
          command = _command(segment)
          if command:
            found.append((f'{source}:{n}', *command))
  for m in re.finditer(r'`([^`]+)`', prose):
    span = ' '.join(m.group(1).split())
    if _COMMAND.search(span):
      n = prose.count('\n', 0, m.start()) + 1
      for segment in _segments(span):
        command = _command(segment)
        if command:
          found.append((f'{source}:{n}', *command))
  return found


# ------------------------------------------------------------------------------------------------ checking

@functools.lru_cache(None)
def _default_config():
  from jaxdecouple.config import get_default_config
  return get_default_config()


def field_problem(dotted: str, value: str | None) -> str | None:
  """Why --config.DOTTED=VALUE would be refused, or None."""
  node, parts = _default_config(), dotted.split('.')
  if any(_PLACEHOLDER.fullmatch(part) for part in parts):  # --config.FIELD=VALUE, --config.replica.X
    return None
  for i, part in enumerate(parts):
    if not hasattr(node, 'keys') or part not in node:
      where = 'config' + ''.join('.' + p for p in parts[:i])
      return f'--config.{dotted}: no such field (fields of {where}: {", ".join(sorted(node.keys())) if hasattr(node, "keys") else "none"})'
    node = node[part]
  if hasattr(node, 'keys'):
    return f'--config.{dotted}: a group of fields, not a field'
  if value is None or is_placeholder(value):
    return None
  try:
    if isinstance(node, bool):
      if value.lower() not in ('true', 'false', '1', '0'):
        raise ValueError
    elif isinstance(node, int):
      int(value)
    elif isinstance(node, float):
      float(value)
  except ValueError:
    kind = type(node).__name__
    return f'--config.{dotted}={value}: not a{"n" * (kind[0] in "aeiou")} {kind} (the field holds {node!r})'
  return None


def _load_config(path: str, *args):
  spec = importlib.util.spec_from_file_location('docs_config_' + re.sub(r'\W', '_', path), os.path.join(ROOT, path))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(*args)


def config_file_problem(spec: str) -> str | None:
  """Why --config=SPEC (FILE.py or FILE.py:ARG) gives no config, or None."""
  if is_placeholder(spec.split(':', 1)[0]):
    return None
  path, colon, arg = spec.partition('.py:')
  path, args = (path + '.py', (arg,)) if colon else (path, ())
  if not os.path.isfile(os.path.join(ROOT, path)):
    return f'--config={spec}: no such file'
  try:
    _load_config(path, *args)
  except Exception as e:  # noqa: BLE001  whatever the file raises
    return f'--config={spec}: get_config() failed: {type(e).__name__}: {e}'
  return None


@functools.lru_cache(None)
def script_flags(path: str) -> tuple[dict, frozenset]:
  """A script's flags read from its text: {name: takes a value}, and the required ones (argparse's
  add_argument('--name', ...) and absl's DEFINE_*('name', ...))."""
  tree = ast.parse(open(os.path.join(ROOT, path)).read())
  flags, required = {}, set()
  for node in ast.walk(tree):
    if not isinstance(node, ast.Call) or not node.args or not isinstance(node.args[0], ast.Constant):
      continue
    name = getattr(node.func, 'attr', getattr(node.func, 'id', ''))
    keywords = {k.arg: k.value for k in node.keywords}
    first = node.args[0].value
    if name == 'add_argument' and isinstance(first, str) and first.startswith('--'):
      action = keywords.get('action')
      takes = not (isinstance(action, ast.Constant) and action.value in ('store_true', 'store_false'))
      flags[first[2:]] = takes
      if isinstance(keywords.get('required'), ast.Constant) and keywords['required'].value:
        required.add(first[2:])
    elif name.startswith('DEFINE_') and isinstance(first, str):
      flags[first] = name not in ('DEFINE_bool', 'DEFINE_boolean')
  return flags, frozenset(required)


def _flags(args):
  """(name, value or None, problem) for each argument: --name=value, --name value, --name."""
  i = 0
  while i < len(args):
    arg = args[i]
    if not arg.startswith('-'):
      yield None, None, f'stray argument {arg!r}'
      i += 1
      continue
    name, eq, value = arg.lstrip('-').partition('=')
    if not eq and i + 1 < len(args) and not args[i + 1].startswith('-'):
      value, i = args[i + 1], i + 1
    yield name, (value if eq or value else None), None
    i += 1


@functools.lru_cache(None)
def _studies():
  from jaxdecouple.study.definitions import STUDIES
  return frozenset(STUDIES)


def command_problems(kind: str, script: str, args: list[str]) -> list[str]:
  """Why a command would not parse (empty when it would)."""
  problems, given = [], {}
  if kind == 'benchmark' and not os.path.isfile(os.path.join(ROOT, script)):
    return [f'{script}: no such script']
  if kind == 'main':
    defined, required = dict.fromkeys(MAIN_FLAGS, True), {'config'}
  else:
    defined, required = script_flags(script)
  for name, value, problem in _flags(args):
    if problem:
      problems.append(problem)
      continue
    given[name] = value
    if name in HELP:
      required = set()
    elif kind == 'main' and name.startswith('config.'):
      problems.append(field_problem(name[len('config.'):], value))
    elif name not in defined:
      problems.append(f'--{name}: not a flag of {script} (its flags: {", ".join(sorted(defined))})')
    elif kind == 'main' and name == 'config':
      problems.append(config_file_problem(value or ''))
    elif kind == 'study' and name == 'study' and value and not is_placeholder(value) and value not in _studies():
      problems.append(f'--study={value}: no such study (studies: {", ".join(sorted(_studies()))})')
    elif defined[name] and value is None:
      problems.append(f'--{name} needs a value')
  problems += [f'--{r} is required' for r in sorted(set(required) - set(given))]
  return [p for p in problems if p]


def problems_in(text: str, source: str = 'text') -> list[str]:
  return [f'{where}: {p}' for where, kind, script, args in commands_in(text, source)
          for p in command_problems(kind, script, args)]


def _read(doc):
  with open(os.path.join(ROOT, doc)) as f:
    return f.read()


def sources():
  """(name, markdown) for the README, the guides, and the docstrings of main.py, the configs and the
  benchmark scripts (each config's docstring holds its exact command), a docstring read as a code block."""
  out = [(doc, _read(doc)) for doc in DOCS]
  for path in ['main.py'] + sorted(glob.glob('configs/*.py', root_dir=ROOT) + glob.glob('benchmarks/*.py', root_dir=ROOT)):
    docstring = ast.get_docstring(ast.parse(_read(path)), clean=False) or ''
    out.append((path, '```\n' + docstring + '\n```'))
  return out


# ------------------------------------------------------------------------------------------------ the tests

def test_every_command_in_the_docs_parses():
  found = [c for name, text in sources() for c in commands_in(text, name)]
  kinds = {kind for _, kind, _, _ in found}
  assert len(found) >= 100 and kinds == {'main', 'study', 'benchmark'}, (len(found), kinds)  # the finder finds
  problems = [f'{where}: {p}' for where, kind, script, args in found for p in command_problems(kind, script, args)]
  assert not problems, '\n'.join(problems)


def test_every_config_field_written_in_the_docs_exists():
  """--config.FIELD outside whole commands too (prose: 'set --config.replica.warmup_steps=W')."""
  problems = []
  for doc, text in sources():
    for m in re.finditer(r'--config\.([A-Za-z0-9_.]*[A-Za-z0-9_])(?:=([^\s`|]*))?', text):
      value = m.group(2) and m.group(2).rstrip('.,;:)')  # the end of a sentence or a parenthesis
      problem = field_problem(m.group(1), value)
      if problem:
        problems.append(f'{doc}: {problem}')
  assert not problems, '\n'.join(problems)


def test_links_and_named_files_exist():
  problems = []
  for doc in DOCS:
    text, here = _read(doc), os.path.dirname(os.path.join(ROOT, doc))
    for target in re.findall(r'\]\(([^)\s]+)\)', text):
      path = target.split('#', 1)[0]
      if path and not re.match(r'[a-z]+:', path) and not os.path.exists(os.path.join(here, path)):
        problems.append(f'{doc}: link to {target}: no such file')
    for path in set(re.findall(r'\b((?:configs|benchmarks)/[A-Za-z0-9_]+\.(?:py|sh))\b', text)):
      if not is_placeholder(path) and not os.path.isfile(os.path.join(ROOT, path)):
        problems.append(f'{doc}: {path}: no such file')
  assert not problems, '\n'.join(problems)


def test_the_configs_guide_names_every_config():
  """docs/CONFIGS.md names every file in configs/, and each table row's method is its config's."""
  text = _read('docs/CONFIGS.md')
  named = set(re.findall(r'(?:`|configs/)([a-z0-9_]+\.py)\b', text)) - {'config.py'}
  files = {os.path.basename(p) for p in glob.glob(os.path.join(ROOT, 'configs', '*.py'))} - {'__init__.py'}
  assert not files - named, f'configs missing from docs/CONFIGS.md: {sorted(files - named)}'
  assert not named - files, f'docs/CONFIGS.md names configs that do not exist: {sorted(named - files)}'
  rows = re.findall(r'^\| `([a-z0-9_]+\.py)` \| (\w+) \|', text, re.M)
  assert len(rows) >= 50, len(rows)
  wrong = [(name, method, _load_config(f'configs/{name}').method) for name, method in rows
           if _load_config(f'configs/{name}').method != method]
  assert not wrong, f'docs/CONFIGS.md: (config, method in the table, method of the config): {wrong}'


def test_the_architecture_map_names_every_module():
  """docs/ARCHITECTURE.md's map names every module of the package and every benchmark script (so a file added
  without its line fails here), each within its folder's entry."""
  text = _read('docs/ARCHITECTURE.md')
  missing = []
  for path in sorted(glob.glob(os.path.join(ROOT, 'jaxdecouple', '**', '*.py'), recursive=True)
                     + glob.glob(os.path.join(ROOT, 'benchmarks', '*.py'))):
    rel = os.path.relpath(path, ROOT)
    name = os.path.basename(rel)
    if name == '__init__.py' or '/definitions/' in rel:  # study definitions: "one file per study"
      continue
    folder = os.path.basename(os.path.dirname(rel))
    entry = re.search(rf'^(?:  )?{re.escape(folder)}/ .*?(?=^(?:  )?[a-z_]+(?:/|\.py) |^```)', text, re.M | re.S)
    scope = text if folder == 'jaxdecouple' else entry.group(0) if entry else ''
    if not re.search(rf'(?<![\w/]){re.escape(name)}', scope):
      missing.append(rel)
  assert not missing, f'docs/ARCHITECTURE.md does not name: {missing}'


def test_the_readme_is_a_front_page():
  text = _read('README.md')
  assert len(text.split('\n')) <= 250
  for doc in DOCS[1:]:
    assert f'({doc})' in text, f'README.md does not link {doc}'


def test_the_readme_test_command_is_what_ci_runs():
  ci = [line.strip() for line in _read('.ci/run').split('\n') if 'pytest' in line]
  assert ci and ci[-1] in _read('README.md'), ci


@pytest.mark.parametrize('text, expected', [
    ('`python main.py --config=configs/quickstart.py --config.num_epochs=2 --workdir=DIR`', None),
    ('```bash\npython main.py --config=configs/resist_deeper.py:localsgd,preact200,cifar100,2 \\\n'
     '    --config.data.path=FILE.npz   # a comment\n```', None),
    ('`python main.py --config=configs/quickstart.py --config.pipeline.betta=0.5`', 'no such field'),
    ('`python main.py --config=configs/quickstart.py --config.pipeline=0.5`', 'a group of fields'),
    ('`python main.py --config=configs/quickstart.py --config.num_epochs=ten`', 'not an int'),
    ('prose `python main.py\n  --config=configs/quickstart.py --config.bogus=1` prose', 'no such field'),
    ('```\npython main.py --config=configs/no_such_config.py\n```', 'no such file'),
    ('```\npython main.py --config=configs/resist_deeper.py:sgd,preact1,c,9\n```', 'get_config() failed'),
    ('`python main.py --config.num_epochs=2`', '--config is required'),
    ('`python main.py --config=configs/quickstart.py --work_dir=DIR`', 'not a flag of main.py'),
    ('`python main.py --config=configs/quickstart.py quickly`', 'stray argument'),
    ('`python -m jaxdecouple.study --study=cpu_fmnist --workdir=DIR --report`', None),
    ('`python -m jaxdecouple.study --study=cpu_fmnist_typo --workdir=DIR --report`', 'no such study'),
    ('`python -m jaxdecouple.study --study=cpu_fmnist --workdir=DIR --job=2`', 'not a flag of'),
    ('`python -m jaxdecouple.study --study=cpu_fmnist`', '--workdir is required'),
    ('`nice python benchmarks/throughput.py --model=resnet56 --rounds=3 > out.txt`', None),
    ('`python benchmarks/throughput.py --model=resnet56 --round=3`', 'not a flag of benchmarks/throughput.py'),
    ('`python benchmarks/no_such_bench.py --model=resnet56`', 'no such script'),
    ('`python benchmarks/throughput.py --isolate --model`', '--model needs a value'),
    ('```\ncd /tmp && python3 benchmarks/resist_worker.py --workers=4 --with_cond; echo done\n```', None),
])
def test_the_checker_catches_what_it_should(text, expected):
  """The oracle itself: good commands pass, each kind of rot is caught."""
  assert len(commands_in(text)) == 1, commands_in(text)
  problems = problems_in(text)
  if expected is None:
    assert not problems, problems
  else:
    assert problems and any(expected in p for p in problems), problems


def test_a_wrong_field_in_prose_is_caught():
  assert field_problem('replica.warmup_steps', '25000') is None
  assert 'no such field' in field_problem('replica.warm_up_steps', '25000')
