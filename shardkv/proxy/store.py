"""``ShardedStore``: the zarr-python 2 MutableMapping proxy that stores chunks in shards.

Routes each key: a chunk of a sharded array to its shard (write-back and the
shard engine), a metadata document to the node table or the metadata writer,
anything else to the base store; warns about chunk-by-chunk write-through.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, KeysView, Mapping, Sequence
from contextlib import suppress
from os import PathLike
from typing import Any, Self, Unpack

from shardkv.engine.cache import IndexCache
from shardkv.engine.engine import ShardEngine
from shardkv.engine.locks import Mode
from shardkv.engine.merge import ShardChange, group_by_shard
from shardkv.engine.options import OptionKeywords, Options
from shardkv.engine.writeback import WriteBack
from shardkv.errors import ChunkOutOfGridError, InvalidKeyError, KeyBelowKeyError, UnflushedWritesError
from shardkv.keys.paths import chunkish_under, join_path, path_prefix, split_key, validate_key, validate_path
from shardkv.keys.space import ChunkRef, ShardedArray
from shardkv.metadata.chunks_per_shard import ChunksPerShardOption
from shardkv.metadata.documents import META_NAMES
from shardkv.proxy.base import ProxyBase, as_buffer, refuse_zarr3
from shardkv.proxy.listing import (
    ListedKeys,
    base_listing,
    child_names,
    count_logical_keys,
    logical_keys,
)
from shardkv.proxy.metadata_writes import MetadataWriter
from shardkv.proxy.nodes import NodeTable
from shardkv.storage.identity import store_identity
from shardkv.storage.kv import ANY, KVStore
from shardkv.storage.local import LocalStore
from shardkv.storage.mapping import MappingStore
from shardkv.storage.open import open_kv

ROUTE_MEMO_LIMIT = 16_384
"""Keys whose route one store remembers (a few MiB) before its memo starts over (see ``ShardedStore._route``)."""


BATCH_MIN_KEYS = 8
"""Fewer keys are routed one by one (the batch path's fixed cost is a few microseconds)."""

DEFAULT_THRESHOLD = 16
"""Partial-shard rewrites of one array before :class:`PartialShardWriteWarning` (a 4 x 4 shard chunk by chunk)."""


def route_batch(owner: Callable[[str], ShardedArray | None], keys: Sequence[str]) -> list[ChunkRef] | None:
    """The chunks ``keys`` name when all are in-grid chunk keys of one sharded array, else ``None``.

    Parameters
    ----------
    owner : callable
        The sharded array that owns a (valid) key, or ``None``
        (:meth:`NodeTable.owner <shardkv.proxy.nodes.NodeTable.owner>`).
    keys : sequence of str
        The keys of one call.

    Notes
    -----
    The first key is validated and its owner looked up as for one key; the
    others are checked and located together by
    :meth:`~shardkv.keys.space.ShardedArray.locate_batch`: a key made of the
    owner's prefix and canonical chunk coords is a valid key with the same
    owner. ``None`` (nothing raised) sends the caller to key-by-key routing,
    which raises the error of the first bad key.
    """
    if len(keys) < BATCH_MIN_KEYS:
        return None
    first = keys[0]
    try:
        validate_key(first)
    except (TypeError, InvalidKeyError):
        return None
    arr = owner(first)
    return None if arr is None else arr.locate_batch(keys)


class PartialShardWriteWarning(UserWarning):
    """Many write calls each rewrote a partly covered shard of one array (write-through; user guide, "Chunk-by-chunk").

    Attributes
    ----------
    path : str
        The array's path in the store ('' for a root array).
    rewrites : int
        Partial-shard rewrites counted when the warning was given.
    """

    def __init__(self, message: str, path: str, rewrites: int) -> None:
        super().__init__(message)
        self.path = path
        self.rewrites = rewrites


class WriteAdvisor:
    """Counts the write-through calls that rewrote a partly covered shard whole, per array; warns once per store.

    Shards that ``rewrites_whole(shard_key, array)`` says are updated in
    O(chunk) (``shard_updates``) are not counted.
    """

    def __init__(self, rewrites_whole: Callable[[str, ShardedArray], bool]) -> None:
        self._rewrites_whole = rewrites_whole
        self._counts: dict[str, int] = {}
        self._warned = False
        self._lock = threading.Lock()

    def observe(self, changes: Mapping[str, ShardChange]) -> None:
        """Count the shards of one write-through call that it covers only partly; warn at :data:`DEFAULT_THRESHOLD`."""
        if self._warned:
            return
        for shard_key, change in changes.items():
            if change.covers_shard() or not self._rewrites_whole(shard_key, change.array):
                continue
            path = change.array.path
            with self._lock:
                if self._warned:
                    return
                count = self._counts[path] = self._counts.get(path, 0) + 1
                if count < DEFAULT_THRESHOLD:
                    continue
                self._warned = True
            _warn_outside_libraries(PartialShardWriteWarning(_advice(change.array, count), path, count))
            return

    def rewrites(self, path: str) -> int:
        """Partial-shard rewrites counted so far for the array at ``path`` (counting stops after the warning)."""
        return self._counts.get(path, 0)


def _warn_outside_libraries(warning: PartialShardWriteWarning) -> None:
    """Warn at the first caller outside shardkv and zarr (Python >= 3.12), else at a shardkv line."""
    if sys.version_info >= (3, 12):
        dirs = tuple(
            os.path.dirname(os.path.abspath(path)) + os.sep
            for m in (sys.modules.get("shardkv"), sys.modules.get("zarr"))
            if m is not None and (path := getattr(m, "__file__", None))
        )
        warnings.warn(warning, skip_file_prefixes=dirs)
    else:
        warnings.warn(warning, stacklevel=3)


def _advice(arr: ShardedArray, count: int) -> str:
    name = repr(arr.path) if arr.path else "the root array"
    cps = "x".join(map(str, arr.chunks_per_shard))
    variable = repr(arr.path.rpartition("/")[2]) if arr.path else "name"
    shape = tuple(arr.shard_shape) if arr.shard_shape is not None else "shard_shape"
    return (
        f"shardkv: {count} writes to {name} each rewrote a partly covered {cps}-chunk shard. Write whole shards: "
        "ShardedStore(..., buffer_bytes=N) then close(); dask: shardkv.rechunk_to_shards(x, target); "
        f"xarray: ds.chunk(dict(zip(ds[{variable}].dims, {shape}))). Shown once per store."
    )


class ShardedStore(ProxyBase):
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
    storage_options : mapping, optional
        fsspec options when ``store`` is a URL.
    journal : str or os.PathLike, optional
        With ``buffer_bytes``: a local file where every buffered chunk write
        is fsync'd before the call returns. Opening a store with the same
        ``journal`` replays and writes what a killed run left; a flush that
        empties the buffer resets it (user guide, "Write-back").
    options : Options, optional
        Every option at once (``chunks_per_shard`` and the keywords below
        then stay unset); what :attr:`options` of another store holds.
    **keywords
        The runtime options (``index_location``, ``index_checksum``,
        ``index_cache_bytes``, ``read_policy``, ``buffer_bytes``,
        ``concurrency``, ``lock_timeout``), each described in
        :class:`~shardkv.engine.options.Options`.

    Raises
    ------
    ConfigurationError
        If ``chunks_per_shard``, an index option, a size or ``concurrency``
        is invalid, ``concurrency`` asks for what the store cannot give,
        ``journal`` is given without ``buffer_bytes``, or ``options`` comes
        with other options; or if the installed zarr-python is 3 or later,
        which cannot use this store (the message names
        :class:`shardkv.zarr3.ShardedStore` and ``shardkv[zarr3]``).
    TypeError
        If ``store`` cannot be used as a store, or a keyword names no option.
    JournalCorruptError
        If an acknowledged record of ``journal`` is damaged or missing.
    JournalMismatchError
        If ``journal`` holds records of another store (or of an array since
        recreated with other chunks): nothing of it is replayed.
    LockTimeoutError
        If another process has ``journal`` open.

    Notes
    -----
    A value that is not bytes-like raises ``TypeError``; a malformed or
    out-of-grid chunk key :class:`InvalidKeyError` (deleting an out-of-grid
    chunk: ``KeyError``, which zarr relies on when shrinking); a damaged shard
    :class:`CorruptShardError` or :class:`ChecksumError`. Base store errors
    other than "not found" propagate. The store pickles as its base store's
    location and options (the copy writes through; ``UnflushedWritesError``
    with unflushed write-back data). Any layout: :func:`shardkv.open_store`.
    """

    _store_version = 2  # the zarr-python 2 store protocol this proxy speaks
    _zarr_protocol = "BaseStore"

    def __init__(
        self,
        store: Any,
        chunks_per_shard: ChunksPerShardOption = None,
        *,
        storage_options: Mapping[str, Any] | None = None,
        journal: str | PathLike[str] | None = None,
        options: Options | None = None,
        **keywords: Unpack[OptionKeywords],
    ) -> None:
        refuse_zarr3(
            "shardkv.ShardedStore",
            'use shardkv.zarr3.ShardedStore (pip install "shardkv[zarr3]"), or this store with zarr-python 2.18 '
            '(pip install "shardkv[zarr2]")',
        )
        options = Options.of(options, chunks_per_shard, keywords)
        self._setup(store, open_kv(store, storage_options), options)
        self._writer.attach_journal(  # replays what a killed run left, if the journal is this store's
            journal, self._route, lambda: store_identity(self._kv, "v2")
        )

    @classmethod
    def _reopen(cls, store: Any, options: Options) -> Self:
        """The proxy over ``store`` without the zarr version check or a journal (unpickled copies, the CLI)."""
        proxy = cls.__new__(cls)
        proxy._setup(store, open_kv(store), options)
        return proxy

    def _setup(self, raw_store: Any, kv: KVStore, options: Options) -> None:
        """Build the proxy's parts over the opened base store (the one place they are made)."""
        self._init_proxy(raw_store, options)
        self._kv = kv  # every request to the base store; pickles as the store's location
        self._nodes = NodeTable(self._kv.values)
        self._routes: tuple[int, dict[str, ChunkRef | None]] = (self._nodes.generation, {})  # see _route
        # zarr 2's MemoryStore/DirectoryStore rules (see _check_set), kept where zarr 2's own stores keep them
        self._rules_kept = isinstance(kv, (LocalStore, MappingStore))
        self._engine = ShardEngine(self._kv, options)
        # warns once per store about chunk-by-chunk rewrites (write-through), not where updates cost the chunks
        self._advisor = WriteAdvisor(self._engine.writes.rewrites_whole)
        self._writer = WriteBack(self._engine, options.buffer_bytes, self._advisor.observe)
        self._metadata = MetadataWriter(self._nodes, self._writer)

    def _pickled_store(self) -> Any:
        return self._kv

    def _check_picklable(self) -> None:
        buffer = self._writer.buffer
        if buffer is not None and len(buffer):
            raise UnflushedWritesError(len(buffer), buffer.nbytes)

    @property
    def base(self) -> KVStore:
        """The base store as a :class:`~shardkv.storage.kv.KVStore`: what is stored (writes here bypass the proxy)."""
        return self._kv

    def refresh(self) -> None:
        """Forget cached array metadata and shard indexes (after other writers changed the store)."""
        self._nodes.clear()
        self._engine.forget()

    @property
    def index_cache(self) -> IndexCache:
        """The shard index cache (``hits``, ``misses``, ``nbytes``, ``clear()``)."""
        return self._engine.cache

    @property
    def concurrency_mode(self) -> Mode:
        """The resolved ``concurrency`` mode: ``"files"``, ``"conditional"``, ``"process"`` or ``"none"``."""
        return self._engine.locks.mode

    @property
    def engine(self) -> ShardEngine:
        """The shard engine (``stats``: read rounds, refused reads, write rounds, lost races)."""
        return self._engine

    def _route(self, key: str) -> ChunkRef | None:
        """The chunk of a sharded array that ``key`` names, or ``None`` (memoised per node table generation).

        Raises
        ------
        InvalidKeyError, ChunkOutOfGridError
            For a malformed key, or a chunk key outside the array's grid.
        TypeError
            For a key that is not a ``str``.
        """
        generation = self._nodes.generation  # read before routing: a later change makes this memo stale
        kept, routes = self._routes
        if kept == generation and key in routes:
            return routes[key]
        validate_key(key)
        arr = self._nodes.owner(key)
        ref = None if arr is None else arr.locate(key)
        if kept != generation or len(routes) >= ROUTE_MEMO_LIMIT:
            routes = {}
            self._routes = (generation, routes)
        routes[key] = ref
        return ref

    # -- reads ----------------------------------------------------------------

    def getitems(self, keys: Sequence[str], *, contexts: Any = None) -> dict[str, bytes | memoryview]:
        """Values of the stored keys among ``keys`` (missing keys left out; chunks as read-only views, batched reads).

        Raises
        ------
        InvalidKeyError, ChunkOutOfGridError
            For a malformed or out-of-grid chunk key.
        CorruptShardError, ChecksumError
            For a damaged shard.
        """
        keys = keys if isinstance(keys, list) else list(keys)
        if len(keys) == 1:  # zarr reading one chunk: no batch to route, nothing to merge
            ref = self._route(keys[0])
            if ref is not None:
                found: dict[str, Any] = self._writer.read_chunks([ref])
                return found
        refs = route_batch(self._nodes.owner, keys)
        out: dict[str, Any] = {}
        if refs is None:
            routed = {key: self._route(key) for key in keys}
            refs = [ref for ref in routed.values() if ref is not None]
            plain = [key for key, ref in routed.items() if ref is None]
            if plain:
                out.update(self._read_plain(plain))
        out.update(self._writer.read_chunks(refs))
        return out

    def _read_plain(self, keys: list[str]) -> dict[str, Any]:
        """Values of the stored keys among ``keys`` that are no chunks (a local directory is a path: left out)."""
        try:
            return self._nodes.read_documents(keys)
        except IsADirectoryError:
            if len(keys) == 1:
                return {}
            out: dict[str, Any] = {}
            for key in keys:  # again one by one, to leave out only the directories
                out.update(self._read_plain([key]))
            return out

    def __getitem__(self, key: str) -> bytes | memoryview:
        """The value stored at ``key``: a chunk's bytes (a copy: a view keeps its shard alive), or a value.

        Raises
        ------
        KeyError
            If nothing is stored at ``key``.
        InvalidKeyError, ChunkOutOfGridError, CorruptShardError, ChecksumError
            As :meth:`getitems`.
        """
        ref = self._route(key)
        found: Mapping[str, Any] = self._read_plain([key]) if ref is None else self._writer.read_chunks([ref])
        if key not in found:
            raise KeyError(key)
        value = found[key]
        return value if ref is None or type(value) is bytes else bytes(as_buffer(key, value))

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        try:
            ref = self._route(key)
        except (TypeError, InvalidKeyError):
            return False
        if ref is None:
            known = self._nodes.contains_document(key)
            return self._kv.contains(key) if known is None else known
        return self._writer.has_chunk(ref)

    # -- writes -------------------------------------------------------------------

    def __setitem__(self, key: str, value: Any) -> None:
        self.setitems({key: value})

    def setitems(self, values: Mapping[str, Any]) -> None:
        """Store several values; chunks of one shard with one shard write (a partly covered shard is merged).

        Raises
        ------
        TypeError
            If a value is not bytes-like (names the key).
        InvalidKeyError, ChunkOutOfGridError, ReservedKeyError
            If a key is malformed, out of the grid or managed by shardkv.
        """
        refs = route_batch(self._nodes.owner, list(values)) if len(values) >= BATCH_MIN_KEYS else None
        if refs is not None:  # chunks of one array: values in the keys' order
            self._writer.write(
                group_by_shard(refs, [v if type(v) is bytes else as_buffer(k, v) for k, v in values.items()])
            )
            return
        routed: dict[str, ChunkRef | None] = {}
        changes: dict[str, bytes | memoryview | None] = {}
        for key, value in values.items():
            routed[key] = self._route(key)
            changes[key] = value if type(value) is bytes else as_buffer(key, value)
        refs = [ref for ref in routed.values() if ref is not None]
        if len(refs) == len(routed):  # chunks only (zarr writing a few chunks): straight to write-back
            self._writer.write(group_by_shard(refs, changes.values()))
        else:
            self._apply(changes, routed)

    def __delitem__(self, key: str) -> None:
        try:
            ref = self._route(key)
        except ChunkOutOfGridError as exc:  # nothing can be stored outside the grid
            raise KeyError(key) from exc
        if ref is None:
            if split_key(key)[1] in META_NAMES:
                self._metadata.delete(key)  # a sharded array's .zarray takes its zarr.json along
            elif self._kv.contains(key):
                self._kv.delete(key)
            elif self._deletes_subtree(key):  # a path: MemoryStore/DirectoryStore delete what it holds
                self.rmdir(key)
            else:
                raise KeyError(key)
            return
        # a delete is a write: decided on the current index (the engine confirms a cached one)
        if not self._writer.has_chunk(ref):
            raise KeyError(key)
        self._writer.write(group_by_shard([ref], [None]))
        self._after_chunk_deletes([ref])

    def delitems(self, keys: Iterable[str]) -> None:
        """Delete the stored keys among ``keys`` (missing and out-of-grid chunk keys are ignored)."""
        keys = list(keys)
        refs = route_batch(self._nodes.owner, keys)
        if refs is not None:
            self._writer.write(group_by_shard(refs, itertools.repeat(None)))
            self._after_chunk_deletes(refs)
            return
        routed: dict[str, ChunkRef | None] = {}
        for key in keys:
            with suppress(ChunkOutOfGridError):
                routed[key] = self._route(key)
        self._apply(dict.fromkeys(routed), routed)

    def _apply(self, changes: Mapping[str, bytes | memoryview | None], routed: Mapping[str, ChunkRef | None]) -> None:
        """Write ``changes`` (``None``: delete) of keys routed one by one (``routed``: each key's chunk or ``None``)."""
        stored = [key for key, value in changes.items() if value is not None and routed[key] is None]
        for path in self._check_set(stored) if stored else ():  # raises before anything is written
            self.rmdir(path)  # keys in the way of a value are replaced, as in zarr 2's own stores
        plain: dict[str, bytes | memoryview | None] = {}
        located: list[ChunkRef] = []
        located_values: list[bytes | memoryview | None] = []
        for key, value in changes.items():
            ref = routed[key]
            if ref is not None:
                located.append(ref)
                located_values.append(value)
            elif split_key(key)[1] not in META_NAMES:
                plain[key] = value
            elif value is None:
                with suppress(KeyError):  # deleting what is not stored is no error in a batch
                    self._metadata.delete(key)
            else:
                self._metadata.set(key, bytes(value))
        if plain:
            self._kv.put_many({key: (value, ANY) for key, value in plain.items()})
        self._writer.write(group_by_shard(located, located_values))
        if None in located_values:
            self._after_chunk_deletes([ref for ref, v in zip(located, located_values, strict=True) if v is None])

    # -- zarr 2's MemoryStore/DirectoryStore rules: a key is a value or a path holding keys, never both --------

    def _chunk_of_array(self, key: str) -> bool:
        """True when ``key`` is chunk-like under an array the node table knows (never checked: it costs requests)."""
        if split_key(key)[1] in META_NAMES:
            return False
        path = self._nodes.array_above(key)
        return path is not None and chunkish_under(path, key)

    def _has_keys_under(self, key: str) -> bool:
        """True when keys are stored under ``key/`` in the base store."""
        if isinstance(self._kv, LocalStore):  # one directory listing, not a walk (a file lists nothing)
            keys, dirs = self._kv.list_dir(path_prefix(key))
            return bool(keys or dirs)
        return next(iter(self._kv.list_prefix(path_prefix(key))), None) is not None

    def _check_set(self, keys: Iterable[str]) -> list[str]:
        """Check that ``keys`` may be stored; return those whose ``key/`` subtree they replace.

        ``KeyBelowKeyError`` if a key lies below a stored key (nothing has been written).
        """
        if not self._rules_kept:
            return []
        replaced: list[str] = []
        for key in keys:
            if self._chunk_of_array(key):
                continue
            parts = key.split("/")[:-1]
            for above in ("/".join(parts[:i]) for i in range(1, len(parts) + 1)):
                if self._kv.contains(above):
                    raise KeyBelowKeyError(key, above)
            if split_key(key)[1] not in META_NAMES and self._has_keys_under(key):
                replaced.append(key)
        return replaced

    def _deletes_subtree(self, key: str) -> bool:
        """True when deleting the missing key ``key`` means deleting the keys under it (a path)."""
        return self._rules_kept and not self._chunk_of_array(key) and self._has_keys_under(key)

    def _after_chunk_deletes(self, refs: Iterable[ChunkRef]) -> None:
        """Let arrays whose ``.zarray`` and ``.zattrs`` were deleted go with their last chunk."""
        for path in {ref.array.path for ref in refs}:
            node = self._nodes.node(path)
            if node.deleted and not node.documents:
                self._metadata.emptied(path)

    def flush(self) -> None:
        """Write every buffered shard to the base store (write-back mode; a no-op otherwise)."""
        self._writer.flush()

    @property
    def _metadata_class(self) -> Any:
        from zarr.meta import Metadata2  # only zarr-python 2 asks for it

        return Metadata2

    def close(self) -> None:
        """Write buffered shards (write-back mode), close the journal, then the base store if it has a ``close``."""
        self.flush()
        self._writer.close()
        self._kv.close()

    def sharded_array(self, path: str) -> ShardedArray | None:
        """The key mapping of the sharded array at ``path``, or ``None``."""
        node = self._nodes.sharded(validate_path(path))
        return None if node is None else node.array

    def v3_metadata(self, path: str) -> dict[str, Any] | None:
        """The ``zarr.json`` document of the sharded array at ``path``, or ``None``."""
        node = self._nodes.sharded(validate_path(path))
        return None if node is None or node.doc is None else dict(node.doc)

    # -- paths (each checked by validate_path first: nothing outside the store is reached) --------

    def compact(self, path: str | None = None) -> int:
        """Rewrite the shards of the array at ``path`` (all if ``None``) that hold unused bytes; the bytes reclaimed.

        Unused bytes: chunks replaced and indexes left by O(chunk) updates, or
        gaps; an interrupted append is finished or undone first.
        :class:`InvalidKeyError` if ``path`` leaves the store.
        """
        if path is not None:
            path = validate_path(path)
        if isinstance(self._kv, LocalStore):  # files a killed writer left, anywhere in the store
            self._kv.remove_stale_temporaries()
        self.flush()
        stored: dict[str, list[str]] = {}  # the shards that exist (a listing), never the grid: sparse grids are cheap
        for key in self._kv.list_prefix(path_prefix(path or "")):
            arr = self._nodes.owner(key)
            if arr is None:
                continue
            coords = arr.shard_coords_of(key)
            grid = arr.shard_grid_shape
            if coords is not None and (grid is None or all(c < n for c, n in zip(coords, grid, strict=True))):
                stored.setdefault(arr.path, []).append(key)
        wanted = sorted(stored) if path is None else [path]
        arrays = {p: arr for p in wanted if (arr := self.sharded_array(p)) is not None}
        return sum(self._engine.writes.compact(arr, sorted(stored.get(p, []))) for p, arr in arrays.items())

    def __iter__(self) -> Iterator[str]:
        """Every key, listed when ``iter`` is called (one enumeration; later writes do not change it)."""
        self.flush()
        return iter(list(logical_keys(self._nodes, self._engine, base_listing(self._kv, self._engine, ""))))

    def keys(self) -> KeysView[str]:
        """The keys, listed once (iteration and ``len`` share one enumeration of the base store; ``in`` is current)."""
        return ListedKeys(self, self)

    def __len__(self) -> int:
        """How many keys are stored now: one enumeration of the base store, no chunk key built."""
        self.flush()
        return count_logical_keys(self._nodes, self._engine, base_listing(self._kv, self._engine, ""))

    def keys_under(self, path: str) -> Iterator[str]:
        """Every logical key under ``path`` (a path, or ``""`` for all); ``InvalidKeyError`` if it leaves the store."""
        path = validate_path(path)
        self.flush()
        return logical_keys(self._nodes, self._engine, base_listing(self._kv, self._engine, path_prefix(path)))

    def listdir(self, path: str = "") -> list[str]:
        """Names of the immediate children of ``path``, as code above the proxy sees them."""
        path = validate_path(path)
        inside = self._nodes.owner(join_path(path, "0")) if path else None
        if inside is None and self._nodes.sharded(path) is None:
            keys, dirs = self._kv.list_dir(path_prefix(path))  # a stored value has no children
            return self._nodes.listed_names(path, sorted({*keys, *dirs}))
        self.flush()
        prefix = path_prefix(path)
        # inside a '/'-separated array the shards holding chunks under ``path`` may lie elsewhere under the array
        listed = inside.key_prefix if inside is not None and inside.path != path else prefix
        return child_names(self._nodes, self._engine, prefix, base_listing(self._kv, self._engine, listed))

    def clear(self) -> None:
        """Delete every key stored, as :meth:`rmdir` of the root (one delete per stored key)."""
        self.rmdir("")

    def rmdir(self, path: str = "") -> None:
        """Delete everything under ``path`` (all for ``""``); a value at ``path`` stays, as in zarr 2."""
        path = validate_path(path)
        arr = self._nodes.owner(join_path(path, "0")) if path else None
        if arr is not None and arr.path != path:
            self.delitems(list(self.keys_under(path)))  # a sub-path of a '/'-separated array
            return
        if path and arr is None and self._kv.contains(path):  # a value: only keys below it go
            keys = list(self._kv.list_prefix(path_prefix(path)))
            if keys:
                self._kv.put_many({key: (None, ANY) for key in keys})
            return
        self._writer.discard_under(path)
        self._kv.delete_prefix(path_prefix(path))
        self._engine.forget()
        self._nodes.forget_under(path)
        self._metadata.removed(path)  # consolidated blocks above it no longer list it

    def getsize(self, path: str = "") -> int:
        """Size in bytes of the key ``path``, or of the keys directly under it, as zarr 2's ``DirectoryStore`` says.

        A chunk's size is its stored bytes (from its index entry), a metadata
        document's the bytes served; 0 for what is not stored. Shard sizes:
        ``store.base.size(shard_key)``.
        """
        path = validate_path(path)
        self.flush()
        if path:
            own = self._sizes([path])
            if path in own:
                return own[path]
        return sum(self._sizes([join_path(path, name) for name in self.listdir(path)]).values())

    def _sizes(self, keys: Sequence[str]) -> dict[str, int]:
        """Sizes in bytes of the stored keys among ``keys`` (paths and missing keys are left out)."""
        refs: list[ChunkRef] = []
        out: dict[str, int] = {}
        for key in keys:
            arr = self._nodes.owner(key)  # a listed name taken as it is: not validated, not memoised
            try:
                ref = None if arr is None else arr.locate(key)
            except InvalidKeyError:  # not a chunk of its array (out of grid, a sub-path): nothing stored
                continue
            if ref is not None:
                refs.append(ref)
                continue
            known = self._nodes.contains_document(key)  # presented documents: the size served
            if known:
                out[key] = len(self._nodes.read_documents([key])[key])
            elif known is None and (size := self._kv.size(key)) is not None:
                out[key] = size
        for ref, size in zip(refs, self._writer.chunk_sizes(refs), strict=True):
            if size is not None:
                out[ref.chunk_key] = size
        return out

    def rename(self, src_path: str, dst_path: str) -> None:
        """Move everything under ``src_path`` to ``dst_path`` (copies, then deletes: not atomic)."""
        src, dst = validate_path(src_path, what="src_path"), validate_path(dst_path, what="dst_path")
        self.flush()
        stored = self._kv  # what is stored: v3 documents move as they are, presented ones are not written
        keys = list(stored.list_prefix(path_prefix(src)))
        values = stored.values(keys)
        stored.put_many({dst + k[len(src) :]: (v, ANY) for k, v in values.items()})
        stored.put_many({k: (None, ANY) for k in keys})
        if src and keys:
            stored.prune_empty_dirs(path_prefix(src))  # the emptied directories too (local files), as zarr 2's rename
        self.refresh()
