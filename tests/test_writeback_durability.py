"""Write-back keeps what it acknowledged: failed shard writes, the journal, SIGKILL, stale temporaries.

* A fault-injecting base store fails a share of shard writes while a random
  zarr 2 workload runs with a buffer small enough to force evictions: every
  failed call raises ``OSError`` (no other type), reads through the proxy
  keep seeing buffered values, and once a flush succeeds the base store holds
  exactly what was acknowledged.
* ``journal=``: a forked child writes random chunks and logs each
  acknowledged write to an fsync'd file; it is SIGKILLed at a random moment,
  the store is reopened with the journal, and no acknowledged chunk is lost
  and every shard verifies.
"""

from __future__ import annotations

import errno
import functools
import os
import random
import signal
import time
from collections.abc import Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from kill_harness import acked_seqs, check_chunks, run_and_kill, write_and_ack

from shardkv import ShardedStore
from shardkv.engine.journal import Journal
from shardkv.errors import ConfigurationError
from shardkv.proxy.verify import verify_store
from shardkv.storage.files import clones_files
from shardkv.storage.kv import TEMP_MARKER

# -- failing shard writes -----------------------------------------------------------------


class FaultyStore(MutableMapping):
    """A dict whose writes of chunk-like keys (no leading '.', not zarr.json) fail at ``rate`` when armed."""

    def __init__(self, rate: float, seed: int) -> None:
        self.data: dict[str, bytes] = {}
        self.rng = random.Random(seed)
        self.rate = rate
        self.armed = False
        self.fired = 0

    def _maybe_fail(self, key: str) -> None:
        name = key.rsplit("/", 1)[-1]
        if self.armed and not name.startswith(".") and name != "zarr.json" and self.rng.random() < self.rate:
            self.fired += 1
            raise OSError(errno.EIO, f"injected EIO writing {key!r}")

    def __setitem__(self, key: str, value: Any) -> None:
        self._maybe_fail(key)
        self.data[key] = bytes(value)

    def __getitem__(self, key: str) -> bytes:
        return self.data[key]

    def __delitem__(self, key: str) -> None:
        self._maybe_fail(key)
        del self.data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self.data))

    def __len__(self) -> int:
        return len(self.data)


def retry(call: Callable[[], Any], failures: list[str]) -> None:
    """Call until it succeeds (bounded): only ``OSError`` may escape a failed attempt."""
    for _ in range(200):
        try:
            call()
            return
        except OSError as exc:  # anything else is an unexpected type and fails the test
            failures.append(str(exc))
    raise AssertionError("200 attempts in a row failed")


@pytest.mark.parametrize("seed", [1, 2])
def test_failed_flushes_and_evictions_lose_no_acknowledged_chunk(seed: int) -> None:
    base = FaultyStore(rate=0.3, seed=seed)
    # buffer_bytes: about 6 chunks of 64 bytes, so evictions
    st = ShardedStore(base, concurrency="process", chunks_per_shard=2, buffer_bytes=400)
    z = zarr.open_array(st, mode="w", shape=(30, 34), chunks=(4, 4), dtype="i4", fill_value=0, compressor=None)
    model = np.zeros((30, 34), dtype="i4")
    rng = np.random.default_rng(seed)
    base.armed = True
    write_failures: list[str] = []
    flush_failures: list[str] = []
    started = time.monotonic()
    for step in range(120):
        if time.monotonic() - started > 15:
            break
        r0, c0 = int(rng.integers(0, 29)), int(rng.integers(0, 33))
        r1, c1 = int(rng.integers(r0 + 1, 31)), int(rng.integers(c0 + 1, 35))
        values = rng.integers(-(2**31), 2**31, (r1 - r0, c1 - c0), dtype="i4")

        def write(r0: int = r0, r1: int = r1, c0: int = c0, c1: int = c1, values: Any = values) -> None:
            z[r0:r1, c0:c1] = values

        retry(write, write_failures)  # acknowledged once a call returns
        model[r0:r1, c0:c1] = values
        assert np.array_equal(z[:], model), f"step {step}: reads through the proxy lost buffered values"
        if step % 25 == 24:
            retry(st.flush, flush_failures)
    retry(st.flush, flush_failures)
    base.armed = False
    assert write_failures and flush_failures, "the faults never fired in a write or a flush"
    assert st._writer.buffer is not None and len(st._writer.buffer) == 0
    fresh = zarr.open_array(ShardedStore(base.data), mode="r")  # no buffer: what the base store holds
    assert np.array_equal(fresh[:], model), "acknowledged chunks were lost"
    assert verify_store(ShardedStore(base.data)).ok


def test_a_failed_flush_raises_keeps_the_chunks_readable_and_a_retry_writes_them() -> None:
    base = FaultyStore(rate=1.0, seed=0)
    st = ShardedStore(base, concurrency="process", chunks_per_shard=2, buffer_bytes=10**6)
    z = zarr.open_array(st, mode="w", shape=(8,), chunks=(2,), dtype="i4", fill_value=0, compressor=None)
    z[0:2], z[4:6] = [1, 2], [3, 4]  # one chunk of each of two shards: buffered
    base.armed = True
    with pytest.raises(OSError, match="injected EIO"):
        st.flush()
    with pytest.raises(OSError, match="injected EIO"):
        st.flush()  # not quietly: the chunks are still there to write
    assert list(z[:]) == [1, 2, 0, 0, 3, 4, 0, 0]
    assert "0" not in base.data and "1" not in base.data  # nothing written yet
    base.armed = False
    st.flush()
    assert list(zarr.open_array(ShardedStore(base.data), mode="r")[:]) == [1, 2, 0, 0, 3, 4, 0, 0]


# -- the journal ------------------------------------------------------------------------------

CHUNK = 256
N_CHUNKS = 16  # 4 shards of 4 chunks


def chunk_of(seq: int) -> int:
    return (seq * 7919 + seq // 5) % N_CHUNKS


def value_of(seq: int) -> np.ndarray:
    rng = np.random.default_rng(seq)
    return (seq + 1) * 1000 + rng.integers(0, 999, CHUNK, dtype="i4")


def open_journalled(root: Path, journal: Path | None) -> ShardedStore:
    if journal is None:
        return ShardedStore(str(root), chunks_per_shard=4, buffer_bytes=6 * CHUNK * 4)
    return ShardedStore(str(root), chunks_per_shard=4, buffer_bytes=6 * CHUNK * 4, journal=str(journal))


def create(root: Path) -> None:
    zarr.open_array(
        ShardedStore(str(root), chunks_per_shard=4),
        mode="w",
        shape=(CHUNK * N_CHUNKS,),
        chunks=(CHUNK,),
        dtype="i4",
        fill_value=0,
    )


def writer(root: Path, journal: Path | None, acks: Path, first_seq: int, seconds: float) -> None:
    """The child: write chunks through the journalled store, logging each acknowledged seq (fsync'd)."""
    z = zarr.open_array(open_journalled(root, journal), mode="r+")
    write_and_ack(z, acks, first_seq, seconds, chunk_of, value_of)


def test_sigkill_with_a_journal_loses_no_acknowledged_chunk(tmp_path: Path) -> None:
    root, journal, acks = tmp_path / "store", tmp_path / "wb.journal", tmp_path / "acks"
    create(root)
    rng = random.Random(10)
    kills = first = 0
    in_flight: set[int] = set()
    started = time.monotonic()
    # on a loaded machine a child may be killed before it writes much: rounds go on
    # (at most 24, 60 s) until more than 20 writes were acknowledged
    for i in range(24):
        if i >= 8 and (len(acked_seqs(acks)) > 20 or time.monotonic() - started > 60):
            break
        status = run_and_kill(functools.partial(writer, root, journal, acks, first, 0.9), rng.uniform(0.1, 0.6))
        kills += os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        this_round = [s for s in acked_seqs(acks) if s >= first]
        in_flight.add(max(this_round) + 1 if this_round else first)
        first = max(in_flight) + 1
        store = open_journalled(root, journal)  # replays the journal
        assert verify_store(store, decode=True, repair=True).ok  # a killed writer's temporary file is removed
        check_chunks(
            zarr.open_array(ShardedStore(str(root)), mode="r")[:],
            acked_seqs(acks),
            in_flight,
            chunk_of,
            value_of,
            N_CHUNKS,
        )
        store.close()  # releases the journal for the next child
        with Journal(journal) as j:
            assert j.empty  # the replayed data is durable: the journal was reset
    assert kills >= 4, f"only {kills} kills"
    assert len(acked_seqs(acks)) > 20  # the children did write


@pytest.mark.parametrize("with_journal", [True, False], ids=["journal", "no-journal"])
def test_an_abrupt_exit_keeps_buffered_writes_only_with_a_journal(tmp_path: Path, with_journal: bool) -> None:
    """The control (no journal) loses the buffered chunks: the journal is what keeps them."""
    root, acks = tmp_path / "store", tmp_path / "acks"
    journal = tmp_path / "wb.journal" if with_journal else None
    create(root)
    assert run_and_kill(lambda: writer(root, journal, acks, 0, 0.3), None) == 0
    acked = acked_seqs(acks)
    assert acked
    if journal is not None:
        with open(journal, "ab") as f:  # a torn last record: ignored on replay
            f.write(b"SKJR\x40\x00\x00\x00\x00\x00")
    data = zarr.open_array(open_journalled(root, journal), mode="r")[:]
    if with_journal:
        check_chunks(data, acked, set(), chunk_of, value_of, N_CHUNKS)
    else:
        with pytest.raises(AssertionError, match="acknowledged write lost"):
            check_chunks(data, acked, set(), chunk_of, value_of, N_CHUNKS)


def test_journal_needs_buffer_bytes(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="buffer_bytes"):
        ShardedStore(str(tmp_path / "s"), chunks_per_shard=2, journal=str(tmp_path / "j"))
    assert not (tmp_path / "j").exists()


# -- stale temporaries --------------------------------------------------------------------------


@pytest.mark.parametrize("when", ["first_write", "compact"])
def test_stale_temporaries_are_removed_young_ones_kept(tmp_path: Path, when: str) -> None:
    from shardkv.storage import local

    root = tmp_path / "store"
    create(root)
    z = zarr.open_array(ShardedStore(str(root)), mode="r+")
    z[:CHUNK] = 1  # the first shard exists: a killed writer leaves its temporary beside it
    shard_dir = next(p.parent for p in root.rglob("0") if p.is_file())
    elsewhere = root / "elsewhere"
    elsewhere.mkdir()
    old, young, far = shard_dir / f"{TEMP_MARKER}old", shard_dir / f"{TEMP_MARKER}young", elsewhere / f"{TEMP_MARKER}x"
    for path in (old, young, far):
        path.write_bytes(b"left by a writer")
    hour_ago = time.time() - 3700
    for path in (old, far):
        os.utime(path, (hour_ago, hour_ago))
    local._SWEPT.clear()  # as in a new process (this one swept the shard's directory a moment ago)
    st = ShardedStore(str(root), chunks_per_shard=4)
    assert old.exists()  # opening alone touches nothing
    if when == "first_write":
        zarr.open_array(st, mode="r+")[:CHUNK] = 7
        assert not old.exists() and young.exists()
        assert far.exists()  # a write looks only in the directories it writes into
        old.write_bytes(b"again")
        os.utime(old, (hour_ago, hour_ago))
        zarr.open_array(ShardedStore(str(root)), mode="r+")[:CHUNK] = 8
        assert old.exists()  # swept once per hour and process, whichever store writes
    else:
        st.compact()
        assert not old.exists() and young.exists()
        assert not far.exists()  # compact walks the whole store


def test_a_stale_temporary_that_cannot_be_removed_warns_and_the_write_goes_on(tmp_path: Path, monkeypatch) -> None:
    from shardkv.storage import local

    root = tmp_path / "store"
    create(root)
    stale = root / f"{TEMP_MARKER}other-users"
    stale.write_bytes(b"x")
    hour_ago = time.time() - 3700
    os.utime(stale, (hour_ago, hour_ago))
    local._SWEPT.clear()
    clones_files(str(root))  # the once-per-device clone probe, which removes its own temporaries, is done

    def refuse(path: str) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", path)

    monkeypatch.setattr(local.os, "remove", refuse)
    z = zarr.open_array(ShardedStore(str(root)), mode="r+")
    with pytest.warns(RuntimeWarning, match="stale temporary"):
        z[:CHUNK] = 5
    monkeypatch.undo()
    assert (z[:CHUNK] == 5).all() and stale.exists()


def crash(store: ShardedStore) -> None:
    """Drop the store as a kill would: its journal file closed (lock released), nothing flushed."""
    assert store._writer.journal is not None
    store._writer.journal.close()


@pytest.mark.parametrize("how", ["rmdir", "shrink"])
def test_replay_does_not_resurrect_chunks_of_a_deleted_or_shrunk_array(tmp_path: Path, how: str) -> None:
    root, journal = tmp_path / "store", tmp_path / "j"
    st = open_journalled(root, journal)
    shape, chunks = (CHUNK * N_CHUNKS,), (CHUNK,)
    b = zarr.open_array(st, mode="w", path="b", shape=shape, chunks=chunks, dtype="i4", fill_value=0)
    a = zarr.open_array(st, mode="w", path="a", shape=shape, chunks=chunks, dtype="i4", fill_value=0)
    b[:CHUNK] = 9  # stays buffered throughout: the journal is never simply reset
    if how == "rmdir":
        a[: 2 * CHUNK] = 5
        st.rmdir("a")  # its buffered chunks are dropped, and so must their journal records be
        a = zarr.open_array(st, mode="w", path="a", shape=shape, chunks=chunks, dtype="i4", fill_value=0)
    else:
        a[12 * CHUNK : 13 * CHUNK] = 7
        a.resize(10 * CHUNK)  # flushes a, then trims chunk 12 from its shard
        a.resize(CHUNK * N_CHUNKS)
    a[CHUNK : 2 * CHUNK] = 8  # still buffered at the crash
    assert st._writer.buffer is not None and len(st._writer.buffer) == 2
    crash(st)
    st = open_journalled(root, journal)
    expected = np.zeros(CHUNK * N_CHUNKS, dtype="i4")
    expected[CHUNK : 2 * CHUNK] = 8
    assert np.array_equal(zarr.open_array(st, mode="r", path="a")[:], expected)
    assert np.array_equal(zarr.open_array(st, mode="r", path="b")[:CHUNK], np.full(CHUNK, 9))
