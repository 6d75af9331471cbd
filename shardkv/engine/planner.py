"""Shard I/O: reading indexes and inner chunks from shards, and writing shards, over a base store.

:class:`ShardIO` is the proxy's I/O planner. It knows nothing of keys above
the proxy: it works on :class:`~shardkv.keys.space.ChunkRef` (which shard, where
in it) and on updates grouped by shard. Request plan:

* read, base store with ranged reads: one batched read of the indexes not in
  the :class:`~shardkv.engine.cache.IndexCache` (prefix or suffix ranges), then one
  batched read of chunk ranges, merged per shard by a
  :class:`~shardkv.format.ranges.ReadPolicy` (or the whole shard when most is wanted);
* read, base store without ranged reads: one batched read of whole shards;
* write: one batched read of the shards a call covers only in part (none for
  shards whose every in-grid chunk is written), then one batched write. With
  the ``append``/``inplace`` strategies on local files, partly covered shards
  get positional writes instead (:mod:`shardkv.engine.strategies`).

Writers of one shard are serialised by a lock per shard key.
"""

from __future__ import annotations

import threading
from contextlib import ExitStack
from typing import Any, Mapping, Sequence

from shardkv.engine.cache import IndexCache
from shardkv.engine.strategies import WriteStrategy, plan_append
from shardkv.errors import ConfigurationError, CorruptShardError
from shardkv.format.index import ShardIndex
from shardkv.format.ranges import ByteRange, ReadPolicy, plan_reads
from shardkv.keys.space import ChunkRef, ShardedArray
from shardkv.storage.adapters import StoreAdapter

__all__ = ["ShardIO", "ShardUpdates"]

ShardUpdates = Mapping[str, tuple[ShardedArray, tuple[int, ...], Mapping[tuple[int, ...], Any]]]
"""shard key -> (array, shard coords, {local coords: encoded chunk bytes, or None to delete})."""


def covers_shard(arr: ShardedArray, shard_coords: tuple[int, ...], updates: Mapping[Any, Any]) -> bool:
    """True when ``updates`` writes every in-grid chunk of the shard (no old bytes needed)."""
    n = arr.n_chunks_in_shard(shard_coords)
    return n > 0 and len(updates) == n and all(v is not None for v in updates.values())


class ShardIO:
    """Batched shard reads and writes over one base store.

    Parameters
    ----------
    base : StoreAdapter
        The base store.
    index_cache_bytes : int
        Limit (bytes) of the decoded-index cache; 0 disables it.
    validate_index_cache : bool
        Check cached indexes against the base store's cheap validator first.
    read_policy : ReadPolicy
        Merging of chunk ranges and the whole-shard threshold.
    write_strategy : {"rewrite", "append", "inplace"}
        How partly covered shards are updated (append/inplace only where the
        base store supports positional writes).
    slack_bytes : int
        Zero bytes after each chunk written with ``"inplace"`` (bytes).

    Raises
    ------
    ConfigurationError
        For an unknown strategy or a negative slack.
    """

    def __init__(
        self,
        base: StoreAdapter,
        *,
        index_cache_bytes: int,
        validate_index_cache: bool,
        read_policy: ReadPolicy,
        write_strategy: WriteStrategy,
        slack_bytes: int,
    ) -> None:
        if write_strategy not in ("rewrite", "append", "inplace"):
            raise ConfigurationError(f"write_strategy must be 'rewrite', 'append' or 'inplace', got {write_strategy!r}")
        if slack_bytes < 0:
            raise ConfigurationError(f"slack_bytes must be >= 0, got {slack_bytes}")
        self.base = base
        self.index_cache = IndexCache(index_cache_bytes)
        self.validate_index_cache = bool(validate_index_cache)
        self.read_policy = read_policy
        self.write_strategy = write_strategy
        self.slack_bytes = int(slack_bytes)
        self._lock = threading.Lock()
        self._shard_locks: dict[str, threading.Lock] = {}

    def shard_lock(self, shard_key: str) -> threading.Lock:
        """The lock that serialises writers of one shard in this process."""
        with self._lock:
            lock = self._shard_locks.get(shard_key)
            if lock is None:
                lock = self._shard_locks[shard_key] = threading.Lock()
            return lock

    # -- reads ------------------------------------------------------------------

    def read_indexes(self, shards: Mapping[str, ShardedArray]) -> tuple[dict[str, ShardIndex], dict[str, bytes]]:
        """Indexes of the stored shards among ``shards`` (at most one batched request).

        Returns the indexes and, for a base store without ranged reads, the
        whole shards that were read to get them.

        Raises
        ------
        CorruptShardError, ChecksumError
            For a damaged index.
        """
        keys = list(shards)
        if not keys:
            return {}, {}
        if not self.base.supports_ranges:
            blobs = self.base.get_many(keys)
            return {k: shards[k].layout.index_of_shard(b, k) for k, b in blobs.items()}, blobs
        indexes: dict[str, ShardIndex] = {}
        validators: dict[str, Any] = {}
        missing: list[str] = []
        for k in keys:
            validator = self.base.validator(k) if self.validate_index_cache else None
            cached = self.index_cache.get(k, validator)
            if cached is None:
                missing.append(k)
                validators[k] = validator
            else:
                indexes[k] = cached
        if missing:
            raw = self.base.get_ranges([(k, shards[k].layout.index_range()) for k in missing])
            for k, data in zip(missing, raw):
                if data is not None:
                    # checked against the shard's size where that is free: a suffix read
                    # alone cannot tell a truncated shard from an intact one
                    index = indexes[k] = shards[k].layout.decode_index(data, k, self.base.size_if_free(k))
                    self.index_cache.put(k, index, validators[k])
        return indexes, {}

    def read_chunks(self, refs: Sequence[ChunkRef]) -> dict[str, bytes]:
        """Encoded bytes of the stored chunks among ``refs``, by chunk key (missing ones left out).

        Raises
        ------
        CorruptShardError, ChecksumError
            For a damaged shard (an index entry past the shard's end included).
        """
        out: dict[str, bytes] = {}
        if not refs:
            return out
        indexes, blobs = self.read_indexes({ref.shard_key: ref.array for ref in refs})
        wanted: list[tuple[ChunkRef, int, int]] = []
        for ref in refs:
            index = indexes.get(ref.shard_key)
            entry = None if index is None else index.get(ref.local_coords)
            if entry is not None:
                wanted.append((ref, *entry))
        if blobs:
            for ref, offset, nbytes in wanted:
                out[ref.chunk_key] = bytes(memoryview(blobs[ref.shard_key])[offset : offset + nbytes])
            return out
        by_shard: dict[str, list[tuple[ChunkRef, int, int]]] = {}
        for item in wanted:
            by_shard.setdefault(item[0].shard_key, []).append(item)
        requests: list[tuple[str, ByteRange]] = []
        plans = []
        for shard_key, items in by_shard.items():
            ranges = [ByteRange(o, o + n) for _, o, n in items]
            for read in plan_reads(ranges, indexes[shard_key].used_nbytes(), self.read_policy):
                requests.append((shard_key, read.range))
                plans.append((items, read))
        data = self.base.get_ranges(requests)
        for (items, read), value in zip(plans, data):
            if value is None:
                continue  # the shard was deleted between the two reads
            view = memoryview(value)
            for i, rel, nbytes in read.members:
                ref, offset, _ = items[i]
                chunk = view[rel : rel + nbytes]
                if len(chunk) != nbytes:
                    raise CorruptShardError(
                        ref.shard_key,
                        f"index entry {ref.local_coords} points at bytes [{offset}, {offset + nbytes}) "
                        f"but the shard ends after {read.range.start + len(value)} bytes (truncated shard?)",
                    )
                out[ref.chunk_key] = bytes(chunk)
        return out

    # -- writes -----------------------------------------------------------------

    def write_shards(self, by_shard: ShardUpdates) -> None:
        """Apply chunk updates grouped by shard: one batched read (partly covered shards), one batched write.

        A shard left with no chunk is deleted. Chunks a shrinking resize left
        outside the grid are dropped.
        """
        with ExitStack() as stack:
            for shard_key in sorted(by_shard):
                stack.enter_context(self.shard_lock(shard_key))
            need_old = [sk for sk, (arr, coords, updates) in by_shard.items() if not covers_shard(arr, coords, updates)]
            if need_old and self.write_strategy != "rewrite" and self.base.supports_append:
                need_old = self._append_to_shards({sk: by_shard[sk] for sk in need_old})
                by_shard = {sk: v for sk, v in by_shard.items() if sk in need_old or covers_shard(*v)}
            old = self.base.get_many(need_old) if need_old else {}
            new_shards: dict[str, bytes] = {}
            new_indexes: dict[str, ShardIndex] = {}
            empty: list[str] = []
            # slack only where in-place writes can use it (elsewhere "inplace" falls back to rewrite)
            slack = self.slack_bytes if self.write_strategy == "inplace" and self.base.supports_append else 0
            for shard_key, (arr, coords, updates) in by_shard.items():
                chunks: dict[tuple[int, ...], Any] = {}
                if shard_key in old:
                    in_grid = {local for _, local in arr.chunks_in_shard(coords)}
                    for local, view in arr.layout.chunks_of_shard(old[shard_key], shard_key).items():
                        if local in in_grid:
                            chunks[local] = view
                for local, value in updates.items():
                    if value is None:
                        chunks.pop(local, None)
                    else:
                        chunks[local] = value
                if chunks:
                    new_shards[shard_key], new_indexes[shard_key] = arr.layout.encode_shard_with_index(chunks, slack)
                elif shard_key in old:
                    empty.append(shard_key)
            for shard_key in by_shard:
                self.index_cache.discard(shard_key)
            self.base.set_many(new_shards)
            if empty:
                self.base.delete_many(empty)
            if not self.validate_index_cache:
                for shard_key, index in new_indexes.items():
                    self.index_cache.put(shard_key, index)

    def _append_to_shards(self, by_shard: ShardUpdates) -> list[str]:
        """Apply updates to stored shards by positional writes (see :mod:`shardkv.engine.strategies`).

        Called with the shards' locks held. Returns the shards that are not
        stored yet (to be written whole).
        """
        indexes, _ = self.read_indexes({sk: v[0] for sk, v in by_shard.items()})
        not_stored = [sk for sk in by_shard if sk not in indexes]
        for shard_key, index in indexes.items():
            arr, coords, updates = by_shard[shard_key]
            changes: dict[tuple[int, ...], bytes | None] = {
                local: None if v is None else bytes(v) for local, v in updates.items()
            }
            in_grid = {local for _, local in arr.chunks_in_shard(coords)}
            for local in index.present():
                if local not in in_grid:
                    changes[local] = None  # left behind by a shrinking resize
            plan = plan_append(
                arr.layout, index, self.base.size(shard_key), changes,
                inplace=self.write_strategy == "inplace", slack_bytes=self.slack_bytes,
            )  # fmt: skip
            self.index_cache.discard(shard_key)
            if plan.index.is_empty():  # type: ignore[union-attr]
                self.base.delete_many([shard_key])
                continue
            self.base.write_at(shard_key, [(w.offset, w.data) for w in plan.writes])
            validator = self.base.validator(shard_key) if self.validate_index_cache else None
            self.index_cache.put(shard_key, plan.index, validator)  # type: ignore[arg-type]
        return not_stored

    def compact_array(self, arr: ShardedArray) -> int:
        """Rewrite the array's shards that hold unused bytes; returns the bytes reclaimed."""
        reclaimed = 0
        for shard_key, _ in arr.shard_keys():
            with self.shard_lock(shard_key):
                try:
                    blob = self.base.get(shard_key)
                except KeyError:
                    continue
                index = arr.layout.index_of_shard(blob, shard_key)
                if len(blob) - arr.layout.index_nbytes - index.used_nbytes() <= 0:
                    continue
                new = arr.layout.encode_shard(arr.layout.chunks_of_shard(blob, shard_key, index))
                self.base.set(shard_key, new)
                self.index_cache.discard(shard_key)
                reclaimed += len(blob) - len(new)
        return reclaimed
