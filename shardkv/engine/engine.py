"""The shard engine (:class:`ShardEngine`): the state its reads (``engine.reads``) and writes (``engine.writes``)
share over one :class:`~shardkv.storage.kv.KVStore` (docs/architecture.md, "The engine")."""

from __future__ import annotations

from collections.abc import Iterable

from shardkv.engine.cache import IndexCache
from shardkv.engine.locks import ShardLocks
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
        The facade's options.
    read_only : bool
        For a read-only store: nothing is ever written, not even the repair
        of an interrupted in-place append a read meets (it raises instead).

    Attributes
    ----------
    cache : IndexCache
        Decoded indexes with the generations of the shards they were read from.
    locks : ShardLocks
        The shard locks, in the mode ``options.concurrency`` resolved to.
    stats : EngineStats
        The counters.
    reads : ShardReader
        The reads: chunks, byte ranges, indexes, listings.
    writes : ShardWriter
        The writes: shard changes, erasures, compaction, repair.

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
        self.writes = ShardWriter(kv, self.cache, self.locks, self.stats, self.options, read_only)
        self.reads = ShardReader(kv, self.cache, self.options.read_policy, self.stats)
        self.reads.repair = self.writes.repair

    def forget(self, shard_keys: Iterable[str] | None = None) -> None:
        """Drop cached indexes (of ``shard_keys``, or all)."""
        if shard_keys is None:
            self.cache.clear()
            return
        for shard_key in shard_keys:
            self.cache.discard(shard_key)
