"""A journal belongs to one store, is locked for its life, and never drops an acknowledged write.

Rows of the issue's table proven here (each fails on the code before the fix):

* store Y opened with the ``journal=`` of store X (another store, a copied
  directory), or X after its array was recreated with other chunks: refused
  naming both, after a real ``kill -9`` left records;
* two real processes opening one new journal at once, resets racing appends:
  no acknowledged record lost in >= 20 trials, no raw ``BlockingIOError``,
  no descriptor leaked;
* a flipped byte anywhere in the last two records, a truncation anywhere:
  every acknowledged record recovered, or an error naming the loss;
* a write-back ``set`` whose flush raised is never applied later.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import zarr
from kill_harness import run_and_kill

from shardkv import ShardedStore
from shardkv.engine.journal import Journal
from shardkv.errors import JournalCorruptError, JournalMismatchError, LockTimeoutError

# -- a journal belongs to one store ------------------------------------------------------------


def make_array(root: Path) -> None:
    zarr.open_array(
        ShardedStore(str(root), chunks_per_shard=4), mode="w", shape=(64,), chunks=(4,), dtype="i4", fill_value=0
    )


def write_then_die(root: Path, journal: Path) -> None:
    """The child: buffered, journalled writes of chunks 0..1 (= 7), then an abrupt exit (no flush)."""
    z = zarr.open_array(ShardedStore(str(root), buffer_bytes=10**6, journal=str(journal)), mode="r+")
    z[0:8] = 7
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.parametrize("other", ["another-store", "copied-directory"])
def test_a_journal_is_never_replayed_into_another_store(tmp_path: Path, other: str) -> None:
    x, y, journal = tmp_path / "x", tmp_path / "y", tmp_path / "wb.journal"
    make_array(x)
    if other == "another-store":
        make_array(y)
    status = run_and_kill(lambda: write_then_die(x, journal), None)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    if other == "copied-directory":
        shutil.copytree(x, y)  # same store id, another location
    with pytest.raises(JournalMismatchError) as info:
        ShardedStore(str(y), buffer_bytes=10**6, journal=str(journal))
    message = str(info.value)
    assert str(x.resolve()) in message and str(y.resolve()) in message and "2 record(s)" in message
    assert list(zarr.open_array(ShardedStore(str(y)), mode="r")[:8]) == [0] * 8  # Y untouched
    st = ShardedStore(str(x), buffer_bytes=10**6, journal=str(journal))  # X's own store replays them
    assert list(zarr.open_array(st, mode="r")[:8]) == [7] * 8
    st.close()
    assert list(zarr.open_array(ShardedStore(str(x)), mode="r")[:8]) == [7] * 8


def clear_write_then_die(root: Path, journal: Path) -> None:
    """The child: through a journalled store, clear the whole store (``rmdir("")``), recreate the array,
    write chunks 0..1 (= 9), then an abrupt exit."""
    store = ShardedStore(str(root), chunks_per_shard=4, buffer_bytes=10**6, journal=str(journal))
    store.rmdir("")
    z = zarr.open_array(store, mode="w", shape=(64,), chunks=(4,), dtype="i4", fill_value=0)
    z[0:8] = 9
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_store_cleared_through_its_journalled_proxy_still_owns_its_journal(tmp_path: Path) -> None:
    """``rmdir("")`` keeps the store id the journal is tied to: the records written after the clear replay."""
    x, journal = tmp_path / "x", tmp_path / "wb.journal"
    make_array(x)
    status = run_and_kill(lambda: clear_write_then_die(x, journal), None)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert list(zarr.open_array(ShardedStore(str(x)), mode="r")[:8]) == [0] * 8  # not flushed: only in the journal
    st = ShardedStore(str(x), buffer_bytes=10**6, journal=str(journal))  # replays into the same store
    st.close()
    assert list(zarr.open_array(ShardedStore(str(x)), mode="r")[:8]) == [9] * 8


def test_records_of_an_array_recreated_with_another_layout_are_refused(tmp_path: Path) -> None:
    x, journal = tmp_path / "x", tmp_path / "wb.journal"
    make_array(x)
    run_and_kill(lambda: write_then_die(x, journal), None)  # records of 4-element chunks
    zarr.open_array(
        ShardedStore(str(x), chunks_per_shard=2), mode="w", shape=(64,), chunks=(8,), dtype="i4", fill_value=3
    )  # the array recreated with 8-element chunks, outside the journal
    with pytest.raises(
        JournalMismatchError,
        match=r"array '' with chunks=4 chunks_per_shard=4, not of array '' "
        r"with chunks=8 chunks_per_shard=2",
    ):
        ShardedStore(str(x), buffer_bytes=10**6, journal=str(journal))
    assert list(zarr.open_array(ShardedStore(str(x)), mode="r")[:16]) == [3] * 16  # nothing replayed into it


def test_an_empty_journal_is_stamped_for_the_store_that_opens_it(tmp_path: Path) -> None:
    x, y, journal = tmp_path / "x", tmp_path / "y", tmp_path / "wb.journal"
    make_array(x)
    make_array(y)
    ShardedStore(str(x), buffer_bytes=10**6, journal=str(journal)).close()  # flushed: no record left
    st = ShardedStore(str(y), buffer_bytes=10**6, journal=str(journal))
    assert st._writer.journal is not None and str(y.resolve()) in st._writer.journal.identity["location"]
    st.close()


# -- two processes, one journal ------------------------------------------------------------------


def racer(path: str, name: str, rounds: int, queue: multiprocessing.Queue) -> None:
    """Open (retrying while the other holds it), replay, append, sometimes reset keeping everything; report acks."""
    acked: list[str] = []
    errors: list[str] = []
    deadline = time.monotonic() + 20
    for r in range(rounds):
        while time.monotonic() < deadline:
            try:
                j = Journal(path)
                break
            except LockTimeoutError:
                time.sleep(0.0005)
            except BaseException as exc:  # noqa: BLE001 - reported to the parent
                errors.append(f"{type(exc).__name__}: {exc}")
                break
        else:
            errors.append("timed out waiting for the journal")
            break
        if errors:
            break
        try:
            held = [(rec.key, rec.value) for rec in j.replay()]
            keys = [f"{name}/{r}/{i}" for i in range(3)]
            j.append((k, k.encode()) for k in keys)
            acked.extend(keys)
            if r % 2:
                j.reset(held + [(k, k.encode()) for k in keys])  # a reset racing the other's open and append
        finally:
            j.close()
    queue.put((name, acked, errors))


def test_two_processes_racing_on_one_new_journal_lose_no_acknowledged_record(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    lost_total = 0
    for trial in range(20):
        path = str(tmp_path / f"j{trial}")
        queue: multiprocessing.Queue = ctx.Queue()
        procs = [ctx.Process(target=racer, args=(path, name, 4, queue)) for name in ("a", "b")]
        for p in procs:
            p.start()
        results = [queue.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(timeout=30)
        for name, _, errors in results:
            assert errors == [], f"trial {trial}, process {name}: {errors}"
        with Journal(path) as j:
            held = {rec.key for rec in j.replay()}
        acked_all = {k for _, acked, _ in results for k in acked}
        assert len(acked_all) == 24
        lost_total += len(acked_all - held)
    assert lost_total == 0, f"{lost_total} acknowledged records lost"


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_second_opener_gets_one_clear_error_and_leaks_no_descriptor(tmp_path: Path) -> None:
    path = tmp_path / "journal"
    with Journal(path):
        before = open_fds()
        for _ in range(20):
            with pytest.raises(LockTimeoutError, match=r"could not lock journal '.*journal': it is open in another"):
                Journal(path)
        assert open_fds() == before
    with Journal(path) as j:  # released on close
        assert j.empty


# -- fault injection: nothing acknowledged lost silently ---------------------------------------


def journal_of(path: Path, n: int) -> tuple[bytes, list[int]]:
    ends = []
    with Journal(path) as j:
        for seq in range(n):
            j.append([(f"k/{seq}", bytes([seq]) * (3 + seq * 5))])
            ends.append(os.path.getsize(path))
    return path.read_bytes(), ends


def recovered_or_error(path: Path, n: int) -> str:
    """Open the damaged journal: 'recovered' if every acknowledged record came back intact, 'error' if refused."""
    try:
        with Journal(path) as j:
            records = list(j.replay())
    except JournalCorruptError as exc:
        assert "lost" in str(exc) or "header" in str(exc) or "watermark" in str(exc) or "identity" in str(exc), str(exc)
        return "error"
    assert [(r.seq, r.key, r.value) for r in records] == [(s, f"k/{s}", bytes([s]) * (3 + s * 5)) for s in range(n)], (
        "an acknowledged record was dropped silently"
    )
    return "recovered"


def test_every_flipped_byte_of_the_last_two_records_is_recovered_or_an_error(tmp_path: Path) -> None:
    path = tmp_path / "journal"
    whole, ends = journal_of(path, 5)
    outcomes = set()
    for pos in range(ends[-3], ends[-1]):
        for mask in (0x01, 0x80):
            blob = bytearray(whole)
            blob[pos] ^= mask
            path.write_bytes(bytes(blob))
            outcomes.add(recovered_or_error(path, 5))
    assert outcomes == {"error"}  # every byte of a frame is checked


def test_every_truncation_point_is_recovered_or_an_error(tmp_path: Path) -> None:
    path = tmp_path / "journal"
    whole, ends = journal_of(path, 5)
    outcomes = {}
    for cut in range(len(whole) + 1):
        path.write_bytes(whole[:cut])
        outcomes[cut] = recovered_or_error(path, 5)
    assert outcomes[len(whole)] == "recovered"
    assert all(outcome == "error" for cut, outcome in outcomes.items() if cut < len(whole))


# -- a write that raised is never applied later -------------------------------------------------


def test_a_set_whose_flush_raised_is_never_applied_later(tmp_path: Path) -> None:
    root, journal = tmp_path / "store", tmp_path / "wb.journal"
    make_array(root)
    st = ShardedStore(str(root), buffer_bytes=10**6, journal=str(journal))
    z = zarr.open_array(st, mode="r+")
    z[0:4] = 1  # one chunk of shard 0: buffered, acknowledged
    engine = st._writer.engine
    real = engine.writes.write

    def failing(changes: object) -> None:
        raise OSError(5, "injected EIO")

    engine.writes.write = failing  # type: ignore[method-assign]
    with pytest.raises(OSError, match="injected EIO"):
        z[0:16] = 9  # completes shard 0: its forced write fails, the caller is told so
    engine.writes.write = real  # type: ignore[method-assign]
    assert list(z[0:16]) == [1] * 4 + [0] * 12  # the earlier acknowledged write stays, the failed one is gone
    st.flush()
    st.close()
    assert list(zarr.open_array(ShardedStore(str(root)), mode="r")[0:16]) == [1] * 4 + [0] * 12
    with Journal(journal) as j:
        assert [r.key for r in j.replay()] == []
    np.testing.assert_array_equal(zarr.open_array(ShardedStore(str(root)), mode="r")[16:], 0)


def fail_a_write_then_die(root: Path, journal: Path) -> None:
    """The child: an acknowledged buffered write (chunk 0 = 1), then a write whose forced flush fails (told to the
    caller), then kill -9 before anything else is flushed."""
    st = ShardedStore(str(root), buffer_bytes=10**6, journal=str(journal))
    z = zarr.open_array(st, mode="r+")
    z[0:4] = 1
    engine = st._writer.engine

    def failing(changes: object) -> None:
        raise OSError(5, "injected EIO")

    engine.writes.write = failing  # type: ignore[method-assign]
    try:
        z[0:16] = 9  # completes shard 0: its forced write fails, the caller is told so
    except OSError:
        pass
    else:
        os._exit(4)  # the failure was not reported: the parent sees exit status 4
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_set_whose_flush_raised_is_not_replayed_after_kill_9(tmp_path: Path) -> None:
    """The journal never brings back a write its caller was told failed, even when the process dies right after."""
    root, journal = tmp_path / "store", tmp_path / "wb.journal"
    make_array(root)
    status = run_and_kill(lambda: fail_a_write_then_die(root, journal), None)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
    st = ShardedStore(str(root), buffer_bytes=10**6, journal=str(journal))  # replays what was acknowledged
    st.close()
    assert list(zarr.open_array(ShardedStore(str(root)), mode="r")[0:16]) == [1] * 4 + [0] * 12
