"""The shard engine: chunk reads and shard writes over one :class:`~shardkv.storage.kv.KVStore`.

:class:`ShardEngine` is the one engine of shardkv: the zarr-python 2 proxies
(:class:`shardkv.ShardedStore`, :class:`shardkv.DraftShardedStore`) and the
2022 draft sharding storage transformer each hold one and call it. It knows
nothing of keys above chunks and shards: it works on
:class:`~shardkv.keys.space.ChunkRef` (which shard, where in it) and on
:class:`~shardkv.engine.merge.ShardChange` (one shard's chunk changes).

The engine owns the state its reads and writes share: the base store, the
index cache (entries ``(decoded index, generation, size)``), the shard locks
(mode resolved from the store's capabilities) and the counters. Its
operations belong to two objects it builds once, each in the module of its
job: ``engine.reads`` (:class:`~shardkv.engine.reads.ShardReader`: chunk
reads conditioned on the cached index's generation; a stale answer refetches
the index once per round) and ``engine.writes``
(:class:`~shardkv.engine.writes.ShardWriter`: read-modify-write conditioned
on the generation read, one retry loop, locks only where the store has no
conditional put). Write-back and the journal sit on top
(:mod:`shardkv.engine.writeback`).
"""

from __future__ import annotations

from collections.abc import Iterable

from shardkv.engine.cache import IndexCache
from shardkv.engine.locks import Mode, ShardLocks
from shardkv.engine.options import Options
from shardkv.engine.reads import ShardReader
from shardkv.engine.retry import EngineStats
from shardkv.engine.writes import ShardWriter
from shardkv.storage.kv import KVStore


class ShardEngine:
    """Batched shard reads and writes over one store.

    Parameters
    ----------
    kv : KVStore
        The base store.
    options : Options, optional
        The facade's options; the engine reads ``index_cache_bytes``,
        ``read_policy``, ``concurrency``, ``lock_timeout``, ``shard_updates``
        and ``max_dead_fraction`` (checked by
        :class:`~shardkv.engine.options.Options`, not again here).
    read_only : bool
        For a read-only store: nothing is ever written, not even the repair
        of an interrupted in-place append a read meets (it raises instead,
        :meth:`~shardkv.engine.writes.ShardWriter.repair`).

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
    reads : ShardReader
        The reads: chunks, byte ranges, indexes, listings (with ``options.read_policy``).
    writes : ShardWriter
        The writes: shard changes, erasures, compaction, the locks for a caller's own writes.

    Raises
    ------
    ConfigurationError
        For a concurrency mode the store cannot give (``"auto"`` where it
        offers neither lock files nor conditional writes).
    """

    def __init__(self, kv: KVStore, options: Options | None = None, *, read_only: bool = False) -> None:
        self.kv = kv
        self.options = options if options is not None else Options()
        self.cache = IndexCache(self.options.index_cache_bytes)
        self.locks = ShardLocks.of_store(kv, self.options.concurrency, self.options.lock_timeout)
        self.stats = EngineStats()
        self.writes = ShardWriter(
            kv,
            self.cache,
            self.locks,
            self.stats,
            self.options.shard_updates,
            self.options.max_dead_fraction,
            read_only,
        )
        self.reads = ShardReader(kv, self.cache, self.options.read_policy, self.stats, self.writes.repair)

    def __repr__(self) -> str:
        return f"ShardEngine({self.kv!r}, concurrency={self.concurrency_mode!r})"

    @property
    def concurrency_mode(self) -> Mode:
        """The resolved concurrency mode: ``"files"``, ``"conditional"``, ``"process"`` or ``"none"``."""
        return self.locks.mode

    def forget(self, shard_keys: Iterable[str] | None = None) -> None:
        """Drop cached indexes (of ``shard_keys``, or all)."""
        if shard_keys is None:
            self.cache.clear()
            return
        for shard_key in shard_keys:
            self.cache.discard(shard_key)
