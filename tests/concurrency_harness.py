"""Helpers and fixtures for the concurrency proofs (zero lost updates).

* :func:`run_counter_processes` — N spawned processes increment a counter file
  under :class:`shardkv.engine.locks.ShardLocks` (a non-atomic
  read-sleep-write, so any gap in the locking loses increments).
* :func:`run_sharded_writers` — N spawned processes, each with its own
  ``ShardedStore``, write disjoint chunks of one zarr-python 2 array whose
  shards they share; returns how many chunk updates were lost.
* fixtures ``moto_s3`` (a moto S3 server on 127.0.0.1, a bucket, an s3fs
  factory; its conditional writes decided as S3 decides them, :mod:`moto_strict`) and
  ``local_cluster`` (a ``dask.distributed`` cluster of worker processes); import them into a test module to use them.

Every loop is bounded in count, every wait in time; child processes are
joined with a timeout and terminated if they overrun.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
import traceback
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import moto_strict
import numpy as np
import pytest

SPAWN = multiprocessing.get_context("spawn")
JOIN_TIMEOUT_S = 60.0


def _join_all(procs: list[Any], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
            p.join(5)
    late = [p.name for p in procs if p.exitcode != 0]
    if late:
        raise RuntimeError(f"child processes failed or overran {timeout:g} s: {late}")


def run_threads(target: Any, n: int, join_s: float = JOIN_TIMEOUT_S) -> list[BaseException]:
    """Run ``target(i)`` for ``i`` in ``range(n)`` in ``n`` threads started together; the errors raised.

    Threads wait at a barrier (30 s at most) so they start at once, and are
    joined within ``join_s`` seconds in all; a thread still running then is
    reported as a ``TimeoutError``.
    """
    errors: list[BaseException] = []
    barrier = threading.Barrier(n, timeout=30)

    def run(i: int) -> None:
        try:
            barrier.wait()
            target(i)
        except BaseException as exc:  # reported to the test
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + join_s
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    if any(t.is_alive() for t in threads):
        errors.append(TimeoutError(f"threads still running after {join_s:g} s"))
    return errors


# -- counter under ShardLocks -----------------------------------------------------


def _counter_worker(root: str, n_increments: int, barrier: Any) -> None:
    from shardkv.engine.locks import ShardLocks
    from shardkv.storage.local import LocalStore

    locks = ShardLocks(LocalStore(root).location, timeout=30.0)
    path = os.path.join(root, "counter")
    barrier.wait(30)
    for _ in range(n_increments):
        with locks.hold(["counter"]):
            with open(path, "rb") as f:
                value = int(f.read() or b"0")
            time.sleep(0.0005)  # widen the read-modify-write window
            tmp = f"{path}.{os.getpid()}"
            with open(tmp, "wb") as f:
                f.write(str(value + 1).encode())
            os.replace(tmp, path)


def run_counter_processes(root: str, n_procs: int, n_increments: int, timeout: float = JOIN_TIMEOUT_S) -> int:
    """Spawn ``n_procs`` processes that each add 1 to ``root/counter`` ``n_increments`` times; the final value."""
    with open(os.path.join(root, "counter"), "wb") as f:
        f.write(b"0")
    barrier = SPAWN.Barrier(n_procs)
    procs = [
        SPAWN.Process(target=_counter_worker, args=(root, n_increments, barrier), name=f"counter-{i}")
        for i in range(n_procs)
    ]
    for p in procs:
        p.start()
    _join_all(procs, timeout)
    with open(os.path.join(root, "counter"), "rb") as f:
        return int(f.read())


# -- disjoint chunk writes through ShardedStore ----------------------------------------


@dataclass(frozen=True)
class LostUpdates:
    """What :func:`run_sharded_writers` found."""

    lost: int
    total: int
    child_errors: tuple[str, ...]


def _chunk_value(chunk_index: int, chunk_len: int) -> np.ndarray:
    return np.full(chunk_len, chunk_index + 1, dtype="i4")


def _writer(
    path: str,
    worker: int,
    n_workers: int,
    n_chunks: int,
    chunk_len: int,
    options: dict,
    barrier: Any,
    errors: Any,
    array_path: str = "",
    make_base: Any = None,
) -> None:
    try:
        import zarr

        from shardkv import ShardedStore

        store = ShardedStore(path if make_base is None else make_base(path), **options)
        arr = zarr.open_array(store=store, path=array_path or None, mode="r+")
        barrier.wait(30)
        for c in range(worker, n_chunks, n_workers):  # chunk c belongs to worker c % n_workers
            arr[c * chunk_len : (c + 1) * chunk_len] = _chunk_value(c, chunk_len)
        store.close()
    except Exception:  # reported to the parent, which fails the run with the traceback
        errors.put(f"worker {worker}: {traceback.format_exc()}")


def run_sharded_writers(
    path: str,
    *,
    n_procs: int = 4,
    n_chunks: int = 256,
    chunk_len: int = 8,
    chunks_per_shard: int = 16,
    concurrency: str = "auto",
    storage_options: dict | None = None,
    timeout: float = JOIN_TIMEOUT_S,
    views: tuple[tuple[str, str], ...] = (),
    make_base: Any = None,
) -> LostUpdates:
    """``n_procs`` spawned processes, one ``ShardedStore`` each, write disjoint chunks of one array.

    Worker ``w`` writes every chunk ``c`` with ``c % n_procs == w``, one chunk
    per call, so every shard is updated by every worker. Afterwards a fresh
    store reads the array back and counts the chunks that do not hold what
    their writer wrote (lost updates). Errors in the children (a
    ``CorruptShardError``, say) are returned, not raised. ``storage_options``
    go to every ``ShardedStore`` (``{"client": "obstore", ...}`` opens
    ``path`` with obstore).

    ``views``: ``(store root, array path)`` pairs that all name one array,
    given to the workers in turn (default: the array at the root of ``path``);
    the array is created through the first.

    ``make_base``: a picklable callable (a class, a module-level function)
    that makes every base store from its path (``zarr.NestedDirectoryStore``);
    by default the path itself is the base store.
    """
    import zarr

    from shardkv import ShardedStore

    views = views or ((path, ""),)
    options = {"chunks_per_shard": chunks_per_shard, "concurrency": concurrency}
    if storage_options is not None:
        options["storage_options"] = dict(storage_options)

    def base(root: str) -> Any:
        return root if make_base is None else make_base(root)

    setup = ShardedStore(base(views[0][0]), **options)
    zarr.open_array(
        store=setup,
        path=views[0][1] or None,
        mode="w",
        shape=(n_chunks * chunk_len,),
        chunks=(chunk_len,),
        dtype="i4",
        fill_value=0,
    )
    setup.close()
    barrier = SPAWN.Barrier(n_procs)
    errors = SPAWN.Queue()
    procs = [
        SPAWN.Process(
            target=_writer,
            args=(
                views[w % len(views)][0],
                w,
                n_procs,
                n_chunks,
                chunk_len,
                options,
                barrier,
                errors,
                views[w % len(views)][1],
                make_base,
            ),
            name=f"writer-{w}",
        )
        for w in range(n_procs)
    ]
    for p in procs:
        p.start()
    _join_all(procs, timeout)
    child_errors = []
    while not errors.empty() and len(child_errors) < n_procs:
        child_errors.append(errors.get(timeout=5))
    check = ShardedStore(base(views[0][0]), **options)
    try:
        data = zarr.open_array(store=check, path=views[0][1] or None, mode="r")[:]
    except Exception as exc:  # a torn shard is a finding, not a harness failure
        return LostUpdates(n_chunks, n_chunks, (*child_errors, f"reading back: {exc!r}"))
    lost = sum(
        not np.array_equal(data[c * chunk_len : (c + 1) * chunk_len], _chunk_value(c, chunk_len))
        for c in range(n_chunks)
    )
    return LostUpdates(int(lost), n_chunks, tuple(child_errors))


# -- fixtures -------------------------------------------------------------------------


@dataclass
class MotoS3:
    """A running moto S3 server: its endpoint, a bucket, and a factory of s3fs filesystems."""

    endpoint_url: str
    bucket: str

    def filesystem(self) -> Any:
        """A new s3fs filesystem (own client) on the server."""
        import s3fs

        return s3fs.S3FileSystem(
            key="testing",
            secret="testing",
            client_kwargs={"endpoint_url": self.endpoint_url, "region_name": "us-east-1"},
            skip_instance_cache=True,
        )


@pytest.fixture(scope="module")
def moto_s3() -> Iterator[MotoS3]:
    """A moto S3 server on 127.0.0.1 (a free port, :mod:`moto_strict`), one bucket; stopped after the module."""
    pytest.importorskip("s3fs")
    boto3 = pytest.importorskip("boto3")
    pytest.importorskip("moto.server")
    server, endpoint = moto_strict.start_server()
    try:
        bucket = f"shardkv-{uuid.uuid4().hex[:8]}"
        client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        client.create_bucket(Bucket=bucket)
        yield MotoS3(endpoint, bucket)
    finally:
        server.stop()


@pytest.fixture(scope="module")
def local_cluster() -> Iterator[Any]:
    """A ``dask.distributed`` client on 2 worker processes (1 thread each), closed after the module."""
    distributed = pytest.importorskip("distributed")
    cluster = distributed.LocalCluster(
        n_workers=2,
        processes=True,
        threads_per_worker=1,
        host="127.0.0.1",
        dashboard_address=":0",  # a free port: None still serves the scheduler's HTTP routes on 8787
        worker_dashboard_address=None,
    )
    client = distributed.Client(cluster, timeout=30)
    try:
        yield client
    finally:
        client.close(timeout=30)
        cluster.close(timeout=30)
