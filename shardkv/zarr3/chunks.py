"""Chunk reads and writes of :class:`shardkv.zarr3.ShardedStore`: the zarr 2 proxy's shard engine, synchronously.

This is the only module of :mod:`shardkv.zarr3` that talks to the engine, so
the zarr 3 store and the zarr 2 proxy share one engine (index cache, coalesced
ranged reads, batched shard writes, write-back, concurrency per store kind)
and the zarr 3 store follows it when it changes. Every call blocks; the store
runs them in worker threads.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Mapping, Sequence

from shardkv.engine.cache import IndexCache
from shardkv.engine.concurrency import Concurrency
from shardkv.engine.planner import ShardIO
from shardkv.format.ranges import ReadPolicy
from shardkv.keys.space import ChunkRef, ShardedArray
from shardkv.proxy.routing import group_by_shard
from shardkv.proxy.writes import ShardWriter
from shardkv.storage.adapters import adapt

__all__ = ["ChunkEngine"]


class ChunkEngine:
    """The shard engine over one base store, as chunk operations.

    Parameters
    ----------
    base : str, fsspec.FSMap, obstore store or MutableMapping
        What :func:`shardkv.storage.adapters.adapt` opens: the same data the
        zarr 3 store underneath reaches (see :mod:`shardkv.zarr3.bases`).
    index_cache_bytes : int
        Limit (bytes) of the cache of decoded shard indexes.
    read_policy : ReadPolicy
        How nearby chunk ranges merge and when whole shards are read.
    buffer_bytes : int or None
        Write-back limit (bytes of chunk data); ``None`` writes within each call.
    concurrency : {"auto", "files", "conditional", "process", "none"}
        How writers of one shard exclude each other (as for the zarr 2 proxy).
    lock_timeout : float or None
        Longest wait (seconds) for a shard lock.

    Raises
    ------
    ConfigurationError
        For a concurrency mode the store cannot give.
    """

    def __init__(
        self,
        base: Any,
        *,
        index_cache_bytes: int,
        read_policy: ReadPolicy,
        buffer_bytes: int | None,
        concurrency: Concurrency,
        lock_timeout: float | None,
    ) -> None:
        self.adapter = adapt(base)
        self.io = ShardIO(
            self.adapter,  # type: ignore[arg-type]  # ShardBackend says bytes where adapters give memoryviews too
            index_cache_bytes=index_cache_bytes,
            validate_index_cache=False,
            read_policy=read_policy,
            write_strategy="rewrite",
            slack_bytes=0,
            concurrency=concurrency,
            lock_timeout=lock_timeout,
        )
        self.writer = ShardWriter(self.io, buffer_bytes)

    @property
    def index_cache(self) -> IndexCache:
        """The cache of decoded shard indexes."""
        return self.io.index_cache

    @property
    def concurrency_mode(self) -> str:
        """The resolved concurrency mode (``"files"``, ``"conditional"``, ``"process"`` or ``"none"``)."""
        return self.io.plan.mode

    def read(self, refs: Sequence[ChunkRef]) -> dict[str, bytes | memoryview]:
        """Encoded bytes of the stored chunks among ``refs`` by chunk key (buffered writes first)."""
        out: dict[str, bytes | memoryview] = {}
        pending = []
        for ref in refs:
            buffered, value = self.writer.lookup(ref.shard_key, ref.local_coords)
            if not buffered:
                pending.append(ref)
            elif value is not None:
                out[ref.chunk_key] = value
        if pending:
            out.update(self.io.read_chunks(pending))
        return out

    def stored(self, ref: ChunkRef) -> bool:
        """True when the chunk is stored (or buffered)."""
        buffered, value = self.writer.lookup(ref.shard_key, ref.local_coords)
        if buffered:
            return value is not None
        indexes, _ = self.io.read_indexes({ref.shard_key: ref.array})
        index = indexes.get(ref.shard_key)
        return index is not None and index.get(ref.local_coords) is not None

    def write(self, refs: Sequence[ChunkRef], values: Iterable[bytes | memoryview | None]) -> None:
        """Store (or, for ``None``, delete) chunks; one shard write per shard touched."""
        if refs:
            self.writer.write(group_by_shard(refs, values))

    def chunk_keys(self, shards: Mapping[str, ShardedArray]) -> Iterator[str]:
        """Keys of the in-grid chunks stored in ``shards`` (shard key -> its array), indexes read in batches."""
        return self.io.chunk_keys(shards)

    def forget(self, shard_keys: Iterable[str]) -> None:
        """Drop cached indexes of shards changed or removed behind the engine's back (a directory delete)."""
        for key in shard_keys:
            self.io.index_cache.discard(key)

    def discard_buffered(self, path: str) -> None:
        """Drop buffered writes of the arrays at and below ``path`` (being deleted)."""
        self.writer.discard_under(path)

    def flush(self) -> None:
        """Write every buffered shard (write-back mode; a no-op otherwise)."""
        self.writer.flush()

    def buffered(self) -> tuple[int, int]:
        """``(shards, bytes of chunk data)`` held by write-back and not yet stored (``(0, 0)`` without it)."""
        buf = self.writer.buffer
        return (0, 0) if buf is None else (len(buf), buf.nbytes)

    def close(self) -> None:
        """Write buffered shards and release the engine's resources."""
        self.writer.flush()
        self.writer.close()
