"""Chunk reads and writes of :class:`shardkv.zarr3.ShardedStore`: the zarr 2 proxy's shard engine, synchronously.

This is the only module of :mod:`shardkv.zarr3` that talks to the engine, so
the zarr 3 store and the zarr 2 proxy share one engine (index cache, coalesced
ranged reads, batched shard writes, write-back, concurrency per store kind)
and the zarr 3 store follows it when it changes. Every call blocks; the store
runs them in worker threads.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from shardkv._types import BytesLike
from shardkv.engine.engine import ShardEngine
from shardkv.engine.merge import group_by_shard
from shardkv.engine.options import Options
from shardkv.engine.writeback import WriteBack
from shardkv.errors import UnsupportedError
from shardkv.keys.space import ChunkRef
from shardkv.storage.identity import STORE_ID_KEY, store_identity
from shardkv.storage.open import open_kv

WRITE_ONCE_BUFFER_BYTES = 2**62
"""The write-back limit over a store that cannot replace a value when none is given: no limit in practice.

Every shard is then held until all its chunks are written, or until
``flush()`` / ``close()``, so that it is written once.
"""

JOURNAL_LAYOUT = "zarr3"
"""The layout a journal of the zarr 3 store records in its store identity (the zarr 2 proxy's is ``"v2"``).

Its records hold zarr 3 chunk keys (``c/0/1``): a journal of the zarr 2 proxy
over the same directory is refused, and the other way round.
"""


class ChunkEngine:
    """The shard engine (:attr:`engine`) and write-back over one base store, as chunk operations.

    ``base`` is what :func:`shardkv.storage.open.open_kv` opens for the data
    of the zarr 3 store underneath (:func:`shardkv.zarr3.bases.engine_base`);
    ``options`` are the :class:`shardkv.zarr3.ShardedStore` options.
    Over a store that cannot replace a stored value (``replaces`` false; named
    ``store_name`` in errors) every shard is written once: write-back holds
    each shard (without limit unless ``options.buffer_bytes`` sets one) and a
    change to a shard already stored is refused. A ``read_only`` engine
    never writes, not even to repair an interrupted append a read meets.
    """

    def __init__(
        self, base: Any, options: Options, *, replaces: bool = True, store_name: str = "", read_only: bool = False
    ) -> None:
        self.kv = open_kv(base)
        self.engine = ShardEngine(self.kv, options, read_only=read_only)
        self.replaces = replaces
        self.store_name = store_name or str(base)
        buffer_bytes = options.buffer_bytes
        if not replaces and buffer_bytes is None:
            buffer_bytes = WRITE_ONCE_BUFFER_BYTES  # every shard held until complete or flushed
        self.writer = WriteBack(self.engine, buffer_bytes)
        self._write_once_lock = threading.Lock()  # the stored-shard check and the write it allows, together
        self._journal: tuple[str, Callable[[str], ChunkRef | None]] | None = None  # (path, route) once attached
        self._journal_closed = False  # by close(): taken back on the next use
        self._journal_lock = threading.Lock()

    # -- journal --------------------------------------------------------------------

    def attach_journal(self, path: str, route: Callable[[str], ChunkRef | None]) -> int:
        """Open the write-back journal at ``path``: replay what a killed run left, write it, reset the journal.

        As the zarr 2 proxy does (:meth:`WriteBack.attach_journal
        <shardkv.engine.writeback.WriteBack.attach_journal>`), with this
        store's identity (layout :data:`JOURNAL_LAYOUT`); ``route`` maps a
        record's chunk key to its :class:`~shardkv.keys.space.ChunkRef`
        (``None`` or ``InvalidKeyError``: skipped). Returns the records replayed.
        """
        with self._journal_lock:
            return self._open_journal(path, route)

    def _open_journal(self, path: str, route: Callable[[str], ChunkRef | None]) -> int:
        """Open (and replay) the journal; the journal lock held."""
        replayed = self.writer.attach_journal(path, route, lambda: store_identity(self.kv, JOURNAL_LAYOUT))
        self._journal, self._journal_closed = (path, route), False
        return replayed

    def _journal_back(self) -> None:
        """Reopen the journal :meth:`close` closed, before a write (a closed zarr 3 store reopens on its next use).

        Reads never need it: a successful :meth:`close` leaves nothing buffered
        and the journal empty (a failed one leaves the journal open).
        """
        if not self._journal_closed or self._journal is None:
            return
        with self._journal_lock:
            if self._journal_closed:
                self._open_journal(*self._journal)

    def keep_identity(self) -> None:
        """Write the store id back after the store was cleared, so the open journal still belongs to it."""
        journal = self.writer.journal
        if journal is not None and not self._journal_closed and "store_id" in journal.identity:
            self.kv.put(STORE_ID_KEY, journal.identity["store_id"].encode())

    def value(self, key: str) -> bytes | None:
        """The whole stored value at ``key`` (a ``zarr.json`` for the replay), or ``None``. Blocks."""
        found = self.kv.get(key)
        return bytes(memoryview(found.whole()).cast("B")) if found.found else None

    def write(self, items: Sequence[tuple[ChunkRef, BytesLike | None]]) -> list[None]:
        """Store (or, for ``None``, delete) chunks; one shard write per shard touched (journalled, if attached).

        One ``None`` per item (the answers of a batch of zarr's ``set`` calls).

        Raises
        ------
        UnsupportedError
            Over a store that cannot replace a value (``replaces`` false), for
            a change to a shard already stored (nothing of the call is applied).
        """
        if self._journal_closed:
            self._journal_back()
        changes = group_by_shard([ref for ref, _ in items], [value for _, value in items])
        if self.replaces:
            self.writer.write(changes)
        else:
            with self._write_once_lock:
                self._refuse_stored(changes)
                self.writer.write(changes)
        return [None] * len(items)

    def _refuse_stored(self, changes: Mapping[str, Any]) -> None:
        """Refuse (``UnsupportedError``) the first shard of ``changes`` that is stored and not buffered."""
        buf = self.writer.buffer
        for shard_key in changes:
            if buf is not None and shard_key in buf:
                continue  # held, not yet written: the change joins it
            if self.kv.contains(shard_key):
                raise UnsupportedError(
                    f"cannot write shard {shard_key!r} again: {self.store_name} cannot replace a stored value (it "
                    "cannot delete), so each shard is written once, when all its chunks are written or on flush() "
                    "or close(); write every chunk of a shard before then, or write to a store that can replace "
                    "values (a LocalStore) and copy the result into this one"
                )

    def discard_buffered(self, path: str) -> None:
        """Drop buffered writes of the arrays at and below ``path`` (being deleted)."""
        self._journal_back()
        self.writer.discard_under(path)

    def flush(self) -> None:
        """Write every buffered shard (write-back mode; a no-op otherwise)."""
        self._journal_back()
        self.writer.flush()

    def buffered(self) -> tuple[int, int]:
        """``(shards, bytes of chunk data)`` held by write-back and not yet stored (``(0, 0)`` without it)."""
        buf = self.writer.buffer
        return (0, 0) if buf is None else (len(buf), buf.nbytes)

    def close(self) -> None:
        """Write buffered shards and close the journal (the data stays reachable: a closed zarr store reopens).

        The journal's lock is released (only after a successful flush); the
        next write, flush or delete takes the journal back.
        """
        self.writer.flush()
        with self._journal_lock:
            self.writer.close()
            self._journal_closed = self._journal is not None
