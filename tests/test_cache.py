"""The shard index cache: LRU bounded by bytes, counters, and when cached indexes are trusted.

Unit tests drive :class:`shardkv.engine.cache.IndexCache` directly; the proxy tests
count index requests on a local directory (1-d float64 array, inner chunks of
8 elements = 64 bytes, 8 chunks per shard: each index is 8 x 2 uint64 = 128
bytes in memory, 132 bytes stored with its CRC32C).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from counting_fs import local_mapper

from shardkv import ShardedStore, ShardIndex
from shardkv.engine.cache import IndexCache

CPS = 8
INDEX_MEM_NBYTES = CPS * 2 * 8


def index_with(offset: int) -> ShardIndex:
    index = ShardIndex.empty((CPS,))
    index.set((0,), offset, 10)
    return index


# -- IndexCache -----------------------------------------------------------------------


def test_lru_eviction_by_bytes() -> None:
    cache = IndexCache(2 * INDEX_MEM_NBYTES)
    cache.put("s0", index_with(0))
    cache.put("s1", index_with(1))
    assert cache.nbytes == 2 * INDEX_MEM_NBYTES and len(cache) == 2
    assert cache.get("s0") == index_with(0)  # s0 is now the most recently used
    cache.put("s2", index_with(2))  # evicts s1, the least recently used
    assert cache.get("s1") is None
    assert cache.get("s0") == index_with(0)
    assert cache.get("s2") == index_with(2)
    assert cache.nbytes == 2 * INDEX_MEM_NBYTES and len(cache) == 2
    assert (cache.hits, cache.misses) == (3, 1)


def test_replacing_an_entry_keeps_the_byte_count() -> None:
    cache = IndexCache(10 * INDEX_MEM_NBYTES)
    cache.put("s0", index_with(0))
    cache.put("s0", index_with(5))
    assert cache.nbytes == INDEX_MEM_NBYTES and len(cache) == 1
    assert cache.get("s0") == index_with(5)


def test_entry_larger_than_limit_is_not_cached() -> None:
    cache = IndexCache(INDEX_MEM_NBYTES - 1)
    cache.put("s0", index_with(0))
    assert len(cache) == 0 and cache.nbytes == 0
    assert cache.get("s0") is None
    assert (cache.hits, cache.misses) == (0, 1)


def test_zero_disables() -> None:
    cache = IndexCache(0)
    for i in range(3):
        cache.put(f"s{i}", index_with(i))
    assert len(cache) == 0 and cache.nbytes == 0


def test_negative_limit_is_rejected() -> None:
    with pytest.raises(ValueError, match="-1"):
        IndexCache(-1)


def test_an_entry_keeps_the_generation_and_size_of_its_shard() -> None:
    cache = IndexCache(10 * INDEX_MEM_NBYTES)
    cache.put("s0", index_with(0), (100, 1), size=7)
    entry = cache.entry("s0")
    assert entry is not None and entry.index == index_with(0) and (entry.generation, entry.size) == ((100, 1), 7)
    assert cache.entry("s1") is None
    assert cache.get("s0") == index_with(0)
    assert (cache.hits, cache.misses) == (2, 1)


def test_discard_and_clear() -> None:
    cache = IndexCache(10 * INDEX_MEM_NBYTES)
    for i in range(3):
        cache.put(f"s{i}", index_with(i))
    cache.discard("s1")
    cache.discard("absent")
    assert len(cache) == 2 and cache.nbytes == 2 * INDEX_MEM_NBYTES
    cache.clear()
    assert len(cache) == 0 and cache.nbytes == 0


# -- the cache in the proxy ---------------------------------------------------------------

N, CHUNK = 4 * CPS * 8, 8  # four shards
DATA = np.arange(N, dtype="f8")


def chunk_bytes(i: int, data: np.ndarray = DATA) -> bytes:
    return data[i * CHUNK : (i + 1) * CHUNK].tobytes()


def make_array(root: str, **kwargs: Any) -> None:
    store = ShardedStore(root, chunks_per_shard=CPS, **kwargs)
    zarr.open_array(store, mode="w", path="a", shape=(N,), chunks=(CHUNK,), dtype="f8", compressor=None)[:] = DATA


def index_reads(fs: Any, n_index: int) -> int:
    return sum(1 for r in fs.reads() if r.nbytes == n_index)


def test_proxy_cache_limit_evicts_least_recently_used(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    make_array(root)
    mapper, fs = local_mapper(root)
    store = ShardedStore(mapper, index_cache_bytes=2 * INDEX_MEM_NBYTES)
    n_index = store.sharded_array("a").layout.index_nbytes  # type: ignore[union-attr]
    for shard in range(3):
        assert store[f"a/{shard * CPS}"] == chunk_bytes(shard * CPS)
    assert store.index_cache.nbytes <= 2 * INDEX_MEM_NBYTES and len(store.index_cache) == 2
    fs.reset()
    assert store[f"a/{2 * CPS + 1}"] == chunk_bytes(2 * CPS + 1)  # shard 2: most recent, cached
    assert index_reads(fs, n_index) == 0 and len(fs.reads()) == 1
    fs.reset()
    assert store["a/1"] == chunk_bytes(1)  # shard 0: evicted
    assert index_reads(fs, n_index) == 1 and len(fs.reads()) == 2
    assert store.index_cache.hits == 1 and store.index_cache.misses == 4


@pytest.mark.parametrize("limit", [0, INDEX_MEM_NBYTES - 1], ids=["disabled", "smaller-than-one-index"])
def test_proxy_without_usable_cache_reads_the_index_every_time(tmp_path: Path, limit: int) -> None:
    root = str(tmp_path / "s")
    make_array(root)
    mapper, fs = local_mapper(root)
    store = ShardedStore(mapper, index_cache_bytes=limit)
    store["a/0"]
    for i in (1, 2, 3):
        fs.reset()
        assert store[f"a/{i}"] == chunk_bytes(i)
        assert len(fs.reads()) == 2
    assert len(store.index_cache) == 0 and store.index_cache.hits == 0


@pytest.mark.parametrize("index_location", ["end", "start"])
def test_own_writes_never_leave_a_stale_index(tmp_path: Path, index_location: str) -> None:
    """Chunks of changing sizes written and deleted through one proxy, read back through it."""
    root = str(tmp_path / "s")
    store = ShardedStore(root, chunks_per_shard=CPS, index_location=index_location)
    zarr.open_array(store, mode="w", path="a", shape=(N,), chunks=(CHUNK,), dtype="u1", compressor=None)
    model: dict[str, bytes] = {}
    rng = random.Random(7)
    for step in range(120):
        i = rng.randrange(2 * CPS)  # two shards, so most writes hit a cached index
        key = f"a/{i}"
        if rng.random() < 0.2:
            if key in model:
                del store[key]
                del model[key]
        else:
            value = bytes([step % 256]) * rng.randrange(1, 40)  # sizes change: offsets move
            store[key] = value
            model[key] = value
        j = rng.randrange(2 * CPS)
        assert store.get(f"a/{j}") == model.get(f"a/{j}"), f"step {step}"
    assert store.index_cache.hits > 0
    assert {k: store[k] for k in model} == model
    fresh = ShardedStore(root)
    assert {k: fresh[k] for k in fresh.keys_under("a") if not k.endswith(".zarray")} == model


def rewrite_shard_zero(root: str, new: np.ndarray) -> None:
    """Another writer: a second proxy rewrites shard 0 so that its chunk offsets move."""
    other = ShardedStore(root)
    del other["a/0"]  # chunk 1 now starts at offset 0
    other.setitems({f"a/{i}": chunk_bytes(i, new) for i in range(1, CPS)})


def test_other_writer_seen_after_refresh(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    make_array(root)
    store = ShardedStore(root)
    assert store["a/1"] == chunk_bytes(1)  # shard 0's index cached
    new = DATA + 1000
    rewrite_shard_zero(root, new)
    store.refresh()
    assert "a/0" not in store
    assert store.getitems([f"a/{i}" for i in range(1, CPS)]) == {f"a/{i}": chunk_bytes(i, new) for i in range(1, CPS)}


def test_other_writer_seen_at_once(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    make_array(root)
    store = ShardedStore(root)
    assert store["a/1"] == chunk_bytes(1)
    assert store["a/2"] == chunk_bytes(2)
    assert store.index_cache.hits == 1  # the entry is used while the shard is unchanged
    new = DATA + 1000
    rewrite_shard_zero(root, new)
    assert "a/0" not in store
    assert store.getitems([f"a/{i}" for i in range(1, CPS)]) == {f"a/{i}": chunk_bytes(i, new) for i in range(1, CPS)}


def test_other_writer_same_size_seen(tmp_path: Path) -> None:
    """A rewrite that keeps the shard's size but moves its chunks is still detected."""
    root = str(tmp_path / "s")
    store = ShardedStore(root, chunks_per_shard=CPS)
    zarr.open_array(store, mode="w", path="a", shape=(N,), chunks=(CHUNK,), dtype="u1", compressor=None)
    store.setitems({"a/0": b"x" * 8, "a/1": b"y" * 8})
    assert store["a/1"] == b"y" * 8
    other = ShardedStore(root)
    other.setitems({"a/0": b"z" * 12, "a/1": b"w" * 4})  # same total size, chunk 1 moved
    assert store["a/1"] == b"w" * 4
    assert store["a/0"] == b"z" * 12


def test_memory_entry_kept_until_used_or_refreshed() -> None:
    """Over memory:// an entry stays cached until a read finds it stale, or refresh() drops it."""
    import uuid

    import fsspec

    url = f"memory://shardkv-cache-{uuid.uuid4().hex}"
    try:
        make_array(url)
        store = ShardedStore(url)
        assert store["a/1"] == chunk_bytes(1)
        assert len(store.index_cache) == 1
        new = DATA + 1000
        rewrite_shard_zero(url, new)
        assert len(store.index_cache) == 1
        store.refresh()
        assert len(store.index_cache) == 0
        assert store["a/1"] == chunk_bytes(1, new)
    finally:
        fsspec.filesystem("memory").rm(url.replace("memory://", "/"), recursive=True)
