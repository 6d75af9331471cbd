"""``DraftShardedStore``: the proxy over a 2022 draft hierarchy (sharding storage transformer).

Arrays live at ``meta/root/<path>.array.json`` and ``data/root/<path>/``.
Code above (zarr-python 2.18's experimental v3 API) sees each array's metadata
without the transformers shardkv applies, and plain chunk keys; metadata it
writes is stored with the array's transformers (the stored ones, or a sharding
transformer for a new array when ``chunks_per_shard`` applies). Metadata
written with its own ``storage_transformers`` is refused, and so is an array
whose stored metadata names a transformer shardkv does not know
(:class:`~shardkv.errors.UnsupportedError`).
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

from shardkv.engine.merge import apply_partial_writes
from shardkv.engine.options import Options
from shardkv.errors import ConfigurationError
from shardkv.format.layout import IndexLocation
from shardkv.format.ranges import ByteRange
from shardkv.keys.paths import is_draft_chunk_segment, owner_candidates, path_prefix, validate_key, validate_path
from shardkv.keys.space import ShardedArray
from shardkv.metadata.chunks_per_shard import ChunksPerShardOption, ChunksPerShardRule
from shardkv.metadata.documents import META_ROOT, ZARR_JSON, dump_json, load_json
from shardkv.metadata.nodes import NodeCache
from shardkv.proxy.base import ProxyBase, refuse_zarr3, to_bytes
from shardkv.storage.kv import check_not_reserved
from shardkv.transformers import (
    DATA_ROOT,
    SHARDING_EXTENSION,
    AbstractStore,
    AdapterStore,
    ShardingStorageTransformer,
    build_stack,
    storage_transformer_entries,
)
from shardkv.transformers.api import normalize_prefix

DRAFT_OPTIONS = frozenset({"chunks_per_shard", "index_location", "index_checksum", "storage_options"})
"""The options the draft proxy takes (the others of :class:`shardkv.ShardedStore` do not apply)."""


def draft_options(chunks_per_shard: ChunksPerShardOption = None) -> Options:
    """The :class:`~shardkv.engine.options.Options` of a draft proxy: the draft's ``indexed`` format
    (index at the end, no checksum) and ``chunks_per_shard`` for new arrays."""
    return Options(ChunksPerShardRule.parse(chunks_per_shard), index_location="end", index_checksum=False)


@dataclass
class DraftArray:
    """One array of the hierarchy as the proxy knows it: its stored metadata and its transformer stack."""

    path: str
    stored: dict[str, Any]
    entries: list[dict[str, Any]]
    stack: AbstractStore | Exception  # the error when the entries could not be built into a stack
    key_prefix: str = field(init=False)

    def __post_init__(self) -> None:
        self.key_prefix = f"{DATA_ROOT}{self.path}/" if self.path else DATA_ROOT

    @property
    def sharded(self) -> bool:
        """True when the array lists storage transformers."""
        return bool(self.entries)

    def top(self) -> AbstractStore:
        """The top of the array's transformer stack.

        Raises
        ------
        ConfigurationError, UnsupportedError
            If the array's transformers could not be built.
        """
        if isinstance(self.stack, Exception):
            raise self.stack
        return self.stack


class DraftNodes:
    """Array states of a draft hierarchy, read lazily from the abstract store under the proxy.

    Parameters
    ----------
    api : AbstractStore
        The store under the proxy.
    rule : ChunksPerShardRule
        Which new arrays get a sharding transformer.
    """

    def __init__(self, api: AbstractStore, rule: ChunksPerShardRule) -> None:
        self._api = api
        self.rule = rule
        self._arrays: NodeCache[DraftArray | None] = NodeCache()
        self._suffix: str | None = None
        self._lock = self._arrays.lock

    def refresh(self) -> None:
        """Forget cached metadata."""
        with self._lock:
            self._arrays.forget_under("")
            self._suffix = None

    def metadata_suffix(self) -> str:
        """The root ``zarr.json``'s ``metadata_key_suffix`` (``".json"`` by default)."""
        if self._suffix is None:
            try:
                suffix = load_json("zarr.json", self._api.get("zarr.json")).get("metadata_key_suffix", ".json")
            except KeyError:
                suffix = ".json"
            with self._lock:
                self._suffix = suffix
        return self._suffix

    def array_key(self, path: str) -> str:
        """The key of the metadata document of the array at ``path``."""
        sfx = self.metadata_suffix()
        return f"{META_ROOT}{path}.array{sfx}" if path else f"meta/root.array{sfx}"

    def meta_path(self, key: str) -> str | None:
        """The array path of an array metadata key, ``None`` for other keys."""
        tail = ".array" + self.metadata_suffix()
        if key == "meta/root" + tail:
            return ""
        if key.startswith(META_ROOT) and key.endswith(tail) and len(key) > len(META_ROOT) + len(tail):
            return key[len(META_ROOT) : -len(tail)]
        return None

    def array(self, path: str) -> DraftArray | None:
        """The array at ``path`` (``None``: no array there). Read once, then cached.

        Raises
        ------
        MetadataError
            If its metadata document is not JSON.
        """
        kept = self._arrays.kept([path])
        if kept:
            return kept[path]
        key = self.array_key(path)
        since = self._arrays.generation  # a write meanwhile: what is read here is not kept
        try:
            raw = self._api.get(key)
        except KeyError:
            state = None
        else:
            state = self._make_state(path, load_json(key, raw))
        return self._arrays.load({path: state}, since)[path]

    def _make_state(self, path: str, stored: dict[str, Any]) -> DraftArray:
        entries = storage_transformer_entries(stored, path)
        try:
            stack = build_stack(entries, stored, path, self._api) if entries else self._api
        except (ConfigurationError, NotImplementedError) as exc:  # unknown transformers included
            return DraftArray(path, stored, entries, exc)
        return DraftArray(path, stored, entries, stack)

    def data_owner(self, key: str) -> DraftArray | None:
        """The sharded array whose data area holds ``key`` (first array met from the root)."""
        if not key.startswith(DATA_ROOT):
            return None
        return self._sharded_owner(list(owner_candidates(key[len(DATA_ROOT) :], is_draft_chunk_segment)))

    def prefix_owner(self, prefix: str) -> DraftArray | None:
        """The sharded array whose data area contains every key starting with ``prefix``."""
        if not prefix.startswith(DATA_ROOT):
            return None
        complete = prefix[len(DATA_ROOT) :].rpartition("/")[0]  # the segments before the last "/"
        return self._sharded_owner(list(owner_candidates(f"{complete}/-" if complete else "-")))

    def _sharded_owner(self, paths: list[str]) -> DraftArray | None:
        """The first array among ``paths`` (from the root down) if it is sharded (an unsharded one owns its keys)."""
        state = self._arrays.first(paths, lambda found: found is not None, self.array).node  # the first array met
        return state if state is not None and state.sharded else None

    def forget(self, key: str) -> None:
        """Forget what a metadata key described (after it was written or erased)."""
        path = self.meta_path(key)
        with self._lock:
            if path is not None:
                self._arrays.forget(path)
            if key == "zarr.json":
                self._suffix = None

    def visible_metadata(self, path: str, raw: bytes) -> bytes:
        """An array's metadata as code above the proxy sees it: without the transformers shardkv applies.

        Raises
        ------
        UnsupportedError
            If the array names a transformer shardkv does not know.
        """
        state = self.array(path)
        if state is None or not state.sharded:
            return raw
        state.top()  # refuses unknown transformers
        return dump_json({k: v for k, v in state.stored.items() if k != "storage_transformers"})

    def store_metadata(self, path: str, key: str, raw: bytes) -> None:
        """Store an array's metadata written from above, with the array's transformers.

        Raises
        ------
        ConfigurationError
            If the document lists ``storage_transformers`` itself, or changes
            the chunk grid of a sharded array.
        """
        doc = load_json(key, raw)
        if doc.get("storage_transformers"):
            raise ConfigurationError(
                f"metadata written to {key!r} lists storage_transformers {doc['storage_transformers']!r}; "
                "shardkv applies the array's transformers itself (pass chunks_per_shard to the proxy)",
                path,
            )
        entries = self._entries_for(path, doc)
        stored = {**doc, "storage_transformers": entries}
        state = self._make_state(path, stored) if entries else DraftArray(path, doc, [], self._api)
        state.top()  # refuses what cannot be built, before anything is stored
        self._api.set(key, dump_json(stored, key=key) if entries else raw)
        self._arrays.set(path, state)

    def _entries_for(self, path: str, doc: dict[str, Any]) -> list[dict[str, Any]]:
        """The stored transformers of an existing sharded array, else the sharding entry the rule gives."""
        old = self.array(path)
        grid = doc.get("chunk_grid") or {}
        if old is not None and old.sharded:
            old.top()
            old_grid = old.stored.get("chunk_grid") or {}
            if list(grid.get("chunk_shape", [])) != list(old_grid.get("chunk_shape", [])) or grid.get(
                "separator"
            ) != old_grid.get("separator"):
                raise ConfigurationError(
                    f"cannot change the chunk grid of a sharded array from {old_grid} to {grid}; "
                    "delete the array first",
                    path,
                )
            return old.entries
        cps = self.rule.for_array(path, len(doc.get("shape", [])))
        if cps is None:
            return []
        return [{"extension": SHARDING_EXTENSION, "type": "indexed", "configuration": {"chunks_per_shard": list(cps)}}]


class DraftShardedStore(ProxyBase):
    """A zarr-python 2.18 v3 store over a 2022 draft hierarchy with sharded arrays.

    Parameters
    ----------
    store : MutableMapping, fsspec.FSMap, str or os.PathLike
        The base store (as :class:`shardkv.ShardedStore` takes it).
    chunks_per_shard : int, tuple of int, mapping or None
        Sharding for arrays created through the proxy (as for
        :class:`shardkv.ShardedStore`). Arrays already stored keep their own
        ``storage_transformers``.
    index_location, index_checksum : optional
        Accepted for symmetry with :class:`shardkv.ShardedStore`; the draft's
        ``indexed`` format has its index at the ``"end"`` and no checksum.
    storage_options : mapping, optional
        fsspec options when ``store`` is a URL.

    Raises
    ------
    ConfigurationError
        If ``chunks_per_shard`` is invalid or an index option differs from the
        draft format; or if the installed zarr-python is 3 or later, which
        cannot use this store and does not read the 2022 draft (the message
        names ``shardkv[zarr2]``).
    TypeError
        If ``store`` cannot be used as a store.
    """

    _store_version = 3  # zarr-python 2.18's v3 API takes the proxy as a StoreV3
    _zarr_protocol = "StoreV3"

    def __init__(
        self,
        store: Any,
        chunks_per_shard: ChunksPerShardOption = None,
        *,
        index_location: IndexLocation = "end",
        index_checksum: bool = False,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        refuse_zarr3(
            "shardkv.proxy.draft.DraftShardedStore",
            "zarr-python 3 does not read 2022 draft hierarchies: use this store with zarr-python 2.18 "
            '(pip install "shardkv[zarr2]")',
        )
        if index_location != "end" or index_checksum:
            raise ConfigurationError(
                "the 2022 draft 'indexed' format keeps its index at the end without a checksum; "
                f"got index_location={index_location!r}, index_checksum={index_checksum!r}"
            )
        self._setup(store, draft_options(chunks_per_shard), storage_options)

    @classmethod
    def _reopen(cls, store: Any, options: Options) -> Self:
        """The proxy over ``store`` without the zarr version check: an unpickled copy (``store`` its
        abstract store), or the command line's view of a draft hierarchy (``store`` a KVStore; it
        needs no zarr-python, so also runs where zarr 3 is installed)."""
        proxy = cls.__new__(cls)
        proxy._setup(store, options)
        return proxy

    def _setup(self, store: Any, options: Options, storage_options: Mapping[str, Any] | None = None) -> None:
        """Build the proxy's parts over ``store`` (an abstract store, or what an adapter takes; the one place)."""
        self._init_proxy(store, options)
        self._api = store if isinstance(store, AbstractStore) else AdapterStore(store, storage_options)
        self._nodes = DraftNodes(self._api, options.chunks_per_shard)

    def _pickled_store(self) -> Any:
        return self._api

    # -- configuration and discovery -------------------------------------------------

    @property
    def base(self) -> AbstractStore:
        """The abstract store under the proxy (writes here bypass the transformers)."""
        return self._api

    def refresh(self) -> None:
        """Forget cached metadata (call after other writers changed the store)."""
        self._nodes.refresh()

    # -- classification -------------------------------------------------------------------

    def _target(self, key: str) -> tuple[str | None, AbstractStore]:
        """``(path, store)``: the array path whose metadata ``key`` is (else ``None``), and the store holding
        ``key``: the top of its array's transformer stack for a chunk of a sharded array, else the base."""
        path = self._nodes.meta_path(key)
        owner = None if path is not None else self._nodes.data_owner(key)
        return path, self._api if owner is None else owner.top()

    # -- reads -------------------------------------------------------------------------------

    def get_partial_values(self, key_ranges: Sequence[tuple[str, Any]]) -> list[bytes | None]:
        """Byte ranges of values (zarr-python 2.18 ``(start, length)`` ranges or ``ByteRange``).

        A sharded array's chunks are read with two requests per array.
        """
        out: list[bytes | None] = [None] * len(key_ranges)
        trims: dict[int, int] = {}  # (start, length) ranges with a negative start: a suffix, cut once read
        groups: dict[int, tuple[AbstractStore, dict[int, tuple[str, ByteRange]]]] = {}  # by store: position -> request
        for i, (key, r) in enumerate(key_ranges):
            if not isinstance(r, ByteRange):
                start, length = r
                if start >= 0:
                    r = ByteRange(start, None if length is None else start + length)
                else:
                    r = ByteRange.suffix(-start)
                    if length is not None:
                        trims[i] = length
            path, store = self._target(key)
            if path is None:
                groups.setdefault(id(store), (store, {}))[1][i] = (key, r)
                continue
            try:
                value = self._nodes.visible_metadata(path, store.get(key))
            except KeyError:
                continue
            start, stop = r.resolve(len(value))
            out[i] = value[start:stop]
        for store, requests in groups.values():
            for i, v in zip(requests, store.get_partial_values(list(requests.values())), strict=True):
                out[i] = v
        for i, length in trims.items():
            if (got := out[i]) is not None:
                out[i] = got[:length]
        return out

    def getitems(self, keys: Sequence[str], *, contexts: Any = None) -> dict[str, bytes]:
        """Values of the stored keys among ``keys`` (two requests per sharded array)."""
        keys = list(keys)
        values = self.get_partial_values([(k, ByteRange(0)) for k in keys])
        return {k: v for k, v in zip(keys, values, strict=True) if v is not None}

    def __getitem__(self, key: str) -> bytes:
        value = self.get_partial_values([(key, ByteRange(0))])[0]
        if value is None:
            raise KeyError(key)
        return value

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        return self._target(key)[1].contains(key)

    # -- writes -----------------------------------------------------------------------------

    def setitems(self, values: Mapping[str, Any]) -> None:
        """Store several values; the chunks of one shard are written with one shard write.

        Raises
        ------
        ConfigurationError
            For array metadata that lists its own ``storage_transformers``, or
            changes the chunk grid of a sharded array.
        InvalidKeyError
            For a malformed key.
        """
        groups: dict[int, tuple[AbstractStore, dict[str, bytes]]] = {}
        for key, value in values.items():
            validate_key(key)
            data = to_bytes(key, value)
            path, store = self._target(key)
            node = _node_path(key)
            if node is not None:
                check_not_reserved(node)  # an array or group named like shardkv's own files
            if path is not None:
                self._nodes.store_metadata(path, key, data)
                continue
            if key == ZARR_JSON:
                self._nodes.forget(key)
            groups.setdefault(id(store), (store, {}))[1][key] = data
        for store, batch in groups.values():
            store.set_values(batch)

    def __setitem__(self, key: str, value: Any) -> None:
        self.setitems({key: value})

    def set_partial_values(self, key_start_values: Sequence[tuple[str, int, Any]]) -> None:
        """Write byte ranges inside values (array metadata is rewritten whole)."""
        for key, start, value in key_start_values:
            path, store = self._target(key)
            if path is not None:
                self[key] = apply_partial_writes(
                    key, self.get_partial_values([(key, ByteRange(0))])[0], [(start, value)]
                )
            else:
                store.set_partial_values([(key, start, to_bytes(key, value))])

    def delitems(self, keys: Iterable[str]) -> None:
        """Delete the stored keys among ``keys`` (missing ones are ignored)."""
        groups: dict[int, tuple[AbstractStore, list[str]]] = {}
        for key in keys:
            path, store = self._target(key)
            if path is not None or key == ZARR_JSON:
                self._nodes.forget(key)
            groups.setdefault(id(store), (store, []))[1].append(key)
        for store, batch in groups.values():
            store.erase_values(batch)

    def __delitem__(self, key: str) -> None:
        self._target(key)[1].erase(key)
        self._nodes.forget(key)  # what a metadata key described (a chunk key describes nothing)

    def erase(self, key: str) -> None:
        """Erase ``key`` (``KeyError`` if it is not stored)."""
        del self[key]

    def erase_values(self, keys: Iterable[str]) -> None:
        """Erase the stored keys among ``keys``."""
        self.delitems(keys)

    def erase_prefix(self, prefix: str) -> None:
        """Erase every key that starts with ``prefix`` (``"/"``: everything)."""
        prefix = _checked_prefix(prefix)
        owner = self._nodes.prefix_owner(prefix)
        if owner is not None:
            owner.top().erase_prefix(prefix)
            return
        self._api.erase_prefix(prefix)
        self.refresh()

    def clear(self) -> None:
        """Erase every key."""
        self.erase_prefix("/")

    # -- listing --------------------------------------------------------------------------------

    def list_prefix(self, prefix: str) -> list[str]:
        """Every key starting with ``prefix``, chunks of sharded arrays listed by chunk key."""
        prefix = _checked_prefix(prefix)
        owner = self._nodes.prefix_owner(prefix)
        if owner is not None:
            return owner.top().list_prefix(prefix)
        out: list[str] = []
        arrays: dict[str, DraftArray] = {}
        for key in self._api.list_prefix(prefix):
            state = self._nodes.data_owner(key)
            if state is None:
                out.append(key)
            else:
                arrays[state.path] = state
        for state in arrays.values():
            out.extend(k for k in state.top().list_prefix(state.key_prefix) if k.startswith(prefix))
        return out

    def list(self) -> builtins.list[str]:
        """Every key."""
        return self.list_prefix("")

    def list_dir(self, prefix: str) -> tuple[builtins.list[str], builtins.list[str]]:
        """``(keys, prefixes)`` directly below ``prefix``."""
        prefix = _checked_prefix(prefix)
        owner = self._nodes.prefix_owner(prefix)
        if owner is not None:
            return owner.top().list_dir(prefix)
        return self._api.list_dir(prefix)

    def listdir(self, path: str = "") -> builtins.list[str]:
        """Names of the immediate children of ``path``."""
        path = validate_path(path)
        prefix = path_prefix(path)
        keys, prefixes = self.list_dir(prefix)
        return sorted({k[len(prefix) :] for k in keys} | {p[len(prefix) :].rstrip("/") for p in prefixes})

    def __iter__(self) -> Iterator[str]:
        return iter(self.list())

    def __len__(self) -> int:
        return len(self.list())

    def rmdir(self, path: str | None = None) -> None:
        """Remove an array or group: its metadata and everything under it (zarr 2.18 v3 semantics)."""
        path = validate_path(path)
        self.erase_prefix(f"{DATA_ROOT}{path}/" if path else DATA_ROOT)
        self._api.erase_prefix(f"{META_ROOT}{path}/" if path else META_ROOT)
        sfx = self._nodes.metadata_suffix()
        base = f"{META_ROOT}{path}" if path else "meta/root"
        self._api.erase_values([f"{base}.array{sfx}", f"{base}.group{sfx}"])
        self.refresh()

    def rename(self, src_path: str, dst_path: str) -> None:
        """Move an array or group (shards move whole; they are keyed relative to the array).

        Raises
        ------
        ValueError
            If nothing is stored at ``src_path``.
        InvalidKeyError
            If a path leaves the store (as for every path- or prefix-taking
            method: :func:`~shardkv.keys.paths.validate_path`).
        """
        src, dst = validate_path(src_path, what="src_path"), validate_path(dst_path, what="dst_path")
        sfx = self._nodes.metadata_suffix()
        moves = {}
        for root in (META_ROOT, DATA_ROOT):
            for key in self._api.list_prefix(f"{root}{src}/"):
                moves[key] = f"{root}{dst}/{key[len(root) + len(src) + 1 :]}"
        for kind in (".array", ".group"):
            key = f"{META_ROOT}{src}{kind}{sfx}"
            if self._api.contains(key):
                moves[key] = f"{META_ROOT}{dst}{kind}{sfx}"
        if not moves:
            raise ValueError(f"nothing stored at {src_path!r} to rename")
        self._api.set_values({new: self._api.get(old) for old, new in moves.items()})
        self._api.erase_values(list(moves))
        self.refresh()

    def getsize(self, path: str = "") -> int:
        """Bytes stored under ``path`` (shards, not logical chunks), as zarr 2.18 sums them."""
        path = validate_path(path)
        keys = self._api.list_prefix(DATA_ROOT + path) + self._api.list_prefix(META_ROOT + path)
        sizes = (self._api.get_partial_values([(k, ByteRange(0))])[0] for k in keys)  # one value held at a time
        return sum(len(v) for v in sizes if v is not None)

    # -- zarr-python 2.18 StoreV3 protocol ----------------------------------------------------------

    @property
    def _metadata_class(self) -> Any:
        from zarr.meta import Metadata3  # only zarr-python 2's v3 API asks for it

        return Metadata3

    @property
    def supports_efficient_get_partial_values(self) -> bool:
        return False

    def supports_efficient_set_partial_values(self) -> bool:
        return False

    def flush(self) -> None:
        """Nothing to write: the draft proxy writes within each call (for symmetry with ``ShardedStore``)."""

    def close(self) -> None:
        """Close the base store if it has a ``close``."""
        if isinstance(self._api, AdapterStore):
            self._api.close()

    # -- introspection ---------------------------------------------------------------------------------

    def array_path_of(self, key: str) -> str | None:
        """The path of the array whose metadata document ``key`` is, or ``None`` for any other key."""
        return self._nodes.meta_path(key)

    def storage_transformers(self, path: str) -> builtins.list[dict[str, Any]]:
        """The stored ``storage_transformers`` entries of the array at ``path`` (``[]`` if none)."""
        state = self._nodes.array(validate_path(path))
        return [] if state is None else [dict(e) for e in state.entries]

    def transformer(self, path: str) -> AbstractStore | None:
        """The top of the transformer stack of the sharded array at ``path``, or ``None``."""
        state = self._nodes.array(validate_path(path))
        return state.top() if state is not None and state.sharded else None

    def sharded_array(self, path: str) -> ShardedArray | None:
        """The key mapping of the sharded array at ``path`` (its sharding transformer's), or ``None``.

        Raises
        ------
        UnsupportedError
            If the array names a transformer shardkv does not know.
        """
        top = self.transformer(path)
        return top.array if isinstance(top, ShardingStorageTransformer) else None


def _node_path(key: str) -> str | None:
    """The path of the node whose metadata document ``key`` is (``meta/root/<path>.array.json``), else ``None``."""
    if not key.startswith(META_ROOT):
        return None
    rest = key[len(META_ROOT) :]
    for kind in (".array", ".group"):
        head, found, _ = rest.rpartition(kind)
        if found:
            return head
    return None


def _checked_prefix(prefix: str) -> str:
    """``prefix`` normalised (:func:`normalize_prefix`) once :func:`validate_path` accepts it."""
    validate_path(prefix, what="prefix")
    return normalize_prefix(prefix)
