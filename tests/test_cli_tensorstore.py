"""The command line on what tensorstore writes: a store with no root group, arrays below it.

tensorstore (run in the zarr3 environment, as tests/test_v3_reverse.py runs its writer) writes a
sharded Zarr v3 array and nothing above it; its shards' indexes, read with an independent parser,
are the oracle for the chunks counted.
"""

from __future__ import annotations

import json
import struct
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest
import zarr
from test_v3_reverse import _zarr3_python

from shardkv import ShardedStore
from shardkv.cli.main import main

WRITE = textwrap.dedent(
    """
    import sys, numpy as np, tensorstore as ts
    root, encoding = sys.argv[1], sys.argv[2]
    sharding = {"name": "sharding_indexed", "configuration": {
        "chunk_shape": [4, 4], "index_location": "end",
        "codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                   {"name": "gzip", "configuration": {"level": 1}}],
        "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]}}
    separator = "." if encoding == "v2" else "/"
    metadata = {"shape": [16, 22], "data_type": "int32", "fill_value": 0, "codecs": [sharding],
                "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [8, 8]}},
                "chunk_key_encoding": {"name": encoding, "configuration": {"separator": separator}}}
    arr = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": root + "/temp/"}, "create": True,
                   "metadata": metadata}).result()
    data = np.arange(16 * 22, dtype="<i4").reshape(16, 22) + 1
    data[:4, :8] = 0  # two inner chunks of fill: tensorstore stores neither
    arr[...] = data
    np.save(root + ".npy", data)
    """
)


def _write(root: Path, encoding: str) -> Path:
    """``root``, a directory tensorstore wrote one sharded array into (``temp/``), with no group at its root."""
    proc = subprocess.run(
        [_zarr3_python(), "-c", WRITE, str(root), encoding], capture_output=True, text=True, timeout=300
    )
    if proc.returncode != 0:
        pytest.fail(f"tensorstore failed:\n{proc.stderr[-3000:]}")
    assert sorted(p.name for p in root.iterdir()) == ["temp"]  # no root group
    return root


@pytest.fixture(params=["v2", "default"])
def written(request, tmp_path) -> Path:
    """What tensorstore wrote, with each chunk key encoding."""
    return _write(tmp_path / f"ts-{request.param}", request.param)


def _cli(capsys, *args) -> tuple[int, str]:
    capsys.readouterr()
    status = main([str(a) for a in args])
    out = capsys.readouterr()
    return status, out.out + out.err


def _stored_chunks(array_dir: Path) -> tuple[int, int]:
    """(shards, inner chunks present) by parsing each shard's index: 2 x 2 (offset, nbytes) uint64 pairs + crc32c."""
    shards = [p for p in array_dir.rglob("*") if p.is_file() and p.name != "zarr.json"]
    present = 0
    for shard in shards:
        blob = shard.read_bytes()
        index = blob[-(16 * 4 + 4) : -4]
        present += sum(struct.unpack_from("<QQ", index, 16 * i) != (2**64 - 1,) * 2 for i in range(4))
    return len(shards), present


def test_info_verify_and_compact_find_the_array_below_a_root_without_group(written, capsys):
    n_shards, n_chunks = _stored_chunks(written / "temp")
    assert (n_shards, n_chunks) == (6, 4 * 6 - 2)  # two inner chunks of fill are not stored
    status, out = _cli(capsys, "info", written, "--json")
    assert status == 0, out
    (info,) = json.loads(out)["arrays"]
    assert (info["path"], info["shards"], info["chunks_present"]) == ("temp", n_shards, n_chunks)
    # zarr 3 opening that root finds no group there (tensorstore wrote none): the table says so
    assert info["v3_readable"] is False and "no group at the root" in info["v3_problems"][0]
    status, out = _cli(capsys, "verify", written, "--decode")
    assert status == 0 and f"{n_shards} shards, 0 damaged" in out, out
    status, out = _cli(capsys, "compact", written)
    assert status == 0 and out.strip().endswith(": 0 bytes reclaimed"), out
    status, out = _cli(capsys, "info", written)  # the same as at the array's own path
    assert status == 0 and f"1 array (1 sharded, 0 unsharded), {n_chunks} chunks in 6 objects" in out, out
    expected = np.load(f"{written}.npy")
    np.testing.assert_array_equal(zarr.open_array(ShardedStore(str(written)), path="temp", mode="r")[...], expected)


def test_a_store_with_nothing_of_zarr_is_still_refused(tmp_path, capsys):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "notes.txt").write_text("no zarr here")
    for command in ("info", "verify", "compact"):
        status, out = _cli(capsys, command, tmp_path / "x")
        assert status == 1 and "is not a Zarr v2 hierarchy: no .zgroup or .zarray at its root or below" in out, out


def test_converting_an_array_sharded_already_counts_its_chunks_objects_and_metadata(tmp_path, capsys):
    written = _write(tmp_path / "ts", "v2")  # v2-style chunk keys: 0.0, 0.1, ...
    n_shards, n_chunks = _stored_chunks(written / "temp")
    files = [p for p in (written / "temp").rglob("*") if p.is_file()]
    status, out = _cli(capsys, "convert", written / "temp", tmp_path / "out", "--chunks-per-shard", "2", "--json")
    assert status == 0, out
    report = json.loads(out)
    (array,) = report["arrays"]
    # a v3 source sharded already is resharded: every chunk its shards hold is counted, none copied as it is
    assert (array["reason"], array["chunks"], array["shards_copied"]) == (None, n_chunks, 0)
    assert report["objects_before"] == len(files) == 7  # six shards and the zarr.json: nothing presented counted
    assert report["bytes_before"] == sum(p.stat().st_size for p in files)
    written_files = [p for p in (tmp_path / "out").rglob("*") if p.is_file()]
    assert report["objects_after"] == len(written_files)
    assert report["bytes_after"] == sum(p.stat().st_size for p in written_files)
    meta_in = (written / "temp" / "zarr.json").stat().st_size
    meta_out = (tmp_path / "out" / "zarr.json").stat().st_size
    assert (report["metadata_bytes_before"], report["metadata_bytes_after"]) == (meta_in, meta_out)
    status, out = _cli(capsys, "convert", written / "temp", tmp_path / "out2", "--chunks-per-shard", "2")
    assert status == 0, out
    assert out.startswith(f"converted 1 array from {written / 'temp'}")
    assert f"chunks: {n_chunks} ({n_chunks} packed into {array['shards']} shards, 0 copied unsharded" in out
    assert f"of which metadata documents {meta_in} -> {meta_out} (written as JSON indented by 4 spaces)" in out
