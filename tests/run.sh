#!/usr/bin/env bash
# The whole test suite, on a fresh machine: builds the two test environments
# (zarr-python 2.18 and zarr-python 3 + tensorstore cannot share one) and runs
# pytest in each. Exit status is non-zero when any test fails.
#   bash tests/run.sh            # everything
#   bash tests/run.sh -k layout  # extra arguments go to both pytest runs
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
py="${PYTHON:-python3}"

make_env() {  # make_env DIR EXTRA
  local dir="$1" extra="$2"
  if [ ! -x "$dir/bin/python" ]; then
    "$py" -m venv "$dir"
  fi
  "$dir/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip >/dev/null
  "$dir/bin/python" -m pip install --quiet --disable-pip-version-check -e ".[$extra]"
}

# zarr3 first: tests/test_v3_reverse.py (zarr2 run) writes its v3 arrays with .venv-zarr3's python
make_env .venv-zarr3 test-zarr3
make_env .venv-zarr2 test-zarr2

status=0
echo "== environment 1: zarr-python 2.18 (core, proxy, CLI, draft transformer)"
.venv-zarr2/bin/python -m pytest tests --ignore=tests/v3 -n 2 -q "$@" || status=$?
echo "== environment 2: zarr-python 3 + tensorstore (v1.0 codec interop)"
.venv-zarr3/bin/python -m pytest tests/v3 -n 2 -q "$@" || status=$?
exit "$status"
