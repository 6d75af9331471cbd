"""Concurrency proofs inside one process: separate stores of one location share their shard locks.

* 8 threads, each with its own ``ShardedStore`` over one local directory /
  one ``memory://`` root / one ``dict``, write disjoint chunks of shared
  shards: nothing is lost;
* a writer holding a shard's lock makes another store's writer of that shard
  wait (here: time out), so the stores really share the lock;
* readers racing a rewriting writer see only complete values;
* a store pickles to an equivalent store, and refuses with unflushed data;
* threads of one store writing chunks of one shard at once are merged into
  one shard rewrite (group commit), nothing lost.

Every loop is bounded in count and time; threads are joined with a timeout.
"""

from __future__ import annotations

import pickle
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from concurrency_harness import run_threads

from shardkv import ShardedStore
from shardkv.errors import LockTimeoutError, UnflushedWritesError

zarr = pytest.importorskip("zarr")
if not zarr.__version__.startswith("2."):
    pytest.skip("zarr-python 2 only", allow_module_level=True)

N_THREADS = 8
CHUNK_LEN = 4
N_CHUNKS = 128  # 8 shards of 16 chunks: every thread writes 2 chunks of every shard
JOIN_S = 60.0


def _base(kind: str, tmp_path):
    if kind == "local":
        return str(tmp_path / "data.zarr")
    if kind == "memory":
        return f"memory://threads-{uuid.uuid4().hex[:8]}"
    return {}  # one dict object, shared by every store


@pytest.mark.parametrize("kind", ["local", "memory", "dict"])
def test_eight_threads_with_separate_stores_lose_nothing(tmp_path, kind) -> None:
    base = _base(kind, tmp_path)
    setup = ShardedStore(base, chunks_per_shard=16)
    zarr.open_array(store=setup, mode="w", shape=(N_CHUNKS * CHUNK_LEN,), chunks=(CHUNK_LEN,), dtype="i4", fill_value=0)
    stores = [ShardedStore(base, chunks_per_shard=16) for _ in range(N_THREADS)]
    assert {s.base.location for s in stores} == {setup.base.location}

    def write(w: int) -> None:
        arr = zarr.open_array(store=stores[w], mode="r+")
        for c in range(w, N_CHUNKS, N_THREADS):  # one chunk per call: one shard read-modify-write each
            arr[c * CHUNK_LEN : (c + 1) * CHUNK_LEN] = c + 1

    assert run_threads(write, N_THREADS, JOIN_S) == []
    data = zarr.open_array(store=ShardedStore(base), mode="r")[:]
    lost = [c for c in range(N_CHUNKS) if not (data[c * CHUNK_LEN : (c + 1) * CHUNK_LEN] == c + 1).all()]
    assert lost == [], f"{len(lost)} of {N_CHUNKS} chunk updates lost"


@pytest.mark.parametrize("kind", ["local", "memory", "dict"])
def test_a_held_shard_lock_excludes_another_stores_writer(tmp_path, kind) -> None:
    base = _base(kind, tmp_path)
    holder = ShardedStore(base, chunks_per_shard=4)
    zarr.open_array(store=holder, mode="w", shape=(16,), chunks=(2,), dtype="i4", fill_value=0)
    other = ShardedStore(base, chunks_per_shard=4, lock_timeout=0.2)
    arr = zarr.open_array(store=other, mode="r+")
    with holder.engine.locks.hold_arrays({"0": holder.sharded_array("")}):  # shard 0 holds chunks 0-3 (elements 0-7)
        started = time.monotonic()
        with pytest.raises(LockTimeoutError):
            arr[0:2] = 5
        assert time.monotonic() - started >= 0.15
        arr[8:10] = 7  # shard 1: another lock stripe, no wait
    arr[0:2] = 5
    np.testing.assert_array_equal(zarr.open_array(store=holder, mode="r")[:10], [5, 5, 0, 0, 0, 0, 0, 0, 7, 7])


@pytest.mark.parametrize("shared_proxy", [True, False], ids=["same-store", "own-store"])
def test_readers_racing_a_writer_see_only_complete_values(tmp_path, shared_proxy) -> None:
    path = str(tmp_path / "race.zarr")
    writer_store = ShardedStore(path, chunks_per_shard=8)
    arr = zarr.open_array(store=writer_store, mode="w", shape=(16 * 64,), chunks=(64,), dtype="i8", fill_value=-1)
    arr[:] = 0  # every chunk acknowledged before the readers start
    n_rounds, stop = 12, threading.Event()
    problems: list[str] = []

    def write() -> None:
        try:
            for version in range(1, n_rounds + 1):
                for c in range(16):  # one chunk per call: every call rewrites a shard
                    arr[c * 64 : (c + 1) * 64] = version
        finally:
            stop.set()

    def read(r: int) -> None:
        store = writer_store if shared_proxy else ShardedStore(path)  # default options
        view = zarr.open_array(store=store, mode="r")
        seen = [0] * 16
        deadline = time.monotonic() + 30
        for _ in range(5000):
            if stop.is_set() or time.monotonic() > deadline:
                break
            c = (r * 7 + _) % 16
            chunk = view[c * 64 : (c + 1) * 64]
            if (chunk == -1).any():
                problems.append(f"reader {r}: chunk {c} read as fill after it was written")
            elif len(set(chunk.tolist())) != 1:
                problems.append(f"reader {r}: chunk {c} torn: {sorted(set(chunk.tolist()))}")
            elif chunk[0] < seen[c]:
                problems.append(f"reader {r}: chunk {c} went back from {seen[c]} to {chunk[0]}")
            else:
                seen[c] = int(chunk[0])

    def run(i: int) -> None:
        write() if i == 0 else read(i)

    assert run_threads(run, 4, JOIN_S) == []
    assert problems == []
    np.testing.assert_array_equal(zarr.open_array(store=ShardedStore(path), mode="r")[:], n_rounds)


def test_a_chunk_delete_sees_another_stores_write(tmp_path) -> None:
    """zarr with a synchronizer deletes an all-fill chunk by ``del store[key]``: decided on the stored index.

    Store ``a`` cached shard 0's index before store ``b`` (another process's,
    say) wrote chunk 0; ``a``'s later write of fill values to chunk 0 must
    still delete it, not find it missing in its cached index and keep ``b``'s.
    """
    path = str(tmp_path / "a.zarr")
    kwargs = {"write_empty_chunks": False, "synchronizer": zarr.ThreadSynchronizer()}  # chunk by chunk
    a = zarr.open_array(store=ShardedStore(path, chunks_per_shard=4), mode="w", shape=(16,), chunks=(4,), dtype="i4")
    a = zarr.open_array(store=a.store, mode="r+", **kwargs)
    a[4:8] = 2  # shard 0 stored; its index cached by store a
    zarr.open_array(store=ShardedStore(path), mode="r+")[0:4] = 1
    a[0:4] = 0  # all fill: zarr deletes chunk 0
    np.testing.assert_array_equal(zarr.open_array(store=ShardedStore(path), mode="r")[:8], [0] * 4 + [2] * 4)


def test_store_pickles_to_an_equivalent_store(tmp_path) -> None:
    store = ShardedStore(str(tmp_path), chunks_per_shard=4, lock_timeout=5.0)
    arr = zarr.open_array(store=store, mode="w", shape=(40,), chunks=(5,), dtype="i2")
    arr[:] = np.arange(40)
    clone = pickle.loads(pickle.dumps(store))
    assert type(clone) is ShardedStore and clone is not store
    assert clone.options == store.options
    assert clone.concurrency_mode == store.concurrency_mode == "files"
    assert clone.engine.locks.lock_dir == store.engine.locks.lock_dir
    np.testing.assert_array_equal(zarr.open_array(store=clone, mode="r")[:], np.arange(40))
    assert sorted(clone) == sorted(store)


def test_pickling_a_store_with_unflushed_writes_raises(tmp_path) -> None:
    store = ShardedStore(str(tmp_path), chunks_per_shard=4, buffer_bytes=1 << 20)
    arr = zarr.open_array(store=store, mode="w", shape=(40,), chunks=(5,), dtype="i2")
    arr[:7] = 1  # buffered: shard 0 is not complete
    with pytest.raises(UnflushedWritesError):
        pickle.dumps(store)
    store.flush()
    np.testing.assert_array_equal(zarr.open_array(store=pickle.loads(pickle.dumps(store)), mode="r")[:7], 1)


def test_rechunk_to_shards_gives_whole_shard_blocks(tmp_path) -> None:
    da = pytest.importorskip("dask.array")
    from shardkv import rechunk_to_shards
    from shardkv.errors import ConfigurationError

    store = ShardedStore(str(tmp_path / "r.zarr"), chunks_per_shard=(4, 2))
    z = zarr.create(shape=(300, 100), chunks=(16, 10), dtype="i4", store=store, path="a")
    source = np.arange(300 * 100, dtype="i4").reshape(300, 100)
    x = rechunk_to_shards(da.from_array(source, chunks=(7, 9)), z)
    assert x.chunks == ((64,) * 4 + (44,), (20,) * 5)  # 4 x 16 and 2 x 10 elements per shard
    assert rechunk_to_shards(x, store, "a").chunks == x.chunks
    x.store(z, lock=False)
    np.testing.assert_array_equal(z[:], source)
    with pytest.raises(ConfigurationError):
        rechunk_to_shards(da.zeros((4,)), z)  # 1-d data, 2-d shards
    with pytest.raises(ConfigurationError):
        rechunk_to_shards(x, store, "missing")


class _HeldDict(dict):
    """A dict base store whose first shard write, once armed, waits inside the store until the test lets it go."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.entered = threading.Event()
        self.release = threading.Event()
        self.shard_puts: list[str] = []

    def __setitem__(self, key, value) -> None:
        if self.armed and key != "zarr.json":
            self.shard_puts.append(key)
            if not self.entered.is_set():
                self.entered.set()
                if not self.release.wait(2 * JOIN_S):  # longer than the test waits for the queue
                    raise TimeoutError("the test never released the held shard write")
        super().__setitem__(key, value)


def test_threads_writing_one_shard_at_once_are_merged_into_one_rewrite() -> None:
    base = _HeldDict()
    store = ShardedStore(base, chunks_per_shard=16)
    arr = zarr.open_array(store=store, mode="w", shape=(16 * CHUNK_LEN,), chunks=(CHUNK_LEN,), dtype="i4", fill_value=0)
    base.armed = True

    def write(c: int) -> None:
        arr[c * CHUNK_LEN : (c + 1) * CHUNK_LEN] = c + 1  # one whole chunk of shard "0": one write call

    stats = store.engine.stats
    with ThreadPoolExecutor(N_THREADS) as pool:
        futures = [pool.submit(write, 0)]
        assert base.entered.wait(JOIN_S), "the first chunk write never reached the base store"
        futures += [pool.submit(write, c) for c in range(1, N_THREADS)]
        for _ in range(int(JOIN_S * 1000)):  # bounded: until the other 7 chunk writes wait for the next commit
            if stats.writes_queued >= N_THREADS - 1:
                break
            threading.Event().wait(0.001)
        base.release.set()
        for future in futures:
            future.result(JOIN_S)
    assert stats.writes_queued == N_THREADS - 1
    assert base.shard_puts == ["0", "0"]  # the first chunk's commit, then one for the seven that queued
    data = zarr.open_array(store=ShardedStore(dict(base)), mode="r")[:]
    expected = np.repeat(np.r_[np.arange(1, N_THREADS + 1), np.zeros(16 - N_THREADS)], CHUNK_LEN).astype("i4")
    np.testing.assert_array_equal(data, expected)
