"""Work bounded by what is stored, memory bounded by limits, one-line CLI errors.

Rows of the issue's table proven here (each fails on the code before the fix):

* ``compact`` (and ``verify``, ``info``, ``unshard``) on a sparse grid of
  10^5 x 10^5 shards with 3 written, and of 10^15 shards: done at once, in a
  subprocess with a timeout and ``RLIMIT_AS``;
* ``verify --decode`` of a chunk that decompresses to 3 GiB (declared: 32
  bytes): reported as damage, under ``RLIMIT_AS``; reads through the inner
  codec pipeline stop the same way;
* a ``zarr.json`` whose ``chunks_per_shard`` means 10^9 chunks per shard:
  refused before any allocation, with a configurable limit;
* a directory (symlink) at a shard key: ``verify`` reports it, one line.
"""

from __future__ import annotations

import gzip
import json
import os
import resource
import subprocess
import sys
import zlib
from pathlib import Path

import numcodecs
import numpy as np
import pytest
import zarr

from shardkv import ShardedStore
from shardkv.codecs.inner import CodecPipeline
from shardkv.errors import ConfigurationError, CorruptShardError
from shardkv.format import layout
from shardkv.format.layout import ShardLayout

MEMORY_LIMIT = 2 * 2**30  # bytes of address space for a CLI run: far below what a grid walk or a bomb would take


def run_cli(*argv: str, env: dict[str, str] | None = None, timeout: float = 90) -> subprocess.CompletedProcess:
    """``python -m shardkv ARGV`` with RLIMIT_AS and a timeout (a hang or a grid walk fails the test, not the run)."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))

    return subprocess.run(
        [sys.executable, "-m", "shardkv", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=limit,
        env={**os.environ, **(env or {})},
    )


# -- sparse grids: the listing, never the grid -----------------------------------------------


@pytest.fixture(scope="module")
def sparse(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sparse")
    stores = {}
    for name, shape, written in [
        ("1e10", (10**5, 10**5), [(0, 0), (500, 7), (99999, 99999)]),
        ("1e15", (10**8, 10**7), [(0, 0), (5, 7)]),
    ]:
        path = root / f"{name}.zarr"
        z = zarr.open_array(
            ShardedStore(str(path), chunks_per_shard=1), mode="w", shape=shape, chunks=(1, 1), dtype="u1", fill_value=0
        )
        for i, at in enumerate(written):
            z[at] = i + 1
        stores[name] = path
    return stores


@pytest.mark.parametrize(
    "command,grid",
    [("compact", "1e10"), ("compact", "1e15"), ("verify", "1e15"), ("info", "1e15"), ("unshard", "1e15")],
)
def test_commands_walk_the_stored_shards_not_the_grid(
    sparse: dict[str, Path], tmp_path: Path, command: str, grid: str
) -> None:
    argv = [command, str(sparse[grid])] + ([str(tmp_path / "out.zarr")] if command == "unshard" else [])
    done = run_cli(*argv)
    assert done.returncode == 0, done.stderr
    if command == "unshard":
        out = zarr.open_array(str(tmp_path / "out.zarr"), mode="r")
        assert out[0, 0] == 1 and out[5, 7] == 2 and out.nchunks_initialized == 2


# -- decompression bounded by the declared chunk size ---------------------------------------


def zlib_bomb(nbytes: int, block: int = 64 * 2**20) -> bytes:
    """A valid zlib stream of ``nbytes`` zero bytes (a multiple of ``block``), built in well under a second.

    After a full flush a deflate stream restarts, so compressing another block
    of zeros gives the same bytes: the middle is one compressed block repeated.
    """
    zeros = bytes(block)
    c = zlib.compressobj(1)
    head = c.compress(zeros) + c.flush(zlib.Z_FULL_FLUSH)
    middle = c.compress(zeros) + c.flush(zlib.Z_FULL_FLUSH)
    assert c.compress(zeros) + c.flush(zlib.Z_FULL_FLUSH) == middle
    end = c.flush()[:-4]  # the final empty block; the Adler-32 of n zero bytes is (n mod 65521) << 16 | 1
    adler = ((nbytes % 65521) << 16) | 1
    return head + middle * (nbytes // block - 1) + end + adler.to_bytes(4, "big")


def test_the_bomb_is_what_it_says() -> None:
    bomb = zlib_bomb(4 * 2**20, block=2**20)
    assert zlib.decompress(bomb) == bytes(4 * 2**20)


def test_verify_decode_stops_a_chunk_that_expands_beyond_its_size(tmp_path: Path) -> None:
    path = tmp_path / "bomb.zarr"
    store = ShardedStore(str(path), chunks_per_shard=4)
    z = zarr.open_array(
        store,
        mode="w",
        path="a",
        shape=(64,),
        chunks=(8,),
        dtype="i4",
        compressor=numcodecs.Zlib(level=1),
        fill_value=0,
    )
    z[:] = np.arange(64)
    bomb = zlib_bomb(3 * 2**30)
    assert len(bomb) < 16 * 2**20
    store["a/1"] = bomb  # inner chunk 1 of shard 0 (declared: 8 x int32 = 32 bytes)
    done = run_cli("verify", str(path), "--decode")
    assert done.returncode == 1, done.stderr
    expected = "inner chunk (1,): decoding stopped: the chunk expands, beyond the 32 bytes its declared size allows"
    assert f"DAMAGED a/0: {expected}" in done.stdout
    assert done.stderr == ""


def test_reads_through_the_inner_codecs_stop_at_the_declared_size() -> None:
    pipeline = CodecPipeline(
        [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "gzip", "configuration": {"level": 1}}]
    )
    good = pipeline.encode(np.arange(8, dtype="<i4"))
    np.testing.assert_array_equal(pipeline.decode(good, (8,), np.dtype("<i4")), np.arange(8))
    bomb = gzip.compress(bytes(64 * 2**20), compresslevel=1)
    with pytest.raises(CorruptShardError, match=r"'a/c/0'.*expands, beyond the 96 bytes its declared size allows"):
        pipeline.decode(bomb, (8,), np.dtype("<i4"), key="a/c/0")  # 32 bytes, + 64 for codec headers


# -- metadata that implies huge allocations ------------------------------------------------


def test_a_layout_beyond_the_chunk_limit_is_refused_before_any_allocation(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigurationError, match=r"1000000000 chunks per shard .* beyond the limit of 16777216"):
        ShardLayout((10**9,))
    monkeypatch.setattr(layout, "MAX_CHUNKS_PER_SHARD", 10)
    with pytest.raises(ConfigurationError, match="beyond the limit of 10"):
        ShardLayout((4, 4))
    assert ShardLayout((2, 5)).chunks_per_shard == (2, 5)


def test_a_zarr_json_with_a_billion_chunks_per_shard_is_named_not_allocated(tmp_path: Path) -> None:
    path = tmp_path / "huge.zarr"
    g = zarr.open_group(ShardedStore(str(path), chunks_per_shard=4), mode="w")
    g.create_dataset("b", shape=(64,), chunks=(8,), dtype="i4")[:] = 1
    doc = json.loads((path / "b" / "zarr.json").read_text())
    doc["shape"], doc["chunk_grid"]["configuration"]["chunk_shape"] = [10**10], [10**9]
    doc["codecs"][0]["configuration"]["chunk_shape"] = [1]
    (path / "b" / "zarr.json").write_text(json.dumps(doc))
    for command in ("info", "verify"):
        done = run_cli(command, str(path))
        assert done.returncode == 1
        text = done.stderr + done.stdout
        assert "b/zarr.json" in text and "1000000000 chunks per shard" in text and "Traceback" not in text
    assert sorted(p.name for p in (path / "b").iterdir() if p.name.isdigit()) == ["0", "1"]  # kept, even then
    small = run_cli("info", str(tmp_path / "huge.zarr"), env={"SHARDKV_MAX_CHUNKS_PER_SHARD": "2"})
    assert "beyond the limit of 2 " in small.stderr  # the limit is configurable per process


# -- one line per failure -----------------------------------------------------------------------


def test_a_directory_at_a_shard_key_is_one_line_of_damage(tmp_path: Path) -> None:
    path = tmp_path / "s.zarr"
    z = zarr.open_array(
        ShardedStore(str(path), chunks_per_shard=4), mode="w", path="a", shape=(64,), chunks=(8,), dtype="i4"
    )
    z[:] = 5
    (path / "a" / "1").unlink()
    (tmp_path / "elsewhere").mkdir()
    (path / "a" / "1").symlink_to(tmp_path / "elsewhere")
    done = run_cli("verify", str(path))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "DAMAGED a/1: listed but cannot be read as a shard" in done.stdout
