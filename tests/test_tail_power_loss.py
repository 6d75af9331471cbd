"""A power loss during an in-place append (``shard_updates="append"``): every state the file system may keep.

The append's writes, syncs and truncations are recorded at the local store's own I/O calls
(tests/crash_states.py); for a crash after each of them, every on-disk state a file system allows
(everything up to each file's last completed sync, any subset of the 4 KiB blocks written since,
blocks not kept read as their old bytes or as zeros) is built in a copy of the array and read:
without recovery as zarr 3 and tensorstore read it (the shard decoded by its layout: a damaged
index is an error), by shardkv (which repairs what it meets), and by shardkv after ``compact``
(the recovery every write hold runs). The chunks have no checksum (no compressor), so zeros read
as chunk data would be wrong values: every reader must get each chunk's old or new value, or an
error; after recovery, old or new with no error, and new once the append's last sync completed.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr
from crash_states import IORecorder, files_of, placed_states

import shardkv.storage.local as local_mod
from shardkv import ShardedStore
from shardkv.errors import CorruptShardError, ShardKVError
from shardkv.format.layout import ShardLayout

CHUNK, PER_SHARD, N_CHUNKS = 2048, 4, 8  # uint16: one 4 KiB block per chunk
UPDATED = (0, 1, 2)
LAYOUT = ShardLayout.v3((PER_SHARD,))


def _old() -> np.ndarray:
    return np.repeat(np.arange(1, N_CHUNKS + 1, dtype="u2"), CHUNK)


def _new() -> np.ndarray:
    data = _old()
    for c in UPDATED:
        data[c * CHUNK : (c + 1) * CHUNK] = 100 + c
    return data


def _check(got: np.ndarray, new_only: bool, where: str) -> None:
    old, new = _old(), _new()
    for c in range(N_CHUNKS):
        part, span = got[c * CHUNK : (c + 1) * CHUNK], slice(c * CHUNK, (c + 1) * CHUNK)
        allowed = [new[span]] if new_only else [old[span], new[span]]
        if not any(np.array_equal(part, a) for a in allowed):
            raise AssertionError(f"{where}: chunk {c} holds {sorted(set(part.tolist()))}, not its old or new value")


def _raw_shard(root: Path) -> np.ndarray | None:
    """Shard 0 decoded by its layout as zarr 3 and tensorstore read it (no recovery); None: a damaged index."""
    try:
        chunks = LAYOUT.chunks_of_shard((root / "0").read_bytes(), "0")
    except CorruptShardError:
        return None
    got = _old()  # shard 1 is not written; a chunk the index leaves out would read as the fill value
    got[: CHUNK * PER_SHARD] = 0
    for (c,), value in chunks.items():
        got[c * CHUNK : (c + 1) * CHUNK] = np.frombuffer(value, dtype="u2")
    return got


def test_every_state_a_power_loss_may_leave_reads_old_or_new_values(tmp_path: Path, monkeypatch) -> None:
    root = tmp_path / "a"
    store = ShardedStore(str(root), chunks_per_shard=PER_SHARD, shard_updates="append", max_dead_fraction=1.0)
    z = zarr.create(shape=(CHUNK * N_CHUNKS,), chunks=(CHUNK,), dtype="u2", compressor=None, store=store)
    z[:] = _old()
    pristine = tmp_path / "pristine"
    shutil.copytree(root, pristine)
    before = files_of(root)
    recorder = IORecorder(str(root))
    with monkeypatch.context() as patched:
        recorder.install(patched, local_mod)
        z[: CHUNK * len(UPDATED)] = _new()[: CHUNK * len(UPDATED)]
    assert store.engine.stats.tail_updates == 1  # an in-place append, not a whole rewrite
    ops = recorder.ops
    shard_syncs = [i for i, op in enumerate(ops) if op[:2] == ("sync", "0")]
    assert shard_syncs and any(op[:2] == ("write", "0") for op in ops), ops
    durable_from = shard_syncs[-1] + 1  # a crash after the append's last sync keeps it
    states = 0
    for crash_at, where in placed_states(root, pristine, before, ops):  # at root: the intent names its shard
        states += 1
        raw = _raw_shard(root)
        if raw is not None:
            _check(raw, False, f"{where}, read without recovery")
        try:
            read = zarr.open(ShardedStore(str(root)), mode="r")[:]
        except ShardKVError:
            pass
        else:
            _check(read, False, f"{where}, read by shardkv")
        ShardedStore(str(root)).compact()  # the recovery of every write hold, then a rewrite
        recovered = zarr.open(ShardedStore(str(root)), mode="r")[:]
        _check(recovered, crash_at >= durable_from, f"{where}, read after recovery")
        raw = _raw_shard(root)
        assert raw is not None and np.array_equal(raw, recovered), where
    assert 20 <= states <= 600, states  # the enumeration is bounded (and not empty)


@pytest.mark.parametrize("fsync", [True, False])
def test_an_append_syncs_its_chunks_before_it_writes_their_index(fsync: bool, tmp_path: Path, monkeypatch) -> None:
    """The append's calls: intent, sync, chunks, sync, index, sync, intent cleared; no sync without fsync."""
    root = tmp_path / "a"
    store = ShardedStore(str(root), chunks_per_shard=PER_SHARD, shard_updates="append", max_dead_fraction=1.0)
    z = zarr.create(shape=(CHUNK * N_CHUNKS,), chunks=(CHUNK,), dtype="u2", compressor=None, store=store)
    z[:] = _old()
    store.engine.kv.fsync = fsync
    recorder = IORecorder(str(root))
    with monkeypatch.context() as patched:
        recorder.install(patched, local_mod)
        z[: CHUNK * len(UPDATED)] = _new()[: CHUNK * len(UPDATED)]
    lock = next(op[1] for op in recorder.ops if op[1] != "0")
    shard_size = os.path.getsize(root / "0")
    expected = [("write", lock), ("sync", lock), ("write", "0"), ("sync", "0"), ("write", "0"), ("sync", "0")]
    expected.append(("write", lock))
    got = [op[:2] for op in recorder.ops]
    assert got == (expected if fsync else [op for op in expected if op[0] == "write"]), got
    chunks_write, index_write = [op for op in recorder.ops if op[:2] == ("write", "0")]
    assert len(chunks_write[3]) == CHUNK * 2 * len(UPDATED)  # the new chunks alone
    assert index_write[2] + len(index_write[3]) == shard_size and len(index_write[3]) == LAYOUT.index_nbytes
