"""``journal=`` of shardkv.zarr3.ShardedStore: write-back that survives ``kill -9``, and belongs to one store.

The journal is the zarr 2 proxy's (engine/journal.py, engine/writeback.py),
tied to one store. A child process (this environment's
python, zarr 3) writes through a store with ``buffer_bytes`` and ``journal=``,
reports each acknowledged write, and is killed with SIGKILL while the shard is
still only buffered; reopening the store with the same journal must restore
every acknowledged write, and zarr 3 without shardkv (and tensorstore) must
read it at the root. The control run without a journal loses the write, which
shows what the journal keeps.
"""

from __future__ import annotations

import os
import pickle
import select
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("zarr.abc.store")

import tensorstore as ts  # noqa: E402
import zarr  # noqa: E402
from zarr.core.buffer import cpu  # noqa: E402
from zarr.core.sync import sync  # noqa: E402
from zarr.storage import LocalStore, MemoryStore  # noqa: E402

from shardkv.engine.journal import Journal  # noqa: E402
from shardkv.errors import (  # noqa: E402
    ConfigurationError,
    JournalCorruptError,
    JournalMismatchError,
    LockTimeoutError,
    UnflushedWritesError,
)
from shardkv.storage.identity import STORE_ID_KEY  # noqa: E402
from shardkv.zarr3 import ShardedStore  # noqa: E402

pytestmark = pytest.mark.zarr3

SHAPE, CHUNKS, CPS = (16, 16), (2, 2), 4  # shards of 8 x 8 elements: 2 x 2 shards of 4 x 4 chunks
BUFFER = 10**6
ROUNDS = 3  # acknowledged writes per child, each into a shard it leaves incomplete (so only buffered)
CHILD_TIMEOUT = 120.0  # seconds for a child to report its writes (imports zarr 3 on a busy machine)

CHILD = textwrap.dedent(
    """
    import sys, time
    import numpy as np, zarr
    from zarr.storage import LocalStore
    from shardkv.zarr3 import ShardedStore

    root, journal, offset = sys.argv[1], sys.argv[2], int(sys.argv[3])
    store = ShardedStore(LocalStore(root), chunks_per_shard=4, buffer_bytes=10**6,
                         journal=None if journal == "-" else journal)
    z = zarr.open_array(store, path="a", mode="r+")
    for i in range({rounds}):
        z[2 * i : 2 * i + 2, 0:2] = offset + i + 1  # one chunk of shard (0, 0): acknowledged when this returns
        print("acked", i, flush=True)
    print("done", flush=True)
    time.sleep(600)  # killed before this ends; never flushes, never closes
    """
).format(rounds=ROUNDS)


def expected(offset: int = 0) -> np.ndarray:
    """The array after the acknowledged writes of a child given ``offset`` (fill value 0 elsewhere)."""
    data = np.zeros(SHAPE, dtype="i4")
    for i in range(ROUNDS):
        data[2 * i : 2 * i + 2, 0:2] = offset + i + 1
    return data


def create(root: Path) -> None:
    """An empty, unsharded int32 array ``a`` written through the store (stored sharded)."""
    zarr.create_array(
        ShardedStore(LocalStore(str(root)), chunks_per_shard=CPS),
        name="a",
        shape=SHAPE,
        chunks=CHUNKS,
        dtype="i4",
        fill_value=0,
    )


def write_then_kill(root: Path, journal: Path | None, offset: int = 0, stored: np.ndarray | None = None) -> int:
    """Run the child writer, wait (bounded) until it reports every write acknowledged, SIGKILL it.

    Returns the number of writes acknowledged. Storage is checked to hold
    ``stored`` (default: nothing written) when the child is killed: its
    writes live in its buffer (and journal) only.
    """
    script = root.parent / "child.py"
    script.write_text(CHILD)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(root), "-" if journal is None else str(journal), str(offset)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out = b""
    try:
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        deadline = time.monotonic() + CHILD_TIMEOUT
        while b"done" not in out and time.monotonic() < deadline:  # bounded by the deadline
            ready, _, _ = select.select([fd], [], [], max(deadline - time.monotonic(), 0))
            chunk = os.read(fd, 4096) if ready else b""
            if not chunk:  # timed out, or the child died: its stderr tells why
                break
            out += chunk
        acked = out.count(b"acked")
        assert acked == ROUNDS, f"the child acknowledged {acked} of {ROUNDS} writes; stderr: {_stderr(proc)}"
        np.testing.assert_array_equal(read_at_root(root), np.zeros(SHAPE, "i4") if stored is None else stored)
    finally:
        proc.send_signal(signal.SIGKILL)
        status = proc.wait(timeout=60)
    assert status == -signal.SIGKILL
    return acked


def _stderr(proc: subprocess.Popen[bytes]) -> str:
    proc.kill()
    _, err = proc.communicate(timeout=60)
    return err.decode(errors="replace")[-2000:]


def read_at_root(root: Path) -> np.ndarray:
    """The array as zarr 3 reads it from storage without shardkv (the stored sharded array)."""
    return np.asarray(zarr.open_array(LocalStore(str(root), read_only=True), path="a", mode="r")[:])


# -- (a) a kill -9 loses no acknowledged write ------------------------------------------------------


@pytest.mark.parametrize("with_journal", [True, False], ids=["journal", "no-journal-control"])
def test_sigkill_after_acknowledged_writes_loses_nothing_with_a_journal(tmp_path: Path, with_journal: bool) -> None:
    root = tmp_path / "data.zarr"
    journal = tmp_path / "wb.journal" if with_journal else None
    create(root)
    write_then_kill(root, journal)
    store = ShardedStore(
        LocalStore(str(root)),
        chunks_per_shard=CPS,
        buffer_bytes=BUFFER,
        journal=None if journal is None else str(journal),
    )  # replays
    if not with_journal:  # the control: the buffered writes died with the process
        assert not read_at_root(root).any()
        return
    # replayed and written to the shard at open: storage holds it, zarr 3 and tensorstore read it
    np.testing.assert_array_equal(read_at_root(root), expected())
    np.testing.assert_array_equal(zarr.open_array(store, path="a", mode="r")[:], expected())
    stored = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": str(root / "a")}}).result()
    np.testing.assert_array_equal(stored.read().result(), expected())
    store.close()
    with Journal(journal) as j:  # type: ignore[arg-type]
        assert j.empty and not list(j.replay())  # the replayed data is durable: the journal was reset


def test_replayed_writes_are_kept_when_the_store_is_killed_again_before_writing_more(tmp_path: Path) -> None:
    """Two kills in a row: the second child replays the first's records, then its own are replayed."""
    root, journal = tmp_path / "data.zarr", tmp_path / "wb.journal"
    create(root)
    write_then_kill(root, journal)
    # the second child replays the first child's records at open (written to storage), then buffers its own
    write_then_kill(root, journal, offset=10, stored=expected())
    ShardedStore(LocalStore(str(root)), chunks_per_shard=CPS, buffer_bytes=BUFFER, journal=str(journal)).close()
    np.testing.assert_array_equal(read_at_root(root), expected(10))


def test_a_damaged_acknowledged_record_is_an_error_and_a_torn_tail_is_ignored(tmp_path: Path) -> None:
    """The journal's rules hold through the zarr 3 store: never a silent drop of an acknowledged write."""
    root, journal = tmp_path / "data.zarr", tmp_path / "wb.journal"
    create(root)
    write_then_kill(root, journal)
    good = journal.read_bytes()
    journal.write_bytes(good + b"SKJR\x40\x00\x00\x00\x00\x00")  # an append torn by a crash: never acknowledged
    ShardedStore(LocalStore(str(root)), chunks_per_shard=CPS, buffer_bytes=BUFFER, journal=str(journal)).close()
    np.testing.assert_array_equal(read_at_root(root), expected())

    other = tmp_path / "other.zarr"  # the emptied journal taken over by another store, then a bit flipped
    create(other)
    write_then_kill(other, journal, offset=20)
    damaged = bytearray(journal.read_bytes())
    damaged[-3] ^= 0x01  # inside the last acknowledged record
    journal.write_bytes(bytes(damaged))
    with pytest.raises(JournalCorruptError, match="lost"):
        ShardedStore(LocalStore(str(other)), chunks_per_shard=CPS, buffer_bytes=BUFFER, journal=str(journal))
    assert not read_at_root(other).any()  # nothing of the journal applied


# -- (b) a journal belongs to one store -------------------------------------------------------------


@pytest.mark.parametrize("other", ["another-store", "copied-directory"])
def test_the_journal_of_store_x_is_refused_for_store_y_naming_both(tmp_path: Path, other: str) -> None:
    x, y, journal = tmp_path / "x.zarr", tmp_path / "y.zarr", tmp_path / "wb.journal"
    create(x)
    if other == "another-store":
        create(y)
    write_then_kill(x, journal)
    if other == "copied-directory":
        shutil.copytree(x, y)  # the same store id, another location
    with pytest.raises(JournalMismatchError) as info:
        ShardedStore(LocalStore(str(y)), chunks_per_shard=CPS, buffer_bytes=BUFFER, journal=str(journal))
    message = str(info.value)
    assert str(x.resolve()) in message and str(y.resolve()) in message, message
    assert f"{ROUNDS} record(s)" in message and str(journal) in message, message
    assert not read_at_root(y).any()  # nothing replayed into Y
    # X's own store takes its records back
    store = ShardedStore(LocalStore(str(x)), chunks_per_shard=CPS, buffer_bytes=BUFFER, journal=str(journal))
    store.close()
    np.testing.assert_array_equal(read_at_root(x), expected())


def test_records_of_an_array_recreated_with_another_layout_are_refused(tmp_path: Path) -> None:
    root, journal = tmp_path / "data.zarr", tmp_path / "wb.journal"
    create(root)
    write_then_kill(root, journal)  # records of 2 x 2 chunks, 4 x 4 per shard
    zarr.create_array(
        ShardedStore(LocalStore(str(root)), chunks_per_shard=2),
        name="a",
        shape=SHAPE,
        chunks=(4, 4),
        dtype="i4",
        fill_value=3,
        overwrite=True,
    )  # recreated outside the journal
    with pytest.raises(
        JournalMismatchError,
        match=r"array 'a' with chunks=2,2 chunks_per_shard=4,4, not of array "
        r"'a' with chunks=4,4 chunks_per_shard=2,2",
    ):
        ShardedStore(LocalStore(str(root)), buffer_bytes=BUFFER, journal=str(journal))
    assert (read_at_root(root) == 3).all()  # nothing replayed into it


def test_a_journal_of_the_zarr2_proxy_layout_is_refused(tmp_path: Path) -> None:
    """Records of the zarr 2 proxy (layout "v2", v2 chunk keys) over the same directory are not replayed here."""
    from shardkv.storage.identity import store_identity
    from shardkv.storage.open import open_kv

    root, journal = tmp_path / "data.zarr", tmp_path / "wb.journal"
    create(root)
    with Journal(journal, store_identity(open_kv(str(root)), "v2")) as j:
        j.append([("a/0.0", b"\x00" * 16, "")])
    with pytest.raises(JournalMismatchError, match="v2"):
        ShardedStore(LocalStore(str(root)), chunks_per_shard=CPS, buffer_bytes=BUFFER, journal=str(journal))


def test_an_empty_journal_is_taken_over_by_the_store_that_opens_it(tmp_path: Path) -> None:
    x, y, journal = tmp_path / "x.zarr", tmp_path / "y.zarr", tmp_path / "wb.journal"
    create(x)
    create(y)
    ShardedStore(LocalStore(str(x)), buffer_bytes=BUFFER, journal=str(journal)).close()  # no record left
    store = ShardedStore(LocalStore(str(y)), buffer_bytes=BUFFER, journal=str(journal))
    store.close()
    with Journal(journal) as j:
        assert str(y.resolve()) in j.identity["location"] and j.identity["layout"] == "zarr3"


def test_one_store_object_holds_the_journal_and_close_lets_go(tmp_path: Path) -> None:
    root, journal = tmp_path / "data.zarr", tmp_path / "wb.journal"
    create(root)
    store = ShardedStore(LocalStore(str(root)), chunks_per_shard=CPS, buffer_bytes=BUFFER, journal=str(journal))
    with pytest.raises(LockTimeoutError):
        ShardedStore(LocalStore(str(root)), buffer_bytes=BUFFER, journal=str(journal))
    z = zarr.open_array(store, path="a", mode="r+")  # zarr's read-only copy (mode="r") would not touch it
    np.testing.assert_array_equal(zarr.open_array(store, path="a", mode="r")[:], np.zeros(SHAPE, "i4"))
    z[0:2, 0:2] = 5
    store.close()  # flushed, the journal released
    other = ShardedStore(LocalStore(str(root)), buffer_bytes=BUFFER, journal=str(journal))
    other.close()
    z[2:4, 0:2] = 6  # the closed store reopens with its next use, and takes its journal back
    with pytest.raises(LockTimeoutError):
        ShardedStore(LocalStore(str(root)), buffer_bytes=BUFFER, journal=str(journal))
    store.close()
    assert read_at_root(root)[2:4, 0:2].tolist() == [[6, 6], [6, 6]]


def test_clear_keeps_the_store_id_the_open_journal_records(tmp_path: Path) -> None:
    root, journal = tmp_path / "data.zarr", tmp_path / "wb.journal"
    create(root)
    store = ShardedStore(LocalStore(str(root)), chunks_per_shard=CPS, buffer_bytes=BUFFER, journal=str(journal))
    store_id = (root / STORE_ID_KEY).read_text()
    sync(store.clear())
    assert (root / STORE_ID_KEY).read_text() == store_id  # a crash after this still replays into this store
    assert sync(store.is_empty(""))  # and the id is never listed
    store.close()


# -- (c) journal needs buffer_bytes, as for the zarr 2 proxy ---------------------------------------


def test_journal_needs_buffer_bytes(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="buffer_bytes"):
        ShardedStore(LocalStore(str(tmp_path / "s")), chunks_per_shard=2, journal=str(tmp_path / "j"))
    assert not (tmp_path / "j").exists()


def test_journal_needs_a_writable_store(tmp_path: Path) -> None:
    (tmp_path / "s").mkdir()
    with pytest.raises(ConfigurationError, match="writable"):
        ShardedStore(str(tmp_path / "s"), read_only=True, buffer_bytes=BUFFER, journal=str(tmp_path / "j"))
    assert not (tmp_path / "j").exists()


# -- copies: pickled and read-only copies never hold acknowledged data, never take the journal ------


@pytest.mark.parametrize("base_kind", ["memory", "local"])
def test_a_pickled_copy_writes_through_and_leaves_the_journal_alone(tmp_path: Path, base_kind: str) -> None:
    base: Any = MemoryStore() if base_kind == "memory" else LocalStore(str(tmp_path / "data.zarr"))
    journal = tmp_path / "wb.journal"
    store = ShardedStore(base, chunks_per_shard=CPS, buffer_bytes=BUFFER, journal=str(journal))
    z = zarr.create_array(store, name="a", shape=SHAPE, chunks=CHUNKS, dtype="i4", fill_value=0)
    z[0:2, 0:2] = 1  # buffered (shard (0, 0) incomplete)
    with pytest.raises(UnflushedWritesError):
        pickle.dumps(store)
    store.flush()
    copy = pickle.loads(pickle.dumps(store))
    # the same store, although the copy writes through (a pickled MemoryStore holds a copy of the dict: another store)
    assert (copy == store) is (base_kind == "local")
    zarr.open_array(copy, path="a", mode="r+")[8:10, 8:10] = 9  # one chunk of shard (1, 1)
    # written through at once: the copy's store underneath has it, no flush of the copy needed (a pickled
    # MemoryStore is a copy of the dict; a LocalStore the same directory)
    plain = np.asarray(zarr.open_array(copy.base, path="a", mode="r")[:])
    assert plain[8:10, 8:10].tolist() == [[9, 9], [9, 9]] and plain[0, 0] == 1
    assert (pickle.loads(pickle.dumps(copy)) == copy) is (base_kind == "local")
    store.close()
    copy.close()


def test_a_with_read_only_copy_of_a_journalled_store_writes_through(tmp_path: Path) -> None:
    root, journal = tmp_path / "data.zarr", tmp_path / "wb.journal"
    create(root)
    store = ShardedStore(LocalStore(str(root)), chunks_per_shard=CPS, buffer_bytes=BUFFER, journal=str(journal))
    writable = store.with_read_only(True).with_read_only(False)
    zarr.open_array(writable, path="a", mode="r+")[0:2, 0:2] = 4
    assert read_at_root(root)[0:2, 0:2].tolist() == [[4, 4], [4, 4]]
    with pytest.raises(ValueError, match="read-only"):
        sync(store.with_read_only(True).set("a/c/0/0", cpu.Buffer.from_bytes(b"x")))
    store.close()


def test_dask_local_cluster_writes_every_chunk_through_a_journalled_store(tmp_path: Path) -> None:
    """No write-back data without an owner (zarr 3 store): worker copies write through, none keeps a buffer."""
    distributed = pytest.importorskip("distributed")
    da = pytest.importorskip("dask.array")

    root, journal = tmp_path / "data.zarr", tmp_path / "wb.journal"
    store = ShardedStore(LocalStore(str(root)), chunks_per_shard=CPS, buffer_bytes=BUFFER, journal=str(journal))
    z = zarr.create_array(store, name="a", shape=SHAPE, chunks=CHUNKS, dtype="i4", fill_value=0)
    data = np.arange(np.prod(SHAPE), dtype="i4").reshape(SHAPE) + 1
    with (
        distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=2,
            host="127.0.0.1",
            dashboard_address=":0",  # a free port: None still serves the scheduler's HTTP routes on 8787
            processes=True,
            worker_dashboard_address=None,  # a dashboard per worker would warn that port 8787 is taken
            death_timeout=60,
        ) as cluster,
        distributed.Client(cluster, timeout=60) as client,
    ):
        da.from_array(data, chunks=CHUNKS).store(z, lock=False, compute=False).compute(scheduler=client)
    store.close()
    np.testing.assert_array_equal(read_at_root(root), data)  # every chunk stored, none left in a worker
