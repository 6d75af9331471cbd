"""The shard engine: chunk reads and shard writes over one :class:`~shardkv.storage.kv.KVStore`.

:class:`ShardEngine` is the one engine of shardkv: the zarr-python 2 proxies
(:class:`shardkv.ShardedStore`, :class:`shardkv.DraftShardedStore`) and the
2022 draft sharding storage transformer each hold one and call it. It knows
nothing of keys above chunks and shards: it works on
:class:`~shardkv.keys.space.ChunkRef` (which shard, where in it) and on
:class:`~shardkv.engine.merge.ShardChange` (one shard's chunk changes).

State: the index cache (entries ``(decoded index, generation, size)``), the
shard locks (mode resolved from the store's capabilities) and counters.
The read path is :mod:`shardkv.engine.reads` (chunk reads conditioned on the
cached index's generation; a stale answer refetches the index once per
round), the write path :mod:`shardkv.engine.writes` (read-modify-write
conditioned on the generation read, one retry loop, locks only where the
store has no conditional put). Write-back and the journal sit on top
(:mod:`shardkv.engine.writeback`).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Iterable, Iterator, Mapping, Sequence

import numpy as np

from shardkv.engine.cache import IndexCache
from shardkv.engine.locks import Mode, ShardLocks
from shardkv.engine.merge import ShardChange
from shardkv.engine.options import Options
from shardkv.engine.reads import (
    WHOLE_CHUNK,
    chunk_keys_of,
    count_chunks_of,
    current_indexes,
    present_masks,
    read_one_cached,
    read_ranges,
)
from shardkv.engine.retry import EngineStats
from shardkv.engine.writes import compact_shards, delete_shards, write_changes
from shardkv.format.index import ShardIndex
from shardkv.format.ranges import ByteRange
from shardkv.keys.space import ChunkRef, ShardedArray
from shardkv.storage.buffers import BytesLike
from shardkv.storage.kv import Generation, KVStore

__all__ = ["ShardEngine", "EngineStats", "ShardChange"]


class ShardEngine:
    """Batched shard reads and writes over one store.

    Parameters
    ----------
    kv : KVStore
        The base store.
    options : Options, optional
        The facade's options; the engine reads ``index_cache_bytes``,
        ``read_policy``, ``concurrency`` and ``lock_timeout`` (checked by
        :class:`~shardkv.engine.options.Options`, not again here).

    Attributes
    ----------
    kv : KVStore
        The base store.
    options : Options
        The options.
    cache : IndexCache
        Decoded indexes with the generations of the shards they were read from.
    locks : ShardLocks
        The shard locks, in the mode ``options.concurrency`` resolved to.
    stats : EngineStats
        Read rounds, refused (stale) reads, whole-shard reads, write rounds, lost races.

    Raises
    ------
    ConfigurationError
        For a concurrency mode the store cannot give (``"auto"`` where it
        offers neither lock files nor conditional writes).
    """

    def __init__(self, kv: KVStore, options: Options | None = None) -> None:
        self.kv = kv
        self.options = options if options is not None else Options()
        self.cache = IndexCache(self.options.index_cache_bytes)
        self.locks = ShardLocks.of_store(kv, self.options.concurrency, self.options.lock_timeout)
        self.stats = EngineStats()

    def __repr__(self) -> str:
        return f"ShardEngine({self.kv!r}, concurrency={self.concurrency_mode!r})"

    @property
    def concurrency_mode(self) -> Mode:
        """The resolved concurrency mode: ``"files"``, ``"conditional"``, ``"process"`` or ``"none"``."""
        return self.locks.mode

    # -- reads --------------------------------------------------------------------

    def read_chunks(self, refs: Sequence[ChunkRef]) -> dict[str, BytesLike]:
        """Encoded bytes of the stored chunks among ``refs``, by chunk key (missing ones left out).

        Parameters
        ----------
        refs : sequence of ChunkRef
            Chunks of any arrays and shards (one batched index read and one
            batched chunk read per round).

        Returns
        -------
        dict of str to bytes-like
            Read-only buffers (``bytes`` or read-only ``memoryview``).

        Raises
        ------
        CorruptShardError, ChecksumError
            For a damaged shard.
        ConcurrentUpdateError
            If a shard kept changing under every read round.
        OSError
            Any error of the store.
        """
        if len(refs) == 1:  # a warm single-chunk read: one exact conditional request, no read plan
            value = read_one_cached(self.kv, self.cache, self.options.read_policy, self.stats, refs[0])
            if value is not None:
                return {refs[0].chunk_key: value}
        values = read_ranges(self.kv, self.cache, self.options.read_policy, self.stats,
                             [(ref, WHOLE_CHUNK) for ref in refs])
        return {ref.chunk_key: v for ref, v in zip(refs, values) if v is not None}

    def read_ranges(
        self, requests: Sequence[tuple[ChunkRef, ByteRange]], relayed: Sequence[tuple[str, ByteRange]] = ()
    ) -> list[BytesLike | None]:
        """Byte ranges inside chunks (the draft's partial reads), and ranges of other keys read along.

        Parameters
        ----------
        requests : sequence of (ChunkRef, ByteRange)
            A chunk and a range *inside its bytes* (clipped to the chunk; a
            suffix range counts from the chunk's end).
        relayed : sequence of (str, ByteRange)
            Ranges of keys that are not chunks (the draft transformer's relayed
            keys), read in the same request as the first index reads.

        Returns
        -------
        list of bytes-like or None
            The values of ``requests`` then of ``relayed``, in order; ``None``
            where the chunk or key is not stored.

        Raises
        ------
        CorruptShardError, ChecksumError, ConcurrentUpdateError, OSError
            As :meth:`read_chunks`.
        """
        return read_ranges(self.kv, self.cache, self.options.read_policy, self.stats, requests, relayed)

    def has_chunks(self, refs: Sequence[ChunkRef]) -> list[bool]:
        """Whether each chunk is stored now (``in``), from indexes confirmed current.

        Raises
        ------
        CorruptShardError, ChecksumError, OSError
            For a damaged index; any error of the store.
        """
        indexes = self.read_indexes({ref.shard_key: ref.array for ref in refs})
        return [
            ref.shard_key in indexes and indexes[ref.shard_key].get(ref.local_coords) is not None for ref in refs
        ]

    def read_indexes(
        self, shards: Mapping[str, ShardedArray], generations: Mapping[str, Generation] | None = None
    ) -> dict[str, ShardIndex]:
        """The current indexes of the stored shards among ``shards`` (one batched request at most per check).

        A cached index is used when it is known current: its generation equals
        the one a store listing returned (``generations``), or a zero-range
        conditional read confirms it; every other index is read.

        Parameters
        ----------
        shards : mapping of str to ShardedArray
            Shard keys and their arrays.
        generations : mapping of str to Generation, optional
            Generations returned by a listing of the store, by shard key.

        Returns
        -------
        dict of str to ShardIndex
            Shards not stored are left out. Do not modify the indexes (they are
            the cached objects); copy first.

        Raises
        ------
        CorruptShardError, ChecksumError
            For a damaged index.
        """
        return current_indexes(self.kv, self.cache, shards, generations)

    def chunk_keys(
        self,
        shards: Mapping[str, ShardedArray],
        *,
        generations: Mapping[str, Generation] | None = None,
        in_grid_only: bool = True,
    ) -> Iterator[str]:
        """Keys of the chunks stored in ``shards``, from their current indexes.

        Per shard one vectorised pass (present entries -> chunk coords ->
        keys), each key string built once; indexes read 4096 shards per request.

        Parameters
        ----------
        shards : mapping of str to ShardedArray
            Stored shard keys and their arrays (a listing of one array's
            prefix touches only that array's shards).
        generations : mapping of str to Generation, optional
            Generations the store listing returned (cached indexes with the
            same generation are used without a request).
        in_grid_only : bool
            Leave out chunks outside the chunk grid (when it is known).
        """
        return chunk_keys_of(self.kv, self.cache, shards, generations, in_grid_only)

    def count_chunks(
        self,
        shards: Mapping[str, ShardedArray],
        *,
        generations: Mapping[str, Generation] | None = None,
        in_grid_only: bool = True,
    ) -> int:
        """How many chunks ``shards`` store (as :meth:`chunk_keys`, without building keys)."""
        return count_chunks_of(self.kv, self.cache, shards, generations, in_grid_only)

    def present_masks(
        self, shards: Mapping[str, ShardedArray], *, generations: Mapping[str, Generation] | None = None
    ) -> Iterator[tuple[tuple[int, ...], np.ndarray]]:
        """``(shard coords, present mask)`` of each stored shard among ``shards``, from its current index.

        The mask is boolean, of shape ``chunks_per_shard``, True where the index
        holds a chunk; indexes are read as for :meth:`chunk_keys`.
        """
        for _, coords, mask in present_masks(self.kv, self.cache, shards, generations):
            yield coords, mask

    # -- writes -------------------------------------------------------------------

    def write(self, changes: Mapping[str, ShardChange]) -> None:
        """Apply chunk changes grouped by shard: one batched read (partly covered shards), one batched write.

        A shard left with no chunk is deleted (where deletes cannot be
        conditioned, in mode ``"conditional"``, it is stored as an empty shard
        instead, which readers read as fill values). Chunks outside the chunk
        grid are dropped. See :mod:`shardkv.engine.writes`.

        Parameters
        ----------
        changes : mapping of str to ShardChange
            Shard key -> the shard's chunk changes.

        Raises
        ------
        ValueError
            If a :class:`~shardkv.engine.merge.ChunkPatch` would leave a gap in its chunk.
        LockTimeoutError
            If a shard lock was not obtained within ``lock_timeout``.
        ConcurrentUpdateError
            If a shard's conditional write lost its race in every round.
        OSError
            Any error of the store.
        """
        write_changes(self.kv, self.cache, self.locks, self.stats, changes)

    def erase(self, shards: Mapping[str, ShardedArray]) -> None:
        """Delete whole shards (holding their locks) and forget their indexes.

        Raises
        ------
        LockTimeoutError, OSError
            As :meth:`write`.
        """
        delete_shards(self.kv, self.cache, self.locks, shards)

    def compact(self, arr: ShardedArray, shard_keys: Iterable[str] | None = None) -> int:
        """Rewrite the array's stored shards that hold unused bytes; the bytes reclaimed.

        Parameters
        ----------
        arr : ShardedArray
            The array.
        shard_keys : iterable of str, optional
            Its shards to look at (default: every shard of its shard grid).

        Raises
        ------
        LockTimeoutError, CorruptShardError, OSError
            As :meth:`write`; for a damaged shard.
        """
        keys = (k for k, _ in arr.shard_keys()) if shard_keys is None else shard_keys
        return compact_shards(self.kv, self.cache, self.locks, arr, keys)

    def hold(self, shards: Mapping[str, ShardedArray]) -> AbstractContextManager[None]:
        """The locks of ``shards`` for a ``with`` block (for a caller's own read-modify-write; not re-entrant).

        Raises
        ------
        LockTimeoutError
            If a lock was not obtained within ``lock_timeout``.
        """
        return self.locks.hold_arrays(shards)

    def forget(self, shard_keys: Iterable[str] | None = None) -> None:
        """Drop cached indexes (of ``shard_keys``, or all)."""
        if shard_keys is None:
            self.cache.clear()
            return
        for shard_key in shard_keys:
            self.cache.discard(shard_key)
