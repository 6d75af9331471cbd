#!/usr/bin/env bash
# The whole test suite, on a fresh machine: builds the three test environments
# (zarr-python 2.18 and zarr-python 3 cannot share one: .venv-zarr2 on python3 with
# zarr 2.18 and xarray <= 2026.2.0; .venv-zarr3 on Python 3.12 with the newest
# zarr 3, tensorstore, xarray and dask, and shardkv installed (shardkv.zarr3); the
# third, .venv-latest, holds the newest zarr 3, tensorstore and xarray on Python 3.12
# WITHOUT shardkv, as readers that tests/latest drives in subprocesses) and runs
# pytest in the first two. The test environments are editable installs of this tree;
# what users get is checked last: tests/installed.sh builds the wheel, installs it (not
# editable) in a fresh environment of each zarr and runs the README's commands there.
# Exit status is non-zero when any test fails.
#   LATEST_PYTHON=/path/to/python3.12 overrides where Python 3.12 is looked for.
#   bash tests/run.sh            # everything
#   bash tests/run.sh -k layout  # extra arguments go to both pytest runs
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
py="${PYTHON:-python3}"

make_env() {  # make_env DIR EXTRA PYTHON
  local dir="$1" extra="$2" python="$3"
  if [ ! -x "$dir/bin/python" ]; then
    "$python" -m venv "$dir"
  fi
  "$dir/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip >/dev/null
  "$dir/bin/python" -m pip install --quiet --disable-pip-version-check -e ".[$extra]"
}

# the readers without shardkv (tests/latest): Python 3.12 and the newest releases
latest_py="${LATEST_PYTHON:-$HOME/.pyenv/versions/3.12.1/bin/python}"
if [ ! -x "$latest_py" ]; then
  latest_py="$(command -v python3.12 || true)"
fi
if [ -z "$latest_py" ] || ! "$latest_py" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'; then
  echo "tests/run.sh: Python 3.12 is required for .venv-latest (set LATEST_PYTHON)" >&2
  exit 2
fi
if [ ! -x .venv-latest/bin/python ]; then
  "$latest_py" -m venv .venv-latest
fi
.venv-latest/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip >/dev/null
.venv-latest/bin/python -m pip install --quiet --disable-pip-version-check --upgrade -r tests/latest/requirements.txt

# zarr3 first: tests/test_v3_reverse.py (zarr2 run) writes its v3 arrays with .venv-zarr3's python.
# zarr >= 3.2 needs Python >= 3.12: an older .venv-zarr3 is rebuilt
if [ -x .venv-zarr3/bin/python ] && ! .venv-zarr3/bin/python -c 'import sys; sys.exit(sys.version_info < (3, 12))'; then
  rm -rf .venv-zarr3
fi
make_env .venv-zarr3 test-zarr3 "$latest_py"
make_env .venv-zarr2 test-zarr2 "$py"

status=0
echo "== environment 1: zarr-python 2.18 (core, proxy, CLI, draft transformer; tests/latest drives .venv-latest)"
.venv-zarr2/bin/python -m pytest tests --ignore=tests/v3 -n 2 -q "$@" || status=$?
echo "== environment 2: newest zarr-python 3 + tensorstore + xarray (v1.0 codec interop, shardkv.zarr3)"
.venv-zarr3/bin/python -m pytest tests/v3 -n 2 -q "$@" || status=$?
echo "== mypy (settings in pyproject.toml): 0 errors"
.venv-zarr2/bin/python -m mypy || status=$?
echo "== ruff check and ruff format --check (rules in pyproject.toml; the pinned ruff of the test-zarr2 extra)"
.venv-zarr2/bin/python -m ruff check . || status=$?
.venv-zarr2/bin/python -m ruff format --check . || status=$?
echo "== the built wheel, installed in fresh environments of each zarr (tests/installed.sh): the README's commands"
LATEST_PYTHON="$latest_py" PYTHON="$py" bash tests/installed.sh || status=$?
exit "$status"
