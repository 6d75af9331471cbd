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
import uuid
from os import PathLike
from typing import Any, Callable, Iterator, Mapping

from shardkv.engine.journal import Journal
from shardkv.engine.planner import ShardIO
from shardkv.engine.writeback import PendingShard, WriteBuffer
from shardkv.errors import ConfigurationError, InvalidKeyError, JournalMismatchError
from shardkv.keys.space import ChunkRef, ShardedArray
from shardkv.proxy.write_advice import WriteAdvisor
from shardkv.storage.base import LOCK_DIR
from shardkv.storage.location import location_of

__all__ = ["ShardWriter", "ShardChanges", "STORE_ID_KEY", "store_identity", "layout_of"]

ShardChanges = Mapping[str, tuple[ShardedArray, tuple[int, ...], dict[tuple[int, ...], "memoryview | bytes | None"]]]
"""``{shard_key: (array, shard_coords, {local_coords: chunk bytes or None (delete)})}``."""

_JOURNAL_SLACK = 4 * 2**20  # bytes a journal may hold beyond twice the buffer before it is compacted

STORE_ID_KEY = f"{LOCK_DIR}/store-id"
"""Key (in the store root, never listed) of the random id that ties a write-back journal to its store."""


def store_identity(base: Any, layout: str) -> dict[str, str]:
    """The identity a journal records for the store over adapter ``base``: location, store id, layout.

    The store id is a random hex string kept beside the data under
    :data:`STORE_ID_KEY` (created on first use), so a copy of the data is
    another store even where locations cannot tell (in-memory mappings).

    Parameters
    ----------
    base : StoreAdapter
        The adapter over the base store.
    layout : str
        The proxy's layout options, as text.

    Returns
    -------
    dict of str to str
        ``{"location": ..., "store_id": ..., "layout": ...}``.
    """
    location = location_of(base)
    where = "unknown" if location is None else ":".join(map(str, location.namespace)) + ":" + location.root
    try:
        stored = base.get(STORE_ID_KEY)
    except KeyError:
        base.set(STORE_ID_KEY, uuid.uuid4().hex.encode())
        stored = base.get(STORE_ID_KEY)  # a racing creator may have won: use what is stored
    return {"location": where, "store_id": bytes(stored).decode("ascii", "replace"), "layout": layout}


def _chunk_key(pending: PendingShard, local: tuple[int, ...]) -> str:
    return pending.array.chunk_key(pending.array.chunk_coords(pending.shard_coords, local))


def layout_of(arr: ShardedArray) -> str:
    """The array layout a journal record carries: inner chunk shape and chunks per shard (as text)."""
    chunks = "?" if arr.chunks is None else ",".join(map(str, arr.chunks))
    return f"chunks={chunks} chunks_per_shard={','.join(map(str, arr.chunks_per_shard))}"


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
        added: list[tuple[str, tuple[int, ...], tuple[bool, bytes | None], bytes | None]] = []
        with buf.lock:
            if self.journal is not None:
                self.journal.append(
                    (
                        arr.chunk_key(arr.chunk_coords(coords, local)),
                        None if value is None else bytes(value),
                        layout_of(arr),
                    )
                    for _, (arr, coords, updates) in changes.items()
                    for local, value in updates.items()
                )
            for shard_key, (arr, coords, updates) in changes.items():
                for local, value in updates.items():
                    before = buf.lookup(shard_key, local)
                    data = None if value is None else bytes(value)
                    buf.add(shard_key, arr, coords, local, data)
                    added.append((shard_key, local, before, data))
        keys = list(changes)
        try:
            self._drain(lambda: {**buf.take_complete(keys), **buf.take_over_limit()})
        except BaseException:
            self._take_back(changes, added)  # the caller is told this write failed: never apply it later
            raise

    def _take_back(
        self, changes: ShardChanges, added: list[tuple[str, tuple[int, ...], tuple[bool, bytes | None], bytes | None]]
    ) -> None:
        """Undo the buffered updates of a failed :meth:`write` that are still buffered (not yet stored).

        Each chunk gets back the value buffered before the call (an earlier,
        acknowledged write), or leaves the buffer; the journal is rewritten to
        match, so a replay cannot apply the failed write either.
        """
        buf = self.buffer
        if buf is None:
            return
        with self._io_lock, buf.lock:
            undone = False
            for shard_key, local, (had, old), data in reversed(added):
                found, current = buf.lookup(shard_key, local)
                if not found or current is not data:  # stored by the drain, or overwritten since
                    continue
                arr, coords, _ = changes[shard_key]
                buf.add(shard_key, arr, coords, local, old)
                if not had:
                    buf.settle(shard_key, PendingShard(arr, coords, {local: old}))
                undone = True
            if undone and self.journal is not None:
                self.journal.reset(self._buffered_records())

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

    def _drain(self, select: Callable[[], dict[str, PendingShard]]) -> None:
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
                self.io.write_shards({k: (p.array, p.shard_coords, p.updates) for k, p in pending.items()})  # type: ignore[misc]
                written = list(pending)
            except Exception as exc:  # which shards of the batch made it is unknown: one at a time
                failure, written = exc, []
                for key, p in pending.items():
                    try:
                        self.io.write_shards({key: (p.array, p.shard_coords, p.updates)})  # type: ignore[dict-item]
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

    def _buffered_records(self) -> Iterator[tuple[str, bytes | None, str]]:
        """``(chunk key, value, array layout)`` of every buffered update (buffer lock held)."""
        if self.buffer is None:
            return
        for _, pending in self.buffer.items():
            layout = layout_of(pending.array)
            for local, value in pending.updates.items():
                yield _chunk_key(pending, local), value, layout

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

    def attach_journal(
        self,
        path: str | PathLike[str] | None,
        route: Callable[[str], ChunkRef | None],
        identity: Callable[[], Mapping[str, str]] | None = None,
    ) -> int:
        """Open the journal at ``path``, replay its records through the buffer, write them and reset it.

        Parameters
        ----------
        path : str or os.PathLike or None
            The journal file (created if missing); ``None``: no journal.
        route : callable
            Maps a chunk key to its :class:`~shardkv.keys.space.ChunkRef`
            (``None`` or :class:`InvalidKeyError` when it names no chunk of a
            sharded array any more: such records are skipped).
        identity : callable, optional
            Returns the identity of the store (:func:`store_identity`); called
            only when ``path`` is given. A journal holding records of another
            identity is refused; ``None`` checks nothing.

        Returns
        -------
        int
            Records replayed.

        Raises
        ------
        ConfigurationError
            If there is no write-back buffer.
        JournalCorruptError
            If an acknowledged record of the journal is damaged or missing.
        JournalMismatchError
            If the journal holds records of another store.
        JournalLockedError
            If another process has the journal open.
        Exception
            A shard write failed: the journal is kept, so opening again retries.
        """
        if path is None:
            return 0
        if self.buffer is None:
            raise ConfigurationError(f"journal={os.fspath(path)!r} needs write-back mode: give buffer_bytes too")
        journal = Journal(path, None if identity is None else identity())
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
        latest = {r.key: r for r in journal.replay()}
        refs: list[tuple[ChunkRef, bytes | None]] = []
        for key, record in latest.items():  # every record checked before any is applied
            try:
                ref = route(key)
            except InvalidKeyError:  # an array deleted or shrunk since: nothing to restore
                continue
            if ref is None:
                continue
            if record.layout and record.layout != layout_of(ref.array):
                raise JournalMismatchError(
                    journal.path, f"array {ref.array.path!r} with {record.layout}",
                    f"array {ref.array.path!r} with {layout_of(ref.array)}", len(latest)
                )  # fmt: skip
            refs.append((ref, record.value))
        with buf.lock:
            for ref, value in refs:
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
