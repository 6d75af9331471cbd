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


def _zarr3_reads(root, path):
    """What zarr-python 3 opening ``root`` at its root reads at ``path`` (None when it refuses)."""
    try:
        return zarr.open_group(str(root), mode="r")[path][...]
    except Exception:  # noqa: BLE001 - the reader's refusal is the answer
        return None


def test_info_counts_every_array_of_a_store_zarr3_wrote_with_native_shards(tmp_path):
    """An xarray-like dataset written by zarr 3: two arrays with shards=, coordinates and two others without."""
    from zarr.codecs.numcodecs import Zlib

    store = tmp_path / "native.zarr"
    root = zarr.open_group(str(store), mode="w", zarr_format=3)
    values = {}
    for name, dtype in (("temp", "f4"), ("precip", "f8")):
        a = root.create_array(name, shape=(8, 40, 60), chunks=(1, 20, 20), shards=(4, 40, 60), dtype=dtype)
        a[...] = values[name] = np.arange(8 * 40 * 60, dtype=dtype).reshape(8, 40, 60)
    for name, size in (("time", 8), ("y", 40), ("x", 60)):
        root.create_array(name, shape=(size,), chunks=(size,), dtype="i8")[...] = values[name] = np.arange(size)
    root.create_array("names", shape=(4,), chunks=(2,), dtype=str)[...] = values["names"] = np.array(
        ["a", "bb", "ccc", "d"]
    )
    zl = root.create_array("zl", shape=(10,), chunks=(5,), dtype="i4", compressors=Zlib(level=3))
    zl[...] = values["zl"] = np.arange(10, dtype="i4")
    proc = run("info", str(store), "--json")
    assert proc.returncode == 0, proc.stderr
    arrays = {a["path"]: a for a in json.loads(proc.stdout)["arrays"]}
    assert sorted(arrays) == sorted(values)
    for path, expected in values.items():
        np.testing.assert_array_equal(_zarr3_reads(store, path), expected)  # the oracle reads every one
        assert arrays[path]["v3_readable"] is True, arrays[path]
        files = [p for p in (store / path).rglob("*") if p.is_file() and p.name != "zarr.json"]
        assert arrays[path]["objects"] == len(files), path
        assert arrays[path]["bytes_stored"] == sum(p.stat().st_size for p in files), path
    assert arrays["time"]["shard_shape"] is None and arrays["time"]["chunks_present"] == 1
    assert arrays["names"]["chunks_present"] == 2 and arrays["zl"]["chunks_present"] == 2
    assert arrays["temp"]["chunks_present"] == 8 * 2 * 3 and arrays["temp"]["shards"] == 2
    text = run("info", str(store)).stdout.splitlines()
    assert text[-1].startswith("7 arrays (2 sharded, 5 unsharded)")


def test_the_v3_view_column_says_what_zarr3_does(tmp_path):
    """Converted from zarr 2 data: an object-string and a zlib array that zarr 3 reads are "yes", sharded or not."""
    import numcodecs

    from shardkv.cli.convert import convert

    src, dst = tmp_path / "v2.zarr", tmp_path / "sharded.zarr"
    root = zarr.open_group(str(src), mode="w", zarr_format=2)
    values = {
        "strings": np.array(["a", "bb", "ccc", "d"] * 4, dtype=object),
        "zl": np.arange(16, dtype="i4"),
        "plain/strings": np.array(["x", "yy"] * 4, dtype=object),
        "grid": np.arange(64.0).reshape(8, 8),
    }
    root.create_array("strings", shape=(16,), chunks=(2,), dtype=str)[...] = values["strings"]
    root.create_array("zl", shape=(16,), chunks=(2,), dtype="i4", compressors=numcodecs.Zlib(level=3))[...] = values[
        "zl"
    ]
    root.create_group("plain").create_array("strings", shape=(8,), chunks=(2,), dtype=str)[...] = values[
        "plain/strings"
    ]
    root.create_array("grid", shape=(8, 8), chunks=(2, 2), dtype="f8")[...] = values["grid"]
    zarr.consolidate_metadata(str(src))
    convert(str(src), str(dst), (2,))  # the 1-d arrays sharded, grid (2-d) left unsharded with a zarr.json mirror
    proc = run("info", str(dst), "--json")
    assert proc.returncode == 0, proc.stderr
    arrays = {a["path"]: a for a in json.loads(proc.stdout)["arrays"]}
    assert sorted(arrays) == sorted(values)
    for path, expected in values.items():
        read = _zarr3_reads(dst, path)
        assert read is not None, path
        np.testing.assert_array_equal(read, expected)
        assert arrays[path]["v3_readable"] is True, arrays[path]
    assert "zarr-python 3 only" in " ".join(arrays["zl"]["v3_problems"])  # tensorstore has no numcodecs.zlib
    line = next(row for row in run("info", str(dst)).stdout.splitlines() if row.startswith("zl "))
    assert line.rstrip().endswith("(zarr-python 3 only, as numcodecs.zlib)") and " yes; other v3 readers: " in line
    # the unconverted source: zarr 3 reads the whole hierarchy as Zarr v2
    v2 = {a["path"]: a for a in json.loads(run("info", str(src), "--json").stdout)["arrays"]}
    assert sorted(v2) == sorted(values) and all(a["v3_readable"] is None for a in v2.values())
    assert all(row.endswith("as Zarr v2") for row in run("info", str(src)).stdout.splitlines()[1:-1])
