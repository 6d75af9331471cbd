"""The warm single-chunk read fast path (``_read_one_cached`` of the engine's reads), counted on a local store.

A warm read of one chunk is one request for exactly the chunk's bytes,
conditioned on the cached index's generation; a shard rewritten by another
store since costs one refused request, one index read and the chunk read (the
requests of the general read path), and returns the new bytes; an absent
chunk still takes the general path's proof of absence. Counts only, no timing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

from shardkv import ShardedStore
from shardkv.format.ranges import ByteRange
from shardkv.storage.kv import ANY

N, CHUNK, CPS = 64, 4, 8  # 16 chunks of 16 bytes (int32, no compressor), 2 shards


def write(path: Path, data: np.ndarray) -> None:
    store = ShardedStore(str(path), chunks_per_shard=CPS)
    z = zarr.open_array(
        store,
        mode="a",
        path="a",
        shape=(N,),
        chunks=(CHUNK,),
        dtype="i4",
        compressor=None,
        fill_value=0,
        write_empty_chunks=False,
    )
    z[:] = data
    store.close()


def counted(path: Path) -> tuple[ShardedStore, list[list[Any]]]:
    """A fresh store whose base store records each ``get_many`` call's requests of shards (metadata left out)."""
    store = ShardedStore(str(path))
    assert store.sharded_array("a") is not None
    kv = store.engine.kv
    calls: list[list[Any]] = []
    inner = kv.get_many

    def get_many(reads: Any) -> Any:
        reads = list(reads)
        shard_reads = [r for r in reads if r[0].startswith("a/") and r[0] != "a/zarr.json"]
        if shard_reads:
            calls.append(shard_reads)
        return inner(reads)

    kv.get_many = get_many  # type: ignore[method-assign]
    return store, calls


@pytest.fixture
def data() -> np.ndarray:
    values = np.arange(N, dtype="i4") + 1
    values[8:12] = 0  # chunk 2 (shard 0) is fill value: not stored
    return values


def test_warm_read_is_one_exact_conditional_request(tmp_path: Path, data: np.ndarray) -> None:
    write(tmp_path, data)
    store, calls = counted(tmp_path)
    assert bytes(store["a/1"]) == data[4:8].tobytes()  # cold: index, then chunk
    assert len(calls) == 2
    calls.clear()
    assert bytes(store["a/3"]) == data[12:16].tobytes()
    assert len(calls) == 1 and len(calls[0]) == 1
    key, ranges, generation = calls[0][0]
    start, nbytes = store.engine.cache.peek("a/0").index.get((3,))  # type: ignore[union-attr]
    assert key == "a/0" and ranges == [ByteRange(start, start + nbytes)] and nbytes == 16
    assert generation == store.engine.cache.peek("a/0").generation and generation != ANY  # type: ignore[union-attr]
    assert store.engine.stats.read_stale == 0


def test_shard_rewritten_elsewhere_costs_one_refused_request_then_index_and_chunk(
    tmp_path: Path, data: np.ndarray
) -> None:
    write(tmp_path, data)
    store, calls = counted(tmp_path)
    assert bytes(store["a/1"]) == data[4:8].tobytes()
    write(tmp_path, data * 3)  # another store rewrites both shards
    calls.clear()
    assert bytes(store["a/3"]) == (data * 3)[12:16].tobytes()
    assert [len(c) for c in calls] == [1, 1, 1]
    refused, index, chunk = (c[0] for c in calls)
    assert refused[2] != ANY and index[2] == ANY and chunk[2] not in (ANY, refused[2])
    assert store.engine.stats.read_stale == 1


def test_absent_chunk_takes_the_proof_of_absence(tmp_path: Path, data: np.ndarray) -> None:
    write(tmp_path, data)
    store, calls = counted(tmp_path)
    assert bytes(store["a/1"]) == data[4:8].tobytes()
    calls.clear()
    with pytest.raises(KeyError):
        store["a/2"]
    assert len(calls) == 1 and calls[0][0][1] == []  # a zero-range read conditioned on the cached generation
    assert zarr.open_array(store, mode="r", path="a")[8:12].tolist() == [0, 0, 0, 0]
