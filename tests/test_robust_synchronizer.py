"""What zarr 2's synchronizers make safe for dask blocks that cut chunks (the README's advice).

* ``zarr.ProcessSynchronizer`` is one lock file per chunk, locked with POSIX
  record locks, which belong to the *process*: two threads of one process
  both hold the same chunk's lock at once. So it orders dask *processes* with
  one thread each, and nothing within a multi-threaded worker: with
  ``threads_per_worker > 1`` patches of one chunk are lost (shown here on a
  ``LocalCluster``).
* ``zarr.ThreadSynchronizer`` orders the threads of one process (the threaded
  scheduler), and nothing across processes.
* Blocks made of whole zarr chunks need neither, on any scheduler.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from shardkv import ShardedStore

zarr = pytest.importorskip("zarr")
if not zarr.__version__.startswith("2."):
    pytest.skip("zarr-python 2 only", allow_module_level=True)
da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")

pytestmark = pytest.mark.filterwarnings("ignore::shardkv.PartialShardWriteWarning")

SHAPE = (96, 96)
CHUNKS = (16, 16)
BLOCKS = (12, 12)  # every block boundary but the first cuts a chunk: 4 tasks patch most chunks


def other_thread_acquires(lock_of: object) -> bool:
    """Whether a second thread gets the chunk lock while this thread holds it (waits at most 2 s)."""
    held = lock_of["0.0"]  # type: ignore[index]
    assert held.acquire()
    result: list[bool] = []

    def grab() -> None:
        lock = lock_of["0.0"]  # type: ignore[index]
        got = lock.acquire(blocking=True, timeout=2.0) if "Thread" in type(lock).__name__ else _try(lock)
        result.append(bool(got))
        if got:
            lock.release()

    t = threading.Thread(target=grab)
    t.start()
    t.join(10)
    held.release()
    return result == [True]


def _try(lock: object) -> bool:
    return bool(lock.acquire(blocking=True, timeout=2.0))  # type: ignore[attr-defined]


def test_a_process_synchronizer_does_not_exclude_threads_a_thread_synchronizer_does(tmp_path: Path) -> None:
    assert other_thread_acquires(zarr.ProcessSynchronizer(str(tmp_path / "locks")))  # both threads hold it
    assert not other_thread_acquires(zarr.ThreadSynchronizer())  # the second one waits


def store_unaligned(path: str, sync: object, scheduler: object) -> int:
    """``da.store`` chunk-cutting blocks into a new sharded array; returns the elements that came out wrong."""
    source = np.random.default_rng(5).integers(1, 1 << 30, size=SHAPE, dtype="i4")
    target = zarr.open_array(
        ShardedStore(path, chunks_per_shard=2),
        mode="w",
        shape=SHAPE,
        chunks=CHUNKS,
        dtype="i4",
        fill_value=0,
        synchronizer=sync,
    )
    da.store(da.from_array(source, chunks=BLOCKS), target, lock=False, compute=True, scheduler=scheduler)
    written = zarr.open_array(ShardedStore(path), mode="r")[:]
    return int(np.count_nonzero(written != source))


def cluster(threads: int, workers: int) -> distributed.Client:
    return distributed.Client(
        distributed.LocalCluster(
            n_workers=workers,
            threads_per_worker=threads,
            processes=True,
            host="127.0.0.1",
            dashboard_address=":0",  # a free port: None still serves the scheduler's HTTP routes on 8787
            worker_dashboard_address=None,
        ),
        timeout=30,
    )


def test_process_synchronizer_with_several_threads_per_worker_loses_patches(tmp_path: Path) -> None:
    client = cluster(threads=4, workers=1)
    try:
        lost: list[int] = []
        for i in range(3):  # a race: shown in at least one of 3 runs (bounded; the first run shows it in practice)
            lost.append(
                store_unaligned(str(tmp_path / f"t{i}.zarr"), zarr.ProcessSynchronizer(str(tmp_path / f"l{i}")), client)
            )
            if lost[-1]:
                break
    finally:
        client.close(timeout=30)
        client.cluster.close(timeout=30)
    print(f"elements lost per run: {lost}")
    assert max(lost) > 0, "every patch survived: zarr's ProcessSynchronizer now excludes threads? update the README"


def test_thread_synchronizer_on_the_threaded_scheduler_loses_nothing(tmp_path: Path) -> None:
    """The other safe combination, ProcessSynchronizer on 1-thread worker processes, is
    ``test_concurrency_dask.py::test_chunk_unaligned_blocks_with_a_process_synchronizer``."""
    assert store_unaligned(str(tmp_path / "threads.zarr"), zarr.ThreadSynchronizer(), "threads") == 0
