"""The quickstart notebook runs top to bottom (tiny setting), and is committed without outputs."""
import json
import os

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError

from conftest import scaled_timeout, timed_out

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, 'notebooks', 'quickstart.ipynb')


def test_committed_notebook_has_no_outputs():
  with open(NOTEBOOK, encoding='utf-8') as f:
    nb = json.load(f)
  code = [c for c in nb['cells'] if c['cell_type'] == 'code']
  assert code and all(c['outputs'] == [] and c['execution_count'] is None for c in code)


def test_notebook_executes_top_to_bottom(tmp_path, monkeypatch):
  monkeypatch.setenv('JAXDECOUPLE_NOTEBOOK_TINY', '1')
  monkeypatch.delenv('JAX_NUM_CPU_DEVICES', raising=False)  # the notebook picks its own devices
  nb = nbformat.read(NOTEBOOK, as_version=4)
  # Run from a scratch copy of notebooks/ so the run's workdirs stay out of the checkout.
  work = tmp_path / 'notebooks'
  work.mkdir()
  os.symlink(os.path.join(ROOT, 'configs'), tmp_path / 'configs')
  os.symlink(os.path.join(ROOT, 'jaxdecouple'), tmp_path / 'jaxdecouple')
  os.symlink(os.path.join(ROOT, 'pyproject.toml'), tmp_path / 'pyproject.toml')  # a project folder
  try:
    NotebookClient(nb, timeout=round(scaled_timeout(300)), kernel_name='python3',
                   resources={'metadata': {'path': str(work)}}).execute()  # raises if any cell fails
  except CellTimeoutError:
    timed_out(300, what='in a cell of the notebook')
  outputs = {c['id']: ''.join(o.get('text', '') for o in c['outputs']) for c in nb['cells']
             if c['cell_type'] == 'code'}
  text = '\n'.join(outputs.values())
  assert 'BP: test accuracy' in text and 'FDG K=2: test accuracy' in text and 'ResIST S=2: test accuracy' in text
  assert 'fdg resnet56: K=' in text
  images = [o for c in nb['cells'] if c['cell_type'] == 'code' for o in c['outputs']
            if 'image/png' in o.get('data', {})]
  assert images, 'the learning curves were not drawn'
  assert (work / 'workdirs' / 'notebook' / 'fdg' / 'metrics.jsonl').exists()


def install_cell() -> str:
  nb = nbformat.read(NOTEBOOK, as_version=4)
  return next(c.source for c in nb.cells if c.cell_type == 'code' and c.source.startswith('# Install the project'))


def test_the_install_cell_installs_only_what_is_missing_or_below_its_bound(tmp_path, monkeypatch):
  """The install cell, run in a project folder whose pyproject.toml asks for what this environment has, calls
  no pip; asking for a version above the installed one (as a runtime's older preinstalled optax would be), or
  for a package that is not installed (tensorflow-datasets included where the Debian package does not hold
  Fashion-MNIST), it runs `pip install PROJECT[tfds]` once and names what was short. The
  bounds are read from the project's own pyproject.toml, and this checkout's meets them here."""
  import contextlib
  import importlib.metadata
  import importlib.util
  import io
  import subprocess
  import sys
  project = tmp_path / 'project'
  (project / 'notebooks').mkdir(parents=True)
  monkeypatch.chdir(project / 'notebooks')
  monkeypatch.delenv('JAXDECOUPLE_SOURCE', raising=False)
  calls = []
  monkeypatch.setattr(subprocess, 'check_call', lambda args, **kw: calls.append(list(args)))
  monkeypatch.setattr(sys, 'path', list(sys.path))  # the cell may add the project folder
  numpy_now = importlib.metadata.version('numpy')

  def run(dependencies):
    (project / 'pyproject.toml').write_text('[project]\nname = "jaxdecouple"\ndependencies = [\n  '
                                            + ', '.join(f'"{d}"' for d in dependencies) + ',\n]\n')
    calls.clear()
    with contextlib.redirect_stdout(io.StringIO()) as printed:
      exec(install_cell(), {'os': os, '__name__': 'cell'})  # one namespace, as a notebook's
    return printed.getvalue()

  printed = run([f'numpy>={numpy_now}', 'jax>=0.7'])
  assert calls == [] and 'jaxdecouple from' in printed
  printed = run([f'numpy>={numpy_now.split(".")[0]}.999', 'jax>=0.7', 'no-such-distribution-here>=1.0'])
  assert len(calls) == 1 and calls[0][1:4] == ['-m', 'pip', 'install'] and calls[0][5] == f'{project}[tfds]', calls
  assert f'numpy>={numpy_now.split(".")[0]}.999, no-such-distribution-here>=1.0' in printed, printed
  with open(os.path.join(ROOT, 'pyproject.toml'), encoding='utf-8') as f:  # this checkout's own bounds
    (project / 'pyproject.toml').write_text(f.read())
  calls.clear()
  with contextlib.redirect_stdout(io.StringIO()):
    exec(install_cell(), {'os': os, '__name__': 'cell'})
  assert calls == []
  # without the Debian package's Fashion-MNIST and without tensorflow-datasets the data has no way in: it installs
  isdir, find_spec = os.path.isdir, importlib.util.find_spec
  monkeypatch.setattr(os.path, 'isdir', lambda p: p != '/usr/share/datasets/fashion-mnist' and isdir(p))
  monkeypatch.setattr(importlib.util, 'find_spec', lambda name, *a: None if name == 'tensorflow_datasets'
                      else find_spec(name, *a))
  calls.clear()
  with contextlib.redirect_stdout(io.StringIO()):
    exec(install_cell(), {'os': os, '__name__': 'cell'})
  assert len(calls) == 1 and calls[0][5] == f'{project}[tfds]', calls


def test_the_package_ships_every_subpackage_and_the_configs():
  """pyproject.toml lists the packages (so that configs/ ships as jaxdecouple.configs, which the notebook reads in
  an installed copy): the list holds every package setuptools finds under jaxdecouple, and the configs."""
  import setuptools
  import tomllib
  with open(os.path.join(ROOT, 'pyproject.toml'), 'rb') as f:
    tool = tomllib.load(f)['tool']['setuptools']
  found = setuptools.find_packages(ROOT, include=['jaxdecouple*'])
  assert sorted(tool['packages']) == sorted([*found, 'jaxdecouple.configs'])
  assert tool['package-dir'] == {'jaxdecouple.configs': 'configs'}
  assert os.path.exists(os.path.join(ROOT, 'configs', '__init__.py'))
  assert os.path.exists(os.path.join(ROOT, 'configs', 'quickstart.py'))  # what the notebook loads


def test_the_install_cell_finds_a_clone_beside_it_and_refuses_an_old_python(tmp_path, monkeypatch):
  """Colab without a %cd: cloned into ./jaxdecouple from the runtime's working folder, the cell takes the clone
  as the project (its sys.path and pip's source; here every requirement is met, so no pip); a folder holding a
  'jaxdecouple' that is not a project is not put on sys.path. On a Python older than pyproject.toml's
  requires-python it stops with one line naming both versions, before any pip."""
  import contextlib
  import io
  import subprocess
  import sys
  import tomllib
  calls = []
  monkeypatch.setattr(subprocess, 'check_call', lambda args, **kw: calls.append(list(args)))
  monkeypatch.setattr(sys, 'path', list(sys.path))
  monkeypatch.delenv('JAXDECOUPLE_SOURCE', raising=False)
  (tmp_path / 'content').mkdir()
  os.symlink(ROOT, tmp_path / 'content' / 'jaxdecouple')  # `!git clone ... jaxdecouple`, no %cd
  monkeypatch.chdir(tmp_path / 'content')
  namespace = {'os': os, '__name__': 'cell'}
  with contextlib.redirect_stdout(io.StringIO()):
    exec(install_cell(), namespace)
  clone = str(tmp_path / 'content' / 'jaxdecouple')
  assert namespace['ROOT'] == namespace['SOURCE'] == clone and clone in sys.path and calls == []
  with open(os.path.join(ROOT, 'pyproject.toml'), 'rb') as f:
    wanted = tomllib.load(f)['project']['requires-python']
  assert wanted == '>={}.{}'.format(*namespace['MIN_PYTHON'])  # the cell's bound is the project's
  monkeypatch.setattr(sys, 'version_info', (3, 10, 14, 'final', 0))
  try:
    exec(install_cell(), {'os': os, '__name__': 'cell'})
    raise AssertionError('the cell ran on Python 3.10')
  except RuntimeError as e:
    assert 'needs Python 3.11 or newer, this runtime has 3.10' in str(e) and '\n' not in str(e)
  assert calls == []
