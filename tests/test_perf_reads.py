"""Read path request plans, measured: requests AND bytes reaching the base store.

The array: float64, shape (192,), inner chunks (8,) (64 bytes each, no
compressor, so every encoded chunk is 64 bytes), chunks_per_shard 8 -> three
shards of 8 chunks written whole (chunk ``i`` of a shard at byte ``64 * i``
when the index is at the end). Reads go through ``ShardedStore.getitems`` /
``__getitem__`` (and zarr-python 2.18 where stated) over an fsspec filesystem
that records every ``cat_file`` with its range and the bytes returned.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from counting_fs import CountingMemoryFS, is_meta, local_mapper, memory_mapper

from shardkv import ShardedStore
from shardkv.format.ranges import ReadPolicy

N, CHUNK, CPS = 192, 8, 8
CHUNK_NBYTES = CHUNK * 8
SHARD_DATA_NBYTES = CPS * CHUNK_NBYTES
DATA = np.arange(N, dtype="f8") * 1.5


def chunk_bytes(i: int) -> bytes:
    return DATA[i * CHUNK : (i + 1) * CHUNK].tobytes()


def write_array(mapper: Any, index_location: str = "end", **options: Any) -> None:
    store = ShardedStore(mapper, chunks_per_shard=CPS, index_location=index_location, **options)
    z = zarr.open_array(store, mode="w", path="a", shape=(N,), chunks=(CHUNK,), dtype="f8", compressor=None)
    z[:] = DATA


def index_nbytes(store: ShardedStore) -> int:
    return store.sharded_array("a").layout.index_nbytes  # type: ignore[union-attr]


@pytest.fixture(params=["memory", "local"])
def base(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Any, Any]]:
    """``(mapper, counting filesystem)`` of either kind."""
    if request.param == "memory":
        mapper, fs = memory_mapper()
        yield mapper, fs
        fs.rm(fs.count_root, recursive=True)
    else:
        yield local_mapper(str(tmp_path / "store"))


@pytest.fixture
def memory() -> Iterator[tuple[Any, CountingMemoryFS]]:
    mapper, fs = memory_mapper()
    yield mapper, fs
    fs.rm(fs.count_root, recursive=True)


def reader(mapper: Any, **kwargs: Any) -> ShardedStore:
    """A fresh proxy with the array's metadata already loaded (so only data requests follow)."""
    store = ShardedStore(mapper, **kwargs)
    assert store.sharded_array("") is None  # the root is a group: looked up once per proxy
    assert store.sharded_array("a") is not None
    mapper.fs.reset()
    return store


# -- index cache: 2 requests cold, 1 warm ---------------------------------------------


@pytest.mark.parametrize("index_location", ["end", "start"])
def test_cold_read_is_index_plus_chunk_and_warm_read_is_chunk_only(base: tuple[Any, Any], index_location: str) -> None:
    mapper, fs = base
    write_array(mapper, index_location)
    store = reader(mapper)
    n_index = index_nbytes(store)

    assert store["a/3"] == chunk_bytes(3)
    reads = fs.reads()
    assert len(reads) == 2
    index_read, chunk_read = reads
    assert index_read.key == chunk_read.key == "a/0"
    assert index_read.nbytes == n_index
    expected_index_start = -n_index if index_location == "end" else 0
    assert index_read.start == expected_index_start
    assert chunk_read.nbytes == CHUNK_NBYTES
    assert store.index_cache.misses == 1 and store.index_cache.hits == 0

    fs.reset()
    assert store["a/5"] == chunk_bytes(5)  # same shard: index cached
    reads = fs.reads()
    assert [(r.key, r.nbytes) for r in reads] == [("a/0", CHUNK_NBYTES)]
    assert store.index_cache.hits == 1

    fs.reset()
    assert store["a/9"] == chunk_bytes(9)  # another shard: cold again
    assert [r.nbytes for r in fs.reads()] == [n_index, CHUNK_NBYTES]


def test_zarr_reads_one_chunk_with_two_then_one_request(base: tuple[Any, Any]) -> None:
    mapper, fs = base
    write_array(mapper)
    z = zarr.open_array(reader(mapper), mode="r", path="a")
    fs.reset()
    np.testing.assert_array_equal(z[24:32], DATA[24:32])
    assert len(fs.reads()) == 2
    fs.reset()
    np.testing.assert_array_equal(z[32:40], DATA[32:40])
    assert [r.nbytes for r in fs.reads()] == [CHUNK_NBYTES]


def test_whole_array_read_costs_one_index_and_one_shard_request_per_shard(memory: tuple[Any, CountingMemoryFS]) -> None:
    mapper, fs = memory
    write_array(mapper)
    store = reader(mapper)
    z = zarr.open_array(store, mode="r", path="a")
    fs.reset()
    np.testing.assert_array_equal(z[:], DATA)
    reads = fs.reads()
    n_index = index_nbytes(store)
    shard_nbytes = SHARD_DATA_NBYTES + n_index
    assert len(reads) == 6  # 3 indexes, then 3 whole shards
    assert sorted(r.nbytes for r in reads) == [n_index] * 3 + [shard_nbytes] * 3
    assert fs.batches == ["cat_ranges", "cat_ranges"]


# -- coalescing and whole-shard reads ----------------------------------------------------

NEVER_WHOLE = 1.01  # whole_shard_fraction above 1: never read a whole shard


@pytest.mark.parametrize(
    "chunks, policy, expected",
    [
        pytest.param([1, 2, 3], ReadPolicy(0, 1 << 20, NEVER_WHOLE), [(64, 256)], id="adjacent-one-request"),
        pytest.param([3, 1, 2], ReadPolicy(0, 1 << 20, NEVER_WHOLE), [(64, 256)], id="unsorted-one-request"),
        pytest.param([1, 4], ReadPolicy(128, 1 << 20, NEVER_WHOLE), [(64, 320)], id="gap-within-max_gap"),
        pytest.param([1, 4], ReadPolicy(127, 1 << 20, NEVER_WHOLE), [(64, 128), (256, 320)], id="gap-over-max_gap"),
        pytest.param([1, 2, 3], ReadPolicy(0, 128, NEVER_WHOLE), [(64, 192), (192, 256)], id="max_request-splits"),
        pytest.param([0, 1, 2, 3, 4, 5, 6, 7], ReadPolicy(0, 1 << 20, NEVER_WHOLE), [(0, 512)], id="all-no-whole"),
    ],
)
def test_coalesced_requests(
    base: tuple[Any, Any], chunks: list[int], policy: ReadPolicy, expected: list[tuple[int, int]]
) -> None:
    mapper, fs = base
    write_array(mapper)
    store = reader(mapper, read_policy=policy)
    store["a/0"]  # warm the index of shard 0
    fs.reset()
    keys = [f"a/{i}" for i in chunks]
    got = store.getitems(keys)
    assert got == {k: chunk_bytes(i) for k, i in zip(keys, chunks, strict=True)}
    reads = fs.reads()
    assert sorted((r.start, r.end) for r in reads) == expected
    assert sorted(r.nbytes for r in reads) == sorted(e - s for s, e in expected)


def test_whole_shard_read_when_most_of_it_is_wanted(base: tuple[Any, Any]) -> None:
    mapper, fs = base
    write_array(mapper)
    store = reader(mapper, read_policy=ReadPolicy(whole_shard_fraction=0.5))
    store["a/0"]
    shard_nbytes = SHARD_DATA_NBYTES + index_nbytes(store)

    fs.reset()
    wanted = [1, 3, 5, 7]  # 256 of 512 bytes: half
    got = store.getitems([f"a/{i}" for i in wanted])
    assert got == {f"a/{i}": chunk_bytes(i) for i in wanted}
    reads = fs.reads()
    assert len(reads) == 1
    assert reads[0].start in (0, None) and reads[0].end is None
    assert reads[0].nbytes == shard_nbytes  # the whole object, index included

    fs.reset()
    wanted = [1, 3, 5]  # 192 of 512 bytes: below half, three separate ranges (gaps of 64 bytes merge)
    store.getitems([f"a/{i}" for i in wanted])
    reads = fs.reads()
    assert len(reads) == 1 and reads[0].end is not None
    assert reads[0].nbytes == 5 * CHUNK_NBYTES  # chunks 1..5, not the whole shard


def test_different_shards_go_out_in_one_batch(memory: tuple[Any, CountingMemoryFS]) -> None:
    mapper, fs = memory
    write_array(mapper)
    store = reader(mapper)
    calls: list[int] = []
    get_many = store.engine.kv.get_many

    def counting_get_many(requests: Any) -> Any:
        calls.append(len(requests))
        return get_many(requests)

    store.engine.kv.get_many = counting_get_many  # type: ignore[method-assign]
    keys = ["a/1", "a/9", "a/17"]  # one chunk in each of the three shards
    assert store.getitems(keys) == {k: chunk_bytes(int(k[2:])) for k in keys}
    assert calls == [3, 3]  # one batch of 3 index reads, one batch of 3 chunk reads
    assert fs.batches == ["cat_ranges", "cat_ranges"]
    assert len(fs.reads()) == 6

    calls.clear()
    fs.reset()
    keys = ["a/2", "a/10", "a/18"]
    assert store.getitems(keys) == {k: chunk_bytes(int(k[2:])) for k in keys}
    assert calls == [3]  # indexes cached: the chunk batch only
    assert fs.batches == ["cat_ranges"]
    assert [r.nbytes for r in fs.reads()] == [CHUNK_NBYTES] * 3


def test_local_batch_is_one_get_many_call(tmp_path: Path) -> None:
    mapper, fs = local_mapper(str(tmp_path / "store"))
    write_array(mapper)
    store = reader(mapper)
    calls: list[int] = []
    get_many = store.engine.kv.get_many

    def counting_get_many(requests: Any) -> Any:
        calls.append(len(requests))
        return get_many(requests)

    store.engine.kv.get_many = counting_get_many  # type: ignore[method-assign]
    keys = ["a/1", "a/9", "a/17"]
    assert store.getitems(keys) == {k: chunk_bytes(int(k[2:])) for k in keys}
    assert calls == [3, 3]
    assert sorted(r.nbytes for r in fs.reads()) == [CHUNK_NBYTES] * 3 + [index_nbytes(store)] * 3


# -- base store without ranged reads --------------------------------------------------


def test_dict_base_reads_each_shard_once_per_call(counting_store: Any) -> None:
    write_array(counting_store, concurrency="process")
    store = ShardedStore(counting_store, concurrency="process")
    assert store.sharded_array("") is None and store.sharded_array("a") is not None
    counting_store.reset()

    keys = ["a/0", "a/1", "a/2", "a/9", "a/10"]  # 3 chunks of shard 0, 2 of shard 1
    assert store.getitems(keys) == {k: chunk_bytes(int(k[2:])) for k in keys}
    data_reads = [k for op, k in counting_store.log if op == "get" and not is_meta(k)]
    assert sorted(data_reads) == ["a/0", "a/1"]

    counting_store.reset()
    z = zarr.open_array(store, mode="r", path="a")
    counting_store.reset()
    np.testing.assert_array_equal(z[:], DATA)
    data_reads = [k for op, k in counting_store.log if op == "get" and not is_meta(k)]
    assert sorted(data_reads) == ["a/0", "a/1", "a/2"]
