"""No wait without end: shard locks have a finite default timeout, and a lock held elsewhere is named.

A lock file held by another process (here a child that took its ``flock`` and waits on a pipe, as a hung
writer would) makes a writer fail after ``lock_timeout`` with a ``LockTimeoutError`` naming the shard, the
lock file and what to do.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_draft_processes import ARRAY, ENTRY_POINT

from shardkv import ShardedStore, open_store
from shardkv.engine.locks import DEFAULT_LOCK_TIMEOUT, ShardLocks, lock_prefix
from shardkv.engine.options import Options
from shardkv.errors import LockTimeoutError
from shardkv.storage.local import LocalStore
from shardkv.transformers import ShardingStorageTransformer

zarr = pytest.importorskip("zarr")
if not zarr.__version__.startswith("2."):
    pytest.skip("zarr-python 2 only", allow_module_level=True)

_HOLD = textwrap.dedent(
    """
    import fcntl, os, sys
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    print("held", flush=True)
    sys.stdin.read()  # until the test closes the pipe
    """
)


def test_the_default_lock_timeout_is_finite(tmp_path: Path) -> None:
    assert 60 <= DEFAULT_LOCK_TIMEOUT <= 600 and math.isfinite(DEFAULT_LOCK_TIMEOUT)
    assert Options().lock_timeout == DEFAULT_LOCK_TIMEOUT
    assert ShardLocks(LocalStore(str(tmp_path)).location).timeout == DEFAULT_LOCK_TIMEOUT
    assert ShardedStore(str(tmp_path / "v2")).engine.locks.timeout == DEFAULT_LOCK_TIMEOUT
    assert ShardingStorageTransformer(str(tmp_path / "t"), [2]).engine.locks.timeout == DEFAULT_LOCK_TIMEOUT
    draft = open_store(str(tmp_path / "draft"), chunks_per_shard=2, layout="draft2022")
    draft["zarr.json"], draft["meta/root/arr.array.json"] = ENTRY_POINT, ARRAY
    top = draft.transformer("arr")
    assert isinstance(top, ShardingStorageTransformer) and top.engine.locks.timeout == DEFAULT_LOCK_TIMEOUT
    assert Options(lock_timeout=None).lock_timeout is None  # waiting for ever stays possible, when asked for


def test_a_lock_file_held_by_another_process_times_out_naming_shard_lock_file_and_remedy(tmp_path: Path) -> None:
    path = str(tmp_path / "data.zarr")
    store = ShardedStore(path, chunks_per_shard=4, lock_timeout=0.2)
    arr = zarr.open_array(store=store, mode="w", shape=(16,), chunks=(2,), dtype="i4", fill_value=0)
    shard_key, sharded = "0", store.sharded_array("")
    assert sharded is not None
    lock_file = store.engine.locks.lock_file(shard_key, lock_prefix(sharded))
    assert lock_file is not None
    os.makedirs(os.path.dirname(lock_file), exist_ok=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, lock_file], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(LockTimeoutError) as info:
            arr[0:2] = 5  # chunk 0 of shard 0
        arr[8:10] = 7  # shard 1: another lock file, no wait
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(60)
    error = info.value
    assert (error.shard_key, error.path, error.timeout) == (shard_key, lock_file, 0.2)
    message = str(error)
    assert message.startswith(f"could not lock shard '0' (lock file {lock_file!r}) within 0.2 s: another process")
    assert f"fuser -v {lock_file}" in message and "lock_timeout=" in message and "do not delete" in message
    arr[0:2] = 5  # the holder is gone: its lock with it
    assert list(zarr.open_array(store=ShardedStore(path), mode="r")[:10]) == [5, 5, 0, 0, 0, 0, 0, 0, 7, 7]
