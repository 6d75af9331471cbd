"""Per-shard locks that belong to the data (shardkv.engine.locks, issue 9).

Threads with their own lock objects over one location serialise; spawned
processes incrementing a counter under the lock lose nothing; lock files stay
out of listings; a forked child never inherits a held lock; pickles carry the
location, never a lock.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import random
import threading
import time

import fsspec
import pytest
from concurrency_harness import run_counter_processes

from shardkv.engine.locks import LOCK_DIR, ShardLocks
from shardkv.errors import ConfigurationError, LockTimeoutError, ShardKVError
from shardkv.storage.adapters import FSMapAdapter, MappingAdapter, adapt
from shardkv.storage.location import StoreLocation, location_of


def _local(root: str) -> FSMapAdapter:
    return FSMapAdapter(fsspec.filesystem("file"), root)


def _run_threads(targets: list, timeout: float = 20.0) -> None:
    threads = [threading.Thread(target=t, daemon=True) for t in targets]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "threads did not finish in time (deadlock?)"


@pytest.mark.parametrize("kind", ["local", "dict", "memory"])
def test_eight_threads_with_own_lock_objects_serialise(tmp_path, kind) -> None:
    shared_dict: dict = {}
    if kind == "local":
        make = lambda: ShardLocks.for_adapter(_local(str(tmp_path)))  # noqa: E731
    elif kind == "dict":
        make = lambda: ShardLocks.for_adapter(MappingAdapter(shared_dict))  # noqa: E731
    else:
        make = lambda: ShardLocks.for_adapter(adapt(f"memory://locks-{tmp_path.name}"))  # noqa: E731
    state = {"inside": 0, "max_inside": 0, "counter": 0}
    n_threads, n_rounds = 8, 40

    def work() -> None:
        locks = make()  # one lock object per thread, as one ShardedStore per thread would have
        for _ in range(n_rounds):
            with locks.hold(["arr/0.0"]):
                state["inside"] += 1
                state["max_inside"] = max(state["max_inside"], state["inside"])
                value = state["counter"]
                time.sleep(0.0002)  # a read-modify-write window
                state["counter"] = value + 1
                state["inside"] -= 1

    _run_threads([work] * n_threads)
    assert state["max_inside"] == 1
    assert state["counter"] == n_threads * n_rounds


def test_locks_follow_the_data_not_the_spelling(tmp_path) -> None:
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "link")
    a = location_of(_local(str(tmp_path / "real")))
    b = location_of(adapt(str(tmp_path / "link")))
    c = location_of(adapt(f"file://{tmp_path}/real/"))
    assert a == b == c and a.local_dir == str((tmp_path / "real").resolve())
    d1, d2 = {}, {}
    assert location_of(MappingAdapter(d1)) == location_of(MappingAdapter(d1))
    assert location_of(MappingAdapter(d1)) != location_of(MappingAdapter(d2))
    # nested roots in one process lock a shard alike (full path in the namespace)
    outer = ShardLocks.for_adapter(_local(str(tmp_path / "real")), cross_process=False)
    inner = ShardLocks.for_adapter(_local(str(tmp_path / "real" / "arr")), cross_process=False)
    assert outer.thread_stripes_of(["arr/0.0"]) == inner.thread_stripes_of(["0.0"])


def test_multi_shard_holds_in_any_order_never_deadlock(tmp_path) -> None:
    keys = [f"a/{i}.{j}" for i in range(6) for j in range(6)]

    def work(seed: int) -> None:
        rng = random.Random(seed)
        locks = ShardLocks.for_adapter(_local(str(tmp_path)), file_stripes=8, thread_stripes=16)
        for _ in range(30):
            chosen = rng.sample(keys, 5)  # overlapping sets, listed in random order
            with locks.hold(chosen):
                pass

    _run_threads([lambda s=s: work(s) for s in range(6)], timeout=30)


def test_lock_timeout_raises_and_releases_nothing_it_did_not_take(tmp_path) -> None:
    holder = ShardLocks.for_adapter(_local(str(tmp_path)))
    waiter = ShardLocks.for_adapter(_local(str(tmp_path)), timeout=0.05)
    with holder.hold(["x/0"]):
        started = time.monotonic()
        with pytest.raises(LockTimeoutError) as info:
            with waiter.hold(["x/0"]):
                pass  # never reached
        assert time.monotonic() - started < 5
    assert isinstance(info.value, TimeoutError) and isinstance(info.value, ShardKVError)
    with waiter.hold(["x/0"]):  # free again once the holder let go
        pass


def test_four_spawned_processes_lose_no_increment(tmp_path) -> None:
    # also proves that lock-file stripes agree between processes (each has its own str hash seed)
    n_procs, n_increments = 4, 30
    assert run_counter_processes(str(tmp_path), n_procs, n_increments, timeout=60) == n_procs * n_increments


def test_lock_files_are_bounded_and_never_listed(tmp_path) -> None:
    adapter = _local(str(tmp_path))
    adapter.set_many({"arr/.zarray": b"{}", "arr/0.0": b"x"})
    locks = ShardLocks.for_adapter(adapter, file_stripes=4)
    for i in range(50):
        with locks.hold([f"arr/{i}.0", f"arr/0.{i}"]):
            pass
    lock_dir = tmp_path / LOCK_DIR
    assert lock_dir.is_dir() and 1 <= len(os.listdir(lock_dir)) <= 4  # one file per stripe, not per shard
    assert sorted(adapter.iter_keys()) == ["arr/.zarray", "arr/0.0"]
    assert adapter.list_dir() == ["arr"]
    assert locks.remove_lock_files() >= 1 and not lock_dir.exists()


def test_stores_opened_below_the_top_of_a_hierarchy_take_its_lock_files(tmp_path) -> None:
    top = tmp_path / "h.zarr"
    (top / "g" / "arr").mkdir(parents=True)
    at_group = ShardLocks.for_adapter(_local(str(top / "g")), file_stripes=16)
    assert at_group.lock_dir == str(top / "g" / LOCK_DIR)  # no group above yet: its own root
    (top / "g" / "zarr.json").write_text("{}")
    assert at_group.lock_dir == str(top / "g" / LOCK_DIR)  # still: the parent is no group
    (top / "zarr.json").write_text("{}")  # now the parent is a group: the top moves up
    at_top = ShardLocks.for_adapter(_local(str(top)), file_stripes=16)
    at_array = ShardLocks.for_adapter(_local(str(top / "g" / "arr")), file_stripes=16)
    assert at_group.lock_dir == at_top.lock_dir == at_array.lock_dir == str(top / LOCK_DIR)
    for i in range(20):  # one shard, one stripe, from every root
        assert at_top.file_stripes_of([f"g/arr/c/{i}"]) == at_group.file_stripes_of([f"arr/c/{i}"])
        assert at_top.file_stripes_of([f"g/arr/c/{i}"]) == at_array.file_stripes_of([f"c/{i}"])
    with at_array.hold(["c/0"]):
        pass
    assert (top / LOCK_DIR).is_dir() and not (top / "g" / "arr" / LOCK_DIR).exists()
    (top / "zarr.json").unlink()
    (top / ".zgroup").write_text("{}")  # a zarr 2 group counts as well
    assert at_array.lock_dir == str(top / LOCK_DIR)
    pinned = ShardLocks.for_adapter(_local(str(top / "g")), lock_root=str(top / "g"))
    assert pinned.lock_dir == os.path.join(os.path.realpath(top / "g"), LOCK_DIR)  # lock_root is taken as given


def test_deleting_everything_keeps_the_lock_files(tmp_path) -> None:
    # zarr's mode="w" at the root deletes every key; a writer elsewhere may hold a lock file meanwhile
    from shardkv import ShardedStore

    zarr = pytest.importorskip("zarr")
    store = ShardedStore(str(tmp_path), chunks_per_shard=2)
    z = zarr.open_array(store=store, mode="w", path="a", shape=(8,), chunks=(2,), dtype="i4")
    z[:] = 1
    assert (tmp_path / LOCK_DIR).is_dir()
    store.rmdir("")
    assert os.listdir(tmp_path) == [LOCK_DIR] and list(store) == []


def test_cross_process_needs_a_directory() -> None:
    with pytest.raises(ConfigurationError, match="directory for lock files"):
        ShardLocks(StoreLocation(("s3", None), "bucket/data"), cross_process=True)
    assert not ShardLocks.for_adapter(MappingAdapter({})).cross_process
    with pytest.raises(ConfigurationError):
        ShardLocks(None, thread_stripes=0)


def test_pickled_locks_find_the_same_locks(tmp_path) -> None:
    locks = ShardLocks.for_adapter(_local(str(tmp_path)), timeout=0.05)
    clone = pickle.loads(pickle.dumps(locks))
    assert clone.location == locks.location and clone.lock_dir == locks.lock_dir and clone.timeout == 0.05
    with locks.hold(["s/0"]):
        with pytest.raises(LockTimeoutError):
            with clone.hold(["s/0"]):
                pass


def _take_in_child(root: str, queue) -> None:  # runs in a forked child
    locks = ShardLocks.for_adapter(_local(root), cross_process=False, timeout=5)
    try:
        with locks.hold(["k/0"]):
            queue.put("ok")
    except LockTimeoutError as exc:
        queue.put(f"timeout: {exc}")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_does_not_inherit_a_held_lock(tmp_path) -> None:
    locks = ShardLocks.for_adapter(_local(str(tmp_path)), cross_process=False)
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    with locks.hold(["k/0"]):  # held by this process while it forks
        child = ctx.Process(target=_take_in_child, args=(str(tmp_path), queue))
        child.start()
        child.join(20)
    assert child.exitcode == 0
    assert queue.get(timeout=5) == "ok"


# -- the concurrency= option (shardkv.engine.concurrency) ------------------------------------


class _PlainFS(fsspec.AbstractFileSystem):
    """An fsspec filesystem with neither a local directory nor conditional writes."""

    protocol = "plainfs"
    cachable = False


def test_auto_concurrency_picks_files_conditional_or_refuses(tmp_path) -> None:
    from shardkv.engine.concurrency import plan_concurrency

    local = plan_concurrency(_local(str(tmp_path)))
    assert local.mode == "files" and local.locks.cross_process and local.conditional is None
    mapping = plan_concurrency(MappingAdapter({}))
    assert mapping.mode == "conditional" and not mapping.locks.cross_process and mapping.conditional is not None
    assert plan_concurrency(adapt("memory://plan"), "auto").mode == "conditional"
    # a store with neither (stands for gcs/abfs/http here): never a silent choice
    other = FSMapAdapter(_PlainFS(), "bucket/x")
    with pytest.raises(ConfigurationError, match="neither lock files nor conditional writes"):
        plan_concurrency(other)
    assert plan_concurrency(other, "process").mode == "process"
    assert plan_concurrency(other, "none").locks is None
    with pytest.raises(ConfigurationError, match="needs a store in a directory"):
        plan_concurrency(other, "files")
    with pytest.raises(ConfigurationError, match="concurrency must be one of"):
        plan_concurrency(MappingAdapter({}), "sometimes")


def test_engines_of_the_proxy_and_the_transformer_take_their_locks_from_the_location(tmp_path) -> None:
    from shardkv import ShardedStore
    from shardkv.transformers import AdapterStore, ShardingStorageTransformer

    proxy = ShardedStore(str(tmp_path), chunks_per_shard=2)
    assert proxy._io.plan.mode == "files" and proxy._io.plan.locks.lock_dir == os.path.join(
        os.path.realpath(str(tmp_path)), ".shardkv-locks"
    )
    assert ShardedStore({}, concurrency="none")._io.plan.locks is None
    over_dir = ShardingStorageTransformer(AdapterStore(str(tmp_path)), [2])
    assert over_dir.io.plan.mode == "files"
    assert over_dir.io.plan.locks.lock_dir == proxy._io.plan.locks.lock_dir  # one directory, one set of locks
    assert ShardingStorageTransformer(AdapterStore({}), [2]).io.plan.mode == "conditional"
    stacked = ShardingStorageTransformer(over_dir, [2])  # location unknown: this object's own locks
    assert stacked.io.plan.mode == "process" and stacked.io.plan.locks.location is None
    with pytest.raises(ConfigurationError):
        ShardingStorageTransformer(over_dir, [2], concurrency="auto")
