"""Generation-conditional writes of the store interface (shardkv.storage.kv).

Against a real S3-protocol server (moto on 127.0.0.1): If-Match /
If-None-Match refusals (412) are told apart from other errors, two writers
racing on one key with conditional puts never lose an update, and racing
conditional puts have one winner. Stores whose data lives in this process (a
dict) serialise threads through process stamps. The per-call contract of
conditional reads, puts and deletes is ``tests/kv_contract.py``, run for every
store kind; the engine's retry loop is ``tests/test_engine.py``.
"""

from __future__ import annotations

import json
import pickle
import sys
import threading
import time
import uuid

import fsspec
import pytest
from concurrency_harness import MotoS3, moto_s3  # noqa: F401  (fixture)

from shardkv.engine.retry import EngineStats
from shardkv.storage.fsspec import FsspecStore
from shardkv.storage.kv import NO_VALUE, KVStore
from shardkv.storage.mapping import MappingStore
from shardkv.storage.open import kv_of_fs, open_kv
from shardkv.storage.s3 import S3Store, is_precondition_failure


def _s3(moto_s3: MotoS3) -> S3Store:  # noqa: F811
    return S3Store(moto_s3.filesystem(), f"{moto_s3.bucket}/{uuid.uuid4().hex[:8]}")


def _append_token(token: str):
    def merge(current: bytes | None) -> bytes:
        items = [] if current is None else json.loads(current)
        return json.dumps([*items, token]).encode()

    return merge


def _update(kv: KVStore, key: str, merge, max_attempts: int, wait: float = 0.0) -> int:
    """Read, merge, put conditioned on the generation read, until a put wins; the lost races."""
    for attempt in range(max_attempts):
        read = kv.get(key)
        current = bytes(read.whole()) if read.found else None
        if kv.put(key, merge(current), if_generation=read.generation) is not None:
            return attempt
        time.sleep(wait)
    raise AssertionError(f"{key!r}: every one of {max_attempts} attempts lost its race")


def test_s3_precondition_failure_is_found_in_the_exception_chain(moto_s3) -> None:  # noqa: F811
    kv = _s3(moto_s3)
    fs = kv.fs
    fs.pipe_file(f"{kv.root}/k", b"1")
    with pytest.raises(Exception) as info:
        fs.pipe_file(f"{kv.root}/k", b"2", IfNoneMatch="*")
    assert is_precondition_failure(info.value)
    with pytest.raises(FileNotFoundError) as missing:
        fs.cat_file(f"{kv.root}/nothing")
    assert not is_precondition_failure(missing.value)


def test_s3_errors_other_than_a_lost_race_propagate(moto_s3) -> None:  # noqa: F811
    kv = S3Store(moto_s3.filesystem(), "no-such-bucket-here/x")
    with pytest.raises(Exception) as info:
        kv.put("k", b"v", if_generation=NO_VALUE)
    assert not isinstance(info.value, KeyError) and not is_precondition_failure(info.value)


def test_two_writers_racing_with_conditional_puts_lose_no_update(moto_s3) -> None:  # noqa: F811
    """Both writers read, meet at a barrier, then both write: every round one of them loses and retries."""
    root = f"{moto_s3.bucket}/race-{uuid.uuid4().hex[:8]}"
    S3Store(moto_s3.filesystem(), root).put("counter", b"[]", if_generation=NO_VALUE)
    n_rounds = 6
    barrier = threading.Barrier(2, timeout=20)
    results: dict[str, object] = {}

    def writer(name: str) -> None:
        kv = S3Store(moto_s3.filesystem(), root)  # own client, as another process would have
        failures = 0
        try:
            for r in range(n_rounds):
                first = [True]

                def merge(current: bytes | None, r: int = r, first: list = first) -> bytes:
                    if first[0]:  # collide on the first attempt of every round
                        first[0] = False
                        try:
                            barrier.wait()
                        except threading.BrokenBarrierError:
                            pass  # the other writer finished its rounds
                    return _append_token(f"{name}{r}")(current)

                failures += _update(kv, "counter", merge, max_attempts=50, wait=0.001)
            results[name] = failures
        except Exception as exc:  # reported below
            results[name] = exc
        finally:
            barrier.abort()

    threads = [threading.Thread(target=writer, args=(n,), daemon=True) for n in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert all(isinstance(v, int) for v in results.values()), results
    tokens = json.loads(bytes(S3Store(moto_s3.filesystem(), root).get("counter").whole()))
    assert sorted(tokens) == sorted(f"{n}{r}" for n in "ab" for r in range(n_rounds))  # nothing lost
    assert sum(results.values()) >= 1  # the server did refuse (412) and the loser retried


def test_process_stamps_serialise_threads_of_a_mapping() -> None:
    shared: dict = {}
    n_threads, n_rounds = 6, 25

    def work(i: int) -> None:
        kv = MappingStore(shared)  # one object per thread, one location
        for r in range(n_rounds):
            _update(kv, "k", _append_token(f"{i}.{r}"), max_attempts=200, wait=0.0005)

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(n_threads)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    assert len(json.loads(shared["k"])) == n_threads * n_rounds


def test_which_stores_have_conditional_writes(tmp_path, moto_s3) -> None:  # noqa: F811
    assert MappingStore({}).caps.in_process  # process stamps are exact: conditional in this process
    assert open_kv("memory://cond-check").caps.in_process
    s3 = kv_of_fs(moto_s3.filesystem(), f"{moto_s3.bucket}/x")
    assert isinstance(s3, S3Store) and s3.caps.conditional_put
    local = open_kv(str(tmp_path))
    assert not local.caps.conditional_put and local.caps.lock_dir  # local files use lock files instead


def test_s3_store_pickles(moto_s3) -> None:  # noqa: F811
    kv = _s3(moto_s3)
    kv.put("p", b"v")
    clone = pickle.loads(pickle.dumps(kv))
    assert clone.location == kv.location
    assert (bytes(clone.get("p").whole()), clone.get("p").generation) == (b"v", kv.get("p").generation)


def test_memory_locations_are_process_global() -> None:
    a = open_kv("memory://shared-root")
    b = FsspecStore(fsspec.filesystem("memory"), "/shared-root")
    assert a.location == b.location


# -- whole ShardedStores writing one S3 array with compare-and-swap (shardkv.engine.writes) ---------


def test_two_sharded_stores_on_s3_with_cas_lose_no_chunk(moto_s3) -> None:  # noqa: F811
    zarr = pytest.importorskip("zarr")
    if not zarr.__version__.startswith("2."):
        pytest.skip("zarr-python 2 only")
    from shardkv import ShardedStore

    url = f"s3://{moto_s3.bucket}/cas-{uuid.uuid4().hex[:8]}"
    options = {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": moto_s3.endpoint_url, "region_name": "us-east-1"},
        "skip_instance_cache": True,  # one client per store, as in separate processes
    }
    n_chunks, chunk_len = 16, 4
    setup = ShardedStore(url, chunks_per_shard=8, storage_options=options)
    zarr.open_array(store=setup, mode="w", shape=(n_chunks * chunk_len,), chunks=(chunk_len,), dtype="i4", fill_value=0)
    barrier = threading.Barrier(2, timeout=30)
    stats: dict[int, EngineStats] = {}
    errors: list[BaseException] = []

    def writer(w: int) -> None:
        try:
            store = ShardedStore(url, chunks_per_shard=8, storage_options=options)
            assert store.concurrency_mode == "conditional"  # chosen by "auto" for s3fs
            stats[w] = store.engine.stats
            arr = zarr.open_array(store=store, mode="r+")
            barrier.wait()
            for c in range(w, n_chunks, 2):  # interleaved: both writers update both shards
                arr[c * chunk_len : (c + 1) * chunk_len] = c + 1
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(w,), daemon=True) for w in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert not any(t.is_alive() for t in threads) and errors == []
    data = zarr.open_array(store=ShardedStore(url, storage_options=options), mode="r")[:]
    lost = [c for c in range(n_chunks) if not (data[c * chunk_len : (c + 1) * chunk_len] == c + 1).all()]
    assert lost == []
    assert sum(s.write_attempts for s in stats.values()) >= n_chunks  # every chunk write ran as a transaction


def test_racing_conditional_puts_have_one_winner(moto_s3) -> None:  # noqa: F811
    """What real S3 promises and the ``moto_s3`` fixture adds to moto (``moto_strict.install``).

    Eight writers put one key from the same generation at once: exactly one
    may win each round (``If-Match``, and ``If-None-Match: *`` for a new key).
    A short GIL switch interval makes the server threads interleave: without
    the fixture's lock, moto 5.2.5 let two win in 3 of 4 runs of this test.
    """
    root = f"{moto_s3.bucket}/racers-{uuid.uuid4().hex[:8]}"
    n_racers, n_rounds = 8, 20
    stores = [S3Store(moto_s3.filesystem(), root) for _ in range(n_racers)]
    winners: list[list[int]] = []
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        for r in range(n_rounds):
            key = f"k{r}"
            expected = NO_VALUE if r % 2 else stores[0].put(key, b"base")  # odd rounds: a new key
            barrier = threading.Barrier(n_racers, timeout=20)
            won: list[int] = []

            def race(i: int, key: str = key, expected=expected, barrier=barrier, won=won) -> None:
                barrier.wait()
                if stores[i].put(key, b"racer %d" % i + bytes(1 << 16), if_generation=expected) is not None:
                    won.append(i)

            threads = [threading.Thread(target=race, args=(i,), daemon=True) for i in range(n_racers)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            winners.append(won)
    finally:
        sys.setswitchinterval(interval)
    assert [len(w) for w in winners] == [1] * n_rounds, winners
