"""What ``import shardkv`` and the command line import before a job needs it.

A fresh interpreter (a subprocess) reports the modules it has imported: the
package's public names are imported on first use, and ``shardkv --help``
builds every command's parser without importing numpy, a codec library,
fsspec, zarr, dask or the proxies; ``shardkv convert`` checksums its shard
indexes without ``importlib.metadata`` (the crc32c package reads its own version
with it at import: about 0.1 s), and the numpy a command loads starts no BLAS
thread (each spins for a while on load).
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import crc32c
import numpy as np
import pytest
import zarr

import shardkv

HEAVY = ("numpy", "numcodecs", "fsspec", "zarr", "dask", "tqdm", "multiprocessing", "shardkv.proxy")


def _imported_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``code`` (which may end with SystemExit)."""
    script = (
        "import json, sys\n"
        f"try:\n    exec({code!r})\nexcept SystemExit:\n    pass\n"
        "sys.stdout.flush()\n"
        "print('\\n' + json.dumps(sorted(sys.modules)))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    return set(json.loads(proc.stdout.strip().splitlines()[-1]))


def _heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


def test_import_shardkv_imports_no_dependency() -> None:
    modules = _imported_after("import shardkv")
    assert "shardkv.errors" in modules
    assert _heavy(modules) == []


def test_help_imports_no_dependency() -> None:
    code = "import sys, runpy; sys.argv = ['shardkv', '--help']; runpy.run_module('shardkv', run_name='__main__')"
    modules = _imported_after(code)
    assert "shardkv.cli.main" in modules and "argparse" in modules  # the parser was built
    assert _heavy(modules) == []


@pytest.mark.skipif((os.cpu_count() or 1) < 2 or not os.path.isdir("/proc/self/task"), reason="one core, or no /proc")
def test_a_command_loads_numpy_without_blas_threads(tmp_path: Path) -> None:
    zarr.open_array(str(tmp_path / "src"), mode="w", shape=(8, 8), chunks=(4, 4), dtype="<f4")[:] = np.ones((8, 8))
    argv = ["convert", str(tmp_path / "src"), str(tmp_path / "dst"), "--chunks-per-shard", "2"]
    code = (
        "import os, sys, threading\n"
        f"from shardkv.cli.main import main\nmain({argv!r})\n"
        "print('numpy' in sys.modules, len(os.listdir('/proc/self/task')) - threading.active_count())\n"
    )
    env = {
        k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")
    }
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True, env=env
    )
    assert proc.stdout.split()[-2:] == ["True", "0"]  # numpy loaded; no thread Python does not know of


def test_convert_and_an_index_checksum_import_no_importlib_metadata() -> None:
    code = (
        "import sys, shardkv.cli.convert\n"
        "from shardkv.format.layout import ShardIndex, ShardLayout\n"
        "print(ShardLayout.v3((2, 2)).encode_index(ShardIndex.empty((2, 2))).hex())\n"
        "print(sorted(sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    index, modules = proc.stdout.splitlines()
    raw = bytes.fromhex(index)
    assert int.from_bytes(raw[-4:], "little") == crc32c.crc32c(raw[:-4])  # a checksum was computed
    assert "'importlib.metadata'" not in modules


@pytest.mark.parametrize("name", sorted(set(shardkv.__all__) - {"__version__"}))
def test_every_public_name_is_its_module_s_object(name: str) -> None:
    value = getattr(shardkv, name)
    module = importlib.import_module(shardkv._LAZY.get(name, "shardkv.errors"))
    assert value is getattr(module, name)
    assert name in dir(shardkv)


def test_an_unknown_name_is_no_attribute() -> None:
    with pytest.raises(AttributeError, match="no attribute 'open_kv'"):
        shardkv.open_kv  # noqa: B018 - a name of a module below, not a public one
    assert set(shardkv._LAZY) <= set(shardkv.__all__)
