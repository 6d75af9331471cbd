"""`shardkv demo` under zarr-python 3 runs a zarr 3 path, not "zarr-python not installed"."""

from __future__ import annotations

import subprocess
import sys

import zarr


def test_demo_reads_the_sharded_copy_with_zarr3(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "shardkv", "demo", "--out", str(tmp_path / "demo")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "not installed" not in proc.stdout
    read_back = proc.stdout.split("read back:", 1)[1]
    for name in ("temperature", "labels", "counts"):
        assert f"  {name}: " in read_back
    assert (
        read_back.count(f"read with zarr-python {zarr.__version__} at the root, without shardkv: equal to the input")
        == 3
    )
    group = zarr.open_group(str(tmp_path / "demo" / "sharded"), mode="r")
    assert all(a.shards is not None for _, a in group.arrays())  # what zarr 3 read are sharded arrays
