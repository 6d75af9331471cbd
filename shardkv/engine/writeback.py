"""The write-back buffer: chunk writes held per shard until the shard can be written once.

Writing an array chunk by chunk (legacy code, zarr 2 with a synchronizer)
through a per-call proxy rewrites a shard once per chunk: O(chunks per
shard) rewrites. With a buffer, each shard is written when it is complete
(every in-grid inner chunk buffered: no read needed), on ``flush()``, or
when the memory limit forces it out (oldest shard first; then merged with
what is stored). The total bytes written approach the array's encoded size.

This module only keeps the books (pure); the proxy does the I/O. Nothing
leaves the buffer because it is *about* to be written: the ``take_*``
methods hand out copies, and :meth:`WriteBuffer.settle` removes what a
successful write stored. A failed write therefore loses nothing: the
updates stay buffered (and visible to readers) for the next attempt.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from shardkv.engine.merge import covers_shard
from shardkv.keys.space import ShardedArray

__all__ = ["WriteBuffer", "PendingShard"]


@dataclass
class PendingShard:
    """Buffered updates of one shard: local coords -> encoded chunk bytes, or ``None`` for a delete."""

    array: ShardedArray
    shard_coords: tuple[int, ...]
    updates: dict[tuple[int, ...], bytes | None] = field(default_factory=dict)
    nbytes: int = 0

    def is_complete(self) -> bool:
        """True when every in-grid chunk of the shard is buffered with bytes (a write needs no read)."""
        return covers_shard(self.array, self.shard_coords, self.updates)


class WriteBuffer:
    """Per-shard buffered chunk updates under a memory limit.

    Parameters
    ----------
    max_bytes : int
        Limit (bytes) on buffered chunk bytes; beyond it the oldest shards are
        handed back for writing.

    Raises
    ------
    ValueError
        If ``max_bytes`` < 0.
    """

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"buffer_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = int(max_bytes)
        self._pending: OrderedDict[str, PendingShard] = OrderedDict()
        self._nbytes = 0
        self.lock = threading.RLock()

    @property
    def nbytes(self) -> int:
        """Chunk bytes currently buffered."""
        return self._nbytes

    def __len__(self) -> int:
        return len(self._pending)

    def __contains__(self, shard_key: object) -> bool:
        return shard_key in self._pending

    def add(
        self,
        shard_key: str,
        array: ShardedArray,
        shard_coords: tuple[int, ...],
        local_coords: tuple[int, ...],
        value: bytes | None,
    ) -> PendingShard:
        """Buffer one chunk update (``None`` deletes) and return its shard's record."""
        pending = self._pending.get(shard_key)
        if pending is None:
            pending = self._pending[shard_key] = PendingShard(array, shard_coords)
        old = pending.updates.get(local_coords)
        delta = (0 if value is None else len(value)) - (0 if old is None else len(old))
        pending.updates[local_coords] = value
        pending.nbytes += delta
        self._nbytes += delta
        return pending

    def lookup(self, shard_key: str, local_coords: tuple[int, ...]) -> tuple[bool, bytes | None]:
        """``(True, value)`` when the chunk has a buffered update (``None``: deleted), else ``(False, None)``."""
        pending = self._pending.get(shard_key)
        if pending is None or local_coords not in pending.updates:
            return False, None
        return True, pending.updates[local_coords]

    def pop(self, shard_key: str) -> PendingShard:
        """Remove and return a shard's buffered updates."""
        pending = self._pending.pop(shard_key)
        self._nbytes -= pending.nbytes
        return pending

    def _copy(self, shard_key: str) -> PendingShard:
        p = self._pending[shard_key]
        return PendingShard(p.array, p.shard_coords, dict(p.updates), p.nbytes)

    def take_complete(self, shard_keys: list[str]) -> dict[str, PendingShard]:
        """Copies of those of ``shard_keys`` that are complete (they stay buffered until settled)."""
        return {k: self._copy(k) for k in shard_keys if k in self._pending and self._pending[k].is_complete()}

    def take_over_limit(self) -> dict[str, PendingShard]:
        """Copies of the oldest shards whose writing brings the buffer within its limit (they stay buffered)."""
        out: dict[str, PendingShard] = {}
        left = self._nbytes
        for key, pending in self._pending.items():
            if left <= self.max_bytes:
                break
            out[key] = self._copy(key)
            left -= pending.nbytes
        return out

    def take_all(self, path: str | None = None) -> dict[str, PendingShard]:
        """Copies of every buffered shard (of the array at ``path`` only, if given); they stay buffered."""
        return {k: self._copy(k) for k, p in self._pending.items() if path is None or p.array.path == path}

    def settle(self, shard_key: str, written: PendingShard) -> None:
        """Forget the updates of ``written`` (a copy from ``take_*``) now stored in the shard.

        An update buffered again since the copy was taken (a newer value,
        compared by identity) stays buffered; a shard with no update left
        leaves the buffer.
        """
        pending = self._pending.get(shard_key)
        if pending is None:
            return
        for local, value in written.updates.items():
            if local in pending.updates and pending.updates[local] is value:
                nbytes = 0 if value is None else len(value)
                del pending.updates[local]
                pending.nbytes -= nbytes
                self._nbytes -= nbytes
        if not pending.updates:
            self.pop(shard_key)

    def items(self) -> list[tuple[str, PendingShard]]:
        """``(shard_key, record)`` of every buffered shard, oldest first (the live records)."""
        return list(self._pending.items())

    def pop_complete(self, shard_keys: list[str]) -> dict[str, PendingShard]:
        """Remove and return those of ``shard_keys`` that are complete."""
        done = [k for k in shard_keys if k in self._pending and self._pending[k].is_complete()]
        return {k: self.pop(k) for k in done}

    def pop_over_limit(self) -> dict[str, PendingShard]:
        """Remove and return the oldest shards until the buffer is within its limit."""
        out: dict[str, PendingShard] = {}
        while self._nbytes > self.max_bytes and self._pending:
            key = next(iter(self._pending))
            out[key] = self.pop(key)
        return out

    def pop_all(self, path: str | None = None) -> dict[str, PendingShard]:
        """Remove and return every buffered shard (of the array at ``path`` only, if given)."""
        keys = [k for k, p in self._pending.items() if path is None or p.array.path == path]
        return {k: self.pop(k) for k in keys}

    def discard_under(self, path: str) -> int:
        """Drop, unwritten, the updates of arrays at or below ``path`` (every array for ``""``).

        Used when those arrays are deleted. Returns the number of shards dropped.
        """
        keys = [
            k for k, p in self._pending.items()
            if not path or p.array.path == path or p.array.path.startswith(f"{path}/")
        ]  # fmt: skip
        for k in keys:
            self.pop(k)
        return len(keys)
