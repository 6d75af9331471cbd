"""``ShardedStore``: the MutableMapping proxy that stores chunks in shards.

Code above the proxy (zarr-python 2, xarray, dask, scripts) reads and writes
ordinary chunk keys (``temp/3.7``); the store below holds shards (``temp/0.1``)
in the v1.0 ``sharding_indexed`` layout, each array's sharding described by a
``zarr.json`` beside its ``.zarray`` (see :mod:`shardkv.metadata.v3_view`).

This module maps keys (which array owns a key, which shard holds a chunk),
handles metadata (new arrays, resize, attributes) and the write-back buffer;
the requests themselves are planned by :class:`shardkv.engine.planner.ShardIO`
(one batched index read and one batched chunk read per call; one batched
write per call; a shard is built in one ``b"".join``, linear time).

Concurrency: writers of one shard in one process are serialised by a lock per
shard key, so no acknowledged write is lost to a concurrent read-modify-write.
Several processes writing the same shard need the same care as zarr itself
(a synchronizer, or shard-aligned work).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import MutableMapping
from typing import Any, Iterable, Iterator, Literal, Mapping, Sequence

import numpy as np

from shardkv.engine.cache import IndexCache
from shardkv.engine.planner import ShardIO
from shardkv.engine.strategies import WriteStrategy
from shardkv.engine.writeback import PendingShard, WriteBuffer
from shardkv.errors import ConfigurationError, InvalidKeyError, ReservedKeyError
from shardkv.format.layout import ShardLayout
from shardkv.format.ranges import ReadPolicy
from shardkv.keys.encodings import V2ChunkKeyEncoding, validate_key
from shardkv.keys.space import ChunkRef, ShardedArray
from shardkv.metadata.v2_view import PresentingAdapter
from shardkv.metadata.v3_view import (
    normalize_chunks_per_shard,
    sharding_spec_from_v3,
    v2_dimension_separator,
    v3_view_of_v2,
)
from shardkv.proxy import _zarr2
from shardkv.storage.adapters import StoreAdapter, adapt

__all__ = ["ShardedStore"]

ChunksPerShard = int | Sequence[int] | Mapping[str, int | Sequence[int]] | None
# chunk-like key segments; signs included so "-1.0" is refused as a malformed chunk key, not stored
_CHUNKISH = re.compile(r"c|c?[0-9.+-]+")  # "c" alone: v3 default shard keys c/1/2
_META_NAMES = frozenset({".zarray", ".zgroup", ".zattrs", ".zmetadata", "zarr.json"})
_NOT_ARRAY = "not an array"
_UNSHARDED = "unsharded array"


def _parent(key: str) -> tuple[str, str]:
    path, _, name = key.rpartition("/")
    return path, name


def _join(path: str, name: str) -> str:
    return f"{path}/{name}" if path else name


def _as_buffer(key: str, value: Any) -> memoryview:
    """A contiguous byte view of a chunk value, or ``TypeError`` naming the key."""
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            raise TypeError(f"value for key {key!r} is an object array, not bytes-like")
        if not (value.flags.c_contiguous or value.flags.f_contiguous):
            value = np.ascontiguousarray(value)
        # F-contiguous arrays are taken in memory order, as zarr's own stores do
        return memoryview(value.reshape(-1, order="A").view(np.uint8))
    try:
        return memoryview(value).cast("B")
    except TypeError:
        raise TypeError(
            f"value for key {key!r} must be bytes-like (bytes, bytearray, memoryview, numpy array), "
            f"got {type(value).__name__}"
        ) from None


class ShardedStore(_zarr2.StoreCapabilities, MutableMapping):
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
    index_location : {"end", "start"}
        Where new shards keep their index (v1.0 codec ``index_location``).
    index_checksum : bool
        Whether new shards protect their index with a CRC32C (``crc32c`` index codec).
    storage_options : mapping, optional
        fsspec options when ``store`` is a URL.
    index_cache_bytes : int
        Limit (bytes) of the cache of decoded shard indexes (default 64 MiB;
        0 disables it). With the index cached, reading a chunk costs one
        request. The proxy keeps the cache right across its own writes;
        for data changed by other writers call :meth:`refresh`, or set
        ``validate_index_cache``.
    validate_index_cache : bool
        Check a cached index against the shard's size and modification time
        before using it, where the base store gives them without a request
        (local files); elsewhere the cache is trusted until :meth:`refresh`.
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
        ``with``) before other readers look.
    write_strategy : {"rewrite", "append", "inplace"}
        How a stored shard is updated when a write does not replace it whole.
        ``"rewrite"`` (default, atomic) writes a new shard through a temporary
        object. On local files, ``"append"`` appends new chunks and a new index
        and ``"inplace"`` also reuses a chunk's slot when the new encoding fits;
        both cost I/O proportional to the change but are not crash-atomic (see
        :mod:`shardkv.engine.strategies`); :meth:`compact` reclaims the unused bytes.
        Elsewhere they fall back to ``"rewrite"``. Never stored in metadata.
    slack_bytes : int
        With ``"inplace"``: zero bytes reserved after every chunk written
        (bytes), so a slightly larger new encoding still fits its slot.

    Raises
    ------
    ConfigurationError
        If ``chunks_per_shard`` or an index option is invalid.
    TypeError
        If ``store`` cannot be used as a store.

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
    """

    _store_version = 2  # the zarr-python 2 store protocol this proxy speaks

    def __new__(cls, store: Any = None, *args: Any, layout: Literal["draft2022"] | None = None, **kwargs: Any) -> Any:
        # 2022 draft mode (shardkv.proxy.draft) when layout="draft2022" or the store holds a draft hierarchy
        if cls is ShardedStore:
            from shardkv.proxy.draft import open_draft_if_wanted

            draft = open_draft_if_wanted(store, layout, *args, **kwargs)
            if draft is not None:
                return draft
        return super().__new__(cls)

    def __init__(
        self,
        store: Any,
        chunks_per_shard: ChunksPerShard = None,
        *,
        layout: Literal["draft2022"] | None = None,  # see __new__ (shardkv.proxy.draft)
        index_location: Literal["start", "end"] = "end",
        index_checksum: bool = True,
        storage_options: Mapping[str, Any] | None = None,
        index_cache_bytes: int = 64 * 2**20,
        validate_index_cache: bool = False,
        read_policy: ReadPolicy | None = None,
        buffer_bytes: int | None = None,
        write_strategy: WriteStrategy = "rewrite",
        slack_bytes: int = 0,
    ) -> None:
        # v3-only sharded arrays and groups (zarr.json, no .zarray) appear with derived v2 documents
        self._base: StoreAdapter = PresentingAdapter(adapt(store, storage_options))
        self._raw_store = store
        if isinstance(chunks_per_shard, Mapping):
            self._cps: Any = {str(k).strip("/"): v for k, v in chunks_per_shard.items()}
        elif chunks_per_shard is None or isinstance(chunks_per_shard, (int, np.integer)):
            self._cps = chunks_per_shard
        else:
            self._cps = tuple(chunks_per_shard)
        ShardLayout((1,), index_location, "little", index_checksum)  # validates the options
        self._index_location = index_location
        self._index_checksum = bool(index_checksum)
        self._states: dict[str, Any] = {}
        self._owner_memo: dict[str, ShardedArray | None] = {}
        self._views: dict[str, dict[str, Any]] = {}
        self._lock = threading.RLock()
        self._io = ShardIO(
            self._base,
            index_cache_bytes=index_cache_bytes,
            validate_index_cache=validate_index_cache,
            read_policy=read_policy or ReadPolicy(),
            write_strategy=write_strategy,
            slack_bytes=slack_bytes,
        )
        self._buffer = None if buffer_bytes is None else WriteBuffer(buffer_bytes)
        _zarr2.register(type(self))

    # -- configuration ------------------------------------------------------

    @property
    def base(self) -> StoreAdapter:
        """The adapter over the base store (for tools; writes here bypass the proxy)."""
        return self._base

    def _chunks_per_shard_for(self, path: str, ndim: int) -> tuple[int, ...] | None:
        cps = self._cps
        if isinstance(cps, dict):
            if path not in cps:
                return None
            return normalize_chunks_per_shard(cps[path], ndim, path)
        if cps is None or ndim == 0:
            return None
        if isinstance(cps, tuple) and len(cps) != ndim:
            return None
        return normalize_chunks_per_shard(cps, ndim, path)

    def refresh(self) -> None:
        """Forget cached array metadata and shard indexes (call after other writers changed the store).

        Buffered writes (write-back mode) are kept.
        """
        with self._lock:
            self._states.clear()
            self._views.clear()
            self._owner_memo.clear()
        self._io.index_cache.clear()

    @property
    def index_cache(self) -> IndexCache:
        """The shard index cache (``hits``, ``misses``, ``nbytes``, ``clear()``)."""
        return self._io.index_cache

    # -- array discovery ----------------------------------------------------

    def _state(self, path: str) -> Any:
        """``ShardedArray``, ``_UNSHARDED`` or ``_NOT_ARRAY`` for an array path (cached)."""
        with self._lock:
            if path in self._states:
                return self._states[path]
        zarray_key, zjson_key = _join(path, ".zarray"), _join(path, "zarr.json")
        found = self._base.get_many([zarray_key, zjson_key])
        state: Any = _NOT_ARRAY
        if zarray_key in found:
            zarray = json.loads(bytes(found[zarray_key]))
            state = _UNSHARDED
            if zjson_key in found:
                view = json.loads(bytes(found[zjson_key]))
                state = self._sharded_from_view(path, zarray, view)
                with self._lock:
                    self._views[path] = view
        with self._lock:
            self._states[path] = state
        return state

    def _sharded_from_view(self, path: str, zarray: Mapping[str, Any], view: Mapping[str, Any]) -> Any:
        spec = sharding_spec_from_v3(view, path)
        if spec is None:
            return _UNSHARDED
        if list(spec.chunks) != list(zarray["chunks"]):
            raise ConfigurationError(
                f"zarr.json inner chunk_shape {list(spec.chunks)} differs from .zarray chunks {zarray['chunks']}", path
            )
        sep = v2_dimension_separator(zarray)
        return ShardedArray(
            path=path,
            key_prefix=f"{path}/" if path else "",
            shape=tuple(int(s) for s in zarray["shape"]),
            chunks=spec.chunks,
            layout=spec.layout,
            chunk_key_encoding=V2ChunkKeyEncoding(sep),  # type: ignore[arg-type]
            shard_key_encoding=spec.shard_key_encoding,
        )

    def _owner(self, key: str) -> ShardedArray | None:
        """The sharded array whose chunk (or shard) ``key`` names, if any.

        Walks the key's prefixes from the root; the first array met owns the
        key (arrays have no children). Only prefixes followed by chunk-like
        segments are candidates.
        """
        parent, _, name = key.rpartition("/")
        if name in _META_NAMES or not _CHUNKISH.fullmatch(name):
            return None  # the last segment of a chunk or shard key is always chunk-like
        memo = self._owner_memo.get(parent, _NOT_ARRAY)
        if memo is not _NOT_ARRAY:
            return memo
        owner = self._owner_of_parent(parent)
        with self._lock:
            if len(self._owner_memo) > 100_000:
                self._owner_memo.clear()
            self._owner_memo[parent] = owner
        return owner

    def _owner_of_parent(self, parent: str) -> ShardedArray | None:
        """:meth:`_owner` for every key ``parent/<chunk-like name>`` (memoised by the caller)."""
        segments = (parent.split("/") if parent else []) + ["0"]
        first_chunkish = len(segments) - 1
        while first_chunkish > 0 and _CHUNKISH.fullmatch(segments[first_chunkish - 1]):
            first_chunkish -= 1
        for i in range(0, len(segments)):
            path = "/".join(segments[:i])
            state = self._state(path)
            if state is _NOT_ARRAY:
                continue
            if state is _UNSHARDED or i < first_chunkish:
                return None
            return state
        return None

    def _set_state(self, path: str, state: Any) -> None:
        """Record what ``path`` is (called with ``self._lock`` held); owners may change."""
        self._states[path] = state
        self._owner_memo.clear()

    def _forget_state(self, path: str) -> None:
        """Forget what ``path`` is (called with ``self._lock`` held)."""
        self._states.pop(path, None)
        self._views.pop(path, None)
        self._owner_memo.clear()

    def _route(self, key: str, validated: bool = False) -> ChunkRef | None:
        if not validated:
            validate_key(key)
        arr = self._owner(key)
        return None if arr is None else arr.locate(key)

    def _is_hidden(self, key: str) -> bool:
        """True for the ``zarr.json`` that shardkv manages beside a sharded array's ``.zarray``."""
        path, name = _parent(key)
        return name == "zarr.json" and isinstance(self._state(path), ShardedArray)

    # -- reads ----------------------------------------------------------------

    def getitems(self, keys: Sequence[str], *, contexts: Any = None) -> dict[str, bytes]:
        """Values of the stored keys among ``keys`` (missing keys are left out).

        Chunks are read with one batched index read and one batched chunk read
        per call (ranged reads), or one batched shard read.

        Raises
        ------
        InvalidKeyError, ChunkOutOfGridError
            For a malformed or out-of-grid chunk key.
        CorruptShardError, ChecksumError
            For a damaged shard.
        """
        plain: list[str] = []
        refs: list[ChunkRef] = []
        out: dict[str, bytes] = {}
        for key in keys:
            ref = self._route(key)
            if ref is None:
                if not self._is_hidden(key):
                    plain.append(key)
                continue
            if self._buffer is not None:
                with self._buffer.lock:
                    buffered, value = self._buffer.lookup(ref.shard_key, ref.local_coords)
                if buffered:
                    if value is not None:
                        out[key] = value
                    continue
            refs.append(ref)
        if plain:
            out.update(self._base.get_many(plain))
        out.update(self._io.read_chunks(refs))
        return out

    def __getitem__(self, key: str) -> bytes:
        ref = self._route(key)
        if ref is None:
            if self._is_hidden(key):
                raise KeyError(key)
            return self._base.get(key)
        found = self.getitems([key])
        if key not in found:
            raise KeyError(key)
        return found[key]

    def __contains__(self, key: object) -> bool:
        try:
            ref = self._route(key)  # type: ignore[arg-type]
        except (TypeError, InvalidKeyError):
            return False
        if ref is None:
            return not self._is_hidden(key) and self._base.contains(key)  # type: ignore[arg-type]
        if self._buffer is not None:
            with self._buffer.lock:
                buffered, value = self._buffer.lookup(ref.shard_key, ref.local_coords)
            if buffered:
                return value is not None
        indexes, _ = self._io.read_indexes({ref.shard_key: ref.array})
        index = indexes.get(ref.shard_key)
        return index is not None and index.get(ref.local_coords) is not None

    # -- writes -------------------------------------------------------------------

    def __setitem__(self, key: str, value: Any) -> None:
        self.setitems({key: value})

    def setitems(self, values: Mapping[str, Any]) -> None:
        """Store several values; chunks of one shard are written with one shard write.

        A shard whose every in-grid chunk is in ``values`` is built without
        reading the old one; a partly covered shard is merged with what is
        stored (read-modify-write).

        Raises
        ------
        TypeError
            If a value is not bytes-like (names the key).
        InvalidKeyError, ChunkOutOfGridError, ReservedKeyError
            If a key is malformed, out of the grid or managed by shardkv.
        """
        changes: dict[str, memoryview | None] = {}
        for key, value in values.items():
            validate_key(key)
            changes[key] = _as_buffer(key, value)
        self._apply(changes)

    def __delitem__(self, key: str) -> None:
        validate_key(key)
        try:
            ref = self._route(key)
        except InvalidKeyError as exc:
            if hasattr(exc, "grid_shape"):  # nothing can be stored outside the grid
                raise KeyError(key) from exc
            raise
        if ref is None:
            if self._is_hidden(key):
                raise ReservedKeyError(key, "the zarr.json of a sharded array is managed by shardkv")
            self._delete_metadata_side_effects(key)
            self._base.delete(key)
            return
        if key not in self:
            raise KeyError(key)
        self._apply({key: None})

    def delitems(self, keys: Iterable[str]) -> None:
        """Delete the stored keys among ``keys`` (missing and out-of-grid chunk keys are ignored)."""
        changes: dict[str, None] = {}
        for key in keys:
            validate_key(key)
            try:
                self._route(key)
            except InvalidKeyError as exc:
                if hasattr(exc, "grid_shape"):
                    continue
                raise
            changes[key] = None
        self._apply(changes)

    def _apply(self, changes: Mapping[str, memoryview | None]) -> None:
        plain_set: dict[str, memoryview] = {}
        plain_del: list[str] = []
        by_shard: dict[str, tuple[ShardedArray, tuple[int, ...], dict[tuple[int, ...], memoryview | None]]] = {}
        for key, value in changes.items():
            if _parent(key)[1] in _META_NAMES:
                if value is None:
                    self._delete_metadata_side_effects(key)
                    plain_del.append(key)
                else:
                    self._set_metadata(key, value)
                continue
            ref = self._route(key, validated=True)
            if ref is None:
                if value is None:
                    plain_del.append(key)
                else:
                    plain_set[key] = value
                continue
            entry = by_shard.setdefault(ref.shard_key, (ref.array, ref.shard_coords, {}))
            entry[2][ref.local_coords] = value
        if plain_set:
            self._base.set_many(plain_set)  # type: ignore[arg-type]
        if plain_del:
            self._base.delete_many(plain_del)
        if by_shard and self._buffer is not None:
            self._buffer_shards(by_shard)
        elif by_shard:
            self._io.write_shards(by_shard)

    def _buffer_shards(
        self,
        by_shard: Mapping[str, tuple[ShardedArray, tuple[int, ...], dict[tuple[int, ...], memoryview | None]]],
    ) -> None:
        buf = self._buffer
        with buf.lock:  # type: ignore[union-attr]
            for shard_key, (arr, coords, updates) in by_shard.items():
                for local, value in updates.items():
                    buf.add(shard_key, arr, coords, local, None if value is None else bytes(value))  # type: ignore[union-attr]
            ready = buf.pop_complete(list(by_shard))  # type: ignore[union-attr]
            ready.update(buf.pop_over_limit())  # type: ignore[union-attr]
        if ready:
            self._write_pending(ready)

    def _write_pending(self, pending: Mapping[str, PendingShard]) -> None:
        self._io.write_shards({k: (p.array, p.shard_coords, p.updates) for k, p in pending.items()})  # type: ignore[misc]

    def flush(self) -> None:
        """Write every buffered shard to the base store (write-back mode; a no-op otherwise)."""
        if self._buffer is None:
            return
        with self._buffer.lock:
            pending = self._buffer.pop_all()
        if pending:
            self._write_pending(pending)

    def _flush_array(self, path: str) -> None:
        if self._buffer is None:
            return
        with self._buffer.lock:
            pending = self._buffer.pop_all(path)
        if pending:
            self._write_pending(pending)

    def compact(self, path: str | None = None) -> int:
        """Rewrite shards that hold unused bytes (after appends, in-place writes or slack).

        Parameters
        ----------
        path : str, optional
            Only the sharded array at this path; every sharded array when ``None``.

        Returns
        -------
        int
            Bytes reclaimed in the base store.
        """
        self.flush()
        if path is not None:
            paths = [path.strip("/")]
        else:
            owners = (self._owner(k) for k in self._base.iter_keys())
            paths = sorted({arr.path for arr in owners if arr is not None})
        arrays = [self.sharded_array(p) for p in paths]
        return sum(self._io.compact_array(arr) for arr in arrays if arr is not None)

    # -- metadata -------------------------------------------------------------

    def _set_metadata(self, key: str, value: memoryview) -> None:
        path, name = _parent(key)
        if name == ".zarray":
            self._on_zarray(path, bytes(value))
            return
        if name == "zarr.json" and self._is_hidden(key):
            raise ReservedKeyError(key, "the zarr.json of a sharded array is managed by shardkv")
        if name == ".zattrs":
            state = self._state(path)
            if isinstance(state, ShardedArray):
                view = dict(self._views[path])
                view["attributes"] = json.loads(bytes(value))
                self._base.set_many({key: bytes(value), _join(path, "zarr.json"): _dump(view)})
                with self._lock:
                    self._views[path] = view
                return
        if name == ".zgroup":
            with self._lock:
                self._set_state(path, _NOT_ARRAY)
        self._base.set(key, bytes(value))

    def _on_zarray(self, path: str, raw: bytes) -> None:
        zarray = json.loads(raw)
        state = self._state(path)
        zjson_key = _join(path, "zarr.json")
        if isinstance(state, ShardedArray):
            self._flush_array(path)
            if list(zarray["chunks"]) != list(state.chunks):
                raise ConfigurationError(
                    f"cannot change the chunks of a sharded array from {list(state.chunks)} to {zarray['chunks']}; "
                    "delete the array first",
                    path,
                )
            view = dict(self._views[path])
            view["shape"] = [int(s) for s in zarray["shape"]]
            new_state = state.with_shape(zarray["shape"])
            self._base.set_many({zjson_key: _dump(view), _join(path, ".zarray"): raw})
            with self._lock:
                self._set_state(path, new_state)
                self._views[path] = view
            if any(n < o for n, o in zip(new_state.shape, state.shape)):
                self._trim(state, new_state)
            return
        if state is _UNSHARDED:
            self._base.set(_join(path, ".zarray"), raw)
            return
        cps = self._chunks_per_shard_for(path, len(zarray["shape"]))
        if cps is None:
            self._base.set(_join(path, ".zarray"), raw)
            with self._lock:
                self._set_state(path, _UNSHARDED)
            return
        layout = ShardLayout.v3(cps, self._index_location, "little", self._index_checksum)
        try:
            attrs = json.loads(bytes(self._base.get(_join(path, ".zattrs"))))
        except KeyError:
            attrs = {}
        view = v3_view_of_v2(zarray, attrs, layout).metadata
        self._base.set_many({_join(path, ".zarray"): raw, zjson_key: _dump(view)})
        with self._lock:
            self._set_state(path, self._sharded_from_view(path, zarray, view))
            self._views[path] = view

    def _trim(self, old: ShardedArray, new: ShardedArray) -> None:
        """Drop the chunks a shrinking resize left outside the chunk grid."""
        import itertools

        grid = new.chunk_grid_shape
        affected = {}
        for coords in itertools.product(*(range(n) for n in old.shard_grid_shape)):
            if any((s + 1) * c > g for s, c, g in zip(coords, new.chunks_per_shard, grid)):
                affected[new.shard_key(coords)] = (new, coords, {})
        if affected:
            self._io.write_shards(affected)

    def _delete_metadata_side_effects(self, key: str) -> None:
        path, name = _parent(key)
        if name in (".zarray", ".zgroup"):
            with self._lock:
                self._forget_state(path)
            if name == ".zarray":
                self._discard_buffered(path)
                self._base.delete_many([_join(path, "zarr.json")])

    def _discard_buffered(self, path: str) -> None:
        """Drop buffered writes of arrays being deleted, so a later flush cannot resurrect them."""
        if self._buffer is not None:
            with self._buffer.lock:
                self._buffer.discard_under(path)

    # -- listing ----------------------------------------------------------------

    def _chunk_keys_of_shards(self, shards: Mapping[str, ShardedArray]) -> Iterator[str]:
        return self._io.chunk_keys(shards)  # in-grid chunks; indexes read 4096 shards per request

    def _classify(self, keys: Iterable[str]) -> tuple[list[str], dict[str, ShardedArray]]:
        plain: list[str] = []
        shards: dict[str, ShardedArray] = {}
        for key in keys:
            arr = self._owner(key)
            if arr is not None and arr.shard_coords_of(key) is not None:
                shards[key] = arr
            elif not self._is_hidden(key):
                plain.append(key)
        return plain, shards

    def __iter__(self) -> Iterator[str]:
        self.flush()
        plain, shards = self._classify(self._base.iter_keys())
        yield from plain
        yield from self._chunk_keys_of_shards(shards)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def keys_under(self, path: str) -> Iterator[str]:
        """Every logical key under ``path`` (a path, or ``""`` for all)."""
        self.flush()
        prefix = f"{path.strip('/')}/" if path.strip("/") else ""
        plain, shards = self._classify(self._base.iter_keys(prefix))
        yield from plain
        yield from self._chunk_keys_of_shards(shards)

    def listdir(self, path: str = "") -> list[str]:
        """Names of the immediate children of ``path``, as code above the proxy sees them."""
        path = path.strip("/")
        inside = self._owner(_join(path, "0")) if path else None
        if inside is None and not isinstance(self._state(path), ShardedArray):
            names = self._base.list_dir(path)
            return [n for n in names if not (n == "zarr.json" and self._is_hidden(_join(path, n)))]
        prefix = f"{path}/" if path else ""
        return sorted({k[len(prefix) :].split("/", 1)[0] for k in self.keys_under(path)})

    def rmdir(self, path: str = "") -> None:
        """Delete everything under ``path`` (the whole store for ``""``)."""
        path = path.strip("/")
        arr = self._owner(_join(path, "0")) if path else None
        if arr is not None and arr.path != path:
            self.delitems(list(self.keys_under(path)))  # a sub-path of a '/'-separated array
            return
        self._discard_buffered(path)
        self._base.rmdir(path)
        self._io.index_cache.clear()
        with self._lock:
            for p in [p for p in self._states if p == path or p.startswith(f"{path}/") or not path]:
                self._forget_state(p)

    def getsize(self, path: str = "") -> int:
        """Bytes stored under ``path`` in the base store (shards, not logical chunks)."""
        self.flush()
        path = path.strip("/")
        if path and self._base.contains(path):
            return self._base.size(path)
        prefix = f"{path}/" if path else ""
        return sum(self._base.size(k) for k in self._base.iter_keys(prefix))

    def rename(self, src_path: str, dst_path: str) -> None:
        """Move everything under ``src_path`` to ``dst_path`` (shards move whole)."""
        self.flush()
        src, dst = src_path.strip("/"), dst_path.strip("/")
        keys = list(self._base.iter_keys(f"{src}/" if src else ""))
        self._base.set_many({dst + k[len(src) :]: self._base.get(k) for k in keys})
        self._base.delete_many(keys)
        self.refresh()

    # -- zarr-python 2 store protocol ----------------------------------------------

    @property
    def _metadata_class(self) -> Any:
        from zarr.meta import Metadata2  # only zarr-python 2 asks for it

        return Metadata2

    def close(self) -> None:
        """Write buffered shards (write-back mode), then close the base store if it has a ``close``."""
        self.flush()
        self._base.close()


    # -- introspection ------------------------------------------------------------

    def sharded_array(self, path: str) -> ShardedArray | None:
        """The key mapping of the sharded array at ``path``, or ``None``."""
        state = self._state(path.strip("/"))
        return state if isinstance(state, ShardedArray) else None

    def v3_metadata(self, path: str) -> dict[str, Any] | None:
        """The ``zarr.json`` document of the sharded array at ``path``, or ``None``."""
        if self.sharded_array(path) is None:
            return None
        return dict(self._views[path.strip("/")])


def _dump(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc, indent=4, sort_keys=True, ensure_ascii=True, allow_nan=False).encode()
