"""A bounded LRU cache of decoded shard indexes, each with the generation of the shard it was read from.

Chunk reads are conditioned on that generation (:mod:`shardkv.engine.reads`); the size limit counts the bytes
of the index arrays.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from shardkv.format.layout import ShardIndex


@dataclass(frozen=True, slots=True)
class CacheEntry:
    """One cached index: the decoded index, the generation of the shard it was read from, its size (bytes) if known."""

    index: ShardIndex
    generation: Any
    size: int | None


class IndexCache:
    """LRU cache of shard indexes with a limit in bytes.

    Parameters
    ----------
    max_bytes : int
        Largest total size (bytes) of the cached index arrays; 0 disables the cache.

    Raises
    ------
    ValueError
        If ``max_bytes`` is negative.
    """

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"index cache size must be >= 0 bytes, got {max_bytes}")
        self.max_bytes = int(max_bytes)
        self._entries: OrderedDict[str, CacheEntry] = OrderedDict()
        self._nbytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def nbytes(self) -> int:
        """Bytes held by the cached index arrays."""
        return self._nbytes

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, shard_key: object) -> bool:
        """True when an index of ``shard_key`` is cached (no count, no reordering, no lock: one dict look-up)."""
        return shard_key in self._entries

    def get(self, shard_key: str) -> ShardIndex | None:
        """The cached index, or ``None``; counts a hit or a miss."""
        entry = self.entry(shard_key)
        return None if entry is None else entry.index

    def entry(self, shard_key: str) -> CacheEntry | None:
        """The cached entry of a shard (index, generation, size), or ``None``; counts a hit or a miss."""
        with self._lock:
            entry = self._entries.get(shard_key)
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(shard_key)
            self.hits += 1
            return entry

    def chunk_location(self, shard_key: str, local_coords: tuple[int, ...]) -> tuple[CacheEntry, int, int] | None:
        """``(entry, offset, nbytes)`` of a chunk in the cached index of a shard of known size, or ``None``.

        Counts a hit only when it answers (the one look-up of a warm single-chunk read).
        """
        with self._lock:
            entry = self._entries.get(shard_key)
            if entry is None or entry.size is None:
                return None
            found = entry.index.get(local_coords)
            if found is None:
                return None
            self._entries.move_to_end(shard_key)
            self.hits += 1
            return entry, found[0], found[1]

    def peek(self, shard_key: str) -> CacheEntry | None:
        """The cached entry of a shard, without counting or reordering (listings compare generations)."""
        with self._lock:
            return self._entries.get(shard_key)

    def put(self, shard_key: str, index: ShardIndex, generation: Hashable = None, size: int | None = None) -> None:
        """Cache an index with its shard's generation and size (bytes) if known, evicting beyond the limit."""
        nbytes = index.nbytes
        with self._lock:
            self._drop(shard_key)
            if nbytes > self.max_bytes:
                return
            self._entries[shard_key] = CacheEntry(index, generation, size)
            self._nbytes += nbytes
            while self._nbytes > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._nbytes -= evicted.index.nbytes

    def discard(self, shard_key: str) -> None:
        """Forget one shard's index."""
        with self._lock:
            self._drop(shard_key)

    def clear(self) -> None:
        """Forget every index."""
        with self._lock:
            self._entries.clear()
            self._nbytes = 0

    def _drop(self, shard_key: str) -> None:
        entry = self._entries.pop(shard_key, None)
        if entry is not None:
            self._nbytes -= entry.index.nbytes
