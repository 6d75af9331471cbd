"""Generation-conditional writes (shardkv.storage.conditional, issue 9).

Against a real S3-protocol server (moto on 127.0.0.1): the ETag read with the
bytes, If-Match / If-None-Match refusals (412), two writers racing on one key
with compare-and-swap never losing an update, and a lost race that really
happens and is retried. The in-process emulation (dict, ``memory://``) passes
the same contract.
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

from shardkv.engine.retry import Backoff, EngineStats, RetryStats, update_with_retry
from shardkv.errors import ConcurrentUpdateError, ShardKVError
from shardkv.format.ranges import ByteRange
from shardkv.storage.adapters import FSMapAdapter, MappingAdapter, adapt
from shardkv.storage.choose_conditional import conditional_store_for, supports_conditional_writes
from shardkv.storage.conditional import (
    ConditionalStore,
    InProcessConditional,
    S3Conditional,
    is_precondition_failure,
)

NO_WAIT = Backoff(initial=0.0, maximum=0.0, jitter=False)


def _s3(moto_s3: MotoS3) -> S3Conditional:  # noqa: F811
    return S3Conditional(moto_s3.filesystem(), f"{moto_s3.bucket}/{uuid.uuid4().hex[:8]}")


@pytest.fixture(params=["s3", "dict", "memory"])
def cond(request) -> ConditionalStore:
    if request.param == "s3":  # the server only for the s3 case
        return _s3(request.getfixturevalue("moto_s3"))
    if request.param == "dict":
        return conditional_store_for(MappingAdapter({}))
    return conditional_store_for(adapt(f"memory://cond-{uuid.uuid4().hex[:8]}"))


def test_compare_and_swap_contract(cond: ConditionalStore) -> None:
    assert cond.read_with_generation("a/0.0") == (None, None)
    ok, g1 = cond.swap("a/0.0", b"hello world", None)  # create only if absent
    assert ok and g1 is not None
    assert cond.swap("a/0.0", b"other", None) == (False, None)  # exists now: refused
    value, g = cond.read_with_generation("a/0.0")
    assert (value, g) == (b"hello world", g1)
    # byte ranges come with the generation of the whole value
    assert cond.read_with_generation("a/0.0", ByteRange.suffix(5)) == (b"world", g1)
    assert cond.read_with_generation("a/0.0", ByteRange(2, 5)) == (b"llo", g1)
    assert cond.read_with_generation("a/0.0", ByteRange(6)) == (b"world", g1)
    # reads pinned to a generation (index read first, chunk bytes after)
    assert cond.read_if_generation("a/0.0", ByteRange(0, 5), g1) == (True, b"hello")
    assert cond.read_if_generation("a/0.0", ByteRange(0, 5), "stale-generation") == (False, None)
    assert cond.read_if_generation("nothing", None, g1) == (False, None)
    assert cond.write_if_generation("a/0.0", b"new", "stale-generation") is False
    assert cond.read_with_generation("a/0.0")[0] == b"hello world"  # a refused write writes nothing
    ok, g2 = cond.swap("a/0.0", b"new", g1)
    assert ok and g2 != g1 and cond.read_with_generation("a/0.0") == (b"new", g2)
    assert cond.read_if_generation("a/0.0", ByteRange(0, 5), g1) == (False, None)  # an index of g1 is stale now
    assert cond.delete_if_generation("a/0.0", g1) is False
    assert cond.read_with_generation("a/0.0")[0] == b"new"
    assert cond.delete_if_generation("a/0.0", g2) is True
    assert cond.read_with_generation("a/0.0") == (None, None)


def test_s3_precondition_failure_is_found_in_the_exception_chain(moto_s3) -> None:  # noqa: F811
    cond = _s3(moto_s3)
    fs = cond.fs
    fs.pipe_file(f"{cond.root}/k", b"1")
    with pytest.raises(Exception) as info:
        fs.pipe_file(f"{cond.root}/k", b"2", IfNoneMatch="*")
    assert is_precondition_failure(info.value)
    with pytest.raises(FileNotFoundError) as missing:
        fs.cat_file(f"{cond.root}/nothing")
    assert not is_precondition_failure(missing.value)


def test_s3_errors_other_than_a_lost_race_propagate(moto_s3) -> None:  # noqa: F811
    cond = S3Conditional(moto_s3.filesystem(), "no-such-bucket-here/x")
    with pytest.raises(Exception) as info:
        cond.swap("k", b"v", None)
    assert not isinstance(info.value, KeyError) and not is_precondition_failure(info.value)


def _append_token(token: str):
    def merge(current: bytes | None) -> bytes:
        items = [] if current is None else json.loads(current)
        return json.dumps([*items, token]).encode()

    return merge


def test_a_lost_race_is_counted_and_retried(cond: ConditionalStore) -> None:
    cond.swap("k", b"[]", None)
    interfered = []

    def merge(current: bytes | None) -> bytes:
        if not interfered:  # another writer slips in between our read and our write, once
            _, generation = cond.read_with_generation("k")
            assert cond.write_if_generation("k", _append_token("other")(current), generation)
            interfered.append(1)
        return _append_token("mine")(current)

    stats = update_with_retry(
        lambda: cond.read_with_generation("k"), merge, lambda v, g: cond.swap("k", v, g), backoff=NO_WAIT, key="k"
    )
    assert stats.attempts == 2 and stats.precondition_failures == 1
    value, generation = cond.read_with_generation("k")
    assert json.loads(value) == ["other", "mine"] and generation == stats.generation


def test_every_attempt_lost_raises_with_counts() -> None:
    waits: list[float] = []
    with pytest.raises(ConcurrentUpdateError) as info:
        update_with_retry(
            lambda: (b"", "g"), lambda c: c, lambda v, g: False, max_attempts=4, backoff=Backoff(0.01, 2, 0.02, False),
            key="arr/0.0", sleep=waits.append,
        )  # fmt: skip
    err = info.value
    assert (err.key, err.attempts, err.precondition_failures) == ("arr/0.0", 4, 4)
    assert waits == [0.01, 0.02, 0.02]  # exponential, capped; no wait after the last attempt
    assert isinstance(err, RuntimeError) and isinstance(err, ShardKVError)


def test_two_writers_racing_with_cas_lose_no_update(moto_s3) -> None:  # noqa: F811
    """Both writers read, meet at a barrier, then both write: every round one of them loses and retries."""
    root = f"{moto_s3.bucket}/race-{uuid.uuid4().hex[:8]}"
    S3Conditional(moto_s3.filesystem(), root).swap("counter", b"[]", None)
    n_rounds = 6
    barrier = threading.Barrier(2, timeout=20)
    results: dict[str, object] = {}

    def writer(name: str) -> None:
        cond = S3Conditional(moto_s3.filesystem(), root)  # own client, as another process would have
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

                stats = update_with_retry(
                    lambda: cond.read_with_generation("counter"), merge,
                    lambda v, g: cond.swap("counter", v, g), max_attempts=50, backoff=Backoff(0.001, 2, 0.02),
                )  # fmt: skip
                failures += stats.precondition_failures
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
    tokens = json.loads(S3Conditional(moto_s3.filesystem(), root).read_with_generation("counter")[0])
    assert sorted(tokens) == sorted(f"{n}{r}" for n in "ab" for r in range(n_rounds))  # nothing lost
    assert sum(results.values()) >= 1  # the server did refuse (412) and the loser retried


def test_in_process_emulation_serialises_threads() -> None:
    shared: dict = {}
    n_threads, n_rounds = 6, 25

    def work(i: int) -> None:
        cond = conditional_store_for(MappingAdapter(shared))  # one object per thread, one location
        for r in range(n_rounds):
            update_with_retry(
                lambda: cond.read_with_generation("k"), _append_token(f"{i}.{r}"),
                lambda v, g: cond.swap("k", v, g), max_attempts=200, backoff=Backoff(0.0, 2, 0.001),
            )  # fmt: skip

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(n_threads)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    assert len(json.loads(shared["k"])) == n_threads * n_rounds


def test_emulation_sees_writes_that_bypass_it() -> None:
    shared: dict = {"k": b"1"}
    cond = InProcessConditional.for_mapping(shared)
    _, generation = cond.read_with_generation("k")
    shared["k"] = b"2"  # a plain write, not through the conditional store
    assert cond.write_if_generation("k", b"3", generation) is False


def test_which_stores_support_conditional_writes(tmp_path, moto_s3) -> None:  # noqa: F811
    assert supports_conditional_writes(MappingAdapter({}))
    assert supports_conditional_writes(adapt("memory://cond-check"))
    assert isinstance(conditional_store_for(FSMapAdapter(moto_s3.filesystem(), f"{moto_s3.bucket}/x")), S3Conditional)
    assert not supports_conditional_writes(adapt(str(tmp_path)))  # local files use lock files instead


def test_s3_conditional_pickles(moto_s3) -> None:  # noqa: F811
    cond = _s3(moto_s3)
    cond.swap("p", b"v", None)
    clone = pickle.loads(pickle.dumps(cond))
    assert clone.location == cond.location and clone.read_with_generation("p") == cond.read_with_generation("p")


def test_memory_locations_are_process_global() -> None:
    a = conditional_store_for(adapt("memory://shared-root"))
    b = conditional_store_for(FSMapAdapter(fsspec.filesystem("memory"), "/shared-root"))
    assert a.location == b.location


# -- whole ShardedStores writing one S3 array with compare-and-swap (shardkv.engine.cas) ---------


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


def test_tracking_adapter_retries_a_whole_write_after_a_lost_race() -> None:
    from shardkv.engine.cas import GenerationTrackingAdapter, run_conditionally
    from shardkv.errors import LostRaceError

    shared = {"s/0": b"a"}
    inner = MappingAdapter(shared)
    tracker = GenerationTrackingAdapter(inner, conditional_store_for(inner))
    runs = []

    def write() -> None:  # merge into s/0, write s/1 whole (never read: written blind)
        old = tracker.get_many(["s/0"])["s/0"]
        if not runs:
            shared["s/0"] = b"a+other"  # another writer, between our read and our write
        runs.append(old)
        tracker.set_many({"s/0": old + b"+mine", "s/1": b"whole"})

    stats = RetryStats()
    run_conditionally(write, tracker, backoff=NO_WAIT, stats=stats)
    assert (stats.attempts, stats.precondition_failures) == (2, 1)
    assert runs == [b"a", b"a+other"] and shared == {"s/0": b"a+other+mine", "s/1": b"whole"}
    tracker.set_many({"s/0": b"plain"})  # outside a transaction: unconditional, passed through
    assert shared["s/0"] == b"plain"
    with pytest.raises(ConcurrentUpdateError):
        run_conditionally(lambda: (_ for _ in ()).throw(LostRaceError("s/0")), tracker, max_attempts=2, backoff=NO_WAIT)


def test_racing_conditional_puts_have_one_winner(moto_s3) -> None:  # noqa: F811
    """What real S3 promises and the ``moto_s3`` fixture adds to moto (``serialised_moto_writes``).

    Eight writers swap one key from the same generation at once: exactly one
    may win each round (``If-Match``, and ``If-None-Match: *`` for a new key).
    A short GIL switch interval makes the server threads interleave: without
    the fixture's lock, moto 5.2.5 let two win in 3 of 4 runs of this test.
    """
    root = f"{moto_s3.bucket}/racers-{uuid.uuid4().hex[:8]}"
    n_racers, n_rounds = 8, 20
    conds = [S3Conditional(moto_s3.filesystem(), root) for _ in range(n_racers)]
    winners: list[list[int]] = []
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        for r in range(n_rounds):
            key = f"k{r}"
            expected = None if r % 2 else conds[0].swap(key, b"base", None)[1]  # odd rounds: a new key
            barrier = threading.Barrier(n_racers, timeout=20)
            won: list[int] = []

            def race(i: int, key: str = key, expected=expected, barrier=barrier, won=won) -> None:
                barrier.wait()
                if conds[i].swap(key, b"racer %d" % i + bytes(1 << 16), expected)[0]:
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
