#!/usr/bin/env bash
# What users install: builds shardkv's wheel from the tracked files (never from a build/ left in the
# tree), checks its file list, installs it NOT editable into a fresh environment of each zarr-python
# (python3 with ".[zarr2,s3]", Python 3.12 with ".[zarr3]", as the README tells users) and runs the
# README's commands (demo, convert, info, verify, compact, unshard) and each extra's example there,
# from a temporary directory, so that the source tree cannot stand in for the installed package.
# The s3 extra converts s3:// URLs against moto's S3 server on 127.0.0.1 (from .venv-zarr2, which
# tests/run.sh builds first). Exit status non-zero on the first failure.
#   bash tests/installed.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${PYTHON:-python3}"
latest_py="${LATEST_PYTHON:-$HOME/.pyenv/versions/3.12.1/bin/python}"
[ -x "$latest_py" ] || latest_py="$(command -v python3.12)"
work="$(mktemp -d)"
server=""
cleanup() {
  if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
pip_q() { "$@" --quiet --disable-pip-version-check; }

# -- the wheel, from the files git tracks (plus new, not ignored ones) --------------------------
mkdir "$work/src" "$work/dist"
git -C "$root" ls-files -z --cached --others --exclude-standard \
  | tar -C "$root" --null --ignore-failed-read -T - -cf - 2>/dev/null | tar -xf - -C "$work/src"
pip_q "$root/.venv-zarr2/bin/python" -m pip wheel --no-deps -w "$work/dist" "$work/src" >/dev/null
wheel="$(ls "$work"/dist/shardkv-*.whl)"
"$root/.venv-zarr2/bin/python" - "$wheel" "$root" <<'EOF'
import pathlib, sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
root = pathlib.Path(sys.argv[2])
want = {f"shardkv/{p.relative_to(root / 'shardkv').as_posix()}" for p in (root / "shardkv").rglob("*.py")}
want |= {f"shardkv/transformers/{p.name}" for p in (root / "transformers").glob("*.py")} | {"shardkv/py.typed"}
problems = [f"missing {n}" for n in sorted(want - names)]
problems += [f"not shardkv's: {n}" for n in sorted(names) if not n.startswith(("shardkv/", "shardkv-"))]
problems += [f"not from the package tree: {n}" for n in sorted(names - want) if not n.startswith("shardkv-")]
if problems:
    sys.exit("the wheel's file list is wrong:\n  " + "\n  ".join(problems))
print(f"{pathlib.Path(sys.argv[1]).name}: {len(want)} files, every shardkv module, shardkv/transformers, py.typed")
EOF

# -- moto's S3 server on loopback, for the s3 extra's commands -----------------------------------
port="$("$root/.venv-zarr2/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
endpoint="http://127.0.0.1:$port"
"$root/.venv-zarr2/bin/python" -m moto.server -H 127.0.0.1 -p "$port" >"$work/moto.log" 2>&1 &
server=$!
export AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_DEFAULT_REGION=us-east-1

readme_examples() {  # readme_examples PYTHON TAG: run each fenced "```python TAG" block of the README, alone
  "$1" - "$root/README.md" "$2" <<'EOF'
import re, subprocess, sys
blocks = [b for tag, b in re.findall(r"^```python([^\n]*)\n(.*?)^```", open(sys.argv[1]).read(), re.S | re.M)
          if tag.strip() == sys.argv[2]]
if not blocks:
    sys.exit(f"no README example tagged {sys.argv[2]!r}")
for block in blocks:
    subprocess.run([sys.executable, "-c", block], check=True)
print(f"README: {len(blocks)} example(s) ran")
EOF
}

check_env() {  # check_env NAME PYTHON EXTRAS EXAMPLE_TAG
  local name="$1" python="$2" extras="$3" tag="$4"
  local venv="$work/venv-$name" run="$work/run-$name"
  echo "-- $name: a fresh $("$python" -c 'import sys; print("Python %d.%d" % sys.version_info[:2])') environment, pip install \"shardkv[$extras]\" from the wheel"
  "$python" -m venv "$venv"
  pip_q "$venv/bin/python" -m pip install "$wheel[$extras]"
  mkdir "$run"
  (
    cd "$run"
    set -x
    "$venv/bin/python" -c "import shardkv, sys; sys.exit(0 if shardkv.__file__.startswith('$venv/') else 'shardkv imported from ' + shardkv.__file__)"
    "$venv/bin/python" -c "import transformers" 2>/dev/null && { echo "a top-level transformers module is installed"; exit 1; }
    "$venv/bin/python" -c "from shardkv.cli.convert import convert"
    "$venv/bin/shardkv" demo
    "$venv/bin/shardkv" demo --out demo >/dev/null
    "$venv/bin/shardkv" convert demo/input sharded.zarr --chunks-per-shard 4
    "$venv/bin/shardkv" convert demo/input sharded2.zarr --chunks-per-shard 4 --workers 2 >/dev/null
    "$venv/bin/shardkv" info sharded.zarr
    "$venv/bin/shardkv" verify sharded.zarr --decode
    "$venv/bin/shardkv" compact sharded.zarr
    "$venv/bin/shardkv" unshard sharded.zarr plain.zarr
    "$venv/bin/shardkv" info plain.zarr >/dev/null
  )
  (cd "$run" && readme_examples "$venv/bin/python" "$tag")
}

check_env zarr2 "$py" zarr2,s3 ""
# the s3 extra: the README's s3:// commands against the loopback server (bounded wait for it)
for _ in $(seq 1 100); do
  "$work/venv-zarr2/bin/python" -c "import urllib.request as u; u.urlopen('$endpoint', timeout=1)" 2>/dev/null && break
  sleep 0.2
done
opts="{\"client_kwargs\": {\"endpoint_url\": \"$endpoint\"}}"
(
  cd "$work/run-zarr2"
  set -x
  "$work/venv-zarr2/bin/python" -c "import s3fs; fs = s3fs.S3FileSystem(endpoint_url='$endpoint'); fs.mkdir('bucket'); fs.put('demo/input', 'bucket/in.zarr', recursive=True)"
  "$work/venv-zarr2/bin/shardkv" convert s3://bucket/in.zarr s3://bucket/out.zarr --chunks-per-shard 4 --index-location start \
    --storage-options "$opts"
  "$work/venv-zarr2/bin/shardkv" convert s3://bucket/in.zarr out.zarr --chunks-per-shard 4 --source-storage-options "$opts" >/dev/null
  "$work/venv-zarr2/bin/shardkv" verify s3://bucket/out.zarr --storage-options "$opts"
)
check_env zarr3 "$latest_py" zarr3 zarr3
echo "installed from the wheel: every README command and example ran"
