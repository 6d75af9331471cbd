"""The write-back journal (:mod:`shardkv.engine.journal`): round trip, torn tails, damage, SIGKILL."""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kill_harness import acked_seqs, run_and_kill

from shardkv.engine.journal import Journal, JournalRecord
from shardkv.errors import JournalCorruptError, LockTimeoutError, ShardKVError


def value_of(seq: int) -> bytes:
    """The value the writers here give record ``seq`` (so a replayed record can be checked byte for byte)."""
    return (f"value-{seq}-".encode() * (1 + seq % 7))[: 5 + (seq * 13) % 200]


@settings(max_examples=12, deadline=None)
@given(
    batches=st.lists(
        st.lists(st.tuples(st.text(min_size=1, max_size=12), st.one_of(st.none(), st.binary(max_size=64))), max_size=5),
        max_size=6,
    )
)
def test_round_trip_in_order_across_reopen(tmp_path_factory: pytest.TempPathFactory, batches: list) -> None:
    path = tmp_path_factory.mktemp("j") / "journal"
    with Journal(path) as j:
        seqs = [j.append(batch) for batch in batches]
    flat = [r for batch in batches for r in batch]
    assert [s for group in seqs for s in group] == list(range(len(flat)))
    with Journal(path) as j:
        assert [(r.key, r.value) for r in j.replay()] == flat
        assert [r.seq for r in j.replay()] == list(range(len(flat)))
        assert j.next_seq == len(flat)


def test_reset_drops_records_and_keeps_sequence_numbers(tmp_path: Path) -> None:
    path = tmp_path / "journal"
    with Journal(path) as j:
        j.append([("a", b"1"), ("b", None)])
        j.reset()
        assert list(j.replay()) == []
        assert j.append([("c", b"3")]) == [2]
    with Journal(path) as j:
        assert list(j.replay()) == [JournalRecord(2, "c", b"3")]
    assert [p.name for p in tmp_path.iterdir()] == ["journal"]  # no temporary file left


def write_records(path: Path, n: int) -> list[int]:
    """Append n records one call each; return the file size after each call."""
    ends = []
    with Journal(path) as j:
        for seq in range(n):
            j.append([(f"a/{seq}", value_of(seq))])
            ends.append(os.path.getsize(path))
    return ends


def test_torn_tail_at_every_byte_of_an_unacknowledged_record_is_ignored(tmp_path: Path) -> None:
    """A crash mid-append leaves frame bytes after the acknowledged end: never replayed, cut off by the next append."""
    path = tmp_path / "journal"
    ends = write_records(path, 4)
    four = path.read_bytes()
    path.unlink()
    write_records(path, 3)
    three = path.read_bytes()  # its watermark acknowledges records 0..2 only
    last_start = ends[-2]
    assert len(three) == last_start
    assert ends[-1] - last_start < 300  # bounded: one case per byte of the last record
    for cut in range(last_start + 1, ends[-1] + 1):
        path.write_bytes(three + four[last_start:cut])
        with Journal(path) as j:
            assert [r.seq for r in j.replay()] == [0, 1, 2]
            assert j.torn_tail_nbytes == cut - last_start
            assert j.append([("again", b"x")]) == [3]  # the torn frame is cut off first
        with Journal(path) as j:
            assert [(r.seq, r.key) for r in j.replay()][-1] == (3, "again")


def test_truncation_inside_an_acknowledged_record_is_an_error_naming_the_loss(tmp_path: Path) -> None:
    path = tmp_path / "journal"
    ends = write_records(path, 4)
    whole = path.read_bytes()
    for cut in range(ends[-2], ends[-1]):
        path.write_bytes(whole[:cut])
        with pytest.raises(JournalCorruptError, match=r"truncated.*lost: acknowledged records seq 3\.\.3"):
            Journal(path)


def test_flipped_byte_in_the_last_record_is_an_error_naming_the_loss(tmp_path: Path) -> None:
    path = tmp_path / "journal"
    ends = write_records(path, 3)
    blob = bytearray(path.read_bytes())
    blob[ends[-1] - 2] ^= 0x01
    path.write_bytes(bytes(blob))
    with pytest.raises(JournalCorruptError, match=r"crc32c mismatch.*lost: acknowledged records seq 2\.\.2") as info:
        Journal(path)
    assert info.value.offset == ends[-2]


@pytest.mark.parametrize("where", ["frame-marker", "length", "crc", "payload"])
def test_flipped_byte_in_a_middle_record_raises(tmp_path: Path, where: str) -> None:
    path = tmp_path / "journal"
    ends = write_records(path, 5)
    start = ends[1]  # record 2
    offset = {"frame-marker": 1, "length": 5, "crc": 9, "payload": 14}[where]
    blob = bytearray(path.read_bytes())
    blob[start + offset] ^= 0x20
    path.write_bytes(bytes(blob))
    with pytest.raises(JournalCorruptError, match="valid records follow") as info:
        Journal(path)
    assert info.value.offset == start and isinstance(info.value, (ShardKVError, ValueError))
    # damage after the journal was opened: replay raises too
    blob[start + offset] ^= 0x20
    path.write_bytes(bytes(blob))
    with Journal(path) as j:
        path.write_bytes(bytes(blob[:start]) + bytes([blob[start] ^ 0xFF]) + bytes(blob[start + 1 :]))
        with pytest.raises(JournalCorruptError):
            list(j.replay())


def test_not_a_journal_and_a_second_writer_are_refused(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.write_bytes(b"x" * 40)
    with pytest.raises(JournalCorruptError, match="not a shardkv journal"):
        Journal(other)
    path = tmp_path / "journal"
    with Journal(path):
        with pytest.raises(LockTimeoutError, match="it is open in another process"):
            Journal(path)


def test_failed_append_leaves_no_torn_frame(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "journal"
    j = Journal(path)
    j.append([("a", b"1")])
    size = os.path.getsize(path)
    real = os.pwrite

    def half_then_fail(fd: int, data: memoryview, offset: int) -> int:
        real(fd, bytes(data[: len(data) // 2]), offset)
        raise OSError(5, "injected EIO")

    monkeypatch.setattr(os, "pwrite", half_then_fail)
    with pytest.raises(OSError, match="injected"):
        j.append([("b", b"2" * 100)])
    monkeypatch.undo()
    assert os.path.getsize(path) == size
    assert j.append([("c", b"3")]) == [1]
    j.close()
    with Journal(path) as again:
        assert [(r.seq, r.key) for r in again.replay()] == [(0, "a"), (1, "c")]


def journal_writer(journal: Path, acks: Path, limit: float) -> None:
    """The killed writer (runs in a forked child): append batches, log each acknowledged seq, fsync'd."""
    j = Journal(journal)
    fd = os.open(acks, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    deadline = time.monotonic() + limit
    for _ in range(100000):
        if time.monotonic() > deadline:
            break
        n = 1 + j.next_seq % 3
        seqs = j.append([(f"a/{s}", value_of(s)) for s in range(j.next_seq, j.next_seq + n)])
        os.write(fd, "".join(f"{s}\n" for s in seqs).encode())
        os.fsync(fd)


def test_sigkill_never_loses_an_acknowledged_record_nor_yields_a_torn_one(tmp_path: Path) -> None:
    journal, acks = tmp_path / "journal", tmp_path / "acks"
    rng = random.Random(7)
    started = time.monotonic()
    kills = 0
    records: list[JournalRecord] = []
    # bounded in count and in time; on a loaded machine a child may be killed before its first
    # append, so rounds go on (at most 36, 30 s) until the journal holds records
    for i in range(36):
        if i >= 12 and (records or time.monotonic() - started > 30):
            break
        status = run_and_kill(lambda: journal_writer(journal, acks, 2.0), rng.uniform(0.02, 0.3))
        kills += os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        acked = acked_seqs(acks)
        with Journal(journal) as j:
            records = list(j.replay())
        assert [r.seq for r in records] == list(range(len(records)))
        assert all(r.key == f"a/{r.seq}" and r.value == value_of(r.seq) for r in records)
        assert set(acked) <= {r.seq for r in records}
    assert kills >= 5 and len(records) > 0
