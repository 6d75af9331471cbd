"""The once-per-store warning about write-through chunk-by-chunk writes."""

from __future__ import annotations

import re

import numpy as np
import pytest
import zarr

from shardkv import PartialShardWriteWarning, ShardedStore, rechunk_to_shards
from shardkv.proxy.store import DEFAULT_THRESHOLD

pytestmark = pytest.mark.filterwarnings("error::shardkv.PartialShardWriteWarning")  # any unexpected one fails

DATA = np.arange(64 * 64, dtype="<f4").reshape(64, 64)  # 8 x 8 chunks of 8 x 8, 2 x 2 shards of 4 x 4 chunks


def _array(store: ShardedStore, name: str = "a") -> zarr.Array:
    return zarr.create(shape=DATA.shape, chunks=(8, 8), dtype=DATA.dtype, store=store, path=name)


def _chunk_by_chunk(z: zarr.Array) -> None:
    for i in range(0, 64, 8):
        for j in range(0, 64, 8):
            z[i : i + 8, j : j + 8] = DATA[i : i + 8, j : j + 8]


def test_unaligned_chunk_by_chunk_writes_warn_once_per_store(tmp_path):
    store = ShardedStore(str(tmp_path / "s.zarr"), chunks_per_shard=4)
    a, b = _array(store, "a"), _array(store, "b")
    with pytest.warns(PartialShardWriteWarning) as record:
        _chunk_by_chunk(a)
        _chunk_by_chunk(a)  # a second pass over the same array adds no warning
        _chunk_by_chunk(b)  # nor does another array of the same store: the advice is the same
    assert [(w.message.path, w.message.rewrites) for w in record] == [("a", DEFAULT_THRESHOLD)]
    text = str(record[0].message)
    assert "buffer_bytes" in text and "rechunk_to_shards" in text and "'a'" in text and "once per store" in text
    assert len(text) <= 300, len(text)
    other = ShardedStore(str(tmp_path / "s.zarr"))  # another store object over the same directory warns again
    with pytest.warns(PartialShardWriteWarning):
        _chunk_by_chunk(zarr.open_array(other, path="b"))
    np.testing.assert_array_equal(a[...], DATA)  # the advice changes nothing stored


def test_an_xarray_dataset_written_chunk_by_chunk_warns_once(tmp_path):
    xr = pytest.importorskip("xarray")
    dask = pytest.importorskip("dask")

    ds = xr.Dataset({name: (("y", "x"), DATA + k) for k, name in enumerate(["temp", "precip", "wind"])})
    ds = ds.chunk({"y": 8, "x": 8})  # one zarr chunk per dask block: every task rewrites its shard
    store = ShardedStore(str(tmp_path / "ds.zarr"), chunks_per_shard=4)
    with dask.config.set(scheduler="synchronous"), pytest.warns(PartialShardWriteWarning) as record:
        ds.to_zarr(store, consolidated=False)
    assert len(record) == 1, [str(w.message) for w in record]
    text = str(record[0].message)
    assert len(text) <= 300
    xr.testing.assert_identical(xr.open_zarr(store, consolidated=False).load(), ds.load())
    # the advice for a Dataset, applied as written: every task writes whole shards, and nothing warns
    advice = re.search(r"xarray: (ds\.chunk\(.*?\)\)\))\.", text)
    assert advice is not None, text
    aligned = eval(advice.group(1), {"ds": ds})  # noqa: S307 - the expression the warning gives
    assert dict(aligned.chunks) == {"y": (32, 32), "x": (32, 32)}  # 4 x 4 chunks of 8 x 8: one shard per block
    fixed = ShardedStore(str(tmp_path / "fixed.zarr"), chunks_per_shard=4)
    with dask.config.set(scheduler="synchronous"):
        aligned.to_zarr(fixed, consolidated=False)  # any PartialShardWriteWarning is an error here
    xr.testing.assert_identical(xr.open_zarr(fixed, consolidated=False).load(), ds.load())


def test_whole_shard_and_buffered_writes_do_not_warn(tmp_path):
    aligned = ShardedStore(str(tmp_path / "aligned.zarr"), chunks_per_shard=4)
    z = _array(aligned)
    for i in range(0, 64, 32):
        for j in range(0, 64, 32):
            z[i : i + 32, j : j + 32] = DATA[i : i + 32, j : j + 32]  # one whole shard per call
    assert aligned._advisor.rewrites("a") == 0

    with ShardedStore(str(tmp_path / "buffered.zarr"), chunks_per_shard=4, buffer_bytes=2**20) as buffered:
        _chunk_by_chunk(_array(buffered))
    assert buffered._advisor.rewrites("a") == 0
    np.testing.assert_array_equal(zarr.open_array(ShardedStore(str(tmp_path / "buffered.zarr")), path="a")[...], DATA)


def test_few_partial_writes_stay_quiet(tmp_path):
    store = ShardedStore(str(tmp_path / "s.zarr"), chunks_per_shard=4)
    z = _array(store)
    for k in range(DEFAULT_THRESHOLD - 1):
        z[8 * (k // 8) : 8 * (k // 8) + 8, 8 * (k % 8) : 8 * (k % 8) + 8] = 1.0
    assert store._advisor.rewrites("a") == DEFAULT_THRESHOLD - 1


def test_dask_blocks_of_one_chunk_warn_and_rechunked_blocks_do_not(tmp_path):
    da = pytest.importorskip("dask.array")
    import dask

    darr = da.from_array(DATA, chunks=(8, 8))
    with dask.config.set(scheduler="synchronous"):
        unaligned = ShardedStore(str(tmp_path / "u.zarr"), chunks_per_shard=4)
        with pytest.warns(PartialShardWriteWarning, match="rechunk_to_shards"):
            darr.to_zarr(unaligned, component="a")
        aligned = ShardedStore(str(tmp_path / "al.zarr"), chunks_per_shard=4)
        z = _array(aligned)
        blocks = rechunk_to_shards(darr, z)
        assert blocks.chunks == ((32, 32), (32, 32))
        da.store(blocks, z, lock=False)
        assert aligned._advisor.rewrites("a") == 0
    np.testing.assert_array_equal(z[...], DATA)


@pytest.mark.parametrize("shard_updates", ["auto", "rewrite"])
def test_no_warning_where_updates_cost_the_chunks(shard_updates: str, reflink_dir) -> None:
    """Where a partial update writes its chunks and an index (a clone on reflinks), no shard is rewritten per
    chunk: the warning would be false. With shard_updates='rewrite' it still holds, and is given."""
    store = ShardedStore(str(reflink_dir / "s.zarr"), chunks_per_shard=4, shard_updates=shard_updates)
    z = _array(store)
    z[...] = 0  # every shard stored: each chunk below updates a stored shard
    if shard_updates == "rewrite":
        with pytest.warns(PartialShardWriteWarning):
            _chunk_by_chunk(z)
    else:
        _chunk_by_chunk(z)  # a warning fails the test (pytestmark)
        assert store._engine.stats.tail_updates > 0
    np.testing.assert_array_equal(z[...], DATA)
