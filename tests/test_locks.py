"""Per-shard locks that belong to the data (shardkv.engine.locks).

Threads with their own lock objects over one location serialise; spawned
processes incrementing a counter under the lock lose nothing; lock files stay
out of listings; a forked child never inherits a held lock; pickles carry the
location, never a lock.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import pickle
import random
import select
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import fsspec
import pytest
from concurrency_harness import run_counter_processes

import shardkv.engine.locks as lock_module
from shardkv.engine.locks import LOCK_DIR, Mode, ShardLocks, stripe_of
from shardkv.engine.options import Options
from shardkv.errors import ConfigurationError, LockTimeoutError, ShardKVError
from shardkv.storage.fsspec import FsspecStore
from shardkv.storage.kv import ANY, KVStore, StoreLocation
from shardkv.storage.local import LocalStore
from shardkv.storage.mapping import MappingStore
from shardkv.storage.open import open_kv


def _local(root: str) -> LocalStore:
    return LocalStore(root)


def _put(kv: KVStore, values: dict[str, bytes]) -> None:
    kv.put_many({k: (v, ANY) for k, v in values.items()})


def _excludes(a: ShardLocks, key_a: str, prefix_a: str, b: ShardLocks, key_b: str, prefix_b: str) -> bool:
    """Whether a hold of ``key_a`` through ``a`` keeps a hold of ``key_b`` through ``b``'s location waiting."""
    quick = ShardLocks(b.location, mode=b.mode, timeout=0.05)
    entered, leave = threading.Event(), threading.Event()

    def hold() -> None:
        with a.hold([key_a], {key_a: prefix_a}):
            entered.set()
            leave.wait(20)

    side = threading.Thread(target=hold, daemon=True)
    side.start()
    assert entered.wait(20)
    try:
        with quick.hold([key_b], {key_b: prefix_b}):
            return False
    except LockTimeoutError:
        return True
    finally:
        leave.set()
        side.join(20)


_HOLD = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()  # until the test closes the pipe
"""


@contextmanager
def _held_by_another_process(lock_file: str | None) -> Iterator[None]:
    """``lock_file`` flocked by a child process for the ``with`` block (it waits for the lock up to 30 s)."""
    assert lock_file is not None
    os.makedirs(os.path.dirname(lock_file), exist_ok=True)
    child = subprocess.Popen([sys.executable, "-c", _HOLD, lock_file], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and select.select([child.stdout], [], [], 30)[0], "the child never got the lock"
        assert child.stdout.readline() == b"held\n"
        yield
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(30)


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
        make = lambda: ShardLocks(_local(str(tmp_path)).location)  # noqa: E731
    elif kind == "dict":
        make = lambda: ShardLocks(MappingStore(shared_dict).location)  # noqa: E731
    else:
        make = lambda: ShardLocks(open_kv(f"memory://locks-{tmp_path.name}").location)  # noqa: E731
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
    a = _local(str(tmp_path / "real")).location
    b = open_kv(str(tmp_path / "link")).location
    c = open_kv(f"file://{tmp_path}/real/").location
    assert a == b == c and a.local_dir == str((tmp_path / "real").resolve())
    d1, d2 = {}, {}
    assert MappingStore(d1).location == MappingStore(d1).location
    assert MappingStore(d1).location != MappingStore(d2).location
    # nested roots in one process lock a shard alike (the real array directory and the key in it)
    outer = ShardLocks(_local(str(tmp_path / "real")).location, mode="process")
    inner = ShardLocks(_local(str(tmp_path / "real" / "arr")).location, mode="process")
    assert _excludes(outer, "arr/0.0", "arr/", inner, "0.0", "")
    assert stripe_of("0.0", 64) != stripe_of("1.0", 64) and not _excludes(outer, "arr/0.0", "arr/", inner, "1.0", "")


def test_multi_shard_holds_in_any_order_never_deadlock(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(lock_module, "FILE_STRIPES", 8)
    keys = [f"a/{i}.{j}" for i in range(6) for j in range(6)]

    def work(seed: int) -> None:
        rng = random.Random(seed)
        locks = ShardLocks(_local(str(tmp_path)).location)
        for _ in range(30):
            chosen = rng.sample(keys, 5)  # overlapping sets, listed in random order
            with locks.hold(chosen):
                pass

    _run_threads([lambda s=s: work(s) for s in range(6)], timeout=30)


def test_lock_timeout_raises_and_releases_nothing_it_did_not_take(tmp_path) -> None:
    holder = ShardLocks(_local(str(tmp_path)).location)
    waiter = ShardLocks(_local(str(tmp_path)).location, timeout=0.05)
    with holder.hold(["x/0"]):
        started = time.monotonic()
        with pytest.raises(LockTimeoutError) as info:
            with waiter.hold(["x/0"]):
                pass  # never reached
        assert time.monotonic() - started < 5
    assert isinstance(info.value, TimeoutError) and isinstance(info.value, ShardKVError)
    with waiter.hold(["x/0"]):  # free again once the holder let go
        pass


@pytest.mark.parametrize("mode", ["files", "process"])
@pytest.mark.parametrize("timeout", [math.inf, 1e12])
def test_a_lock_timeout_longer_than_any_wait_the_platform_allows_waits_as_long_as_it_takes(
    tmp_path, mode: Mode, timeout: float
) -> None:
    """``threading.Lock.acquire`` refuses timeouts above ``threading.TIMEOUT_MAX``: such a timeout is no limit."""
    locks = ShardLocks(_local(str(tmp_path)).location, mode=mode, timeout=timeout)
    with locks.hold(["x/0", "y/0"]):
        pass
    holder = ShardLocks(_local(str(tmp_path)).location, mode=mode)
    taken, go = threading.Event(), threading.Event()

    def hold_until_told() -> None:
        with holder.hold(["x/0"]):
            taken.set()
            go.wait(60)

    thread = threading.Thread(target=hold_until_told)
    thread.start()
    assert taken.wait(60)
    threading.Timer(0, go.set).start()  # the waiter below waits for this holder, as long as it takes
    with locks.hold(["x/0"]):
        assert go.is_set()
    thread.join(60)


def test_four_spawned_processes_lose_no_increment(tmp_path) -> None:
    # also proves that lock-file stripes agree between processes (each has its own str hash seed)
    n_procs, n_increments = 4, 30
    assert run_counter_processes(str(tmp_path), n_procs, n_increments, timeout=60) == n_procs * n_increments


def test_lock_files_are_bounded_and_never_listed(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(lock_module, "FILE_STRIPES", 4)
    adapter = _local(str(tmp_path))
    _put(adapter, {"arr/.zarray": b"{}", "arr/0.0": b"x"})
    locks = ShardLocks(adapter.location)
    for i in range(50):
        with locks.hold([f"arr/{i}.0", f"arr/0.{i}"]):
            pass
    lock_dir = tmp_path / LOCK_DIR
    assert lock_dir.is_dir() and 1 <= len(os.listdir(lock_dir)) <= 4  # one file per stripe, not per shard
    assert sorted(adapter.list_prefix("")) == ["arr/.zarray", "arr/0.0"]
    assert adapter.list_dir("") == ([], ["arr"])


def test_lock_files_live_in_the_array_directory_whatever_the_root(tmp_path) -> None:
    adapter = _local(str(tmp_path))
    _put(adapter, {"g/arr/zarr.json": b"{}", "g/arr/c/0": b"x"})
    at_root = ShardLocks(adapter.location)
    at_group = ShardLocks(_local(str(tmp_path / "g")).location)
    at_array = ShardLocks(_local(str(tmp_path / "g" / "arr")).location)
    for i in range(20):  # one shard, one lock file, from every root
        k = f"c/{i}"
        views = [(at_root, f"g/arr/{k}", "g/arr/"), (at_group, f"arr/{k}", "arr/"), (at_array, k, "")]
        assert len({lk.lock_file(key, p) for lk, key, p in views}) == 1
    assert _excludes(at_root, "g/arr/c/0", "g/arr/", at_array, "c/0", "")  # and one thread stripe
    with at_root.hold(["g/arr/c/0"], {"g/arr/c/0": "g/arr/"}):
        pass
    assert (tmp_path / "g" / "arr" / LOCK_DIR).is_dir() and not (tmp_path / LOCK_DIR).exists()
    (tmp_path / "zarr.json").write_text("{}")  # a group appearing above changes nothing
    assert os.path.dirname(at_group.lock_file("arr/c/0", "arr/")) == str(tmp_path / "g" / "arr" / LOCK_DIR)
    assert sorted(adapter.list_prefix("")) == ["g/arr/c/0", "g/arr/zarr.json", "zarr.json"]  # locks never listed
    assert adapter.list_dir("g/arr/") == (["zarr.json"], ["c"])
    with pytest.raises(ConfigurationError, match="not under its array prefix"):
        at_root.lock_file("other/c/0", "g/arr/")


def test_a_group_reached_through_a_symbolic_link_takes_the_same_locks(tmp_path) -> None:
    real = tmp_path / "elsewhere" / "sub"
    (real / "arr").mkdir(parents=True)
    (tmp_path / "data.zarr").mkdir()
    (tmp_path / "data.zarr" / "sub").symlink_to(real, target_is_directory=True)
    via_root = ShardLocks(_local(str(tmp_path / "data.zarr")).location)
    via_link = ShardLocks(_local(str(real)).location)
    key_root, key_link = "sub/arr/c/0", "arr/c/0"
    assert (
        via_root.lock_file(key_root, "sub/arr/")
        == via_link.lock_file(key_link, "arr/")
        == str(real / "arr" / LOCK_DIR / f"{stripe_of('c/0', 64)}.lock")
    )
    assert _excludes(via_root, key_root, "sub/arr/", via_link, key_link, "arr/")


def test_in_process_stripes_agree_with_or_without_lock_files_and_through_links(tmp_path) -> None:
    # concurrency="process" takes no lock file: its thread stripe alone must match every other store's
    real = tmp_path / "real"
    (real / "arr").mkdir(parents=True)
    (tmp_path / "link").symlink_to(real, target_is_directory=True)
    key = "arr/c/0"
    views = [
        ShardLocks(_local(str(real)).location),  # "files"
        ShardLocks(_local(str(real)).location, mode="process"),  # "process"
        ShardLocks(_local(str(tmp_path / "link")).location, mode="process"),  # "process", via the link
    ]
    assert _excludes(views[0], key, "arr/", views[1], key, "arr/")
    assert _excludes(views[1], key, "arr/", views[2], key, "arr/")
    from shardkv import ShardedStore

    stores = [
        ShardedStore(str(real)),
        ShardedStore(str(real), concurrency="process"),
        ShardedStore(str(tmp_path / "link"), concurrency="process"),
    ]
    assert _excludes(stores[0].engine.locks, key, "arr/", stores[2].engine.locks, key, "arr/")
    assert _excludes(stores[2].engine.locks, key, "arr/", stores[1].engine.locks, key, "arr/")


def test_a_hold_over_several_arrays_waits_holding_nothing(tmp_path, monkeypatch) -> None:
    # shards of two arrays: another process holds the second array's lock file, so the hold backs off,
    # letting go of the first array's lock file each time (never waiting while holding). A third process
    # takes the first array's lock file once the hold has backed off; only then is the second one let go.
    # A hold that waited while holding the first would keep the third out (the test fails after 30 s).
    adapter = _local(str(tmp_path))
    keys, prefixes = ["a/c/0", "b/c/0"], {"a/c/0": "a/", "b/c/0": "b/"}
    waiter = ShardLocks(adapter.location, timeout=30.0)
    lock_a, lock_b = waiter.lock_file("a/c/0", "a/"), waiter.lock_file("b/c/0", "b/")
    backed_off = threading.Event()
    uniform = random.uniform

    def backoff(low: float, high: float) -> float:  # the hold's back-off delay: it let go of everything
        backed_off.set()
        return uniform(low, high)

    monkeypatch.setattr(random, "uniform", backoff)
    outcome: list[str] = []

    def hold_both() -> None:
        with waiter.hold(keys, prefixes):
            outcome.append("held both")

    with _held_by_another_process(lock_b):
        side = threading.Thread(target=hold_both, daemon=True)
        side.start()
        assert backed_off.wait(30), "the hold never backed off"
        with _held_by_another_process(lock_a):
            assert outcome == []
    side.join(30)
    assert outcome == ["held both"]
    monkeypatch.undo()
    quick = ShardLocks(adapter.location, timeout=0.05)
    with _held_by_another_process(lock_b):
        with pytest.raises(LockTimeoutError):  # and a hold that cannot get every lock file times out
            with quick.hold(keys, prefixes):
                pass  # never reached


def test_released_lock_files_leave_no_descriptor_open(tmp_path) -> None:
    # no table of lock file objects: each hold opens its own descriptor and closes it on release
    locks = ShardLocks(_local(str(tmp_path)).location)
    before = len(os.listdir("/proc/self/fd"))
    for i in range(40):  # 40 arrays, a lock directory each
        key = f"arr{i}/c/{i}"
        with locks.hold([key], {key: f"arr{i}/"}):
            pass
    assert len(os.listdir("/proc/self/fd")) == before


@pytest.mark.parametrize("mode", ["files", "process"])
def test_a_shard_takes_the_thread_stripe_of_its_lock_file(tmp_path, monkeypatch, mode: Mode) -> None:
    # two threads of one process never hold one lock file at once (flock emulated by fcntl on NFS is per process)
    monkeypatch.setattr(lock_module, "FILE_STRIPES", 4)
    locks = ShardLocks(_local(str(tmp_path)).location, mode=mode)
    first = next(i for i in range(1, 64) if stripe_of(f"c/{i}", 4) == stripe_of("c/0", 4))
    assert _excludes(locks, "arr/c/0", "arr/", locks, f"arr/c/{first}", "arr/")  # another shard, one lock file


def test_holds_of_one_lock_file_in_two_threads_exclude_each_other(tmp_path, monkeypatch) -> None:
    # each hold opens its own descriptor; the thread stripe of the lock file keeps the two apart
    monkeypatch.setattr(lock_module, "FILE_STRIPES", 1)
    locks = ShardLocks(_local(str(tmp_path)).location, timeout=0.05)
    entered, leave = threading.Event(), threading.Event()

    def hold_first() -> None:
        with locks.hold(["a/0"]):
            entered.set()
            leave.wait(20)

    side = threading.Thread(target=hold_first, daemon=True)
    side.start()
    assert entered.wait(20)
    with pytest.raises(LockTimeoutError):
        with locks.hold(["a/1"]):  # another shard, the same (only) lock file
            pass
    leave.set()
    side.join(20)
    with locks.hold(["a/1"]):
        pass


def test_deleting_everything_keeps_the_lock_files(tmp_path) -> None:
    # zarr's mode="w" at the root deletes every key; a writer elsewhere may hold a lock file meanwhile
    from shardkv import ShardedStore

    zarr = pytest.importorskip("zarr")
    store = ShardedStore(str(tmp_path), chunks_per_shard=2)
    z = zarr.open_array(store=store, mode="w", shape=(8,), chunks=(2,), dtype="i4")  # a root array
    z[:] = 1
    assert (tmp_path / LOCK_DIR).is_dir()
    store.rmdir("")
    assert os.listdir(tmp_path) == [LOCK_DIR] and list(store) == []


def test_cross_process_needs_a_directory() -> None:
    with pytest.raises(ConfigurationError, match="directory for lock files"):
        ShardLocks(StoreLocation(("s3", None), "bucket/data"), mode="files")
    assert not ShardLocks(MappingStore({}).location).cross_process


def test_pickled_locks_find_the_same_locks(tmp_path) -> None:
    locks = ShardLocks(_local(str(tmp_path)).location, timeout=0.05)
    clone = pickle.loads(pickle.dumps(locks))
    assert clone.location == locks.location and clone.lock_dir == locks.lock_dir and clone.timeout == 0.05
    with locks.hold(["s/0"]):
        with pytest.raises(LockTimeoutError):
            with clone.hold(["s/0"]):
                pass


def _take_in_child(root: str, queue) -> None:  # runs in a forked child
    locks = ShardLocks(_local(root).location, mode="process", timeout=5)
    try:
        with locks.hold(["k/0"]):
            queue.put("ok")
    except LockTimeoutError as exc:
        queue.put(f"timeout: {exc}")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_does_not_inherit_a_held_lock(tmp_path) -> None:
    locks = ShardLocks(_local(str(tmp_path)).location, mode="process")
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    with locks.hold(["k/0"]):  # held by this process while it forks
        child = ctx.Process(target=_take_in_child, args=(str(tmp_path), queue))
        child.start()
        child.join(20)
    assert child.exitcode == 0
    assert queue.get(timeout=5) == "ok"


# -- the concurrency= option (ShardLocks.of_store) -------------------------------------


class _PlainFS(fsspec.AbstractFileSystem):
    """An fsspec filesystem with neither a local directory nor conditional writes."""

    protocol = "plainfs"
    cachable = False


def test_auto_concurrency_picks_files_conditional_or_refuses(tmp_path) -> None:
    local = ShardLocks.of_store(_local(str(tmp_path)))
    assert local.mode == "files" and local.cross_process and not local.optimistic
    mapping = ShardLocks.of_store(MappingStore({}))
    assert mapping.mode == "conditional" and not mapping.cross_process and mapping.optimistic
    assert ShardLocks.of_store(open_kv("memory://plan"), "auto").mode == "conditional"
    # a store with neither (stands for gcs/abfs/http here): never a silent choice
    other = FsspecStore(_PlainFS(), "bucket/x")
    with pytest.raises(ConfigurationError, match="neither lock files nor conditional writes"):
        ShardLocks.of_store(other)
    assert ShardLocks.of_store(other, "process").mode == "process"
    nothing = ShardLocks.of_store(other, "none", timeout=0.05)
    with nothing.hold(["k"]), nothing.hold(["k"]):  # no lock is taken: the same shard twice does not wait
        assert nothing.mode == "none"
    with pytest.raises(ConfigurationError, match="needs a store in a directory"):
        ShardLocks.of_store(other, "files")
    with pytest.raises(ConfigurationError, match="concurrency must be one of"):
        Options(concurrency="sometimes")  # checked once, where the option enters


def test_engines_of_the_proxy_and_the_transformer_take_their_locks_from_the_location(tmp_path) -> None:
    from shardkv import ShardedStore
    from shardkv.transformers import AdapterStore, ShardingStorageTransformer

    proxy = ShardedStore(str(tmp_path), chunks_per_shard=2)
    assert proxy.concurrency_mode == "files" and proxy.engine.locks.lock_dir == os.path.join(
        os.path.realpath(str(tmp_path)), ".shardkv-locks"
    )
    assert ShardedStore({}, concurrency="none").engine.locks.mode == "none"
    over_dir = ShardingStorageTransformer(AdapterStore(str(tmp_path)), [2])
    assert over_dir.concurrency_mode == "files"
    assert over_dir.engine.locks.lock_dir == proxy.engine.locks.lock_dir  # one directory, one set of locks
    assert ShardingStorageTransformer(AdapterStore({}), [2]).concurrency_mode == "conditional"
    assert ShardingStorageTransformer(str(tmp_path), [2]).engine.kv.location == proxy.engine.kv.location
