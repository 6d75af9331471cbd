"""What a pickled ``ShardedStore`` carries, and how it is rebuilt (issue 9, item 5).

``dask.distributed`` and ``multiprocessing`` send the store to other
processes, so ``pickle.loads(pickle.dumps(store))`` must give an equivalent
store: the same base location, the same options, and, through the location,
the same locks (:mod:`shardkv.engine.locks`). It must not carry what belongs
to one process: threading locks, the index cache, memoised array states, and
the write-back buffer.

``ShardedStore.__reduce__`` is meant to be ``return reduce_sharded_store(self)``.

What is carried:

* the adapter that does the I/O (``FSMapAdapter`` pickles as filesystem
  class + storage options + root; ``MappingAdapter`` as its mapping, which
  for a ``dict`` is a *copy*, a new location);
* the options of ``ShardedStore.__init__`` that change behaviour:
  ``chunks_per_shard``, ``index_location``, ``index_checksum``,
  ``index_cache_bytes``, ``read_policy``, ``buffer_bytes``, ``concurrency``,
  ``lock_timeout`` (the locks themselves are found again by location).

Unflushed write-back data is refused, not silently dropped or silently
flushed as a side effect of pickling: :class:`~shardkv.errors.UnflushedWritesError`
says to call ``flush()`` first.
"""

from __future__ import annotations

from typing import Any

from shardkv.errors import UnflushedWritesError

__all__ = ["reduce_sharded_store", "rebuild_sharded_store", "sharded_store_options"]


def _io_adapter(store: Any) -> Any:
    base = store._base
    return getattr(base, "inner", base)  # the presenting wrapper is rebuilt by __init__


def sharded_store_options(store: Any) -> dict[str, Any]:
    """The ``ShardedStore.__init__`` keyword options of ``store`` (everything but the base store)."""
    engine = store._engine
    buffer = store._writer.buffer
    return {
        "chunks_per_shard": store._cps,
        "index_location": store._mirror.index_location,
        "index_checksum": store._mirror.index_checksum,
        "index_cache_bytes": engine.options.index_cache_bytes,
        "read_policy": engine.options.read_policy,
        "buffer_bytes": None if buffer is None else buffer.max_bytes,
        "concurrency": engine.options.concurrency,
        "lock_timeout": engine.options.lock_timeout,
    }


def reduce_sharded_store(store: Any) -> tuple[Any, tuple[Any, ...]]:
    """``__reduce__`` of a ``ShardedStore``: ``(rebuild_sharded_store, (class, adapter, options))``.

    Raises
    ------
    UnflushedWritesError
        If the store holds buffered writes not yet in the base store.
    """
    buffer = store._writer.buffer
    if buffer is not None and len(buffer):
        raise UnflushedWritesError(len(buffer), buffer.nbytes)
    return (rebuild_sharded_store, (type(store), _io_adapter(store), sharded_store_options(store)))


def rebuild_sharded_store(cls: type, adapter: Any, options: dict[str, Any]) -> Any:
    """A new ``cls`` (a ``ShardedStore``) over ``adapter`` with ``options`` (the inverse of :func:`reduce_sharded_store`).

    The class travels with the pickle, so the engine never imports the proxy layer above it.
    """
    return cls(adapter, **options)
