"""``shardkv convert`` of a local Zarr v3 array imports what moving chunk bytes needs, nothing more.

A fresh interpreter runs the command on an array zarr-python 3 wrote and reports the
modules it imported: no numpy (chunks move as bytes, and shard indexes are built, encoded
and checksummed without it: about 0.1 s of start-up and exit), no codec library (nothing
is decoded), no fsspec (a local path), no ``importlib.metadata`` (about 0.1 s of start-up
that reads versions: the index checksums are google-crc32c's, which reads none), no
progress bar (none shown), no process pool (one worker), no zarr, none of the proxies'
stack (the chunks are objects of their own: no shard engine); the output is then read by
zarr-python 3 in this process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import zarr
from zarr.codecs import ZstdCodec

NOT_NEEDED = (
    *("numpy", "numcodecs", "fsspec", "tqdm", "multiprocessing", "zarr", "dask", "importlib.metadata"),
    *("shardkv.proxy.store", "shardkv.proxy.draft", "shardkv.transformers", "shardkv.engine"),  # the proxies' stack
)


def test_convert_of_a_local_v3_array_imports_no_numpy_or_codec_library(tmp_path: Path) -> None:
    src, dst = tmp_path / "src.zarr", tmp_path / "dst.zarr"
    data = np.arange(16 * 16 * 8, dtype="f4").reshape(16, 16, 8)
    array = zarr.create_array(src, shape=data.shape, chunks=(4, 4, 4), dtype="f4", compressors=ZstdCodec(level=3))
    array[:] = data
    script = (
        "import json, sys\n"
        "from shardkv.cli.main import main\n"
        f"status = main(['convert', {str(src)!r}, {str(dst)!r}, '--chunks-per-shard', '2'])\n"
        "print(json.dumps([status, sorted(sys.modules)]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    status, modules = json.loads(proc.stdout.strip().splitlines()[-1])
    assert status == 0
    assert "shardkv.cli.convert.v3_job" in modules  # the v3 job ran
    assert sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in NOT_NEEDED)) == []
    assert np.array_equal(zarr.open_array(dst, mode="r")[:], data)
