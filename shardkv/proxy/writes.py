"""Chunk writes of the proxy: straight to the shards, or through the write-back buffer.

:class:`ShardWriter` is the glue between the proxy, the pure books of
:class:`~shardkv.engine.writeback.WriteBuffer` and the requests of
:class:`~shardkv.engine.planner.ShardIO`. Without a buffer every call writes
its shards at once; with one, a shard is written when all its in-grid chunks
are buffered, on :meth:`ShardWriter.flush`, or when the memory limit forces
the oldest shards out.
"""

from __future__ import annotations

from typing import Mapping

from shardkv.engine.planner import ShardIO
from shardkv.engine.writeback import PendingShard, WriteBuffer
from shardkv.keys.space import ShardedArray

__all__ = ["ShardWriter", "ShardChanges"]

ShardChanges = Mapping[str, tuple[ShardedArray, tuple[int, ...], dict[tuple[int, ...], "memoryview | bytes | None"]]]
"""``{shard_key: (array, shard_coords, {local_coords: chunk bytes or None (delete)})}``."""


class ShardWriter:
    """Writes chunk changes to shards, optionally buffered.

    Parameters
    ----------
    io : ShardIO
        Plans and issues the shard requests.
    buffer_bytes : int or None
        Limit (bytes) of buffered chunk data; ``None`` writes within each call.

    Raises
    ------
    ValueError
        If ``buffer_bytes`` < 0.
    """

    def __init__(self, io: ShardIO, buffer_bytes: int | None) -> None:
        self.io = io
        self.buffer = None if buffer_bytes is None else WriteBuffer(buffer_bytes)

    def lookup(self, shard_key: str, local_coords: tuple[int, ...]) -> tuple[bool, bytes | None]:
        """``(True, value)`` for a buffered chunk (``None``: deleted), else ``(False, None)``."""
        if self.buffer is None:
            return False, None
        with self.buffer.lock:
            return self.buffer.lookup(shard_key, local_coords)

    def write(self, changes: ShardChanges) -> None:
        """Apply chunk changes: buffered in write-back mode, else written now."""
        if not changes:
            return
        buf = self.buffer
        if buf is None:
            self.io.write_shards(changes)  # type: ignore[arg-type]
            return
        with buf.lock:
            for shard_key, (arr, coords, updates) in changes.items():
                for local, value in updates.items():
                    buf.add(shard_key, arr, coords, local, None if value is None else bytes(value))
            ready = buf.pop_complete(list(changes))
            ready.update(buf.pop_over_limit())
        self._write_pending(ready)

    def write_now(self, changes: ShardChanges) -> None:
        """Write chunk changes at once, bypassing the buffer (resize trims)."""
        if changes:
            self.io.write_shards(changes)  # type: ignore[arg-type]

    def _write_pending(self, pending: Mapping[str, PendingShard]) -> None:
        if pending:
            self.io.write_shards({k: (p.array, p.shard_coords, p.updates) for k, p in pending.items()})  # type: ignore[misc]

    def flush(self, path: str | None = None) -> None:
        """Write the buffered shards (of the array at ``path`` only, if given)."""
        if self.buffer is None:
            return
        with self.buffer.lock:
            pending = self.buffer.pop_all(path)
        self._write_pending(pending)

    def discard_under(self, path: str) -> None:
        """Drop buffered writes of arrays being deleted, so a later flush cannot resurrect them."""
        if self.buffer is not None:
            with self.buffer.lock:
                self.buffer.discard_under(path)
