"""Shard-aligned conversion tasks, run here, in local processes or on a dask.distributed cluster.

A :class:`ShardTask` names whole shards of one array and the chunk keys that
go into each; :func:`run_task` reads those chunks (one batched read per
shard: ``cat``-style concurrent requests on object stores), packs them (bytes
unchanged) and writes the shards. No two tasks name the same shard, so tasks
can run in any order and in parallel without touching each other's objects.

:func:`array_tasks` makes the tasks of one array lazily, one shard at a time,
from the bitmap of its stored chunks (:class:`shardkv.cli.convert.listing.ChunkBitmap`):
chunk keys exist as strings only for the shards of tasks in flight.

:func:`execute` runs an iterable of tasks in this process (``workers=1``), in a
pool of local processes (``workers=N``), or on an existing dask.distributed
cluster (``scheduler="tcp://host:port"``), keeping a bounded number of tasks in
flight (:data:`IN_FLIGHT_PER_WORKER` per worker), and calls ``on_done`` in this
process as each task finishes; the caller records progress there (see
:mod:`shardkv.cli.manifest`). Tasks run elsewhere open the stores again from
their names and storage options, so those must be paths or URLs the workers
can reach. Local worker processes end themselves when the process that
started them is gone (killed with ``kill -9`` or ``SIGTERM``): see
:func:`_watch_parent`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from shardkv._types import BytesLike
from shardkv.cli.convert.listing import ArrayListing, ChunkBitmap, block_coords
from shardkv.errors import ConfigurationError
from shardkv.format.layout import IndexLocation, ShardLayout
from shardkv.keys.paths import path_prefix
from shardkv.keys.space import ShardedArray
from shardkv.storage.kv import KVStore

__all__ = [
    "ShardTask",
    "TaskResult",
    "run_task",
    "execute",
    "array_tasks",
    "shard_index",
    "shard_members_at",
    "IN_FLIGHT_PER_WORKER",
]

IN_FLIGHT_PER_WORKER = 2
"""Tasks submitted ahead per worker: enough to keep each busy, few enough to bound memory."""

PARENT_POLL_SECONDS = 0.5
"""How often a local worker process checks that the process that started it is still there."""


@dataclass(frozen=True)
class ShardTask:
    """Whole shards of one array to write: where from, where to, and how.

    Attributes
    ----------
    src, dst : str
        Source and destination (path or URL), opened again by a worker.
    src_options, dst_options : dict
        Their fsspec storage options.
    chunks_per_shard : tuple of int
        Inner chunks per shard of the array.
    index_location : {"start", "end"}
    index_checksum : bool
    shards : tuple of (int, str, tuple of (tuple of int, str))
        Per shard: its index in the array's shard grid (C order), its key, and
        ``(local_coords, chunk_key)`` of each source chunk in it.
    path : str
        The array's path (for the caller's bookkeeping).
    write_batch_nbytes, write_batch_objects : int
        Finished shards held (bytes, objects) before one batched write.
    source_shards : ShardedArray or None
        For a source already sharded: its shards, the chunk keys of ``shards`` being its
        chunk keys, each read as the inner chunk its shard's index locates; ``None``: one object per chunk.
    """

    src: str
    dst: str
    src_options: Mapping[str, Any]
    dst_options: Mapping[str, Any]
    chunks_per_shard: tuple[int, ...]
    index_location: IndexLocation
    index_checksum: bool
    shards: tuple[tuple[int, str, tuple[tuple[tuple[int, ...], str], ...]], ...]
    path: str = ""
    write_batch_nbytes: int = 64 * 2**20
    write_batch_objects: int = 64
    source_shards: ShardedArray | None = None

    @property
    def n_chunks(self) -> int:
        """Source chunks named by the task."""
        return sum(len(members) for _, _, members in self.shards)


@dataclass(frozen=True)
class TaskResult:
    """What one task wrote: ``(shard index, shard key, shard bytes, chunk bytes read)`` per shard written."""

    written: tuple[tuple[int, str, int, int], ...]
    nbytes_read: int
    n_chunks: int


def shard_index(shard_coords: tuple[int, ...], shard_grid: tuple[int, ...]) -> int:
    """The position of a shard in its array's shard grid, C order."""
    index = 0
    for c, g in zip(shard_coords, shard_grid, strict=True):
        index = index * g + c
    return index


def _shard_members(
    chunks: ChunkBitmap, shard_coords: tuple[int, ...], cps: tuple[int, ...], key_of: Callable[[tuple[int, ...]], str]
) -> tuple[tuple[tuple[int, ...], str], ...]:
    """``(local coords, chunk key)`` of the stored chunks of one shard, in C order."""
    lo = tuple(s * n for s, n in zip(shard_coords, cps, strict=True))
    hi = tuple(min(a + n, g) for a, n, g in zip(lo, cps, chunks.grid, strict=True))
    if not chunks.any_in(lo, hi):
        return ()
    members = []
    for coords in block_coords(lo, hi):
        if coords in chunks:
            members.append((tuple(c - a for c, a in zip(coords, lo, strict=True)), key_of(coords)))
    return tuple(members)


def shard_members_at(
    listing: ArrayListing, cps: tuple[int, ...], index: int
) -> tuple[tuple[tuple[int, ...], str], ...]:
    """``(local coords, chunk key)`` of the stored chunks of the shard at ``index`` (C order) of an array."""
    shard_grid = tuple(-(-g // n) for g, n in zip(listing.chunks.grid, cps, strict=True))
    coords = []
    for g in reversed(shard_grid):
        index, c = divmod(index, g)
        coords.append(c)
    return _shard_members(listing.chunks, tuple(reversed(coords)), cps, listing.chunk_key)


def array_tasks(
    listing: ArrayListing,
    cps: tuple[int, ...],
    base: Mapping[str, Any],
    max_chunks: int,
    skip: Callable[[int], bool] = lambda index: False,
    on_skipped: Callable[[int, int], None] = lambda index, n_chunks: None,
    on_empty: Callable[[int], None] = lambda index: None,
) -> Iterator[ShardTask]:
    """The tasks of one array, made lazily: whole shards, about ``max_chunks`` chunks each.

    Parameters
    ----------
    listing : ArrayListing
        The array's stored chunks.
    cps : tuple of int
        Chunks per shard along each dimension.
    base : mapping
        The other :class:`ShardTask` fields (``src``, ``dst``, options, layout).
    max_chunks : int
        Chunks per task, at least one shard per task.
    skip : callable
        ``skip(shard_index)``: True for a shard an earlier run finished (not in any task).
    on_skipped : callable
        Called with ``(shard_index, chunks in it)`` for each shard skipped.
    on_empty : callable
        Called with ``shard_index`` for each shard-grid position that holds no stored chunk (no task).
    """
    encoding = listing.key_encoding
    prefix = path_prefix(listing.path)
    shard_grid = tuple(-(-g // n) for g, n in zip(listing.chunks.grid, cps, strict=True))
    batch: list[tuple[int, str, tuple[tuple[tuple[int, ...], str], ...]]] = []
    n = 0

    def key_of(coords: tuple[int, ...]) -> str:
        return prefix + encoding.encode(coords)

    for shard_coords in block_coords((0,) * len(shard_grid), shard_grid):
        members = _shard_members(listing.chunks, shard_coords, cps, key_of)
        index = shard_index(shard_coords, shard_grid)
        if not members:
            on_empty(index)
            continue
        if skip(index):
            on_skipped(index, len(members))
            continue
        batch.append((index, key_of(shard_coords), members))
        n += len(members)
        if n >= max_chunks:
            yield ShardTask(shards=tuple(batch), path=listing.path, **base)
            batch, n = [], 0
    if batch:
        yield ShardTask(shards=tuple(batch), path=listing.path, **base)


def run_task(task: ShardTask, source: KVStore | None = None, target: KVStore | None = None) -> TaskResult:
    """Read, pack and write the shards of one task (in this process or a worker).

    A shard is written while the next ones are read (:class:`_Writes`); the
    task returns once every shard of it is stored.

    Parameters
    ----------
    task : ShardTask
    source, target : KVStore, optional
        Open stores to use; opened from the task's names and options when omitted.

    Returns
    -------
    TaskResult
        Shards written (a shard none of whose chunks is still stored is not written).
    """
    from shardkv.cli.stores import open_store

    source = source or open_store(task.src, task.src_options, role="source")
    target = target or open_store(task.dst, task.dst_options, role="destination")
    layout = ShardLayout.v3(task.chunks_per_shard, task.index_location, "little", task.index_checksum)
    read = _chunk_reader(source, task.source_shards)
    written: list[tuple[int, str, int, int]] = []
    nbytes_read = 0
    with _Writes(target, task.write_batch_nbytes, task.write_batch_objects) as writes:
        for index, shard_key, members in task.shards:
            values = read([k for _, k in members])
            chunks = {local: values[k] for local, k in members if k in values}
            if not chunks:
                continue
            shard_read = sum(memoryview(v).nbytes for v in chunks.values())
            nbytes_read += shard_read
            parts = layout.encode_shard_with_index(chunks)[0]  # the chunks as read and the index: no copy
            nbytes = sum(memoryview(p).nbytes for p in parts)
            writes.put(shard_key, parts, nbytes)
            written.append((index, shard_key, nbytes, shard_read))
    return TaskResult(tuple(written), nbytes_read, task.n_chunks)


class _Writes:
    """A task's shard writes, made on one thread of their own while the task reads on.

    Shards finished while a write is under way are written together by the
    next one (one batched ``put_many``). Shards held, written or waiting, stay
    under ``max_nbytes`` and ``max_objects`` (plus the shard just finished).
    Leaving the ``with`` block waits for every write; the first error of a
    write is raised there or at the next ``put``.
    """

    def __init__(self, kv: KVStore, max_nbytes: int, max_objects: int) -> None:
        self.kv, self.max_nbytes, self.max_objects = kv, max_nbytes, max_objects
        self.pending: dict[str, list[BytesLike]] = {}
        self.pending_nbytes = self.held_nbytes = self.held_objects = 0
        self.in_flight: Future[None] | None = None
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shardkv-convert-write")

    def put(self, key: str, parts: list[BytesLike], nbytes: int) -> None:
        self.pending[key] = parts
        self.pending_nbytes += nbytes
        if self.in_flight is not None and (
            self.in_flight.done()
            or self.held_nbytes + self.pending_nbytes >= self.max_nbytes
            or self.held_objects + len(self.pending) >= self.max_objects
        ):
            self._wait()
        if self.in_flight is None:
            self._submit()

    def _submit(self) -> None:
        from shardkv.cli.stores import put_all

        batch, self.pending = self.pending, {}
        self.held_nbytes, self.held_objects, self.pending_nbytes = self.pending_nbytes, len(batch), 0
        self.in_flight = self.pool.submit(put_all, self.kv, batch)

    def _wait(self) -> None:
        future, self.in_flight = self.in_flight, None
        self.held_nbytes = self.held_objects = 0
        if future is not None:
            future.result()

    def __enter__(self) -> _Writes:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        try:
            self._wait()
            if exc_type is None and self.pending:
                self._submit()
                self._wait()
        finally:
            self.pool.shutdown(wait=True)


def _chunk_reader(source: KVStore, shards: ShardedArray | None) -> Callable[[list[str]], Mapping[str, BytesLike]]:
    """Stored chunk bytes by chunk key: objects of their own, or inner chunks located through their shard's index."""
    if shards is None:
        return source.values
    from shardkv.engine.engine import ShardEngine
    from shardkv.engine.options import Options

    reads = ShardEngine(source, Options(concurrency="none")).reads
    return lambda keys: reads.read_chunks([shards.locate(k) for k in keys])


def execute(
    tasks: Iterable[ShardTask],
    on_done: Callable[[ShardTask, TaskResult], None],
    *,
    workers: int = 1,
    scheduler: str | None = None,
    source: KVStore | None = None,
    target: KVStore | None = None,
) -> None:
    """Run ``tasks`` (taken lazily); ``on_done(task, result)`` is called here as each one finishes.

    Parameters
    ----------
    tasks : iterable of ShardTask
        Consumed as tasks finish: at most ``IN_FLIGHT_PER_WORKER * workers`` are pending at once.
    on_done : callable
        Called in this process, in completion order.
    workers : int
        1: run here, one task after another, with ``source``/``target``;
        N > 1: a pool of N local processes (spawned), which end themselves if this process dies.
    scheduler : str, optional
        Address of a running dask.distributed scheduler: tasks run on its workers.

    Raises
    ------
    ConfigurationError
        If ``workers`` < 1, or ``distributed`` is not installed for ``scheduler``.
    """
    if workers < 1:
        raise ConfigurationError(f"workers must be >= 1, got {workers}")
    if scheduler is not None:
        _execute_distributed(tasks, on_done, scheduler)
    elif workers == 1:
        for task in tasks:
            on_done(task, run_task(task, source, target))
    else:
        _execute_processes(tasks, on_done, workers)


def _watch_parent(parent_pid: int) -> None:
    """Worker initializer: end this worker when the process that started it is gone.

    A pool's workers otherwise outlive a main process killed with ``kill -9``
    (nothing tells them), holding the destination's files open. Polled every
    :data:`PARENT_POLL_SECONDS` on a daemon thread: ``os.getppid()`` changes
    when the parent dies (the worker is re-parented).
    """

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_SECONDS)
        os._exit(1)

    threading.Thread(target=watch, name="shardkv-watch-parent", daemon=True).start()


def _execute_processes(
    tasks: Iterable[ShardTask], on_done: Callable[[ShardTask, TaskResult], None], workers: int
) -> None:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor  # imports multiprocessing: only for a pool

    pending = iter(tasks)
    in_flight: dict[Future[TaskResult], ShardTask] = {}
    with ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_watch_parent,
        initargs=(os.getpid(),),
    ) as pool:
        try:
            while True:
                while len(in_flight) < IN_FLIGHT_PER_WORKER * workers:
                    task = next(pending, None)
                    if task is None:
                        break
                    in_flight[pool.submit(run_task, task)] = task
                if not in_flight:
                    return
                done, _ = wait(in_flight, return_when=FIRST_COMPLETED)
                for future in done:
                    on_done(in_flight.pop(future), future.result())
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise


def _execute_distributed(
    tasks: Iterable[ShardTask], on_done: Callable[[ShardTask, TaskResult], None], address: str
) -> None:
    try:
        from distributed import Client
        from distributed import as_completed as dask_as_completed
    except ImportError:
        raise ConfigurationError("--scheduler needs dask.distributed: pip install 'shardkv[distributed]'") from None
    with Client(address, timeout=30) as client:
        limit = IN_FLIGHT_PER_WORKER * max(1, len(client.scheduler_info().get("workers", {})))
        pending = iter(tasks)
        by_key: dict[Any, ShardTask] = {}
        queue = dask_as_completed([])
        for task in pending:
            future = client.submit(run_task, task, pure=False)
            by_key[future.key] = task
            queue.add(future)
            if len(by_key) >= limit:
                break
        for future in queue:
            on_done(by_key.pop(future.key), future.result())
            following = next(pending, None)
            if following is not None:
                nxt = client.submit(run_task, following, pure=False)
                by_key[nxt.key] = following
                queue.add(nxt)
