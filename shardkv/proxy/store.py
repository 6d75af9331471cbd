"""``ShardedStore``: the MutableMapping proxy that stores chunks in shards.

Code above the proxy (zarr-python 2, xarray, dask, scripts) reads and writes
ordinary chunk keys (``temp/3.7``); the store below holds shards (``temp/0.1``)
in the v1.0 ``sharding_indexed`` layout, each array's sharding described by a
``zarr.json``, a Zarr v3 array and nothing else (issue 11; zarr-python 2 sees
the ``.zarray`` presented from it, see :mod:`shardkv.proxy.presenting`).

This module routes each key: a chunk of a sharded array goes to its shard
(:class:`~shardkv.keys.space.ShardedArray`), anything else to the base store.
The other jobs live beside it: what each path is
(:mod:`shardkv.proxy.nodes`), the v3 documents kept in step with
``.zarray``/``.zattrs``/``.zgroup`` writes (:mod:`shardkv.proxy.mirror`), write-back
(:mod:`shardkv.proxy.writes`), listing (:mod:`shardkv.proxy.listing`), and the
requests themselves (:class:`shardkv.engine.planner.ShardIO`: one batched
index read and one batched chunk read per call; one batched write per call).

Concurrency: no acknowledged chunk write is lost to another writer's
read-modify-write of the same shard, whichever store, thread or process made
it, as the ``concurrency`` option of :class:`ShardedStore` describes.
"""

from __future__ import annotations

import itertools
from collections.abc import MutableMapping
from contextlib import suppress
from os import PathLike
from typing import Any, Iterable, Literal, Mapping, Sequence

from shardkv.engine.cache import IndexCache
from shardkv.engine.concurrency import Concurrency
from shardkv.engine.picklable import reduce_sharded_store
from shardkv.engine.planner import ShardIO
from shardkv.engine.strategies import WriteStrategy
from shardkv.engine.temporaries import DirectorySweeper
from shardkv.errors import ChunkOutOfGridError, ConfigurationError, InvalidKeyError
from shardkv.format.layout import ShardLayout
from shardkv.format.ranges import ReadPolicy
from shardkv.keys.encodings import validate_key
from shardkv.keys.paths import split_key, validate_path
from shardkv.keys.space import ChunkRef, ShardedArray
from shardkv.metadata.chunks_per_shard import ChunksPerShardOption, ChunksPerShardRule
from shardkv.proxy import _zarr2
from shardkv.proxy.layouts import Layout, open_unless_v2
from shardkv.proxy.mirror import MetadataMirror
from shardkv.proxy.nodes import META_NAMES, NodeCache
from shardkv.proxy.paths import PathMethods
from shardkv.proxy.presenting import PresentingAdapter
from shardkv.proxy.routing import group_by_shard, route_batch
from shardkv.proxy.values import as_buffer
from shardkv.proxy.writes import ShardWriter, store_identity
from shardkv.storage.adapters import StoreAdapter, adapt

__all__ = ["ShardedStore"]


class ShardedStore(PathMethods, _zarr2.StoreCapabilities, MutableMapping):
    """A MutableMapping of chunk keys whose chunks are stored in shards.

    Parameters
    ----------
    store : MutableMapping, fsspec.FSMap, str or os.PathLike
        The base store: a ``dict``, a zarr-python 2 store, an fsspec mapper, or
        an fsspec URL / local path (opened with ``fsspec.get_mapper``).
    chunks_per_shard : int, tuple of int, mapping or None
        Sharding for arrays created through the proxy (when their ``.zarray``
        is first written): an int (that many chunks per shard along every
        dimension), a tuple (for every new array with that many dimensions;
        others stay unsharded), or ``{array path: int or tuple}``. ``None``
        shards nothing new. Arrays already sharded in the store are recognised
        from their stored ``zarr.json`` whatever this says; unsharded arrays
        pass through untouched. 0-d arrays are never sharded.
    layout : {"v2", "draft2022"} or None
        Which proxy the store needs; ``None`` detects it (one read of the root
        ``zarr.json``). For ``"draft2022"`` (given or detected) the result is
        a :class:`~shardkv.proxy.draft.DraftShardedStore`, exactly as from
        :func:`shardkv.open_store`, the explicit way to open any layout.
    index_location : {"end", "start"}
        Where new shards keep their index (v1.0 codec ``index_location``).
    index_checksum : bool
        Whether new shards protect their index with a CRC32C (``crc32c`` index codec).
    storage_options : mapping, optional
        fsspec options when ``store`` is a URL.
    index_cache_bytes : int
        Limit (bytes) of the cache of decoded shard indexes (default 64 MiB;
        0 disables it). With the index cached, reading a chunk costs one
        request. The proxy keeps the cache right across its own writes, and
        chunk reads check entries against other writers' changes where the
        store allows (see ``validate_index_cache``).
    validate_index_cache : bool
        Also check cached indexes for listings, ``in`` and writes (chunk reads
        always check them where the store allows: local files and
        ``memory://`` compare the shard's identity, size and modification
        time; S3 reads chunk bytes ``If-Match`` the index's ETag). Elsewhere
        the cache is trusted until :meth:`refresh`.
    read_policy : ReadPolicy, optional
        How nearby chunk ranges of one shard merge into one request and when
        the whole shard is read instead (default ``ReadPolicy()``: gaps up to
        64 KiB, requests up to 16 MiB, whole shard from half its bytes).
    buffer_bytes : int or None
        Write-back mode: hold chunk writes per shard, up to this many bytes of
        chunk data, and write each shard once: when all its in-grid chunks
        are buffered, on :meth:`flush`, :meth:`close` or leaving a ``with``
        block, or when the limit forces the oldest shard out (then merged
        with what is stored). ``None`` (default) writes within each call.
        Buffered writes are visible to reads through the proxy at once, and
        reach the base store only when written: call :meth:`flush` (or use
        ``with``) before other readers look. A shard whose write fails stays
        buffered (the error propagates; the next :meth:`flush` writes it).
    journal : str or os.PathLike, optional
        With ``buffer_bytes``: a local file where every buffered chunk write
        is appended and fsync'd before the call returns, so a crash loses no
        acknowledged write. Opening a store with the same ``journal`` replays
        what a killed run left (through the normal write path), writes it,
        and resets the journal; it is also reset after every flush that
        empties the buffer. See :mod:`shardkv.engine.journal` and the user
        guide ("Write-back") for the fsync policy.
    write_strategy : {"rewrite", "append", "inplace"}
        How a stored shard is updated when a write does not replace it whole.
        ``"rewrite"`` (default, atomic) writes a new shard through a temporary
        object. On local files, ``"append"`` appends new chunks and a new index
        and ``"inplace"`` also reuses a chunk's slot when the new encoding fits;
        both are crash-safe (copy on write, see :mod:`shardkv.engine.strategies`);
        :meth:`compact` reclaims the unused bytes.
        Elsewhere they fall back to ``"rewrite"``. Never stored in metadata.
    slack_bytes : int
        With ``"inplace"``: zero bytes reserved after every chunk written
        (bytes), so a slightly larger new encoding still fits its slot.
    concurrency : {"auto", "files", "conditional", "process", "none"}
        How writers of one shard (threads, stores, processes) keep each
        other's chunks. ``"auto"``: lock files in each array's
        ``.shardkv-locks/`` on local and network file systems;
        compare-and-swap writes (ETag ``If-Match``, retried on 412) on S3
        (s3fs or obstore) and obstore's GCS, Azure and memory stores; locks
        shared in this process for ``memory://`` and in-memory mappings;
        ``ConfigurationError`` for other stores, which need ``"process"``
        (this process only) or ``"none"`` (shard-aligned writers). See the
        user guide, "Concurrency".
    lock_timeout : float or None
        Longest wait (seconds) for a shard lock (then ``LockTimeoutError``).

    Raises
    ------
    ConfigurationError
        If ``chunks_per_shard``, ``layout``, an index option or
        ``concurrency`` is invalid, ``concurrency`` asks for what the store
        cannot give, or ``journal`` is given without ``buffer_bytes``.
    TypeError
        If ``store`` cannot be used as a store.
    JournalCorruptError
        If ``journal`` is damaged before its last record.

    Notes
    -----
    Errors per operation: a value that is not bytes-like raises ``TypeError``;
    a malformed chunk key, a key with ``..`` or an empty segment, and a chunk
    key outside the array's chunk grid raise :class:`InvalidKeyError` (a
    ``ValueError``), except that deleting an out-of-grid chunk raises
    ``KeyError`` (there is nothing stored there; zarr relies on it when
    shrinking an array). A damaged shard raises :class:`CorruptShardError` or
    :class:`ChecksumError`. Errors of the base store other than "not found"
    propagate. Implements the v1.0 ``sharding_indexed`` binary format and the
    2022 draft's key rewriting rule (shard coords = chunk coords //
    chunks_per_shard).

    A store pickles (``multiprocessing``, ``dask.distributed``) as its base
    store's location and options; the copy finds the same locks. With
    unflushed write-back data it raises ``UnflushedWritesError`` instead.
    """

    _store_version = 2  # the zarr-python 2 store protocol this proxy speaks

    def __new__(cls, store: Any = None, *args: Any, layout: Layout | None = None, **kwargs: Any) -> Any:
        # the draft hierarchy proxy when layout="draft2022" or the store holds one (the same choice as open_store);
        # no store: unpickling (object.__reduce_ex__ calls __new__ with the class alone)
        if cls is ShardedStore and store is not None:
            draft = open_unless_v2(store, layout, args, kwargs)
            if draft is not None:
                return draft
        return super().__new__(cls)

    def __init__(
        self,
        store: Any,
        chunks_per_shard: ChunksPerShardOption = None,
        *,
        layout: Layout | None = None,  # the choice is made in __new__
        index_location: Literal["start", "end"] = "end",
        index_checksum: bool = True,
        storage_options: Mapping[str, Any] | None = None,
        index_cache_bytes: int = 64 * 2**20,
        validate_index_cache: bool = False,
        read_policy: ReadPolicy | None = None,
        buffer_bytes: int | None = None,
        write_strategy: WriteStrategy = "rewrite",
        slack_bytes: int = 0,
        journal: str | PathLike[str] | None = None,
        concurrency: Concurrency = "auto",
        lock_timeout: float | None = None,
    ) -> None:
        if layout not in (None, "v2"):
            raise ConfigurationError(f"{type(self).__name__} opens the 'v2' layout only, got layout={layout!r}")
        rule = ChunksPerShardRule.parse(chunks_per_shard)
        ShardLayout((1,), index_location, "little", index_checksum)  # validates the options
        # v3-only sharded arrays and groups (zarr.json, no .zarray) appear with derived v2 documents
        self._base: StoreAdapter = PresentingAdapter(adapt(store, storage_options))
        self._raw_store = store
        self._cps = rule.value  # shown by repr
        self._nodes = NodeCache(self._base)
        self._io = ShardIO(
            self._base,
            index_cache_bytes=index_cache_bytes,
            validate_index_cache=validate_index_cache,
            read_policy=read_policy or ReadPolicy(),
            write_strategy=write_strategy,
            slack_bytes=slack_bytes,
            concurrency=concurrency,
            lock_timeout=lock_timeout,
        )
        self._writer = ShardWriter(self._io, buffer_bytes)
        self._mirror = MetadataMirror(self._base, self._nodes, self._writer, rule, index_location, bool(index_checksum))
        _zarr2.register(type(self))
        self._sweeper = DirectorySweeper(self._base)  # stale temporaries, per directory written into
        self._writer.attach_journal(  # replays what a killed run left, if the journal is this store's
            journal, self._route, lambda: store_identity(self._base, "v2")
        )

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle as location and options (:mod:`shardkv.engine.picklable`); ``UnflushedWritesError`` if buffered."""
        return reduce_sharded_store(self)

    # -- configuration ------------------------------------------------------

    @property
    def base(self) -> StoreAdapter:
        """The adapter over the base store: what is stored (for tools; writes here bypass the proxy)."""
        return self._base.inner  # type: ignore[attr-defined,no-any-return]

    def refresh(self) -> None:
        """Forget cached array metadata and shard indexes (call after other writers changed the store).

        Buffered writes (write-back mode) are kept.
        """
        self._nodes.clear()
        self._io.index_cache.clear()

    @property
    def index_cache(self) -> IndexCache:
        """The shard index cache (``hits``, ``misses``, ``nbytes``, ``clear()``)."""
        return self._io.index_cache

    # -- routing ----------------------------------------------------------------

    def _route(self, key: str, validated: bool = False) -> ChunkRef | None:
        """The chunk of a sharded array that ``key`` names, or ``None`` for a key stored as it is.

        Raises
        ------
        InvalidKeyError, ChunkOutOfGridError
            For a malformed key, or a chunk key outside the array's grid.
        """
        if not validated:
            validate_key(key)
        arr = self._nodes.owner(key)
        return None if arr is None else arr.locate(key)

    # -- reads ----------------------------------------------------------------

    def getitems(self, keys: Sequence[str], *, contexts: Any = None) -> dict[str, bytes | memoryview]:
        """Values of the stored keys among ``keys`` (missing keys are left out).

        Chunks are read with one batched index read and one batched chunk read
        per call (ranged reads), or one batched shard read. Chunk values are
        read-only views into the bytes read (no copy).

        Raises
        ------
        InvalidKeyError, ChunkOutOfGridError
            For a malformed or out-of-grid chunk key.
        CorruptShardError, ChecksumError
            For a damaged shard.
        """
        keys = keys if isinstance(keys, list) else list(keys)
        refs = route_batch(self._nodes.owner, keys)
        out: dict[str, bytes | memoryview] = {}
        if refs is None:
            plain: list[str] = []
            refs = []
            for key in keys:
                ref = self._route(key)
                if ref is not None:
                    refs.append(ref)
                elif not self._nodes.is_hidden(key):
                    plain.append(key)
            if plain:
                out.update(self._base.get_many(plain))
        return self._read_chunks(refs, out)

    def _read_chunks(self, refs: list[ChunkRef], out: dict[str, Any]) -> dict[str, Any]:
        """Add the stored chunks among ``refs`` to ``out``: buffered ones (write-back mode), then one batched read."""
        if self._writer.buffer is not None:
            unbuffered = []
            for ref in refs:
                buffered, value = self._writer.lookup(ref.shard_key, ref.local_coords)
                if not buffered:
                    unbuffered.append(ref)
                elif value is not None:
                    out[ref.chunk_key] = value
            refs = unbuffered
        if refs:
            out.update(self._io.read_chunks(refs))
        return out

    def __getitem__(self, key: str) -> bytes | memoryview:
        ref = self._route(key)
        if ref is None:
            if self._nodes.is_hidden(key):
                raise KeyError(key)
            return self._base.get(key)
        found = self._read_chunks([ref], {})
        if key not in found:
            raise KeyError(key)
        return found[key]

    def __contains__(self, key: object) -> bool:
        try:
            ref = self._route(key)  # type: ignore[arg-type]
        except (TypeError, InvalidKeyError):
            return False
        if ref is None:
            return not self._nodes.is_hidden(key) and self._base.contains(key)  # type: ignore[arg-type]
        return self._chunk_stored(ref)

    def _chunk_stored(self, ref: ChunkRef, *, fresh: bool = False) -> bool:
        """True when the chunk is stored (or buffered); ``fresh``: its shard's index read from the store."""
        buffered, value = self._writer.lookup(ref.shard_key, ref.local_coords)
        if buffered:
            return value is not None
        indexes, _ = self._io.read_indexes({ref.shard_key: ref.array}, fresh=fresh)
        index = indexes.get(ref.shard_key)
        return index is not None and index.get(ref.local_coords) is not None

    # -- writes -------------------------------------------------------------------

    def __setitem__(self, key: str, value: Any) -> None:
        self.setitems({key: value})

    def setitems(self, values: Mapping[str, Any]) -> None:
        """Store several values; chunks of one shard are written with one shard write.

        A shard whose every in-grid chunk is in ``values`` is built without
        reading the old one; a partly covered shard is merged with what is
        stored (read-modify-write). Values are not copied (``bytes`` are
        kept as they are, other bytes-like values as views).

        Raises
        ------
        TypeError
            If a value is not bytes-like (names the key).
        InvalidKeyError, ChunkOutOfGridError, ReservedKeyError
            If a key is malformed, out of the grid or managed by shardkv.
        """
        keys = list(values)
        refs = route_batch(self._nodes.owner, keys)
        changes: dict[str, bytes | memoryview | None] = {}
        for key, value in values.items():
            if refs is None:
                validate_key(key)
            changes[key] = value if type(value) is bytes else as_buffer(key, value)
        if refs is None:
            self._apply(changes)
        else:
            self._sweeper.before_writing([ref.shard_key for ref in refs])
            self._writer.write(group_by_shard(refs, changes.values()))

    def __delitem__(self, key: str) -> None:
        try:
            ref = self._route(key)
        except ChunkOutOfGridError as exc:  # nothing can be stored outside the grid
            raise KeyError(key) from exc
        if ref is None:
            if split_key(key)[1] in META_NAMES:
                self._mirror.delete(key)  # a sharded array's .zarray takes its zarr.json along
            else:
                self._base.delete(key)
            return
        # a delete is a write: decided on the stored index, not on a cached one that another
        # process's write may have outdated (zarr deletes chunk by chunk with a synchronizer)
        if not self._chunk_stored(ref, fresh=True):
            raise KeyError(key)
        self._writer.write(group_by_shard([ref], [None]))

    def delitems(self, keys: Iterable[str]) -> None:
        """Delete the stored keys among ``keys`` (missing and out-of-grid chunk keys are ignored)."""
        keys = list(keys)
        refs = route_batch(self._nodes.owner, keys)
        if refs is not None:
            self._writer.write(group_by_shard(refs, itertools.repeat(None)))
            return
        changes: dict[str, None] = {}
        for key in keys:
            try:
                self._route(key)
            except ChunkOutOfGridError:
                continue
            changes[key] = None
        self._apply(changes)

    def _apply(self, changes: Mapping[str, bytes | memoryview | None]) -> None:
        """Write ``changes`` (``None``: delete), routing key by key."""
        plain_set: dict[str, bytes | memoryview] = {}
        plain_del: list[str] = []
        located: list[ChunkRef] = []
        located_values: list[bytes | memoryview | None] = []
        for key, value in changes.items():
            if split_key(key)[1] in META_NAMES:
                if value is None:
                    with suppress(KeyError):  # deleting what is not stored is no error in a batch
                        self._mirror.delete(key)
                else:
                    self._mirror.set(key, bytes(value))
                continue
            ref = self._route(key, validated=True)
            if ref is not None:
                located.append(ref)
                located_values.append(value)
            elif value is None:
                plain_del.append(key)
            else:
                plain_set[key] = value
        self._sweeper.before_writing([*changes, *(ref.shard_key for ref in located)])
        if plain_set:
            self._base.set_many(plain_set)
        if plain_del:
            self._base.delete_many(plain_del)
        self._writer.write(group_by_shard(located, located_values))

    def flush(self) -> None:
        """Write every buffered shard to the base store (write-back mode; a no-op otherwise)."""
        self._writer.flush()

    # -- zarr-python 2 store protocol ----------------------------------------------

    @property
    def _metadata_class(self) -> Any:
        from zarr.meta import Metadata2  # only zarr-python 2 asks for it

        return Metadata2

    def close(self) -> None:
        """Write buffered shards (write-back mode), close the journal, then the base store if it has a ``close``."""
        self.flush()
        self._writer.close()
        self._base.close()

    # -- introspection ------------------------------------------------------------

    def sharded_array(self, path: str) -> ShardedArray | None:
        """The key mapping of the sharded array at ``path``, or ``None``."""
        node = self._nodes.sharded(validate_path(path))
        return None if node is None else node.array

    def v3_metadata(self, path: str) -> dict[str, Any] | None:
        """The ``zarr.json`` document of the sharded array at ``path``, or ``None``."""
        node = self._nodes.sharded(validate_path(path))
        return None if node is None else dict(node.view)

