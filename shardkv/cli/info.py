"""What a Zarr v2 hierarchy holds: its arrays, their chunk keys, and their shards.

Two jobs for the command line, both read-only:

* :func:`read_hierarchy` lists a store once and sorts every key into the
  array it belongs to (metadata, in-grid chunk keys, stale chunk keys outside
  the chunk grid, other keys) or into the groups around the arrays. It also
  detects the chunk key separator of arrays whose ``.zarray`` does not name
  one (zarr-python's ``NestedDirectoryStore`` wrote ``0/0`` keys without
  saying so): see :func:`detect_separator`. ``shardkv convert`` works from it.
* :func:`inspect_store` is the data behind ``shardkv info``: per array its
  grid, sharding, chunks present, shards, bytes stored, bytes unused inside
  shards, and what zarr-python 3 opening the root does with it; arrays only
  v3 readers see (a ``zarr.json`` alone, unsharded) are counted too
  (:mod:`shardkv.cli.info_v3`).

The key sorting (:func:`classify_array`, :func:`detect_separator`) is pure;
all I/O goes through the store's :class:`~shardkv.storage.kv.KVStore`, read
through a :class:`~shardkv.cli.view.HierarchyView` (v3 nodes presented as v2).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shardkv.cli.errors import NotAHierarchyError, UnfinishedRunError
from shardkv.cli.info_draft import inspect_draft, is_draft
from shardkv.cli.info_format import format_info  # re-exported: the table lives there
from shardkv.cli.info_model import ArrayInfo, shard_stats
from shardkv.cli.info_v3 import v3_only_arrays, zarr3_view
from shardkv.cli.manifest import MANIFEST_KEY, UNSHARD_MANIFEST_KEY, find_unfinished
from shardkv.cli.stores import open_store
from shardkv.cli.view import HierarchyView, sizes
from shardkv.errors import ConfigurationError, MetadataError
from shardkv.keys.paths import owning_array, path_prefix
from shardkv.keys.space import Separator, ShardedArray, V2ChunkKeyEncoding, grid_shape
from shardkv.metadata.documents import META_NAMES, load_json, unreadable_documents
from shardkv.metadata.v2_view import unusable_sharding
from shardkv.metadata.v3_view import v2_dimension_separator, v3_view_of_v2
from shardkv.proxy.nodes import NodeTable
from shardkv.proxy.verify import shard_directories
from shardkv.storage.kv import KVStore

__all__ = [
    "META_NAMES",
    "NotAHierarchyError",
    "ArrayKeys",
    "Hierarchy",
    "detect_separator",
    "classify_array",
    "read_hierarchy",
    "ArrayInfo",
    "inspect_store",
    "format_info",
]


@dataclass
class ArrayKeys:
    """The stored keys of one Zarr v2 array, sorted by role.

    Attributes
    ----------
    path : str
        The array's path in the hierarchy (``""`` for a root array).
    zarray : dict
        The ``.zarray`` document as stored.
    separator : {".", "/"}
        The chunk key separator in use (from ``.zarray`` or detected).
    separator_detected : bool
        True when ``.zarray`` names no ``dimension_separator`` and ``"/"`` was
        detected from the stored chunk keys.
    chunk_keys : dict of tuple of int to str
        In-grid chunk coords -> stored chunk key.
    stale_keys : list of str
        Chunk keys whose coords lie outside the chunk grid (left behind by a
        shrinking resize, for example).
    other_keys : list of str
        Keys inside the array's directory that are neither metadata nor chunk keys.
    meta_keys : list of str
        ``.zarray``, ``.zattrs``, ``zarr.json`` ... of the array.
    """

    path: str
    zarray: dict[str, Any]
    separator: Separator
    separator_detected: bool
    chunk_keys: dict[tuple[int, ...], str] = field(default_factory=dict)
    stale_keys: list[str] = field(default_factory=list)
    other_keys: list[str] = field(default_factory=list)
    meta_keys: list[str] = field(default_factory=list)

    @property
    def shape(self) -> tuple[int, ...]:
        """Array shape (elements)."""
        return tuple(int(s) for s in self.zarray["shape"])

    @property
    def chunks(self) -> tuple[int, ...]:
        """Chunk shape (elements)."""
        return tuple(int(c) for c in self.zarray["chunks"])

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def chunk_grid_shape(self) -> tuple[int, ...]:
        """Number of chunks along each dimension."""
        return grid_shape(self.shape, self.chunks)

    def all_keys(self) -> list[str]:
        """Every stored key of the array."""
        return [*self.meta_keys, *self.chunk_keys.values(), *self.stale_keys, *self.other_keys]


@dataclass
class Hierarchy:
    """Every key of a Zarr v2 hierarchy, sorted into arrays and the groups around them.

    Attributes
    ----------
    keys : list of str
        Every key zarr-python 2 sees through shardkv: the stored ones and the presented documents.
    arrays : dict of str to ArrayKeys
        Array path -> its keys, in path order.
    group_keys : list of str
        Keys outside every array (group metadata, other files).
    presented : frozenset of str
        The keys of ``keys`` presented from a ``zarr.json``, not stored.
    """

    keys: list[str]
    arrays: dict[str, ArrayKeys]
    group_keys: list[str]
    presented: frozenset[str] = frozenset()

    @property
    def n_stored(self) -> int:
        """Stored objects (``keys`` without the documents presented from a ``zarr.json``)."""
        return len(self.keys) - len(self.presented)


def _decodes(encoding: V2ChunkKeyEncoding, suffix: str, ndim: int) -> tuple[int, ...] | None:
    try:
        return encoding.decode(suffix, ndim)
    except ValueError:
        return None


def detect_separator(path: str, zarray: Mapping[str, Any], suffixes: Iterable[str]) -> tuple[Separator, bool]:
    """The chunk key separator of a v2 array, and whether it was detected from its keys.

    A ``.zarray`` with a ``dimension_separator`` decides. Without one, zarr
    means ``"."``, but arrays written through zarr-python's
    ``NestedDirectoryStore`` store their chunks at ``0/0`` all the same; when
    the array has 2 or more dimensions and its stored chunk keys (``suffixes``,
    relative to the array path) are ``/``-separated, ``"/"`` is detected.

    Parameters
    ----------
    path : str
        The array path (named in errors).
    zarray : mapping
        The ``.zarray`` document.
    suffixes : iterable of str
        The stored keys of the array, relative to its path.

    Returns
    -------
    separator : {".", "/"}
    detected : bool
        True when ``"/"`` was detected although ``.zarray`` does not say so.

    Raises
    ------
    ConfigurationError
        If ``.zarray`` names an invalid separator, or names none while the
        stored chunk keys use both ``.`` and ``/``.
    """
    if zarray.get("dimension_separator") is not None:
        return v2_dimension_separator(zarray), False
    ndim = len(zarray["shape"])
    if ndim < 2:
        return ".", False  # one coordinate: both separators give the same keys
    dot, slash = V2ChunkKeyEncoding("."), V2ChunkKeyEncoding("/")
    n_dot = n_slash = 0
    for suffix in suffixes:
        if _decodes(dot, suffix, ndim) is not None:
            n_dot += 1
        elif _decodes(slash, suffix, ndim) is not None:
            n_slash += 1
    if n_dot and n_slash:
        raise ConfigurationError(
            f".zarray names no dimension_separator and the stored chunk keys use both '.' "
            f"({n_dot} keys) and '/' ({n_slash} keys)",
            path,
        )
    return ("/", True) if n_slash else (".", False)


def classify_array(path: str, zarray: Mapping[str, Any], keys: Iterable[str]) -> ArrayKeys:
    """Sort the stored keys of one array by role (pure).

    Parameters
    ----------
    path : str
        The array path (``""`` for a root array).
    zarray : mapping
        Its ``.zarray`` document.
    keys : iterable of str
        Every stored key under the array's path (full keys).

    Raises
    ------
    ConfigurationError
        As :func:`detect_separator`; also if ``shape`` and ``chunks`` differ in length.
    """
    if len(zarray["shape"]) != len(zarray["chunks"]):
        raise ConfigurationError(
            f".zarray shape {zarray['shape']} and chunks {zarray['chunks']} differ in length", path
        )
    prefix = path_prefix(path)
    keys = list(keys)
    suffixes = [k[len(prefix) :] for k in keys]
    separator, detected = detect_separator(path, zarray, suffixes)
    out = ArrayKeys(path, dict(zarray), separator, detected)
    encoding = V2ChunkKeyEncoding(separator)
    grid = out.chunk_grid_shape
    ndim = out.ndim
    for key, suffix in zip(keys, suffixes, strict=True):
        if suffix in META_NAMES:
            out.meta_keys.append(key)
            continue
        coords = _decodes(encoding, suffix, ndim)
        if coords is None:
            out.other_keys.append(key)
        elif all(c < g for c, g in zip(coords, grid, strict=True)):
            out.chunk_keys[coords] = key
        else:
            out.stale_keys.append(key)
    return out


def read_hierarchy(store: HierarchyView, name: str = "store", strict: bool = True) -> Hierarchy:
    """List a Zarr v2 hierarchy once and sort its keys (one listing, one batched metadata read).

    Parameters
    ----------
    store : HierarchyView
        The store holding the hierarchy (v3 nodes presented as v2 documents).
    name : str
        How to call the store in errors (its URL or path).
    strict : bool
        Refuse a hierarchy with an unreadable ``zarr.json`` or ``.zgroup``
        (else the node would silently be left out); ``verify`` reports them itself.

    Raises
    ------
    NotAHierarchyError
        If the store holds no key, or no ``.zgroup`` or ``.zarray`` (stored, or presented from a
        ``zarr.json``) at its root or below it (a root without a group document: tensorstore writes none).
    UnfinishedRunError
        If the store holds the manifest of an interrupted ``convert`` or ``unshard``
        (its message says the command that resumes it).
    ConfigurationError
        If a ``.zarray`` is not valid JSON or has an invalid separator (see
        :func:`classify_array`).
    """
    presented: set[str] = set()
    keys = sorted(store.keys(presented=presented))
    if not keys:
        raise NotAHierarchyError(f"{name} does not exist or is empty")
    key_set = set(keys)
    if MANIFEST_KEY in key_set or UNSHARD_MANIFEST_KEY in key_set:
        unfinished = find_unfinished(store.kv)
        if unfinished is not None:
            raise UnfinishedRunError(
                name, unfinished.command, unfinished.resume_command(name), unfinished.describe(name)
            )
    # a root without a group document holds a hierarchy when nodes lie below it (tensorstore writes no root group)
    if not any(k.rpartition("/")[2] in (".zgroup", ".zarray") for k in keys):
        hint = " (it has a zarr.json: Zarr v3?)" if "zarr.json" in key_set else ""
        raise NotAHierarchyError(f"{name} is not a Zarr v2 hierarchy: no .zgroup or .zarray at its root or below{hint}")
    zarray_keys = [k for k in keys if k.rpartition("/")[2] == ".zarray"]
    if strict:
        node_keys = [k for k in keys if k.rpartition("/")[2] in ("zarr.json", ".zgroup")]
        node_docs = store.values(node_keys)
        problems = unreadable_documents(node_docs)
        for key, raw in node_docs.items():
            doc = None if key in problems or not key.endswith("zarr.json") else load_json(key, raw)
            reason = unusable_sharding(doc, key.rpartition("/")[0]) if isinstance(doc, dict) else None
            if reason is not None:
                problems[key] = reason
        for key, reason in sorted(problems.items()):
            raise MetadataError(key, f"{reason} (in {name}; the node would be left out: repair or remove it)")
    docs = store.values(zarray_keys)
    zarrays: dict[str, dict[str, Any]] = {}
    for k in zarray_keys:
        path = k.rpartition("/")[0]
        try:
            zarrays[path] = json.loads(bytes(docs[k]))
        except (KeyError, ValueError) as exc:
            raise ConfigurationError(f"cannot read {k!r} as a JSON .zarray document: {exc}", path) from exc
    array_paths = frozenset(zarrays)
    members: dict[str, list[str]] = {p: [] for p in sorted(array_paths)}
    group_keys: list[str] = []
    for k in keys:
        owner = owning_array(k, array_paths)
        if owner is None:
            group_keys.append(k)
        else:
            members[owner].append(k)
    arrays = {p: classify_array(p, zarrays[p], ks) for p, ks in members.items()}
    return Hierarchy(keys, arrays, group_keys, frozenset(presented))


# -- shardkv info -------------------------------------------------------------


def _sharded_info(store: KVStore, keys: ArrayKeys, arr: ShardedArray, zattrs: Mapping[str, Any]) -> ArrayInfo:
    shard_keys = [k for k in keys.all_keys() if k not in keys.meta_keys and arr.shard_coords_of(k) is not None]
    shard_keys += shard_directories(store, arr)  # not listed: read, a directory fails naming its key
    layout = arr.layout
    present, used, index_bytes, stored = shard_stats(
        store, shard_keys, arr.shard_coords_of, layout, keys.chunk_grid_shape
    )
    view = v3_view_of_v2(keys.zarray, zattrs, layout)
    return ArrayInfo(
        path=keys.path,
        shape=keys.shape,
        chunks=keys.chunks,
        dtype=str(keys.zarray.get("dtype")),
        shard_shape=arr.shard_shape,
        chunks_per_shard=arr.chunks_per_shard,
        index_location=layout.index_location,
        index_checksum=layout.index_checksum,
        chunks_present=present,
        shards=len(shard_keys),
        objects=len(shard_keys),
        bytes_stored=stored,
        bytes_unused=stored - index_bytes - used,
        v3_readable=view.translatable,
        v3_problems=list(view.problems),
    )


def inspect_store(
    store: Any, storage_options: Mapping[str, Any] | None = None, progress: Callable[[int, int], None] | None = None
) -> list[ArrayInfo]:
    """Per-array facts about a hierarchy shardkv reads, for ``shardkv info``.

    Zarr v2 hierarchies (sharded by shardkv or not), 2022 draft hierarchies
    (:func:`shardkv.cli.info_draft.inspect_draft`) and Zarr v3 hierarchies whose
    arrays use the ``sharding_indexed`` codec (presented as v2 arrays of their
    inner chunks, as :class:`~shardkv.ShardedStore` reads them).

    Parameters
    ----------
    store : str, os.PathLike, MutableMapping, fsspec.FSMap or KVStore
        The hierarchy (any store :func:`shardkv.storage.open.open_kv` accepts;
        URLs are checked by :func:`shardkv.cli.stores.open_store`).
    storage_options : mapping, optional
        fsspec options when ``store`` is a URL.
    progress : callable, optional
        Called as ``progress(arrays done, arrays)`` after each array of a Zarr v2/v3 hierarchy.

    Returns
    -------
    list of ArrayInfo
        One per array, in path order.

    Raises
    ------
    NotAHierarchyError
        If the store is missing, empty or not a hierarchy shardkv reads.
    StoreAccessError
        If the store cannot be reached or used.
    ConfigurationError, UnsupportedError
        If an array's metadata or sharding cannot be used.
    CorruptShardError, ChecksumError
        If a shard's index is damaged.
    OSError
        If a key cannot be read (permissions; a directory, FIFO or socket where a shard should be).
    """
    name = store if isinstance(store, str) else repr(store)
    kv = open_store(store, storage_options)
    if is_draft(kv):
        return inspect_draft(kv, name)
    hierarchy = read_hierarchy(HierarchyView(kv), name)  # v3 sharded arrays (zarr.json only) appear as v2 arrays
    nodes = NodeTable(kv.values)
    infos: list[ArrayInfo] = []
    for path, keys in hierarchy.arrays.items():
        node = nodes.node(path)
        if node.array is not None:
            attributes = (node.doc or {}).get("attributes") or {}
            infos.append(_sharded_info(kv, keys, node.array, attributes))
        else:
            infos.append(_unsharded_info(kv, path, keys))
        if progress is not None:
            progress(len(infos), len(hierarchy.arrays))
    view = HierarchyView(kv)
    infos += v3_only_arrays(view, hierarchy.keys, list(hierarchy.arrays))
    infos.sort(key=lambda i: i.path)
    groups = [k.rpartition("/")[0] for k in hierarchy.group_keys if k.rpartition("/")[2] == ".zgroup"]
    return zarr3_view(view, infos, groups, {p: a.zarray for p, a in hierarchy.arrays.items()})


def _unsharded_info(kv: KVStore, path: str, keys: ArrayKeys) -> ArrayInfo:
    data_keys = [*keys.chunk_keys.values(), *keys.stale_keys]
    return ArrayInfo(
        path=path,
        shape=keys.shape,
        chunks=keys.chunks,
        dtype=str(keys.zarray.get("dtype")),
        shard_shape=None,
        chunks_per_shard=None,
        index_location=None,
        index_checksum=None,
        chunks_present=len(keys.chunk_keys),
        shards=0,
        objects=len(data_keys),
        bytes_stored=sum(sizes(kv, data_keys).values()),
        bytes_unused=0,
        v3_readable=None,
        v3_problems=[],
    )
