"""``shardkv.zarr3.ShardedStore``: transparent sharding for zarr-python 3.

Code above the store writes ordinary v3 arrays, one key per chunk; storage holds
them sharded (:mod:`shardkv.zarr3.metadata`), one object per shard written and
read by the shard engine the zarr 2 proxy uses. Every other key passes through
to the zarr 3 store underneath.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Unpack

from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, Store, SuffixByteRequest
from zarr.core.buffer import Buffer, BufferPrototype, default_buffer_prototype

from shardkv._types import BytesLike
from shardkv.engine.cache import IndexCache
from shardkv.engine.engine import ShardEngine
from shardkv.engine.merge import group_by_shard
from shardkv.engine.options import OptionKeywords, Options
from shardkv.engine.writeback import WriteBack
from shardkv.errors import ChunkOutOfGridError, ConfigurationError, UnflushedWritesError, UnsupportedError
from shardkv.keys.paths import path_prefix
from shardkv.keys.space import ChunkRef, ShardedArray
from shardkv.metadata.chunks_per_shard import ChunksPerShardOption
from shardkv.storage.identity import STORE_ID_KEY, store_identity
from shardkv.storage.kv import check_not_reserved, hidden
from shardkv.storage.open import open_kv
from shardkv.zarr3.bases import engine_base, same_store, zarr3_store
from shardkv.zarr3.batching import Batcher
from shardkv.zarr3.nodes import NodeTable, meta_path

WRITE_ONCE_BUFFER_BYTES = 2**62
"""Write-back limit over a store that cannot replace a value, when none is given: every shard held until complete."""

JOURNAL_LAYOUT = "zarr3"
"""The layout in a journal's store identity: records hold zarr 3 chunk keys, so the zarr 2 proxy's (``"v2"``) differ."""


def _slice(data: BytesLike, byte_range: ByteRequest | None) -> BytesLike:
    """The bytes of ``data`` a zarr 3 ``ByteRequest`` asks for (``TypeError`` with zarr's message for another type)."""
    if byte_range is None:
        return data
    if isinstance(byte_range, RangeByteRequest):
        return data[byte_range.start : byte_range.end]
    if isinstance(byte_range, OffsetByteRequest):
        return data[byte_range.offset :]
    if isinstance(byte_range, SuffixByteRequest):
        return data[max(len(data) - byte_range.suffix, 0) :]
    raise TypeError(f"Unexpected byte_range, got {byte_range}.")


class ShardedStore(Store):
    """A zarr-python 3 store that keeps the chunks of the arrays written through it in shards.

    Parameters
    ----------
    store : zarr.abc.store.Store, str or os.PathLike
        The zarr 3 store underneath (``LocalStore``, ``FsspecStore``,
        ``ObjectStore``, ``MemoryStore`` or any other), a local path, or an
        fsspec URL.
    chunks_per_shard : int, tuple of int, mapping or None
        Sharding of arrays created through the store (when their ``zarr.json``
        is written), as for :class:`shardkv.ShardedStore`: an int, a tuple (for
        arrays with that many dimensions), ``{array path: int or tuple}`` or
        ``None``. Shard shape = ``chunks_per_shard`` x chunk shape (elements).
    storage_options : mapping, optional
        fsspec options when ``store`` is a URL.
    read_only : bool
        Refuse writes (``ValueError``); the store underneath is opened read-only too.
    journal : str or os.PathLike, optional
        With ``buffer_bytes``: as for :class:`shardkv.ShardedStore` (identity
        layout ``"zarr3"``). Locked while the store is open: :meth:`close`
        releases it, the next write of a closed store takes it back.
    options : Options, optional
        Every option at once (``chunks_per_shard`` and the keywords below
        then stay unset).
    **keywords
        The runtime options, as for :class:`shardkv.ShardedStore`, each
        described in :class:`~shardkv.engine.options.Options`.

    Raises
    ------
    ConfigurationError
        For an invalid ``chunks_per_shard``, index option or ``concurrency``,
        a ``journal`` without ``buffer_bytes`` or on a read-only store,
        ``options`` given with other options, or ``storage_options`` without a URL.
    TypeError
        If ``store`` is not a zarr 3 store, a path or a URL, or a keyword names no option.
    JournalCorruptError, JournalMismatchError
        As for :class:`shardkv.ShardedStore`.
    LockTimeoutError
        If another process (or another store object) has ``journal`` open.

    Notes
    -----
    Stored: a Zarr v3 array with the ``sharding_indexed`` codec (v1.0
    sharding specification), chunk grid = shard shape, the codecs written as
    inner codecs, and an extension member ``"shardkv"`` (``"must_understand":
    false``) marking the sharding as this store's. Arrays whose ``zarr.json``
    asks for shards itself are stored as written.

    Out-of-grid chunk keys are refused on writes
    (:class:`~shardkv.errors.ChunkOutOfGridError`) and read as missing.
    ``set_if_not_exists`` of a chunk is atomic within this process only. Array
    documents are cached: call :meth:`refresh` after another process changed
    arrays. The store pickles as its store underneath and its options (the
    copy writes through; ``UnflushedWritesError`` with unflushed data). Stores
    are equal when their base stores are the same store and their options are
    the same, ``buffer_bytes`` aside.

    Over a store that cannot delete (``supports_deletes`` false: ``ZipStore``)
    each shard is written once: chunk writes are held per shard (no limit
    unless ``buffer_bytes`` sets one) until the shard is complete or the store
    is flushed or closed; a later change to a stored shard raises
    :class:`~shardkv.errors.UnsupportedError`. zarr's capability flags are the
    base store's; ``supports_partial_writes`` is always false.
    """

    # zarr's capability flags, the base store's (set by _setup): zarr decides from them what it may ask
    supports_writes = supports_deletes = supports_listing = supports_consolidated_metadata = True

    def __init__(
        self,
        store: Any,
        chunks_per_shard: ChunksPerShardOption = None,
        *,
        storage_options: Mapping[str, Any] | None = None,
        read_only: bool = False,
        journal: str | os.PathLike[str] | None = None,
        options: Options | None = None,
        **keywords: Unpack[OptionKeywords],
    ) -> None:
        options = Options.of(options, chunks_per_shard, keywords)
        self._setup(zarr3_store(store, storage_options, read_only), options, read_only, journal)

    def _setup(self, base: Store, options: Options, read_only: bool, journal: str | os.PathLike[str] | None) -> None:
        """Build the store's parts over the zarr 3 store ``base`` (the one place they are made)."""
        read_only = bool(read_only or base.read_only)
        if read_only and not base.read_only:
            base = base.with_read_only(True)
        super().__init__(read_only=read_only)
        self._base = base
        self.supports_writes, self.supports_deletes = bool(base.supports_writes), bool(base.supports_deletes)
        self.supports_listing = bool(base.supports_listing)  # chunk keys are listed from the shards it lists
        self.supports_consolidated_metadata = bool(base.supports_consolidated_metadata)
        self._options = options
        # a read-only store writes nothing, so it has no writer of its own to exclude: "auto" needs no locks
        # (a read-only ZipStore offers neither lock files nor conditional writes)
        engine_options = (
            replace(options, concurrency="none") if read_only and options.concurrency == "auto" else options
        )
        self._kv = open_kv(engine_base(base))
        # never a byte changed by a read-only store: an interrupted append it meets is reported, not repaired
        self._engine = ShardEngine(self._kv, engine_options, read_only=read_only)
        # a store that cannot delete cannot replace a value either: each shard is written once, held until complete
        self._write_once = not base.supports_deletes
        buffer_bytes = options.buffer_bytes
        if self._write_once and buffer_bytes is None:
            buffer_bytes = WRITE_ONCE_BUFFER_BYTES
        self._writer = WriteBack(self._engine, buffer_bytes)
        self._write_once_lock = threading.Lock()  # the stored-shard check and the write it allows, together
        self._nodes = NodeTable(base, options)
        self._journal: str | None = None
        self._journal_closed = False  # by close(): taken back on the next write, flush or delete
        self._journal_lock = threading.Lock()
        if journal is not None:
            if read_only:
                raise ConfigurationError(
                    f"journal={os.fspath(journal)!r} needs a writable store: replaying it writes to {base}"
                )
            # replays what a killed run left, if the journal is this store's (before zarr reads anything)
            self._open_journal(os.fspath(journal))
        # concurrent chunk gets / sets of zarr (one per chunk) reach the engine as batches
        self._reads: Batcher[ChunkRef, BytesLike | None] = Batcher(self._read_batch)
        self._writes: Batcher[tuple[ChunkRef, bytes], None] = Batcher(self._write)

    def _read_batch(self, refs: list[ChunkRef]) -> list[BytesLike | None]:
        found = self._writer.read_chunks(refs)
        return [found.get(ref.chunk_key) for ref in refs]

    def _write(self, items: Sequence[tuple[ChunkRef, BytesLike | None]]) -> list[None]:
        """Store (``None``: delete) chunks, one shard write per shard; one ``None`` per item. Blocks.

        Over a store that cannot replace a value, a change to a shard already
        stored raises :class:`~shardkv.errors.UnsupportedError` (nothing of the call applied).
        """
        if self._journal_closed:
            self._journal_back()
        changes = group_by_shard([ref for ref, _ in items], [value for _, value in items])
        if not self._write_once:
            self._writer.write(changes)
            return [None] * len(items)
        with self._write_once_lock:
            buf = self._writer.buffer
            for shard_key in changes:
                if (buf is None or shard_key not in buf) and self._kv.contains(shard_key):
                    raise UnsupportedError(
                        f"cannot write shard {shard_key!r} again: {self._base!r} cannot replace a stored value (it "
                        "cannot delete), so each shard is written once, when all its chunks are written or on "
                        "flush() or close(); write every chunk of a shard before then, or write to a store that "
                        "can replace values (a LocalStore) and copy the result into this one"
                    )
            self._writer.write(changes)
        return [None] * len(items)

    # -- the write-back journal (closed by close(), taken back by the next write, flush or delete) -------

    def _open_journal(self, path: str) -> None:
        """Open (replaying what a killed run left) the journal at ``path``; the journal lock held or not yet shared."""
        self._writer.attach_journal(path, self._replay_route, lambda: store_identity(self._kv, JOURNAL_LAYOUT))
        self._journal, self._journal_closed = path, False

    def _journal_back(self) -> None:
        """Reopen the journal :meth:`close` closed (reads never need it: a close leaves nothing buffered)."""
        if self._journal_closed and self._journal is not None:
            with self._journal_lock:
                if self._journal_closed:
                    self._open_journal(self._journal)

    def _keep_identity(self) -> None:
        """Write the store id back after the store was cleared, so the open journal still belongs to it."""
        journal = self._writer.journal
        if journal is not None and not self._journal_closed and "store_id" in journal.identity:
            self._kv.put(STORE_ID_KEY, journal.identity["store_id"].encode())

    def _discard_buffered(self, path: str) -> None:
        """Drop buffered writes of the arrays at and below ``path`` (being deleted)."""
        self._journal_back()
        self._writer.discard_under(path)

    def _replay_route(self, key: str) -> ChunkRef | None:
        """What a journal record's key is (its array's document read through the engine, blocking)."""
        return self._nodes.route_now(key, self._value)

    def _value(self, key: str) -> bytes | None:
        """The whole stored value at ``key`` (a ``zarr.json`` for the replay), or ``None``; blocks."""
        found = self._kv.get(key)
        return bytes(memoryview(found.whole()).cast("B")) if found.found else None

    # -- identity, pickling, lifecycle ---------------------------------------------

    @property
    def base(self) -> Store:
        """The zarr 3 store underneath: shards and stored ``zarr.json`` (writes there bypass sharding)."""
        return self._base

    @property
    def concurrency_mode(self) -> str:
        """The resolved concurrency mode: ``"files"``, ``"conditional"``, ``"process"`` or ``"none"``."""
        return self._engine.locks.mode

    @property
    def index_cache(self) -> IndexCache:
        """The shard index cache (``hits``, ``misses``, ``nbytes``, ``clear()``)."""
        return self._engine.cache

    def __eq__(self, value: object) -> bool:
        return (
            isinstance(value, ShardedStore)
            and same_store(self._base, value._base)
            and self._options.for_copy() == value._options.for_copy()  # a copy that writes through is the same store
            and self.read_only == value.read_only
        )

    def __hash__(self) -> int:
        # what equal stores share for certain: zarr 3 stores need not hash (MemoryStore does not),
        # and an option may be a mapping
        return hash((ShardedStore, type(self._base), self.read_only))

    def __repr__(self) -> str:
        return f"ShardedStore({self._base!r}, chunks_per_shard={self._options.chunks_per_shard.value!r})"

    def __str__(self) -> str:
        return f"sharded+{self._base}"

    def __getstate__(self) -> dict[str, Any]:
        """The store underneath and the options of a copy that writes through (``UnflushedWritesError`` if buffered)."""
        buf = self._writer.buffer
        if buf is not None and len(buf):
            raise UnflushedWritesError(len(buf), buf.nbytes)
        return {"base": self._base, "options": self._options.for_copy(), "read_only": self.read_only}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._setup(state["base"], state["options"], state["read_only"], None)

    def with_read_only(self, read_only: bool = False) -> ShardedStore:
        """The same data and options with another ``read_only`` (no journal: the copy writes through)."""
        other = ShardedStore.__new__(ShardedStore)
        options = self._options.for_copy() if self._journal is not None else self._options
        other._setup(self._base.with_read_only(read_only), options, read_only, None)
        return other

    async def _open(self) -> None:
        await super()._open()
        if not self._base._is_open:
            await self._base._open()

    def refresh(self) -> None:
        """Forget cached array documents and shard indexes (after other processes changed the store)."""
        self._nodes.cache.forget_under("")
        self._engine.forget()

    def flush(self) -> None:
        """Write every buffered shard (write-back mode; a no-op otherwise). Blocks."""
        self._journal_back()
        self._writer.flush()

    def close(self) -> None:
        """Write buffered shards, then close the store underneath."""
        self._writer.flush()
        with self._journal_lock:  # released only after a successful flush; the next write takes it back
            self._writer.close()
            self._journal_closed = self._journal is not None
        self._base.close()
        super().close()

    # -- reads ----------------------------------------------------------------

    async def get(
        self, key: str, prototype: BufferPrototype | None = None, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        """The value of ``key`` (the bytes ``byte_range`` asks for), or ``None``; sharded ``zarr.json`` unsharded.

        Raises
        ------
        TypeError
            For a ``byte_range`` that is not a zarr ``ByteRequest``.
        CorruptShardError, ChecksumError
            For a damaged shard.
        """
        await self._ensure_open()
        prototype = prototype or default_buffer_prototype()
        path = meta_path(key)
        if path is not None:
            value = await self._nodes.read_document(path)
            return None if value is None else prototype.buffer.from_bytes(_slice(value, byte_range))
        try:
            ref = await self._nodes.route(key)
        except ChunkOutOfGridError:
            return None
        if ref is None:
            return await self._base.get(key, prototype=prototype, byte_range=byte_range)
        _slice(b"", byte_range)  # refuse a malformed range before reading
        chunk = await self._reads.submit(ref)
        return None if chunk is None else prototype.buffer.from_bytes(_slice(chunk, byte_range))

    async def get_partial_values(
        self, prototype: BufferPrototype, key_ranges: Iterable[tuple[str, ByteRequest | None]]
    ) -> list[Buffer | None]:
        """Values of (key, byte range) pairs, in order (concurrent :meth:`get` calls: chunks read in batches)."""
        return list(await asyncio.gather(*(self.get(key, prototype, byte_range) for key, byte_range in key_ranges)))

    async def exists(self, key: str) -> bool:
        """True when ``key`` is stored (a chunk: present in its shard's index)."""
        await self._ensure_open()
        try:
            ref = await self._nodes.route(key)
        except ChunkOutOfGridError:
            return False
        if ref is not None:
            return await asyncio.to_thread(self._writer.has_chunk, ref)
        return await self._base.exists(key)

    async def getsize(self, key: str) -> int:
        """Size (bytes) of the value at ``key``; a chunk's from its shard's index, without reading it.

        Raises
        ------
        FileNotFoundError
            If ``key`` is not stored.
        """
        await self._ensure_open()
        if meta_path(key) is not None:
            return await super().getsize(key)  # the presented document's size
        try:
            ref = await self._nodes.route(key)
        except ChunkOutOfGridError:
            raise FileNotFoundError(key) from None
        if ref is None:
            return await self._base.getsize(key)
        (size,) = await asyncio.to_thread(self._writer.chunk_sizes, [ref])
        if size is None:
            raise FileNotFoundError(key)
        return size

    # -- writes -------------------------------------------------------------------

    async def set(self, key: str, value: Buffer) -> None:
        """Store ``value`` at ``key`` (an array ``zarr.json`` sharded; a chunk into its shard).

        Raises
        ------
        ValueError
            If the store is read-only.
        TypeError
            If ``value`` is not a zarr ``Buffer``.
        ChunkOutOfGridError
            For a chunk key outside its array's chunk grid.
        ReservedKeyError
            For a key under a name shardkv keeps for its own files (``.shardkv-locks``,
            ``*.shardkv-tmp-*``): such a node would be hidden from every listing.
        UnsupportedError
            For a chunk of a shard already stored, over a store that cannot
            replace a value (see the class notes).
        """
        self._check_writable()
        check_not_reserved(key)
        await self._ensure_open()
        if not isinstance(value, Buffer):
            raise TypeError(f"ShardedStore.set(): expected a zarr Buffer for {key!r}, got {type(value).__name__}")
        path = meta_path(key)
        if path is not None:
            if await self._nodes.sharded(path) is not None:
                await asyncio.to_thread(self.flush)  # buffered chunks are keyed to the old document
            data = await self._nodes.stored_form(path, value.to_bytes())
            await self._base.set(key, default_buffer_prototype().buffer.from_bytes(data))
            self._nodes.remember(path, data)
            return
        ref = await self._nodes.route(key)
        if ref is None:
            await self._base.set(key, value)
        else:
            await self._writes.submit((ref, value.to_bytes()))

    async def set_if_not_exists(self, key: str, value: Buffer) -> None:
        """Store ``value`` unless ``key`` is stored (chunks: checked and written by this process)."""
        self._check_writable()
        check_not_reserved(key)
        await self._ensure_open()
        if meta_path(key) is None and await self._nodes.route(key) is None:
            await self._base.set_if_not_exists(key, value)
        elif not await self.exists(key):
            await self.set(key, value)

    async def _set_many(self, values: Iterable[tuple[str, Buffer]]) -> None:
        """Store several values; the chunks of one shard are written with one shard write."""
        self._check_writable()
        await self._ensure_open()
        chunks: list[tuple[ChunkRef, bytes]] = []
        for key, value in values:
            check_not_reserved(key)
            ref = await self._nodes.route(key)
            if ref is None:
                await self.set(key, value)
            else:
                chunks.append((ref, value.to_bytes()))
        if chunks:
            await asyncio.to_thread(self._write, chunks)

    async def delete(self, key: str) -> None:
        """Delete ``key`` (nothing happens when it is not stored).

        Raises
        ------
        ValueError
            If the store is read-only.
        UnsupportedError
            For a stored chunk of a shard already stored, over a store that
            cannot replace a value (as such a store refuses to delete a key).
        """
        self._check_writable()
        await self._ensure_open()
        path = meta_path(key)
        if path is not None:
            await self._base.delete(key)
            self._nodes.cache.forget_under(path)
            return
        try:
            ref = await self._nodes.route(key)
        except ChunkOutOfGridError:
            return
        if ref is None:
            await self._base.delete(key)
        elif await asyncio.to_thread(self._writer.has_chunk, ref):
            await asyncio.to_thread(self._write, [(ref, None)])

    async def delete_dir(self, prefix: str) -> None:
        """Delete every key under ``prefix`` (shards included), and what this store cached about them.

        Raises
        ------
        ValueError
            If the store is read-only.
        NotImplementedError
            As the store underneath raises it when it cannot delete (``ZipStore``
            with keys under ``prefix``); the chunk writes held for it are kept.
        """
        self._check_writable()
        await self._ensure_open()
        path = prefix.rstrip("/")
        if not self.supports_deletes:  # such a store refuses to delete what it holds: ask it before dropping
            await self._base.delete_dir(prefix)  # the chunk writes held for it
        await asyncio.to_thread(self._discard_buffered, path)
        await self._base.delete_dir(prefix)
        if not path:
            await asyncio.to_thread(self._keep_identity)  # the open journal still belongs to this store
        self._nodes.cache.forget_under(path)
        self._engine.forget()

    async def clear(self) -> None:
        """Delete every key of the store underneath."""
        self._check_writable()
        await self._ensure_open()
        await asyncio.to_thread(self._discard_buffered, "")
        await self._base.clear()
        await asyncio.to_thread(self._keep_identity)  # the open journal still belongs to this store
        self.refresh()

    # -- listing -----------------------------------------------------------------

    def list(self) -> AsyncIterator[str]:
        """Every key: stored keys as they are, and each shard's chunk keys in place of the shard."""
        return self.list_prefix("")

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        """Every key that starts with ``prefix`` (chunk keys of sharded arrays from their shards' indexes)."""
        await self._ensure_open()
        owner = await self._nodes.owner_of_prefix(prefix)
        listed = owner.key_prefix if owner is not None else prefix
        shards: dict[str, ShardedArray] = {}
        async for key in self._base.list_prefix(listed):
            if hidden(key):
                continue
            arr = None if meta_path(key) is not None else await self._nodes.array_of_shard(key)
            if arr is None:
                if key.startswith(prefix):
                    yield key
            else:
                shards[key] = arr
        if shards:
            keys = await asyncio.to_thread(
                lambda: [k for k in self._engine.reads.chunk_keys(shards) if k.startswith(prefix)]
            )
            for key in keys:
                yield key

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        """The names directly below ``prefix`` (keys and sub-prefixes, without the prefix)."""
        await self._ensure_open()
        path = prefix.rstrip("/")
        start = path_prefix(path)
        if await self._nodes.owner_of_prefix(start) is None and await self._nodes.sharded(path) is None:
            async for name in self._base.list_dir(prefix):
                if not hidden(name):
                    yield name
            return
        names = {key[len(start) :].split("/", 1)[0]: None async for key in self.list_prefix(start)}  # in order, once
        for name in names:
            yield name
