"""Chunk writes of the proxy: straight to the shards, or through the write-back buffer.

:class:`ShardWriter` is the glue between the proxy, the pure books of
:class:`~shardkv.engine.writeback.WriteBuffer`, the optional write-ahead
:class:`~shardkv.engine.journal.Journal` and the requests of
:class:`~shardkv.engine.planner.ShardIO`. Without a buffer every call writes
its shards at once; with one, a shard is written when all its in-grid chunks
are buffered, on :meth:`ShardWriter.flush`, or when the memory limit forces
the oldest shards out.

What is acknowledged is kept
----------------------------
A buffered shard leaves the buffer only once its write succeeded
(:meth:`~shardkv.engine.writeback.WriteBuffer.settle`). When a shard write
fails (during a flush or an eviction), its updates stay buffered and visible
to reads, the error propagates, and the next flush writes them again. Shards
are written by one thread at a time, so an older copy of a shard's updates
is never written after a newer one.

With a journal, every buffered chunk write is appended (and fsync'd) before
the call returns; the journal is reset whenever the buffer is empty after a
successful write, and compacted (rewritten atomically with the writes still
buffered) when it grows well past the buffer.
"""

from __future__ import annotations

import os
import threading
from os import PathLike
from typing import Callable, Iterator, Mapping

from shardkv.engine.journal import Journal
from shardkv.engine.planner import ShardIO
from shardkv.engine.merge import ShardChange
from shardkv.engine.writeback import WriteBuffer
from shardkv.errors import ConfigurationError, InvalidKeyError
from shardkv.keys.space import ChunkRef, ShardedArray
from shardkv.proxy.write_advice import WriteAdvisor

__all__ = ["ShardWriter", "ShardChanges"]

ShardChanges = Mapping[str, tuple[ShardedArray, tuple[int, ...], dict[tuple[int, ...], "memoryview | bytes | None"]]]
"""``{shard_key: (array, shard_coords, {local_coords: chunk bytes or None (delete)})}``."""

_JOURNAL_SLACK = 4 * 2**20  # bytes a journal may hold beyond twice the buffer before it is compacted


def _chunk_key(pending: ShardChange, local: tuple[int, ...]) -> str:
    return pending.array.chunk_key(pending.array.chunk_coords(pending.shard_coords, local))


class ShardWriter:
    """Writes chunk changes to shards, optionally buffered and journalled.

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
        self.journal: Journal | None = None
        self.advisor = WriteAdvisor()  # warns once per array about chunk-by-chunk rewrites (write-through)
        self._io_lock = threading.RLock()  # one thread writes buffered shards at a time

    def lookup(self, shard_key: str, local_coords: tuple[int, ...]) -> tuple[bool, bytes | None]:
        """``(True, value)`` for a buffered chunk (``None``: deleted), else ``(False, None)``."""
        if self.buffer is None:
            return False, None
        with self.buffer.lock:
            return self.buffer.lookup(shard_key, local_coords)

    def write(self, changes: ShardChanges) -> None:
        """Apply chunk changes: journalled and buffered in write-back mode, else written now.

        Raises
        ------
        OSError
            If the journal append fails (nothing of the call is buffered), or
            a shard write forced by the call fails (its updates stay buffered).
        """
        if not changes:
            return
        buf = self.buffer
        if buf is None:
            self.io.write_shards(changes)  # type: ignore[arg-type]
            self.advisor.observe(changes)  # type: ignore[arg-type]
            return
        with buf.lock:
            if self.journal is not None:
                self.journal.append(
                    (arr.chunk_key(arr.chunk_coords(coords, local)), None if value is None else bytes(value))
                    for _, (arr, coords, updates) in changes.items()
                    for local, value in updates.items()
                )
            for shard_key, (arr, coords, updates) in changes.items():
                for local, value in updates.items():
                    buf.add(shard_key, arr, coords, local, None if value is None else bytes(value))
        keys = list(changes)
        self._drain(lambda: {**buf.take_complete(keys), **buf.take_over_limit()})

    def write_now(self, changes: ShardChanges) -> None:
        """Write chunk changes at once, bypassing the buffer (resize trims).

        The journal is compacted afterwards, so that no older record of a
        trimmed chunk can come back on replay should the array grow again.
        """
        if not changes:
            return
        self.io.write_shards(changes)  # type: ignore[arg-type]
        if self.journal is not None and self.buffer is not None:
            with self.buffer.lock:
                self.journal.reset(self._buffered_records())

    def _drain(self, select: Callable[[], dict[str, ShardChange]]) -> None:
        """Write the shards ``select`` picks (under the buffer lock) and settle those written."""
        buf = self.buffer
        if buf is None:
            return
        with self._io_lock:
            with buf.lock:
                pending = select()
            if not pending:
                return
            failure: Exception | None = None
            try:
                self.io.write_shards({k: (p.array, p.shard_coords, p.chunks) for k, p in pending.items()})  # type: ignore[misc]
                written = list(pending)
            except Exception as exc:  # which shards of the batch made it is unknown: one at a time
                failure, written = exc, []
                for key, p in pending.items():
                    try:
                        self.io.write_shards({key: (p.array, p.shard_coords, p.chunks)})  # type: ignore[dict-item]
                    except Exception:  # noqa: BLE001 - kept buffered; the first error is raised below
                        continue
                    written.append(key)
            with buf.lock:
                for key in written:
                    buf.settle(key, pending[key])
                self._tidy_journal()
            if failure is not None and len(written) < len(pending):
                raise failure

    def _tidy_journal(self) -> None:
        """Reset the journal when the buffer is empty; compact it when it outgrew the buffer (buffer lock held)."""
        journal, buf = self.journal, self.buffer
        if journal is None or buf is None:
            return
        if not len(buf):
            if not journal.empty:
                journal.reset()
        elif journal.nbytes > 2 * buf.max_bytes + _JOURNAL_SLACK:
            journal.reset(self._buffered_records())

    def _buffered_records(self) -> Iterator[tuple[str, bytes | None]]:
        """``(chunk key, value)`` of every buffered update (buffer lock held)."""
        if self.buffer is None:
            return
        for _, pending in self.buffer.items():
            for local, value in pending.chunks.items():
                yield _chunk_key(pending, local), value

    def flush(self, path: str | None = None) -> None:
        """Write the buffered shards (of the array at ``path`` only, if given).

        Raises
        ------
        Exception
            The first error of a failed shard write; the shards not written
            stay buffered, and a later flush writes them.
        """
        buf = self.buffer
        if buf is not None:
            self._drain(lambda: buf.take_all(path))

    def discard_under(self, path: str) -> None:
        """Drop buffered writes of arrays being deleted, so a later flush (or replay) cannot resurrect them."""
        if self.buffer is None:
            return
        with self._io_lock, self.buffer.lock:  # a flush under way finishes first: it cannot write them after
            if self.buffer.discard_under(path) and self.journal is not None:
                self.journal.reset(self._buffered_records())

    # -- journal ---------------------------------------------------------------------------

    def attach_journal(self, path: str | PathLike[str] | None, route: Callable[[str], ChunkRef | None]) -> int:
        """Open the journal at ``path``, replay its records through the buffer, write them and reset it.

        Parameters
        ----------
        path : str or os.PathLike or None
            The journal file (created if missing); ``None``: no journal.
        route : callable
            Maps a chunk key to its :class:`~shardkv.keys.space.ChunkRef`
            (``None`` or :class:`InvalidKeyError` when it names no chunk of a
            sharded array any more: such records are skipped).

        Returns
        -------
        int
            Records replayed.

        Raises
        ------
        ConfigurationError
            If there is no write-back buffer.
        JournalCorruptError
            If the journal is damaged before its last record.
        Exception
            A shard write failed: the journal is kept, so opening again retries.
        """
        if path is None:
            return 0
        if self.buffer is None:
            raise ConfigurationError(f"journal={os.fspath(path)!r} needs write-back mode: give buffer_bytes too")
        journal = Journal(path)
        try:
            return self._replay(journal, route)
        except BaseException:
            self.journal = None
            journal.close()
            raise

    def _replay(self, journal: Journal, route: Callable[[str], ChunkRef | None]) -> int:
        buf = self.buffer
        if buf is None:
            return 0
        latest = {r.key: r.value for r in journal.replay()}
        with buf.lock:
            for key, value in latest.items():
                try:
                    ref = route(key)
                except InvalidKeyError:  # an array deleted or shrunk since: nothing to restore
                    continue
                if ref is not None:
                    buf.add(ref.shard_key, ref.array, ref.shard_coords, ref.local_coords, value)
            self.journal = journal
        self.flush()
        with buf.lock:
            self._tidy_journal()
        return len(latest)

    def close(self) -> None:
        """Close the journal (after a flush; its records, if any, stay for the next open)."""
        if self.journal is not None:
            self.journal.close()
