"""Concurrency proofs with several processes: no lost updates, pickled adapters and stores in worker processes.

Every ``ShardedStore`` of one directory takes the same lock files
(:mod:`shardkv.engine.locks`) around each shard read-modify-write, so
spawned processes writing disjoint chunks of shared shards lose nothing.
"""

from __future__ import annotations

import os
import pickle
import uuid

import fsspec
import numpy as np
import pytest
from concurrency_harness import local_cluster, moto_s3, run_sharded_writers  # noqa: F401  (fixtures)

from shardkv import ShardedStore
from shardkv.engine.locks import LOCK_DIR, ShardLocks
from shardkv.engine.options import Options
from shardkv.errors import UnflushedWritesError
from shardkv.format.ranges import ReadPolicy
from shardkv.storage.fsspec import FsspecStore
from shardkv.storage.mapping import MappingStore
from shardkv.storage.open import open_kv

zarr = pytest.importorskip("zarr")
if not zarr.__version__.startswith("2."):
    pytest.skip("zarr-python 2 only", allow_module_level=True)


def test_four_processes_writing_disjoint_chunks_lose_nothing(tmp_path) -> None:
    result = run_sharded_writers(str(tmp_path / "data.zarr"), n_procs=4, n_chunks=128, chunks_per_shard=16)
    assert result.child_errors == ()
    assert result.lost == 0, f"{result.lost} of {result.total} chunk updates lost"


def test_writers_that_open_the_hierarchy_at_different_roots_lose_nothing(tmp_path) -> None:
    # two workers open the store at the hierarchy's root, two at its group: a shard has one lock file
    root = tmp_path / "nested.zarr"
    zarr.group(store=ShardedStore(str(root)), path="g")
    views = ((str(root), "g/arr"), (str(root / "g"), "arr"))
    found = run_sharded_writers(str(root), n_procs=4, n_chunks=128, views=views)
    assert found.child_errors == ()
    assert found.lost == 0, f"{found.lost} of {found.total} chunk updates lost"
    assert sorted(os.listdir(root / "g" / "arr" / LOCK_DIR))  # the array's own lock files ...
    assert not (root / LOCK_DIR).exists() and not (root / "g" / LOCK_DIR).exists()  # ... and no others


@pytest.mark.filterwarnings("ignore::FutureWarning")  # NestedDirectoryStore is deprecated in zarr 2.18
def test_a_nested_directory_store_takes_lock_files_and_four_processes_lose_nothing(tmp_path) -> None:
    path = str(tmp_path / "nested.zarr")
    store = ShardedStore(zarr.NestedDirectoryStore(path))
    assert store.concurrency_mode == "files"
    assert store.engine.kv.location.local_dir == os.path.realpath(path)
    found = run_sharded_writers(path, n_procs=4, n_chunks=64, chunks_per_shard=64, make_base=zarr.NestedDirectoryStore)
    assert found.child_errors == ()
    assert found.lost == 0, f"{found.lost} of {found.total} chunk updates lost"
    assert os.listdir(os.path.join(path, LOCK_DIR))  # the lock files are there ...
    keys = list(ShardedStore(zarr.NestedDirectoryStore(path)).keys())
    assert keys and not [k for k in keys if LOCK_DIR in k]  # ... and never listed


@pytest.mark.filterwarnings("ignore::FutureWarning")  # SQLiteStore is deprecated in zarr 2.18
def test_zarr2_stores_outside_a_directory_ask_for_an_explicit_mode(tmp_path) -> None:
    from shardkv.errors import ConfigurationError

    sqlite = zarr.SQLiteStore(str(tmp_path / "data.sqlite"))
    with pytest.raises(ConfigurationError, match=r"SQLiteStore.*concurrency='process'.*concurrency='none'"):
        ShardedStore(sqlite)
    for mode in ("none", "process"):
        arr = zarr.open_array(
            store=ShardedStore(sqlite, chunks_per_shard=4, concurrency=mode),
            path=mode,
            mode="w",
            shape=(16,),
            chunks=(2,),
            dtype="i4",
        )
        arr[:] = np.arange(16)
        view = zarr.open_array(store=ShardedStore(sqlite, concurrency=mode), path=mode, mode="r")
        np.testing.assert_array_equal(view[:], np.arange(16))
    sqlite.close()
    # data in this process keeps the in-process emulation; a local FSStore is its files
    local_fsstore = zarr.storage.FSStore(str(tmp_path / "fsstore"))  # its files, read directly: lock files
    assert ShardedStore(local_fsstore).concurrency_mode == "files"
    with pytest.raises(ConfigurationError, match="zarr/json"):  # it would rewrite the keys shardkv writes
        ShardedStore(zarr.storage.FSStore(str(tmp_path / "fsstore"), key_separator="/"))
    for kind in (zarr.DirectoryStore, zarr.NestedDirectoryStore):  # lowercased keys: locks would miss their arrays
        with pytest.raises(ConfigurationError, match="normalize_keys"):
            ShardedStore(kind(str(tmp_path / "low"), normalize_keys=True))
    for memory in ({}, zarr.MemoryStore(), zarr.storage.FSStore("memory://kinds")):
        assert ShardedStore(memory).concurrency_mode == "conditional", type(memory).__name__
    # a KVStore keeps its mapping private; an LRUStoreCache would answer a shard read under the lock from its
    # cache, missing what other processes wrote: both must be told
    wrapped = zarr.LRUStoreCache(zarr.DirectoryStore(str(tmp_path / "wrapped")), max_size=1 << 20)
    for wrapper in (zarr.KVStore({}), wrapped):
        with pytest.raises(ConfigurationError, match=type(wrapper).__name__):
            ShardedStore(wrapper)
        assert ShardedStore(wrapper, concurrency="process").concurrency_mode == "process"
    with pytest.raises(ConfigurationError, match="needs a store in a directory"):
        ShardedStore(wrapped, concurrency="files")


def test_stores_pickle_to_the_same_location(tmp_path) -> None:
    local = open_kv(str(tmp_path))
    memory = open_kv("memory://pickled-root")
    mapping = MappingStore({"a": b"1"})
    for kv in (local, memory):
        clone = pickle.loads(pickle.dumps(kv))
        assert type(clone) is type(kv) and clone.location == kv.location
        assert clone.root == kv.root  # type: ignore[attr-defined]
    assert pickle.loads(pickle.dumps(memory)).fs.protocol == memory.fs.protocol  # type: ignore[attr-defined]
    clone = pickle.loads(pickle.dumps(mapping))
    assert bytes(clone.get("a").whole()) == b"1"  # a dict pickles as a copy: equal data, a new location
    assert clone.location != mapping.location


def test_fsspec_store_pickle_keeps_storage_options(tmp_path) -> None:
    fs = fsspec.filesystem("file", auto_mkdir=True)
    clone = pickle.loads(pickle.dumps(FsspecStore(fs, str(tmp_path))))
    assert clone.fs.storage_options == fs.storage_options and clone.fs.auto_mkdir


# -- what ShardedStore.__reduce__ must carry (shardkv.proxy.base, shardkv.engine.options) ------------


def _roundtrip(store):
    func, args = pickle.loads(pickle.dumps(store.__reduce__()))
    return func(*args)


def test_store_reduce_carries_location_and_options(tmp_path) -> None:
    store = ShardedStore(
        str(tmp_path),
        chunks_per_shard=4,
        index_location="start",
        index_checksum=False,
        index_cache_bytes=1 << 20,
        read_policy=ReadPolicy(max_gap=7),
        buffer_bytes=1 << 16,
        concurrency="files",
        lock_timeout=3.5,
    )
    arr = zarr.open_array(store=store, mode="w", shape=(40,), chunks=(5,), dtype="i2")
    arr[:] = np.arange(40)
    store.flush()
    clone = _roundtrip(store)
    assert type(clone) is ShardedStore
    # every option travels, but write-back: a copy writes through
    assert clone.options == Options.from_keywords(
        4,
        index_location="start",
        index_checksum=False,
        index_cache_bytes=1 << 20,
        read_policy=ReadPolicy(max_gap=7),
        buffer_bytes=None,
        concurrency="files",
        lock_timeout=3.5,
    )
    assert store.options.buffer_bytes == 1 << 16 and clone._writer.buffer is None
    assert clone.base.location == store.base.location
    np.testing.assert_array_equal(zarr.open_array(store=clone, mode="r")[:], np.arange(40))


def test_store_reduce_refuses_unflushed_writes(tmp_path) -> None:
    store = ShardedStore(str(tmp_path), chunks_per_shard=4, buffer_bytes=1 << 20)
    arr = zarr.open_array(store=store, mode="w", shape=(40,), chunks=(5,), dtype="i2")
    arr[:7] = 1  # buffered: shard 0 is not complete
    with pytest.raises(UnflushedWritesError) as info:
        pickle.dumps(store)
    assert info.value.n_shards == 1 and isinstance(info.value, pickle.PicklingError)
    store.flush()
    assert _roundtrip(store)["0"] is not None  # pickles once flushed


def _write_through_rebuilt_store(reduced, start: int) -> int:  # runs in a dask worker process
    func, args = reduced
    arr = zarr.open_array(store=func(*args), mode="r+")
    arr[start : start + 5] = start
    return os.getpid()


def _location_in_worker(kv):  # runs in a dask worker process
    return kv.location, ShardLocks(kv.location).lock_dir


def test_adapters_and_rebuilt_stores_work_in_worker_processes(tmp_path, local_cluster) -> None:  # noqa: F811
    # one test, one cluster: starting worker processes is the slow part
    kv = open_kv(str(tmp_path))
    location, lock_dir = local_cluster.submit(_location_in_worker, kv, pure=False).result(timeout=60)
    assert location == kv.location  # the store pickled to the same data ...
    assert lock_dir == ShardLocks(kv.location).lock_dir  # ... and so to the same locks

    store = ShardedStore(str(tmp_path), chunks_per_shard=2)
    zarr.open_array(store=store, mode="w", shape=(20,), chunks=(5,), dtype="i4", fill_value=-1)
    reduced = store.__reduce__()
    # one shard per task (chunks 0-1 and 2-3)
    futures = [local_cluster.submit(_write_through_rebuilt_store, reduced, s, pure=False) for s in (0, 10)]
    pids = {f.result(timeout=60) for f in futures}
    assert os.getpid() not in pids  # really other processes
    store.refresh()
    expected = np.array([0] * 5 + [-1] * 5 + [10] * 5 + [-1] * 5)
    np.testing.assert_array_equal(zarr.open_array(store=store, mode="r")[:], expected)


# -- S3 compare-and-swap ----------------------------------------------------------------------


def _s3_options(moto_s3) -> dict:  # noqa: F811
    return {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": moto_s3.endpoint_url, "region_name": "us-east-1"},
        "skip_instance_cache": True,
    }


def test_a_forced_race_on_s3_is_refused_with_412_and_retried(moto_s3) -> None:  # noqa: F811
    url = f"s3://{moto_s3.bucket}/race-{uuid.uuid4().hex[:8]}"
    options = _s3_options(moto_s3)
    store = ShardedStore(url, chunks_per_shard=4, storage_options=options)
    arr = zarr.open_array(store=store, mode="w", shape=(16,), chunks=(2,), dtype="i4", fill_value=0)
    arr[0:2] = 1
    # another process's writer: takes none of this process's locks
    other = zarr.open_array(store=ShardedStore(url, storage_options=options, concurrency="none"), mode="r+")
    kv = store.engine.kv
    read = kv.get_many
    raced: list[str] = []

    def read_then_lose_the_race(requests):
        found = read(requests)
        if not raced and requests and requests[0][1] is None:  # the shard read of the write
            raced.append(requests[0][0])  # the other writer stores shard 0 between our read and our write
            other[2:4] = 2
        return found

    kv.get_many = read_then_lose_the_race
    arr[4:6] = 3
    stats = store.engine.stats
    assert raced == ["0"] and stats.write_lost >= 1, stats  # the 412 answer
    check = zarr.open_array(store=ShardedStore(url, storage_options=options), mode="r")
    np.testing.assert_array_equal(check[:8], [1, 1, 2, 2, 3, 3, 0, 0])  # both writers' chunks kept
