"""`shardkv compact` and the draft-source refusal of layout options, through the command line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import zarr

from shardkv import ShardedStore


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shardkv", *args], capture_output=True, text=True, timeout=120)


def test_compact_reclaims_unused_bytes_and_keeps_the_data(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = ShardedStore(str(root), chunks_per_shard=4)
    z = zarr.create(shape=(40, 40), chunks=(10, 10), dtype="i4", store=store, compressor=None)
    data = np.arange(1600, dtype="i4").reshape(40, 40)
    z[:] = data
    shard = root / "0.0"
    # unused bytes between the chunks and the index, as other writers (or earlier versions) leave them
    layout = ShardedStore(str(root)).sharded_array("").layout
    blob = shard.read_bytes()
    shard.write_bytes(blob[: -layout.index_nbytes] + bytes(3000) + blob[-layout.index_nbytes :])
    before = os.path.getsize(shard)
    result = _run("compact", str(root))
    assert result.returncode == 0, result.stderr
    after = os.path.getsize(shard)
    layout = ShardedStore(str(root)).sharded_array("").layout
    assert after == layout.index_nbytes + 16 * 10 * 10 * 4  # index + 16 chunks of 400 bytes
    assert f"{before - after} bytes reclaimed" in result.stdout
    np.testing.assert_array_equal(zarr.open_array(ShardedStore(str(root)), mode="r")[:], data)
    again = _run("compact", str(root))
    assert again.returncode == 0 and "0 bytes reclaimed" in again.stdout


def test_convert_of_a_draft_hierarchy_refuses_layout_options(shared_data: Path, tmp_path: Path) -> None:
    src = shared_data / "zarr_implementations" / "examples" / "zarrita.zr3"
    result = _run("convert", str(src), str(tmp_path / "out"), "--chunks-per-shard", "2", "--index-location", "start")
    assert result.returncode == 1
    assert len(result.stderr.strip().splitlines()) == 1
    assert "draft" in result.stderr and "index" in result.stderr


def test_compact_help_says_what_it_repairs_and_why_shards_have_unused_bytes() -> None:
    result = _run("compact", "--help")
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert "writes every shard whole" not in text  # updates of a few chunks leave unused bytes too
    assert "shard_updates" in text
    assert "an append to a shard that its writer left unfinished (killed, power lost) is finished" in text
    assert "else undone (the shard cut back to its size before the append)" in text
    assert "the temporary files of writers that no longer run are removed" in text
    assert "finish or undo interrupted appends" in " ".join(_run("--help").stdout.split())
