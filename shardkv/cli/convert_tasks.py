"""Shard-aligned conversion tasks, run here, in local processes or on a dask.distributed cluster.

A :class:`ShardTask` names whole shards of one array and the chunk keys that
go into each; :func:`run_task` reads those chunks (one batched read per
shard), packs them (bytes unchanged) and writes the shards. No two tasks name
the same shard, so tasks can run in any order and in parallel without
touching each other's objects.

:func:`execute` runs a list of tasks in this process (``workers=1``), in a
pool of local processes (``workers=N``), or on an existing dask.distributed
cluster (``scheduler="tcp://host:port"``), and calls ``on_done`` in this
process as each task finishes; the caller records progress there (see
:mod:`shardkv.cli.manifest`). Tasks run elsewhere open the stores again from
their names and storage options, so those must be paths or URLs the workers
can reach.
"""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

from shardkv.errors import ConfigurationError
from shardkv.format.layout import ShardLayout
from shardkv.keys.encodings import V2ChunkKeyEncoding
from shardkv.storage.adapters import StoreAdapter

__all__ = ["ShardTask", "TaskResult", "run_task", "execute", "group_tasks"]


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
    shards : tuple of (str, tuple of (tuple of int, str))
        Per shard: its key, and ``(local_coords, chunk_key)`` of each source chunk in it.
    write_batch_nbytes, write_batch_objects : int
        Finished shards held (bytes, objects) before one batched write.
    """

    src: str
    dst: str
    src_options: Mapping[str, Any]
    dst_options: Mapping[str, Any]
    chunks_per_shard: tuple[int, ...]
    index_location: str
    index_checksum: bool
    shards: tuple[tuple[str, tuple[tuple[tuple[int, ...], str], ...]], ...]
    write_batch_nbytes: int = 64 * 2**20
    write_batch_objects: int = 64

    @property
    def n_chunks(self) -> int:
        """Source chunks named by the task."""
        return sum(len(members) for _, members in self.shards)


@dataclass(frozen=True)
class TaskResult:
    """What one task wrote: ``(shard key, shard bytes, chunk bytes read)`` per shard written."""

    written: tuple[tuple[str, int, int], ...]
    nbytes_read: int
    n_chunks: int


def group_tasks(
    by_shard: Mapping[tuple[int, ...], Mapping[tuple[int, ...], str]],
    prefix: str,
    separator: str,
    base: Mapping[str, Any],
    max_chunks: int,
) -> Iterator[ShardTask]:
    """Cut one array's shards into tasks of whole shards, about ``max_chunks`` chunks each.

    Parameters
    ----------
    by_shard : mapping
        Shard coords -> {local coords -> source chunk key}.
    prefix : str
        The array's key prefix (``"path/"`` or ``""``).
    separator : {".", "/"}
        Shard key separator (the array's chunk key separator).
    base : mapping
        The other :class:`ShardTask` fields (``src``, ``dst``, options, layout).
    max_chunks : int
        Chunks per task, at least one shard per task.
    """
    encoding = V2ChunkKeyEncoding(separator)  # type: ignore[arg-type]
    batch: list[tuple[str, tuple[tuple[tuple[int, ...], str], ...]]] = []
    n = 0
    for shard_coords in sorted(by_shard):
        members = tuple(sorted(by_shard[shard_coords].items()))
        batch.append((prefix + encoding.encode(shard_coords), members))
        n += len(members)
        if n >= max_chunks:
            yield ShardTask(shards=tuple(batch), **base)
            batch, n = [], 0
    if batch:
        yield ShardTask(shards=tuple(batch), **base)


def run_task(task: ShardTask, source: StoreAdapter | None = None, target: StoreAdapter | None = None) -> TaskResult:
    """Read, pack and write the shards of one task (in this process or a worker).

    Parameters
    ----------
    task : ShardTask
    source, target : StoreAdapter, optional
        Open stores to use; opened from the task's names and options when omitted.

    Returns
    -------
    TaskResult
        Shards written (a shard none of whose chunks is still stored is not written).
    """
    from shardkv.cli.stores import open_store

    source = source or open_store(task.src, task.src_options, role="source")
    target = target or open_store(task.dst, task.dst_options, role="destination")
    layout = ShardLayout.v3(task.chunks_per_shard, task.index_location, "little", task.index_checksum)  # type: ignore[arg-type]
    written: list[tuple[str, int, int]] = []
    pending: dict[str, bytes] = {}
    pending_nbytes = nbytes_read = 0
    for shard_key, members in task.shards:
        values = source.get_many([k for _, k in members])
        chunks = {local: values[k] for local, k in members if k in values}
        if not chunks:
            continue
        shard_read = sum(memoryview(v).nbytes for v in chunks.values())
        nbytes_read += shard_read
        blob = layout.encode_shard(chunks)
        pending[shard_key] = blob
        pending_nbytes += len(blob)
        written.append((shard_key, len(blob), shard_read))
        if pending_nbytes >= task.write_batch_nbytes or len(pending) >= task.write_batch_objects:
            target.set_many(pending)
            pending, pending_nbytes = {}, 0
    target.set_many(pending)
    return TaskResult(tuple(written), nbytes_read, task.n_chunks)


def execute(
    tasks: Sequence[ShardTask],
    on_done: Callable[[ShardTask, TaskResult], None],
    *,
    workers: int = 1,
    scheduler: str | None = None,
    source: StoreAdapter | None = None,
    target: StoreAdapter | None = None,
) -> None:
    """Run ``tasks``; ``on_done(task, result)`` is called here as each one finishes.

    Parameters
    ----------
    tasks : sequence of ShardTask
    on_done : callable
        Called in this process, in completion order.
    workers : int
        1: run here, one task after another, with ``source``/``target``;
        N > 1: a pool of N local processes (spawned).
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
        import multiprocessing

        with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {pool.submit(run_task, task): task for task in tasks}
            try:
                for future in as_completed(futures):
                    on_done(futures[future], future.result())
            except BaseException:
                for future in futures:
                    future.cancel()
                raise


def _execute_distributed(tasks: Sequence[ShardTask], on_done: Callable[[ShardTask, TaskResult], None], address: str) -> None:
    try:
        from distributed import Client
        from distributed import as_completed as dask_as_completed
    except ImportError:
        raise ConfigurationError(
            "--scheduler needs dask.distributed: pip install 'shardkv[distributed]'"
        ) from None
    with Client(address, timeout=30) as client:
        futures = client.map(run_task, list(tasks), pure=False)
        by_key = {f.key: t for f, t in zip(futures, tasks)}
        for future in dask_as_completed(futures):
            on_done(by_key[future.key], future.result())
