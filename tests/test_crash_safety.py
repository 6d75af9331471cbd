"""Shard writes under SIGKILL and injected I/O errors: no torn shard, no acknowledged chunk lost.

A forked child writes random whole chunks through ``ShardedStore(local dir)``
with zarr-python 2 (write ``seq`` stores the value
``seq + 1`` in chunk ``chunk_of(seq)``) and logs each acknowledged ``seq`` to
an fsync'd file; it is killed at a random moment, the store is reopened, and
every shard must pass :func:`shardkv.proxy.verify.verify_store` and every
chunk must hold its last acknowledged value (or the value of the one write
that was in flight). A second test makes a share of the low-level writes fail
with ``EIO`` (after writing part of their bytes) and checks that each failed
call raises and leaves the old value, each successful one the new.
"""

from __future__ import annotations

import errno
import functools
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pytest
import zarr
from kill_harness import acked_seqs, check_chunks, run_and_kill, write_and_ack

from shardkv import ShardedStore
from shardkv.proxy.verify import find_stale_temporaries, remove_stale_temporaries, verify_store
from shardkv.storage import local as local_store  # the local-file writes and their fault seams

CHUNK = 512  # 2 KiB of int32 noise per chunk
N_CHUNKS = 12  # 3 shards of 4 chunks


def chunk_of(seq: int) -> int:
    return (seq * 7919 + seq // 3) % N_CHUNKS


def value_of(seq: int) -> np.ndarray:
    """Chunk data of write ``seq``: its value in every element, noise so the encoded size varies."""
    rng = np.random.default_rng(seq)
    return (seq + 1) * 1000 + rng.integers(0, 2**20 + seq % 900, CHUNK, dtype="i4")


def open_store(root: Path) -> ShardedStore:
    return ShardedStore(str(root), chunks_per_shard=4)


def create(root: Path) -> None:
    zarr.open_array(
        open_store(root),
        mode="w",
        shape=(CHUNK * N_CHUNKS,),
        chunks=(CHUNK,),
        dtype="i4",
        fill_value=0,
        compressor=numcodecs.Zlib(level=1),
    )


class KillingWrites:
    """In the child: a share of low-level writes stop after a random prefix of their bytes and SIGKILL
    the process, as a kill inside the ``write`` system call would; renames are killed around too."""

    def __init__(self, seed: int, rate: float) -> None:
        self.rng = random.Random(seed)
        self.rate = rate
        self.real_write = local_store._pwrite_all
        self.real_replace = os.replace

    def write(self, fd: int, data: memoryview, offset: int) -> None:
        if self.rng.random() < self.rate:
            self.real_write(fd, data[: self.rng.randrange(len(data) + 1)], offset)
            os.kill(os.getpid(), signal.SIGKILL)
        self.real_write(fd, data, offset)

    def write_parts(self, fd: int, parts: list[memoryview]) -> None:
        """The ``writev`` path (a shard written from its parts): the same faults, on the parts joined."""
        self.write(fd, memoryview(b"".join(parts)), os.lseek(fd, 0, os.SEEK_CUR))

    def replace(self, src: str, dst: str) -> None:
        if self.rng.random() < self.rate / 2:
            os.kill(os.getpid(), signal.SIGKILL)  # before the rename: a temporary file is left
        self.real_replace(src, dst)
        if self.rng.random() < self.rate / 2:
            os.kill(os.getpid(), signal.SIGKILL)  # after it, before the directory fsync

    def install(self) -> None:
        local_store._pwrite_all = self.write  # the child is a forked copy: nothing leaks into pytest
        local_store.write_parts = self.write_parts
        os.replace = self.replace


def writer(root: Path, acks: Path, first_seq: int, killer: KillingWrites | None) -> None:
    """The killed child: write chunks (bounded), logging each acknowledged seq."""
    z = zarr.open_array(open_store(root), mode="r+")
    write_and_ack(z, acks, first_seq, 5.0, chunk_of, value_of, None if killer is None else killer.install)


def crash_rounds(root: Path, rounds: int, seed: int) -> int:
    """Kill a writer at least ``rounds`` times, checking the store after each kill; returns kills.

    On a loaded machine a child may be killed before its first write: rounds go on (at most
    ``3 * rounds``, 60 s) until more than 10 writes were acknowledged, so the test checks what it claims.
    """
    create(root)
    acks = root.parent / "acks"
    rng = random.Random(seed)
    started = time.monotonic()
    kills = first = 0
    in_flight: set[int] = set()
    acked: list[int] = []
    for i in range(3 * rounds):
        if i >= rounds and (len(acked) > 10 or time.monotonic() - started > 60):
            break
        # odd rounds: killed inside a write or around a rename; even rounds: killed at a random time
        killer = KillingWrites(seed * 100 + i, 0.08) if i % 2 else None
        status = run_and_kill(functools.partial(writer, root, acks, first, killer), rng.uniform(0.05, 0.3))
        kills += os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        acked = acked_seqs(acks)
        this_round = [s for s in acked if s >= first]
        in_flight.add(max(this_round) + 1 if this_round else first)  # may or may not have landed
        first = max(in_flight) + 1
        store = open_store(root)
        report = verify_store(store, decode=True)
        assert not report.damaged and not report.stray_keys and not report.orphan_keys, report.to_json()  # 0 torn
        check_chunks(
            zarr.open_array(store, mode="r")[:], acked, in_flight, chunk_of, value_of, N_CHUNKS
        )  # 0 acknowledged chunks lost
        # what the killed writer left is found and removed at once (its lock went with it), however young
        assert remove_stale_temporaries(store.base) == report.stale_temporaries
    assert len(acked) > 10  # the children did write
    return kills


def test_sigkill_leaves_no_torn_shard_and_loses_no_acknowledged_chunk(tmp_path: Path) -> None:
    kills = crash_rounds(tmp_path / "store", rounds=10, seed=0)
    assert kills >= 5, f"only {kills} kills"
    assert find_stale_temporaries(open_store(tmp_path / "store").base, 0) == []


def naive_write(path: str, parts: list[memoryview], fsync: bool, create_only: bool = False) -> Any:
    """A writer without atomicity: the shard is written straight into the live file (truncated first)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        local_store._pwrite_all(fd, memoryview(b"".join(parts)), 0)
        return local_store.file_generation(os.fstat(fd))
    finally:
        os.close(fd)


def test_the_kill_harness_catches_a_writer_that_tears(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Proof that the test above can fail: the same rounds against writes into the live file find a torn shard."""
    monkeypatch.setattr(local_store, "atomic_write", naive_write)
    with pytest.raises(
        AssertionError,
        match="crc32c mismatch|outside the chunk data region|lost or torn|expected an index|shorter than",
    ):
        crash_rounds(tmp_path / "store", rounds=16, seed=5)


class FlakyWrites:
    """Replaces ``local_store._pwrite_all`` and ``write_parts``: some calls write half their bytes, then raise EIO."""

    def __init__(self, rate: float, seed: int) -> None:
        self.rng = random.Random(seed)
        self.rate = rate
        self.fired = 0
        self.real = local_store._pwrite_all

    def __call__(self, fd: int, data: memoryview, offset: int) -> None:
        if self.rng.random() < self.rate:
            self.fired += 1
            self.real(fd, data[: len(data) // 2], offset)
            raise OSError(errno.EIO, "injected EIO")
        self.real(fd, data, offset)

    def write_parts(self, fd: int, parts: list[memoryview]) -> None:
        """The ``writev`` path (a shard written from its parts): the same faults, on the parts joined."""
        self(fd, memoryview(b"".join(parts)), os.lseek(fd, 0, os.SEEK_CUR))


def test_failed_writes_raise_and_leave_the_old_chunk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "store"
    create(root)
    z = zarr.open_array(open_store(root), mode="r+")
    flaky = FlakyWrites(0.25, seed=7)
    monkeypatch.setattr(local_store, "_pwrite_all", flaky)
    monkeypatch.setattr(local_store, "write_parts", flaky.write_parts)
    model = np.zeros(CHUNK * N_CHUNKS, dtype="i4")
    failures = 0
    for seq in range(80):
        c = chunk_of(seq)
        before = flaky.fired
        try:
            z[c * CHUNK : (c + 1) * CHUNK] = value_of(seq)
        except OSError as exc:
            assert exc.errno == errno.EIO and flaky.fired > before
            failures += 1
        else:
            assert flaky.fired == before, "an injected error was swallowed"
            model[c * CHUNK : (c + 1) * CHUNK] = value_of(seq)
        np.testing.assert_array_equal(z[c * CHUNK : (c + 1) * CHUNK], model[c * CHUNK : (c + 1) * CHUNK])
    monkeypatch.undo()
    assert failures >= 5
    fresh = open_store(root)
    assert verify_store(fresh, decode=True).ok
    np.testing.assert_array_equal(zarr.open_array(fresh, mode="r")[:], model)
    assert find_stale_temporaries(fresh.base, 0) == []  # failed writers clean up after themselves


@pytest.mark.parametrize("durable", [True, False])
def test_fsync_policy_of_local_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, durable: bool) -> None:
    """Each shard file is fsync'd before its rename, each directory once per batch after; none when off."""
    import stat

    synced: list[str] = []
    real = os.fsync

    def counting(fd: int) -> None:
        synced.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real(fd)

    store = ShardedStore(str(tmp_path), chunks_per_shard=2)
    store["a/.zarray"] = (
        b'{"zarr_format": 2, "shape": [8], "chunks": [1], "dtype": "|u1", "compressor": null,'
        b' "fill_value": 0, "filters": null, "order": "C"}'
    )
    store.engine.kv.fsync = durable  # the store the engine writes shards through
    monkeypatch.setattr(os, "fsync", counting)
    store.setitems({f"a/{i}": b"x" for i in range(0, 8, 2)})  # four new shards in one directory
    assert synced == (["file"] * 4 + ["dir"] if durable else [])
    synced.clear()
    store["a/1"] = b"y"  # a partial update: copy on write
    assert synced == (["file", "dir"] if durable else [])
    assert store["a/1"] == b"y" and store["a/0"] == b"x"
