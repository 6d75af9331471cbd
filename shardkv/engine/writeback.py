"""Write-back: chunk writes held per shard until the shard can be written once, optionally journalled.

:class:`WriteBuffer` keeps the books (pure); :class:`WriteBack` writes through
:meth:`ShardWriter.write <shardkv.engine.writes.ShardWriter.write>` and keeps the optional write-ahead
:class:`~shardkv.engine.journal.Journal`. A shard is written when complete, on ``flush()``, or when the
limit forces the oldest out. Nothing leaves the buffer before a write stored it, and a :meth:`WriteBack.write`
that raised is taken back out of the buffer and the journal (docs/architecture.md; docs/user-guide.md).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from os import PathLike
from typing import TYPE_CHECKING

from shardkv._types import BytesLike
from shardkv.engine.journal import Journal
from shardkv.engine.merge import ShardChange
from shardkv.errors import ConfigurationError, InvalidKeyError, JournalMismatchError
from shardkv.keys.space import ChunkRef, ShardedArray

if TYPE_CHECKING:
    from shardkv.engine.engine import ShardEngine

_JOURNAL_SLACK = 4 * 2**20  # bytes a journal may hold beyond twice the buffer before it is compacted

Buffered = ShardChange[bytes | None]  # what the buffer holds of one shard: whole chunks and deletions
# (shard_key, local_coords, (was buffered, value before), value buffered) of one WriteBack.write
_Added = list[tuple[str, tuple[int, ...], tuple[bool, "bytes | None"], "bytes | None"]]


def _records(changes: Iterable[ShardChange]) -> Iterator[tuple[str, bytes | None, str]]:
    """``(chunk key, value, array layout)`` of each chunk update of ``changes``, as the journal records them."""
    for change in changes:
        layout = layout_of(change.array)
        for local, value in change.chunks.items():
            yield change.chunk_key(local), None if value is None else bytes(value), layout


def layout_of(arr: ShardedArray) -> str:
    """The array layout a journal record carries (inner chunk shape and chunks per shard, as text)."""
    chunks = "?" if arr.chunks is None else ",".join(map(str, arr.chunks))
    return f"chunks={chunks} chunks_per_shard={','.join(map(str, arr.chunks_per_shard))}"


class WriteBuffer:
    """Per-shard buffered chunk updates under a memory limit.

    Parameters
    ----------
    max_bytes : int
        Limit (bytes) on buffered chunk bytes; beyond it the oldest shards are handed back for writing.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._pending: OrderedDict[str, Buffered] = OrderedDict()
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
    ) -> Buffered:
        """Buffer one chunk update (``None`` deletes) and return its shard's record."""
        pending = self._pending.get(shard_key)
        if pending is None:
            pending = self._pending[shard_key] = ShardChange(array, shard_coords)
        old = pending.chunks.get(local_coords)
        delta = (0 if value is None else len(value)) - (0 if old is None else len(old))
        pending.chunks[local_coords] = value
        pending.nbytes += delta
        self._nbytes += delta
        return pending

    def lookup(self, shard_key: str, local_coords: tuple[int, ...]) -> tuple[bool, bytes | None]:
        """``(True, value)`` when the chunk has a buffered update (``None``: deleted), else ``(False, None)``."""
        pending = self._pending.get(shard_key)
        if pending is None or local_coords not in pending.chunks:
            return False, None
        return True, pending.chunks[local_coords]

    def pop(self, shard_key: str) -> Buffered:
        """Remove and return a shard's buffered updates."""
        pending = self._pending.pop(shard_key)
        self._nbytes -= pending.nbytes
        return pending

    def take_complete(self, shard_keys: list[str]) -> dict[str, Buffered]:
        """Copies of those of ``shard_keys`` that are complete (they stay buffered until settled)."""
        pending = self._pending
        return {k: pending[k].copy() for k in shard_keys if k in pending and pending[k].covers_shard()}

    def take_over_limit(self) -> dict[str, Buffered]:
        """Copies of the oldest shards whose writing brings the buffer within its limit (they stay buffered)."""
        out: dict[str, Buffered] = {}
        left = self._nbytes
        for key, pending in self._pending.items():
            if left <= self.max_bytes:
                break
            out[key] = pending.copy()
            left -= pending.nbytes
        return out

    def take_all(self, path: str | None = None) -> dict[str, Buffered]:
        """Copies of every buffered shard (of the array at ``path`` only, if given); they stay buffered."""
        return {k: p.copy() for k, p in self._pending.items() if path is None or p.array.path == path}

    def settle(self, shard_key: str, written: Buffered) -> None:
        """Forget the updates of ``written`` (a copy from ``take_*``) now stored; newer ones (by identity) stay."""
        pending = self._pending.get(shard_key)
        if pending is None:
            return
        for local, value in written.chunks.items():
            if local in pending.chunks and pending.chunks[local] is value:
                nbytes = 0 if value is None else len(value)
                del pending.chunks[local]
                pending.nbytes -= nbytes
                self._nbytes -= nbytes
        if not pending.chunks:
            self.pop(shard_key)

    def changes(self) -> list[Buffered]:
        """The record of every buffered shard, oldest first (the live records)."""
        return list(self._pending.values())

    def discard_under(self, path: str) -> int:
        """Drop, unwritten, the updates of arrays at or below ``path`` (deleted arrays); the shards dropped."""
        keys = [k for k, p in self._pending.items() if not path or f"{p.array.path}/".startswith(f"{path}/")]
        for k in keys:
            self.pop(k)
        return len(keys)


class WriteBack:
    """Chunk changes written to shards through the engine: at once, or buffered and journalled.

    Parameters
    ----------
    engine : ShardEngine
        Writes the shards.
    buffer_bytes : int or None
        Limit (bytes) of buffered chunk data; ``None`` writes within each call.
    on_write_through : callable, optional
        Called with the changes of every unbuffered write (the proxy's advice
        about chunk-by-chunk rewrites).

    Attributes
    ----------
    buffer : WriteBuffer or None
        The buffered changes (``None`` without write-back).
    journal : Journal or None
        The write-ahead journal, once attached.
    write : callable
        Apply chunk changes (shard key -> :class:`~shardkv.engine.merge.ShardChange`):
        journalled and buffered in write-back mode, else the engine's
        :meth:`~shardkv.engine.writes.ShardWriter.write` itself. Raises
        ``OSError`` if the journal append fails (nothing of the call is
        buffered) or a shard write the call forced fails (the call's updates
        not yet stored are taken back out of the buffer and the journal).
    """

    def __init__(
        self,
        engine: ShardEngine,
        buffer_bytes: int | None,
        on_write_through: Callable[[Mapping[str, ShardChange]], None] | None = None,
    ) -> None:
        self.engine = engine
        self.buffer = None if buffer_bytes is None else WriteBuffer(buffer_bytes)
        self.journal: Journal | None = None
        self._io_lock = threading.RLock()  # one thread writes buffered shards at a time
        self.write: Callable[[Mapping[str, ShardChange[BytesLike | None]]], None] = self._write_back
        if self.buffer is None:  # no layer between the caller and the engine
            self.write = engine.writes.write
            engine.writes.observe = on_write_through

    def lookup(self, shard_key: str, local_coords: tuple[int, ...]) -> tuple[bool, bytes | None]:
        """``(True, value)`` for a buffered chunk (``None``: deleted), else ``(False, None)``."""
        if self.buffer is None:
            return False, None
        with self.buffer.lock:
            return self.buffer.lookup(shard_key, local_coords)

    # -- reads that see buffered writes (both facades ask these) -------------------------

    def _split(self, refs: Sequence[ChunkRef]) -> tuple[dict[int, bytes | None], list[int]]:
        """The buffered values among ``refs`` by position (``None``: deleted), and the positions of the others."""
        found = [self.lookup(ref.shard_key, ref.local_coords) for ref in refs]
        return {i: v for i, (b, v) in enumerate(found) if b}, [i for i, (b, _) in enumerate(found) if not b]

    def read_chunks(self, refs: Sequence[ChunkRef]) -> dict[str, BytesLike]:
        """Encoded bytes of the chunks among ``refs`` by chunk key: buffered ones as buffered, the rest read in one
        call (missing and buffered-deleted chunks left out)."""
        if self.buffer is None:
            return self.engine.reads.read_chunks(refs)
        buffered, others = self._split(refs)
        out: dict[str, BytesLike] = {refs[i].chunk_key: v for i, v in buffered.items() if v is not None}
        if others:
            out.update(self.engine.reads.read_chunks([refs[i] for i in others]))
        return out

    def has_chunk(self, ref: ChunkRef) -> bool:
        """True when the chunk is buffered (not as a delete), or stored now (its shard's index confirmed current)."""
        buffered, value = self.lookup(ref.shard_key, ref.local_coords)
        if buffered:
            return value is not None
        return self.engine.reads.has_chunks([ref])[0]

    def chunk_sizes(self, refs: Sequence[ChunkRef]) -> list[int | None]:
        """Encoded sizes (bytes) of the chunks, buffered ones included, from the indexes; ``None``: no chunk."""
        buffered, others = self._split(refs)
        out: list[int | None] = [None] * len(refs)
        for i, value in buffered.items():
            out[i] = None if value is None else len(value)
        indexes = self.engine.reads.read_indexes({refs[i].shard_key: refs[i].array for i in others}) if others else {}
        for i in others:
            index = indexes.get(refs[i].shard_key)
            entry = None if index is None else index.get(refs[i].local_coords)
            out[i] = None if entry is None else entry[1]
        return out

    # -- writes ---------------------------------------------------------------------------

    def _write_back(self, changes: Mapping[str, ShardChange[BytesLike | None]]) -> None:
        """:attr:`write` in write-back mode."""
        buf = self.buffer
        if not changes or buf is None:
            return
        added: _Added = []
        with buf.lock:
            if self.journal is not None:
                self.journal.append(_records(changes.values()))
            for shard_key, change in changes.items():
                for local, value in change.chunks.items():
                    before = buf.lookup(shard_key, local)
                    data = None if value is None else bytes(value)
                    buf.add(shard_key, change.array, change.shard_coords, local, data)
                    added.append((shard_key, local, before, data))
        keys = list(changes)
        try:
            self._drain(buf, lambda: {**buf.take_complete(keys), **buf.take_over_limit()})
        except BaseException:
            self._take_back(buf, changes, added)  # the caller is told this write failed: never apply it later
            raise

    def _take_back(self, buf: WriteBuffer, changes: Mapping[str, ShardChange], added: _Added) -> None:
        """Undo the updates of a failed :attr:`write` still buffered: each chunk gets back its value from
        before the call (or leaves the buffer), and the journal is rewritten to match."""
        with self._io_lock, buf.lock:
            undone = False
            for shard_key, local, (had, old), data in reversed(added):
                found, current = buf.lookup(shard_key, local)
                if not found or current is not data:  # stored by the drain, or overwritten since
                    continue
                change = changes[shard_key]
                pending = buf.add(shard_key, change.array, change.shard_coords, local, old)
                if not had:  # the chunk was not buffered before the call: it leaves the buffer
                    written = ShardChange(change.array, change.shard_coords, {local: pending.chunks[local]})
                    buf.settle(shard_key, written)
                undone = True
            if undone and self.journal is not None:
                self.journal.reset(_records(buf.changes()))

    def write_now(self, changes: Mapping[str, ShardChange]) -> None:
        """Write chunk changes at once, bypassing the buffer (resize trims); then compact the journal, so no
        older record of a trimmed chunk comes back on replay should the array grow again."""
        if not changes:
            return
        self.engine.writes.write(changes, observed=False)
        buf = self.buffer
        if self.journal is not None and buf is not None:
            with buf.lock:
                self.journal.reset(_records(buf.changes()))

    def _drain(self, buf: WriteBuffer, select: Callable[[], dict[str, ShardChange]]) -> None:
        """Write the shards ``select`` picks (under the buffer lock) and settle those written."""
        with self._io_lock:
            with buf.lock:
                pending = select()
            if not pending:
                return
            failure: Exception | None = None
            try:
                self.engine.writes.write(pending)
                written = list(pending)
            except Exception as exc:  # which shards of the batch made it is unknown: one at a time
                failure, written = exc, []
                for key, change in pending.items():
                    try:
                        self.engine.writes.write({key: change})
                    except Exception:  # noqa: BLE001 - kept buffered; the first error is raised below
                        continue
                    written.append(key)
            with buf.lock:
                for key in written:
                    buf.settle(key, pending[key])
                self._tidy_journal(buf)
            if failure is not None and len(written) < len(pending):
                raise failure

    def _tidy_journal(self, buf: WriteBuffer) -> None:
        """Reset the journal when the buffer is empty; compact it when it outgrew the buffer (buffer lock held)."""
        journal = self.journal
        if journal is None:
            return
        if not len(buf):
            if not journal.empty:
                journal.reset()
        elif journal.nbytes > 2 * buf.max_bytes + _JOURNAL_SLACK:
            journal.reset(_records(buf.changes()))

    def flush(self, path: str | None = None) -> None:
        """Write the buffered shards (of the array at ``path`` only); those a write failed for stay buffered."""
        buf = self.buffer
        if buf is not None:
            self._drain(buf, lambda: buf.take_all(path))

    def discard_under(self, path: str) -> None:
        """Drop buffered writes of arrays being deleted, so a later flush (or replay) cannot resurrect them."""
        buf = self.buffer
        if buf is None:
            return
        with self._io_lock, buf.lock:  # a flush under way finishes first: it cannot write them after
            if buf.discard_under(path) and self.journal is not None:
                self.journal.reset(_records(buf.changes()))

    # -- journal ---------------------------------------------------------------------------

    def attach_journal(
        self,
        path: str | PathLike[str] | None,
        route: Callable[[str], ChunkRef | None],
        identity: Callable[[], Mapping[str, str]] | None = None,
    ) -> int:
        """Open the journal at ``path``, replay its records through the buffer, write them and reset it.

        ``path`` ``None``: no journal. ``route`` maps a record's chunk key to its
        :class:`~shardkv.keys.space.ChunkRef` (``None`` or ``InvalidKeyError``:
        skipped); ``identity`` gives the store's identity
        (:func:`shardkv.storage.identity.store_identity`; ``None``: not checked).
        Returns the records replayed.

        Raises
        ------
        ConfigurationError
            If there is no write-back buffer.
        JournalCorruptError
            If an acknowledged record of the journal is damaged or missing.
        JournalMismatchError
            If the journal holds records of another store, or of an array
            since recreated with another layout (nothing is applied).
        LockTimeoutError
            If another process has the journal open.
        """
        if path is None:
            return 0
        buf = self.buffer
        if buf is None:
            raise ConfigurationError(f"journal={os.fspath(path)!r} needs write-back mode: give buffer_bytes too")
        journal = Journal(path, None if identity is None else dict(identity()))
        try:
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
                        journal.path,
                        f"array {ref.array.path!r} with {record.layout}",
                        f"array {ref.array.path!r} with {layout_of(ref.array)}",
                        len(latest),
                    )
                refs.append((ref, record.value))
            with buf.lock:
                for ref, value in refs:
                    buf.add(ref.shard_key, ref.array, ref.shard_coords, ref.local_coords, value)
                self.journal = journal
            self.flush()
            with buf.lock:
                self._tidy_journal(buf)
            return len(latest)
        except BaseException:
            self.journal = None
            journal.close()
            raise

    def close(self) -> None:
        """Close the journal (after a flush; its records, if any, stay for the next open)."""
        if self.journal is not None:
            self.journal.close()
