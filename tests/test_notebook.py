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
