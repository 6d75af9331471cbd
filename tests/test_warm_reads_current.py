"""Warm local chunk reads stay current: every read checks the shard file's generation.

A warm single-chunk read of a local store is one ranged read of exactly the
chunk's bytes conditioned on the cached index's generation (``(st_ino,
st_mtime_ns, st_size)`` from the ``fstat`` of the descriptor that reads). These
tests change the shard file between two warm reads in every way a writer can
(replaced by rename from another store or process, rewritten in place with
another size or the same size, deleted) and check the second read returns what
is stored now; and that warm reads keep no file descriptors open, in this
process or a forked child.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from test_perf_fast_read import CHUNK, CPS, N, write  # 16 chunks of 16 bytes in shards a/0, a/1

from shardkv import ShardedStore, ShardIndex
from shardkv.engine.cache import IndexCache
from shardkv.errors import InvalidKeyError
from shardkv.format.ranges import ByteRange
from shardkv.storage.kv import ANY
from shardkv.storage.local import LocalStore

pytestmark = pytest.mark.zarr2


def chunk(data: np.ndarray, i: int) -> bytes:
    return data[i * CHUNK : (i + 1) * CHUNK].tobytes()


def warm(path: Path, data: np.ndarray) -> ShardedStore:
    """A store whose index of shard ``a/0`` is cached and whose warm reads take the one-request path."""
    store = ShardedStore(str(path))
    assert bytes(store["a/1"]) == chunk(data, 1)  # cold: index then chunk
    before = store.engine.stats.read_attempts
    assert bytes(store["a/3"]) == chunk(data, 3)
    assert store.engine.stats.read_attempts == before + 1  # warm: one conditional request
    return store


def copy_in_place(src: Path, dst: Path) -> None:
    """Overwrite the file ``dst`` with the bytes of ``src`` in place (same inode, as an in-place writer does)."""
    ino = os.stat(dst).st_ino
    with open(src, "rb") as f_src, open(dst, "r+b") as f_dst:
        f_dst.truncate(0)
        f_dst.write(f_src.read())
    assert os.stat(dst).st_ino == ino


@pytest.fixture
def data() -> np.ndarray:
    return np.arange(N, dtype="i4") + 1


def test_shard_replaced_by_another_store_between_two_warm_reads(tmp_path: Path, data: np.ndarray) -> None:
    write(tmp_path, data)
    store = warm(tmp_path, data)
    write(tmp_path, data * 3)  # another store renames new shards over the old ones
    assert bytes(store["a/3"]) == chunk(data * 3, 3)
    assert bytes(store["a/5"]) == chunk(data * 3, 5)
    assert store.engine.stats.read_stale == 1


def test_shard_replaced_by_another_process_between_two_warm_reads(tmp_path: Path, data: np.ndarray) -> None:
    write(tmp_path, data)
    store = warm(tmp_path, data)
    code = (
        "import sys, numpy as np, zarr\n"
        "from shardkv import ShardedStore\n"
        "s = ShardedStore(sys.argv[1])\n"
        "z = zarr.open_array(s, mode='r+', path='a')\n"
        f"z[:] = (np.arange({N}, dtype='i4') + 1) * 7\n"
        "s.close()\n"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, timeout=120)
    assert bytes(store["a/3"]) == chunk(data * 7, 3)
    assert bytes(store["a/12"]) == chunk(data * 7, 12)


def test_shard_rewritten_in_place_with_another_size(tmp_path: Path, data: np.ndarray) -> None:
    write(tmp_path, data)
    store = warm(tmp_path, data)
    other = data * 5
    other[0:CHUNK] = 0  # chunk 0 is fill value: not stored, so shard a/0 is smaller
    write(tmp_path / "other", other)
    shard, new = tmp_path / "a" / "0", tmp_path / "other" / "a" / "0"
    assert os.path.getsize(new) < os.path.getsize(shard)
    copy_in_place(new, shard)
    assert bytes(store["a/3"]) == chunk(other, 3)
    with pytest.raises(KeyError):
        store["a/0"]


def test_shard_rewritten_in_place_with_the_same_size(tmp_path: Path, data: np.ndarray) -> None:
    write(tmp_path, data)
    store = warm(tmp_path, data)
    write(tmp_path / "other", data * 9)
    shard, new = tmp_path / "a" / "0", tmp_path / "other" / "a" / "0"
    assert os.path.getsize(new) == os.path.getsize(shard)
    before = os.stat(shard)
    copy_in_place(new, shard)
    # a writer's new mtime, made distinct from the old one whatever the file system's timestamp granularity
    os.utime(shard, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000_000))
    assert bytes(store["a/3"]) == chunk(data * 9, 3)


def test_shard_deleted_between_two_warm_reads(tmp_path: Path, data: np.ndarray) -> None:
    write(tmp_path, data)
    store = warm(tmp_path, data)
    os.remove(tmp_path / "a" / "0")
    with pytest.raises(KeyError):
        store["a/3"]
    assert "a/3" not in store
    assert bytes(store["a/9"]) == chunk(data, 9)  # the other shard is still read


def test_shard_directory_replaced_between_two_warm_reads(tmp_path: Path, data: np.ndarray) -> None:
    write(tmp_path, data)
    store = warm(tmp_path, data)
    write(tmp_path / "other", data * 11)
    shutil.rmtree(tmp_path / "a")
    shutil.copytree(tmp_path / "other" / "a", tmp_path / "a")
    assert bytes(store["a/3"]) == chunk(data * 11, 3)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc/self/fd")
def test_warm_reads_of_many_shards_keep_no_descriptor_open(tmp_path: Path) -> None:
    shape = (16 * 64,)  # 128 shards of 8 chunks
    values = np.arange(shape[0], dtype="i4")
    store = ShardedStore(str(tmp_path), chunks_per_shard=CPS)
    zarr.open_array(store, mode="w", path="b", shape=shape, chunks=(CHUNK,), dtype="i4", compressor=None)[:] = values
    store.close()
    reader = ShardedStore(str(tmp_path))
    before = _open_fds()
    for _ in range(2):  # cold, then warm
        for i in range(shape[0] // CHUNK):
            assert bytes(reader[f"b/{i}"]) == values[i * CHUNK : (i + 1) * CHUNK].tobytes()
    assert _open_fds() == before
    reader.close()
    assert _open_fds() == before


def _read_in_child(store: ShardedStore, keys: list[str], queue: Any) -> None:
    queue.put({key: bytes(store[key]) for key in keys})


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs the fork start method")
def test_forked_child_reads_the_current_shard(tmp_path: Path, data: np.ndarray) -> None:
    write(tmp_path, data)
    store = warm(tmp_path, data)
    write(tmp_path, data * 13)  # replaced after the parent cached the index
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    keys = ["a/3", "a/4", "a/10"]
    child = ctx.Process(target=_read_in_child, args=(store, keys, queue))
    child.start()
    try:
        got = queue.get(timeout=120)
    finally:
        child.join(timeout=120)
    assert child.exitcode == 0
    assert got == {key: chunk(data * 13, int(key[2:])) for key in keys}
    assert bytes(store["a/3"]) == chunk(data * 13, 3)  # and the parent too


# -- the local store's one-range read (the warm chunk read) ------------------------------------------


def test_one_range_read_is_clipped_to_the_file(tmp_path: Path) -> None:
    kv = LocalStore(tmp_path)
    g = kv.put("k", bytes(range(100)))
    assert g is not None
    for byte_range, want in [
        (ByteRange(90, 120), bytes(range(90, 100))),
        (ByteRange(100, 120), b""),
        (ByteRange(150, 160), b""),
        (ByteRange(5, 5), b""),
        (ByteRange(0, 3), b"\x00\x01\x02"),
    ]:
        for cond in (ANY, g):
            result = kv.get("k", [byte_range], if_generation=cond)
            assert result.found and result.values == [want] and result.generation == g and result.size == 100


def test_one_range_read_finishes_a_short_pread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kv = LocalStore(tmp_path)
    kv.put("k", bytes(range(100)))
    real = os.pread
    calls: list[tuple[int, int]] = []

    def short_first(fd: int, n: int, offset: int) -> bytes:
        calls.append((n, offset))
        return real(fd, min(n, 7) if len(calls) == 1 else n, offset)

    monkeypatch.setattr(os, "pread", short_first)
    result = kv.get("k", [ByteRange(10, 40)])
    monkeypatch.undo()
    assert result.values == [bytes(range(10, 40))] and len(calls) >= 2


def test_bad_keys_are_refused_on_every_read(tmp_path: Path) -> None:
    kv = LocalStore(tmp_path)
    kv.put("k", b"v")
    for _ in range(2):  # checked paths are remembered for good keys only
        with pytest.raises(TypeError, match="store keys are str"):
            kv.get_many([(b"k", None, ANY)])  # type: ignore[list-item]
        with pytest.raises(InvalidKeyError, match="leave its directory"):
            kv.get_many([("../k", None, ANY)])
    assert kv.get("k").values == [b"v"]


# -- the index cache's one look-up of a warm chunk read ----------------------------------------------


def test_chunk_location_counts_a_hit_only_when_it_answers() -> None:
    index = ShardIndex.empty((4, 4))
    index.set((1, 2), 100, 16)
    index.set((3, 3), 0, 0)  # an empty chunk that is stored (nbytes 0) is a location, not an absence
    cache = IndexCache(1 << 20)
    cache.put("s", index, "g", 500)
    cache.put("t", index, "h", None)  # size unknown: not for the one-request read
    cache.put("u", index, "k", 500)  # most recently used
    got = cache.chunk_location("s", (1, 2))
    assert got is not None and got[1:] == (100, 16) and got[0].generation == "g"
    assert all(type(v) is int for v in got[1:])
    stored_empty = cache.chunk_location("s", (3, 3))
    assert stored_empty is not None and stored_empty[1:] == (0, 0)
    assert cache.hits == 2 and cache.misses == 0
    assert cache.chunk_location("s", (0, 0)) is None  # absent
    assert cache.chunk_location("t", (1, 2)) is None  # size unknown
    assert cache.chunk_location("x", (1, 2)) is None  # not cached
    assert cache.hits == 2 and cache.misses == 0  # a look-up that does not answer counts nothing
    cache.max_bytes = 2 * index.entries.nbytes
    cache.put("v", index, "m", 500)  # evicts the least recently used: t (s was used last by chunk_location)
    assert cache.peek("t") is None and cache.peek("s") is not None
