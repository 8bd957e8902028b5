#!/usr/bin/env bash
# Runs the quickstart notebook's install cell on a fresh virtual environment (no packages but pip's, as a new
# Colab or TPU VM runtime has none of the project's), from a copy of this checkout's committed files, then
# imports the library and checks a paper config. Needs the package registry (pip); took 24-94 s here (README).
#   bash notebooks/check_install.sh            # SOURCE: the project folder the notebook sits in
#   bash notebooks/check_install.sh --beside   # Colab without a %cd: the cell runs from the folder the project
#                                              # was cloned into (./jaxdecouple), not from notebooks/
#   JAXDECOUPLE_SOURCE=dist/jaxdecouple-0.1.0-py3-none-any.whl bash notebooks/check_install.sh
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
if [ -n "${JAXDECOUPLE_SOURCE:-}" ] && [ -e "$JAXDECOUPLE_SOURCE" ]; then  # a file: its absolute path (the cell
  export JAXDECOUPLE_SOURCE=$(realpath "$JAXDECOUPLE_SOURCE")              # runs from another folder)
fi
case "${1:-}" in
  '') from=jaxdecouple/notebooks ;;
  --beside) from=. ;;
  *) echo "check_install: unknown argument '$1' (none, or --beside)" >&2; exit 2 ;;
esac
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir "$scratch/jaxdecouple"
git -C "$here" archive HEAD | tar -x -C "$scratch/jaxdecouple"   # what a clone holds, nothing of this machine's
python3 -m venv "$scratch/venv"
python3 - "$here/notebooks/quickstart.ipynb" > "$scratch/install_cell.py" <<'PY'
import json, sys
cells = [''.join(c['source']) for c in json.load(open(sys.argv[1]))['cells'] if c['cell_type'] == 'code']
print('import os')
print(next(c for c in cells if c.startswith('# Install the project')))
PY
start=$(date +%s)
(cd "$scratch/$from" && env -u PYTHONPATH "$scratch/venv/bin/python" "$scratch/install_cell.py")
echo "install cell: $(( $(date +%s) - start )) s"
cd /
env -u PYTHONPATH "$scratch/venv/bin/python" - "$scratch" <<'PY'
import importlib.util, os, sys
import jaxdecouple
assert not jaxdecouple.__file__.startswith(sys.argv[1] + '/jaxdecouple/'), 'imported from the copy, not installed'
# the installed package's own copy of the configs (a wheel or git+https install has no configs/ folder beside it)
spec = importlib.util.spec_from_file_location('c', os.path.join(os.path.dirname(jaxdecouple.__file__), 'configs',
                                                                'resist_preact101_c10_s2.py'))
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
from jaxdecouple.methods import validate
validate(module.get_config())
import jax, flax, optax, orbax.checkpoint, tensorflow_datasets
print('installed:', jaxdecouple.__file__, '| jax', jax.__version__, '| flax', flax.__version__, '| optax',
      optax.__version__, '| tensorflow-datasets', tensorflow_datasets.__version__)
PY
echo "check_install: the install cell installed the project and its requirements on a fresh environment"
