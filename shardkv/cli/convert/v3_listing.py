"""A Zarr v3 source of ``shardkv convert`` and ``unshard --zarr-format 3``, listed lazily: nodes, then chunks as bits.

:func:`walk_v3` visits the groups directory by directory from the root's
``zarr.json``, reading the ``zarr.json`` of a group's sub-directories in one
batch: ``node_type`` ``array`` is an array (its directory is not walked),
``group`` a group; a directory without one is walked too (its keys are
copied as they are). :func:`list_v3_array` then streams one array's keys
once into a bitmap of its chunk grid (:class:`~shardkv.cli.convert.listing.ChunkBitmap`):
keys decoded by the array's ``chunk_key_encoding``; for an array already
sharded, its shard keys, whose indexes are read (a batch of
:data:`INDEX_BATCH` shards per request, through the engine's read path) to
set the bit of each inner chunk stored. Memory: a bit per chunk, a batch of
shard keys.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shardkv.cli.convert.listing import ArrayListing, ChunkBitmap, _Lister, _reserved, iter_array_keys
from shardkv.cli.errors import NotAHierarchyError, ReservedNameError
from shardkv.cli.view import HierarchyView
from shardkv.errors import MetadataError
from shardkv.keys.paths import join_path, path_prefix
from shardkv.keys.space import ShardedArray, grid_shape
from shardkv.metadata.documents import load_object
from shardkv.metadata.hierarchy import ZARR_JSON
from shardkv.metadata.v3_source import ArraySource

if TYPE_CHECKING:
    import numpy as np

__all__ = ["V3Walk", "walk_v3", "is_v3_root", "list_v3_array", "INDEX_BATCH"]

INDEX_BATCH = 1024
"""Source shards whose indexes one listing request reads."""


@dataclass
class V3Walk:
    """The nodes of a Zarr v3 hierarchy.

    Attributes
    ----------
    arrays, groups : dict of str to dict
        Path -> its ``zarr.json`` document, in path order.
    group_keys : list of str
        Keys outside every array other than the groups' ``zarr.json`` (copied as they are).
    stored : dict of str to bytes
        The nodes' ``zarr.json`` bytes as stored, by key (copied as they are where nothing changes).
    """

    arrays: dict[str, dict[str, Any]]
    groups: dict[str, dict[str, Any]]
    group_keys: list[str]
    stored: dict[str, bytes]


def is_v3_root(view: HierarchyView) -> bool:
    """True when the root holds a ``zarr.json`` of ``zarr_format`` 3 (and no ``.zgroup``/``.zarray``)."""
    found = view.kv.values([ZARR_JSON, ".zgroup", ".zarray"])
    if set(found) != {ZARR_JSON}:
        return False
    try:
        return load_object(ZARR_JSON, found[ZARR_JSON]).get("zarr_format") == 3
    except MetadataError:
        return False


def walk_v3(view: HierarchyView, name: str) -> V3Walk:
    """The arrays and groups of the v3 hierarchy in ``view`` (stored documents, nothing presented).

    Raises
    ------
    NotAHierarchyError
        If the root holds no ``zarr.json``.
    MetadataError
        If a ``zarr.json`` is not a JSON object.
    ReservedNameError
        If a node is named like one of shardkv's own files.
    """
    raw = view.kv.values([ZARR_JSON]).get(ZARR_JSON)
    if raw is None:
        raise NotAHierarchyError(f"{name} is not a Zarr v3 hierarchy: no zarr.json at its root")
    root = load_object(ZARR_JSON, raw)
    walk = V3Walk({}, {}, [], {ZARR_JSON: bytes(raw)})
    if root.get("node_type") == "array":
        walk.arrays[""] = root
        return walk
    walk.groups[""] = root
    lister = _Lister(view)
    pending = [""]
    while pending:
        path = pending.pop()
        dirs: list[str] = []
        for child, is_dir in lister.children(path):
            key = join_path(path, child)
            if lister.is_file(key, is_dir):
                if child != ZARR_JSON and not _reserved(child):
                    walk.group_keys.append(key)
            else:
                dirs.append(key)
        docs = view.kv.values([join_path(d, ZARR_JSON) for d in dirs])
        for d in dirs:
            raw = docs.get(join_path(d, ZARR_JSON))
            if _reserved(d.rpartition("/")[2]):
                if raw is not None:
                    raise ReservedNameError(name, d)
                continue
            doc = None if raw is None else load_object(join_path(d, ZARR_JSON), raw)
            if raw is not None:
                walk.stored[join_path(d, ZARR_JSON)] = bytes(raw)
            if doc is not None and doc.get("node_type") == "array":
                walk.arrays[d] = doc
                continue
            if doc is not None:
                walk.groups[d] = doc
            pending.append(d)
    walk.arrays = dict(sorted(walk.arrays.items()))
    walk.groups = dict(sorted(walk.groups.items()))
    walk.group_keys.sort()
    return walk


def list_v3_array(view: HierarchyView, source: ArraySource) -> tuple[ArrayListing, int]:
    """The stored chunks of one v3 array (inner chunks located through the shard indexes of a sharded one).

    Keys that decode as no chunk (or shard) are kept in ``other_keys`` (copied);
    chunk (or shard) keys outside the grid in ``stale_keys`` (skipped).
    Returns the listing and the number of in-grid chunk (or shard) objects stored.

    Raises
    ------
    CorruptShardError, ChecksumError
        For a damaged source shard index.
    """
    path, ndim = source.path, len(source.shape)
    grid = grid_shape(source.shape, source.chunks)
    shards = source.shards()
    key_grid = grid if shards is None else shards.shard_grid_shape or ()
    listing = ArrayListing(
        path,
        {"shape": list(source.shape), "chunks": list(source.chunks)},
        source.encoding.separator,
        False,
        ChunkBitmap(grid),
        meta_keys=[join_path(path, ZARR_JSON)],
        encoding=source.encoding,
    )
    prefix = path_prefix(path)
    batch: list[str] = []
    n_objects = 0
    for key in iter_array_keys(view, path):
        suffix = key[len(prefix) :]
        if suffix == ZARR_JSON:
            continue
        try:
            coords = source.encoding.decode(suffix, ndim)
        except ValueError:
            listing.other_keys.append(key)
            continue
        if not all(c < g for c, g in zip(coords, key_grid, strict=True)):
            listing.stale_keys.append(key)
        elif shards is None:
            listing.chunks.add(coords)
            n_objects += 1
        else:
            batch.append(key)
            n_objects += 1
            if len(batch) >= INDEX_BATCH:
                _add_inner(listing.chunks, view, shards, batch)
                batch = []
    if batch and shards is not None:
        _add_inner(listing.chunks, view, shards, batch)
    return listing, n_objects


def _add_inner(chunks: ChunkBitmap, view: HierarchyView, shards: ShardedArray, keys: list[str]) -> None:
    """Set the bits of the in-grid inner chunks the indexes of the shards ``keys`` hold."""
    from shardkv.engine.engine import ShardEngine  # a sharded source's indexes only
    from shardkv.engine.options import Options

    reads = ShardEngine(view.kv, Options(concurrency="none")).reads
    for shard_coords, mask in reads.present_masks(dict.fromkeys(keys, shards)):
        for local in _true(mask):
            coords = tuple(s * n + c for s, n, c in zip(shard_coords, shards.chunks_per_shard, local, strict=True))
            if all(c < g for c, g in zip(coords, chunks.grid, strict=True)):
                chunks.add(coords)


def _true(mask: np.ndarray) -> Iterator[tuple[int, ...]]:
    return zip(*(axis.tolist() for axis in mask.nonzero()), strict=True)
