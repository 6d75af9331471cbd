"""`shardkv info` on a Zarr v3 hierarchy written by zarr-python 3 (sharding_indexed codec), and
no warning text from dependencies (numcodecs >= 0.16 in this environment) on a normal run."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import zarr


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shardkv", *args], capture_output=True, text=True, timeout=300)


def test_info_reads_a_v3_sharded_hierarchy_written_by_zarr3(tmp_path):
    root = zarr.open_group(str(tmp_path / "v3.zarr"), mode="w", zarr_format=3)
    a = root.create_array("temp", shape=(40, 60), chunks=(10, 10), shards=(20, 30), dtype="f4", fill_value=0)
    a[...] = np.arange(2400, dtype="f4").reshape(40, 60)
    proc = run("info", str(tmp_path / "v3.zarr"), "--json")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    (info,) = json.loads(proc.stdout)["arrays"]
    assert info["path"] == "temp" and info["shape"] == [40, 60] and info["chunks"] == [10, 10]
    assert info["chunks_per_shard"] == [2, 3] and info["shard_shape"] == [20, 30]
    assert info["shards"] == 4 and info["chunks_present"] == 24 and info["bytes_unused"] == 0
    shard_files = [p for p in (tmp_path / "v3.zarr" / "temp").rglob("*") if p.is_file() and p.name != "zarr.json"]
    assert info["bytes_stored"] == sum(p.stat().st_size for p in shard_files)


def test_demo_prints_no_warning_text(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "shardkv", "demo"], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "" and "warn" not in proc.stdout.lower()
    assert list(tmp_path.iterdir()) == []
