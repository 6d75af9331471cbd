"""No write-back data without an owner.

A ``ShardedStore`` with ``buffer_bytes`` sent to dask.distributed workers (each
unpickles its own copy) used to buffer the workers' chunk writes in copies that
nobody flushed: ``da.to_zarr``/``ds.to_zarr`` returned normally and stored 0 of
256 chunks. A dask user wants the data stored, so a pickled copy writes through
(its locks keep the shards' other chunks, as for any writer); the write-back
buffer and the journal stay with the store that was opened with them, and a
store that holds unflushed writes refuses to pickle.
"""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
from concurrency_harness import local_cluster  # noqa: F401  (fixture)

from shardkv import ShardedStore, open_store
from shardkv.errors import UnflushedWritesError

zarr = pytest.importorskip("zarr")
if not zarr.__version__.startswith("2."):
    pytest.skip("zarr-python 2 only", allow_module_level=True)
da = pytest.importorskip("dask.array")
xr = pytest.importorskip("xarray")

pytestmark = pytest.mark.filterwarnings("ignore::shardkv.PartialShardWriteWarning")

SHAPE = (256, 256)
CHUNKS = (16, 16)  # 16 x 16 = 256 chunks
CPS = 4  # 16 chunks per shard, 16 shards


def _data() -> np.ndarray:
    return np.random.default_rng(20).integers(0, 1 << 30, size=SHAPE, dtype="i4")


def _chunk_keys(store: ShardedStore, path: str) -> list[str]:
    prefix = f"{path}/" if path else ""
    return [k for k in store.keys_under(path) if k[len(prefix) :][:1].isdigit()]


def test_a_pickled_copy_writes_through_and_keeps_no_journal(tmp_path) -> None:
    store = ShardedStore(str(tmp_path / "s"), chunks_per_shard=CPS, buffer_bytes=1 << 20, journal=tmp_path / "j")
    zarr.open_array(store=store, mode="w", shape=SHAPE, chunks=CHUNKS, dtype="i4", fill_value=0)
    store.flush()
    copy = pickle.loads(pickle.dumps(store))
    assert store.options.buffer_bytes == 1 << 20 and copy.options.buffer_bytes is None
    zarr.open_array(store=copy, mode="r+")[0:16, 0:16] = 7  # one chunk of a 16-chunk shard
    # stored at once: a fresh store (no buffer of its own) sees it
    assert (zarr.open_array(store=ShardedStore(str(tmp_path / "s")), mode="r")[0:16, 0:16] == 7).all()
    assert pickle.loads(pickle.dumps(copy)).options == copy.options  # a copy of a copy is the same


def test_a_store_holding_unflushed_writes_refuses_to_pickle(tmp_path) -> None:
    store = ShardedStore(str(tmp_path / "s"), chunks_per_shard=CPS, buffer_bytes=1 << 20)
    zarr.open_array(store=store, mode="w", shape=SHAPE, chunks=CHUNKS, dtype="i4", fill_value=0)[0:16, 0:16] = 1
    with pytest.raises(UnflushedWritesError, match="flush"):
        pickle.dumps(store)
    store.flush()
    pickle.dumps(store)


def test_the_draft_proxy_pickles_to_an_equivalent_store(tmp_path) -> None:
    proxy = open_store(str(tmp_path / "d"), chunks_per_shard=2, layout="draft2022")
    copy = pickle.loads(pickle.dumps(proxy))
    assert type(copy) is type(proxy) and copy.options == proxy.options


@pytest.mark.parametrize("close", [False, True], ids=["no-close", "close"])
def test_da_to_zarr_on_a_cluster_into_a_write_back_store_stores_every_chunk(tmp_path, local_cluster, close) -> None:  # noqa: F811
    path = str(tmp_path / "da.zarr")
    data = _data()
    store = ShardedStore(path, chunks_per_shard=CPS, buffer_bytes=1 << 20)
    da.to_zarr(da.from_array(data, chunks=CHUNKS), store)  # each task runs in a worker's unpickled copy
    if close:
        store.close()
    pids = set(local_cluster.run(os.getpid).values())
    assert os.getpid() not in pids  # the writes really happened in other processes
    fresh = ShardedStore(path)
    assert len(_chunk_keys(fresh, "")) == 256  # all 256 chunks stored (0 when a pickled copy buffered its writes)
    np.testing.assert_array_equal(zarr.open_array(store=fresh, mode="r")[:], data)


def test_ds_to_zarr_on_a_cluster_into_a_write_back_store_stores_every_chunk(tmp_path, local_cluster) -> None:  # noqa: F811
    path = str(tmp_path / "ds.zarr")
    ds = xr.Dataset({"v": (("y", "x"), _data())}).chunk({"y": CHUNKS[0], "x": CHUNKS[1]})
    with ShardedStore(path, chunks_per_shard=CPS, buffer_bytes=1 << 20) as store:
        ds.to_zarr(store, mode="w")
    fresh = ShardedStore(path)
    assert len(_chunk_keys(fresh, "v")) == 256
    xr.testing.assert_identical(xr.open_zarr(fresh).load(), ds.load())
