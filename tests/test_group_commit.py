"""Group commit: concurrent writes of one shard in one process are merged into one read-modify-write.

The first write of a shard starts its commit; writes of that shard arriving
while it runs join the next commit, which stores all of them with one shard
put. The overlap is made deterministic: the store holds the first shard put
until every other writer has queued its change for the next commit
(``engine.stats.writes_queued`` counts them; the engines below get counters
that wake the test when it moves), so no count below depends on timing. Every
wait is bounded.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

import pytest
from engine_kv import CountingKV

from shardkv.engine.engine import ShardEngine
from shardkv.engine.merge import ChunkPatch, ShardChange
from shardkv.engine.options import Options
from shardkv.engine.retry import EngineStats
from shardkv.errors import LockTimeoutError
from shardkv.format.layout import ShardLayout
from shardkv.keys.space import ShardedArray, V2ChunkKeyEncoding
from shardkv.storage.kv import Generation, Value

WAIT_S = 30.0  # the longest any wait below may take (a broken mechanism fails instead of hanging)
N_WRITERS = 8


def _array(cps: tuple[int, ...] = (4, 4)) -> ShardedArray:
    enc = V2ChunkKeyEncoding(".")
    return ShardedArray("a", "a/", (16, 16), (2, 2), ShardLayout.v3(cps), enc, enc)


def _change(arr: ShardedArray, coords: tuple[int, ...], value: object) -> dict[str, ShardChange]:
    ref = arr.locate(arr.chunk_key(coords))
    return {ref.shard_key: ShardChange(arr, ref.shard_coords, {ref.local_coords: value})}  # type: ignore[dict-item]


def _wait_for(condition, what: str) -> None:
    """Wait until ``condition()`` holds: re-checked every millisecond, failing after ``WAIT_S`` seconds.

    Only for a state the engine shows through nothing but its own attributes (a
    commit waiting for a lock); counts of queued writes are waited for on
    :class:`QueuedStats` instead.
    """
    pause = threading.Event()
    for _ in range(int(WAIT_S * 1000)):
        if condition():
            return
        pause.wait(0.001)
    pytest.fail(f"gave up after {WAIT_S:g} s waiting for {what}")


class QueuedStats(EngineStats):
    """The engine's counters, waking waiters of :meth:`wait_queued` when ``writes_queued`` moves.

    The writer counts a queued change under its own guard, before it waits for
    the running commit: once the count is reached, those changes are in the
    next commit.
    """

    def __setattr__(self, name: str, value: object) -> None:
        changed = self.__dict__.get("_changed")
        if name != "writes_queued" or changed is None:
            object.__setattr__(self, name, value)
            return
        with changed:
            object.__setattr__(self, name, value)
            changed.notify_all()

    def __init__(self) -> None:
        super().__init__()
        object.__setattr__(self, "_changed", threading.Condition())

    def wait_queued(self, n: int, what: str) -> None:
        """Wait until ``writes_queued`` is at least ``n`` (failing after ``WAIT_S`` seconds)."""
        changed: threading.Condition = self.__dict__["_changed"]
        with changed:
            if not changed.wait_for(lambda: self.writes_queued >= n, WAIT_S):
                pytest.fail(f"gave up after {WAIT_S:g} s waiting for {what}")


def _engine(kv: CountingKV, options: Options | None = None) -> tuple[ShardEngine, QueuedStats]:
    """An engine over ``kv`` whose writes count into :class:`QueuedStats` (its public ``stats`` attributes)."""
    engine = ShardEngine(kv, options)
    stats = QueuedStats()
    engine.stats = engine.writes.stats = engine.reads.stats = stats
    return engine, stats


class HeldKV(CountingKV):
    """A counting store whose first put waits inside the store until the test lets it go.

    ``fail_first``: that held put raises instead of storing, after the release.
    """

    def __init__(self, fail_first: bool = False) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()
        self.fail_first = fail_first
        self._first = True

    def put_many(self, writes: Mapping[str, tuple[Value | None, Generation]]) -> dict[str, Generation | None]:
        if self._first:
            self._first = False
            self.entered.set()
            if not self.release.wait(WAIT_S):
                raise TimeoutError("the test never released the held put")
            if self.fail_first:
                raise OSError(5, "injected write error", "a/0.0")
        return super().put_many(writes)

    def shard_puts(self) -> list[str]:
        return [key for op, key, _, _ in self.log if op == "put"]


def _hold_first_round(kv: HeldKV, stats: QueuedStats, submit, n_joining: int) -> None:
    """Run ``submit(0)`` until its put is held in the store, then ``submit(1..n_joining)``; release once all joined."""
    submit(0)
    assert kv.entered.wait(WAIT_S), "the first write never reached the store"
    for i in range(1, n_joining + 1):
        submit(i)
    stats.wait_queued(n_joining, f"{n_joining} writes to queue for the next commit")
    kv.release.set()


def test_concurrent_writers_of_one_shard_are_merged_into_two_shard_puts() -> None:
    kv, arr = HeldKV(), _array()
    engine, stats = _engine(kv)
    coords = [(i // 4, i % 4) for i in range(N_WRITERS)]  # distinct chunks of shard a/0.0
    with ThreadPoolExecutor(N_WRITERS) as pool:
        futures = []
        _hold_first_round(
            kv,
            stats,
            lambda i: futures.append(pool.submit(engine.writes.write, _change(arr, coords[i], bytes([i + 1]) * 3))),
            N_WRITERS - 1,
        )
        for future in futures:
            future.result(WAIT_S)
    assert kv.shard_puts() == ["a/0.0", "a/0.0"]  # the first write's commit, then one for the other seven
    fresh = ShardEngine(kv)  # nothing lost: every chunk reads back from the store
    found = fresh.reads.read_chunks([arr.locate(arr.chunk_key(c)) for c in coords])
    assert {k: bytes(v) for k, v in found.items()} == {
        arr.chunk_key(c): bytes([i + 1]) * 3 for i, c in enumerate(coords)
    }


def test_a_commit_error_reaches_every_writer_of_that_commit_and_no_other() -> None:
    kv, arr = HeldKV(fail_first=True), _array()
    engine, stats = _engine(kv)
    with ThreadPoolExecutor(4) as pool:
        futures = []
        # the first write's commit fails; the three that joined the next one are stored
        _hold_first_round(
            kv,
            stats,
            lambda i: futures.append(pool.submit(engine.writes.write, _change(arr, (0, i), bytes([i + 1])))),
            3,
        )
        with pytest.raises(OSError, match="injected write error"):
            futures[0].result(WAIT_S)
        for future in futures[1:]:
            future.result(WAIT_S)
    found = ShardEngine(kv).reads.read_chunks([arr.locate(arr.chunk_key((0, i))) for i in range(4)])
    assert sorted(found) == ["a/0.1", "a/0.2", "a/0.3"]


def test_a_bad_change_in_a_merged_commit_fails_its_own_call_and_no_other() -> None:
    kv, arr = HeldKV(), _array()
    engine, stats = _engine(kv)
    with ThreadPoolExecutor(4) as pool:
        futures = []

        def submit(i: int) -> None:
            # writer 3 patches a chunk nobody stored at byte 5: a gap, refused; the writers beside it are stored
            value = ChunkPatch("a/1.3", [(5, b"x")]) if i == 3 else bytes([i + 1])
            futures.append(pool.submit(engine.writes.write, _change(arr, (1, i), value)))

        _hold_first_round(kv, stats, submit, 3)
        for future in futures[:3]:
            future.result(WAIT_S)
        with pytest.raises(ValueError, match="gap"):
            futures[3].result(WAIT_S)
    found = ShardEngine(kv).reads.read_chunks([arr.locate(arr.chunk_key((1, i))) for i in range(4)])
    assert {k: bytes(v) for k, v in found.items()} == {"a/1.0": b"\x01", "a/1.1": b"\x02", "a/1.2": b"\x03"}


def test_a_patch_refused_by_joining_it_to_an_earlier_writers_value_fails_its_own_call_alone() -> None:
    kv, arr = HeldKV(), _array()
    engine, stats = _engine(kv)
    values: list[object] = [b"first", b"ab", ChunkPatch("a/0.1", [(5, b"x")]), b"other"]
    with ThreadPoolExecutor(4) as pool:
        futures = []

        def submit(i: int) -> None:
            coords = [(0, 0), (0, 1), (0, 1), (0, 2)][i]
            futures.append(pool.submit(engine.writes.write, _change(arr, coords, values[i])))
            if i:  # one at a time, so the order they join in is known
                stats.wait_queued(i, f"write {i} to queue")

        _hold_first_round(kv, stats, submit, 3)
        for i in (0, 1, 3):
            futures[i].result(WAIT_S)
        with pytest.raises(ValueError, match="gap"):
            futures[2].result(WAIT_S)
    found = ShardEngine(kv).reads.read_chunks([arr.locate(k) for k in ("a/0.0", "a/0.1", "a/0.2")])
    assert {k: bytes(v) for k, v in found.items()} == {"a/0.0": b"first", "a/0.1": b"ab", "a/0.2": b"other"}


def test_a_bad_change_of_one_shard_fails_no_other_callers_change_of_another_shard() -> None:
    kv, arr = HeldKV(), _array()
    engine, stats = _engine(kv)
    a, b = (arr.locate(arr.chunk_key(c)) for c in ((0, 0), (4, 4)))  # shards a/0.0 and a/1.1
    bad = {
        a.shard_key: ShardChange(arr, a.shard_coords, {a.local_coords: ChunkPatch(a.chunk_key, [(5, b"x")])}),
        b.shard_key: ShardChange(arr, b.shard_coords, {b.local_coords: b"mine"}),
    }
    good = {b.shard_key: ShardChange(arr, b.shard_coords, {(0, 1): b"theirs"}), **_change(arr, (0, 2), b"theirs")}
    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(engine.writes.write, _change(arr, (0, 1), b"first"))]  # held in the store
        assert kv.entered.wait(WAIT_S)
        futures.append(pool.submit(engine.writes.write, bad))  # starts both shards' next commits
        stats.wait_queued(1, "the bad call to queue for a/0.0")
        futures.append(pool.submit(engine.writes.write, good))  # joins both
        stats.wait_queued(2, "the good call to queue for a/0.0")
        kv.release.set()
        futures[0].result(WAIT_S)
        with pytest.raises(ValueError, match="gap"):
            futures[1].result(WAIT_S)
        futures[2].result(WAIT_S)
    found = ShardEngine(kv).reads.read_chunks([arr.locate(k) for k in ("a/0.1", "a/0.2", "a/4.4", "a/4.5")])
    assert {k: bytes(v) for k, v in found.items()} == {
        "a/0.1": b"first",
        "a/0.2": b"theirs",
        "a/4.4": b"mine",  # the bad call's change of the other shard is stored too: only its bad shard is refused
        "a/4.5": b"theirs",
    }


def test_joined_writes_of_one_chunk_apply_in_arrival_order() -> None:
    kv, arr = HeldKV(), _array()
    engine, stats = _engine(kv)
    engine_write = engine.writes.write
    values: list[object] = [b"first", b"abcdef", ChunkPatch("a/0.1", [(1, b"XY")]), ChunkPatch("a/0.1", [(-1, b"!")])]
    with ThreadPoolExecutor(4) as pool:
        futures = []

        def submit(i: int) -> None:
            coords = (0, 0) if i == 0 else (0, 1)
            futures.append(pool.submit(engine_write, _change(arr, coords, values[i])))
            if i:  # one at a time, so the order they join in is known
                stats.wait_queued(i, f"write {i} to queue")

        _hold_first_round(kv, stats, submit, 3)
        for future in futures:
            future.result(WAIT_S)
    found = ShardEngine(kv).reads.read_chunks([arr.locate("a/0.1")])
    assert bytes(found["a/0.1"]) == b"aXYde!"
    assert kv.shard_puts() == ["a/0.0", "a/0.0"]


def test_a_write_inside_its_own_threads_hold_of_the_shard_ends_with_a_lock_timeout() -> None:
    """No write is made while its thread holds shard locks (stacked draft transformers are refused): one that
    is waits for that thread's own lock like any other writer, until the lock timeout, naming the shard."""
    kv, arr = CountingKV(), _array()
    engine, _ = _engine(kv, Options(lock_timeout=0.05))
    ref = arr.locate(arr.chunk_key((0, 0)))
    with engine.locks.hold_arrays({ref.shard_key: arr}):
        with pytest.raises(LockTimeoutError) as info:
            engine.writes.write({ref.shard_key: ShardChange(arr, ref.shard_coords, {ref.local_coords: b"x"})})
    assert info.value.shard_key == ref.shard_key
    engine.writes.write({ref.shard_key: ShardChange(arr, ref.shard_coords, {ref.local_coords: b"x"})})
    assert bytes(ShardEngine(kv).reads.read_chunks([ref])[ref.chunk_key]) == b"x"


def test_writes_of_several_shards_merge_per_shard_in_one_batched_put() -> None:
    kv, arr = HeldKV(), _array()
    engine, stats = _engine(kv)
    a, b = (arr.locate(arr.chunk_key(c)) for c in ((0, 0), (4, 4)))  # shards a/0.0 and a/1.1

    def both(first, second, value: bytes) -> dict[str, ShardChange]:
        out = {}
        for ref in (first, second):
            out[ref.shard_key] = ShardChange(arr, ref.shard_coords, {ref.local_coords: value})
        return out

    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(engine.writes.write, _change(arr, (0, 1), b"first"))]  # held in the store
        assert kv.entered.wait(WAIT_S)
        # the two shards named in opposite orders: each call's shards start or join their next commits together
        futures.append(pool.submit(engine.writes.write, both(a, b, b"x")))
        futures.append(pool.submit(engine.writes.write, both(b, a, b"y")))
        stats.wait_queued(2, "both calls to queue for a/0.0")
        kv.release.set()
        for future in futures:
            future.result(WAIT_S)
    # a/0.0 alone, then both shards' next commits in one write round (one batched put for the two)
    assert sorted(kv.shard_puts()) == ["a/0.0", "a/0.0", "a/1.1"]
    assert engine.stats.write_attempts == 2
    found = ShardEngine(kv).reads.read_chunks([arr.locate("a/0.1"), a, b])
    assert bytes(found["a/0.1"]) == b"first"
    assert {bytes(found[a.chunk_key]), bytes(found[b.chunk_key])} <= {b"x", b"y"}
    assert bytes(found[a.chunk_key]) == bytes(found[b.chunk_key])  # the later call won on both shards


class _Interrupted(BaseException):
    """What the signal handler below raises in the main thread (as ``KeyboardInterrupt`` would)."""


def test_a_call_interrupted_before_its_commit_ran_leaves_no_writer_of_that_shard_waiting() -> None:
    """An interrupted leader: the writer that joined its commit is told, and later writes of the shard go on."""
    kv, arr = HeldKV(), _array()
    engine, stats = _engine(kv)
    main = threading.get_ident()

    def interrupt(signum, frame) -> None:
        raise _Interrupted

    previous = signal.signal(signal.SIGUSR1, interrupt)
    joiner_done, later_done = threading.Event(), threading.Event()
    outcome: dict[str, BaseException | None] = {}

    def run(name: str, change: dict[str, ShardChange], done: threading.Event) -> None:
        try:
            engine.writes.write(change)
            outcome[name] = None
        except BaseException as exc:  # the test reads it
            outcome[name] = exc
        done.set()

    try:
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(engine.writes.write, _change(arr, (0, 0), b"first"))  # held in the store
            assert kv.entered.wait(WAIT_S)

            def send_when_queued() -> None:  # the main thread leads the next commit of a/0.0, then is interrupted
                stats.wait_queued(1, "the main thread to queue")
                joiner = _change(arr, (0, 2), b"j")
                threading.Thread(target=run, args=("joiner", joiner, joiner_done), daemon=True).start()
                stats.wait_queued(2, "the joiner to queue")
                signal.pthread_kill(main, signal.SIGUSR1)

            sender = threading.Thread(target=send_when_queued)
            sender.start()
            with pytest.raises(_Interrupted):
                engine.writes.write(_change(arr, (0, 1), b"interrupted"))  # waits for the held commit until interrupted
            sender.join(WAIT_S)
            kv.release.set()
            first.result(WAIT_S)
        assert joiner_done.wait(WAIT_S), "the writer that joined the interrupted call's commit never returned"
        assert isinstance(outcome["joiner"], _Interrupted)  # told: its change was not stored
        threading.Thread(target=run, args=("later", _change(arr, (0, 3), b"later"), later_done), daemon=True).start()
        assert later_done.wait(WAIT_S), "a later write of the shard waits for a commit that will never run"
        assert outcome["later"] is None
    finally:
        signal.signal(signal.SIGUSR1, previous)
    found = ShardEngine(kv).reads.read_chunks([arr.locate(arr.chunk_key((0, i))) for i in range(4)])
    assert {k: bytes(v) for k, v in found.items()} == {"a/0.0": b"first", "a/0.3": b"later"}
