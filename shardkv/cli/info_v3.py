"""``shardkv info`` as zarr-python 3 sees a hierarchy: the arrays only v3 readers see, and what zarr 3 does with each.

* :func:`v3_only_arrays`: arrays stored as a ``zarr.json`` alone that shardkv
  does not present to zarr-python 2 (written by zarr-python 3 or tensorstore
  without sharding: ``time``, ``x``, ``y`` of an xarray dataset with native
  ``shards=`` data variables). They hold their chunks one per key, in their
  own chunk key encoding; ``info`` counts them as unsharded arrays.
* :func:`zarr3_view`: for every array, whether zarr-python 3 opening the
  hierarchy at its root reads it (:func:`shardkv.metadata.all_v3.zarr3_unreachable`
  answers for the v3 side; a root without ``zarr.json`` is read as Zarr v2),
  and what other v3 readers (tensorstore) refuse of an array zarr 3 reads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from shardkv.cli.info_model import ArrayInfo
from shardkv.cli.view import HierarchyView, sizes
from shardkv.errors import ConfigurationError, MetadataError, UnsupportedError
from shardkv.keys.paths import join_path, owning_array, path_prefix, split_key
from shardkv.keys.space import chunk_key_encoding_from_metadata, grid_shape
from shardkv.metadata.all_v3 import zarr3_unreachable
from shardkv.metadata.documents import load_json
from shardkv.metadata.hierarchy import ZARR_JSON, group_paths
from shardkv.metadata.v3_view import sharding_spec_from_v3, v3_view_of_v2

__all__ = ["v3_only_arrays", "zarr3_view"]


def _v3_array_info(view: HierarchyView, path: str, doc: Mapping[str, Any], keys: Sequence[str]) -> ArrayInfo:
    """The info of an unsharded v3 array from its ``zarr.json`` and its listed keys (chunk keys counted, not read)."""
    key = join_path(path, ZARR_JSON)
    try:
        shape = tuple(int(n) for n in doc["shape"])
        chunks = tuple(int(n) for n in doc["chunk_grid"]["configuration"]["chunk_shape"])
        encoding = chunk_key_encoding_from_metadata(dict(doc["chunk_key_encoding"]))
        data_type = doc["data_type"]
    except (KeyError, TypeError, ValueError, ConfigurationError) as exc:
        raise MetadataError(key, f"not a usable v3 array document ({exc})") from None
    grid = grid_shape(shape, chunks)
    prefix = path_prefix(path)
    data_keys = [k for k in keys if k != key]
    present = 0
    for k in data_keys:
        try:
            coords = encoding.decode(k[len(prefix) :], len(shape))
        except ValueError:
            continue
        present += all(c < g for c, g in zip(coords, grid, strict=True))
    return ArrayInfo(
        path=path,
        shape=shape,
        chunks=chunks,
        dtype=data_type if isinstance(data_type, str) else str((data_type or {}).get("name")),
        shard_shape=None,
        chunks_per_shard=None,
        index_location=None,
        index_checksum=None,
        chunks_present=present,
        shards=0,
        objects=len(data_keys),
        bytes_stored=sum(sizes(view.kv, data_keys).values()),
        bytes_unused=0,
        v3_readable=None,
        v3_problems=[],
    )


def v3_only_arrays(view: HierarchyView, keys: Sequence[str], v2_arrays: Sequence[str]) -> list[ArrayInfo]:
    """The arrays stored as a ``zarr.json`` alone that are not among ``v2_arrays`` (those presented to zarr 2).

    Parameters
    ----------
    view : HierarchyView
        The store (its v3 documents are read once, in one batch).
    keys : sequence of str
        Every stored key of the hierarchy.
    v2_arrays : sequence of str
        Paths of the arrays zarr-python 2 sees (stored or presented ``.zarray``).

    Returns
    -------
    list of ArrayInfo
        One per such array, unsharded, with its in-grid chunk keys counted.

    Raises
    ------
    MetadataError
        If such an array's ``zarr.json`` lacks its shape, chunk grid, chunk key encoding or data type.
    """
    known = set(v2_arrays)
    candidates = [p for p, name in map(split_key, keys) if name == ZARR_JSON and p and p not in known]
    found = view.kv.values([join_path(p, ZARR_JSON) for p in candidates])
    docs = {split_key(k)[0]: load_json(k, v) for k, v in found.items()}
    arrays = frozenset(p for p, d in docs.items() if isinstance(d, dict) and d.get("node_type") == "array")
    if not arrays:
        return []
    members: dict[str, list[str]] = {p: [] for p in arrays}
    for k in keys:
        owner = owning_array(k, arrays)
        if owner is not None:
            members[owner].append(k)
    return [_v3_array_info(view, p, docs[p], members[p]) for p in sorted(arrays)]


def _other_readers(doc: Mapping[str, Any] | None, zarray: Mapping[str, Any] | None, path: str) -> list[str]:
    """What v3 readers other than zarr-python 3 refuse of an array zarr-python 3 reads."""
    encoding = (doc or {}).get("chunk_key_encoding")
    if doc is None or zarray is None or not isinstance(encoding, Mapping) or encoding.get("name") != "v2":
        return []  # written by a v3 writer: in v3 terms already
    try:
        spec = sharding_spec_from_v3(doc, path)
        if spec is None:
            return list(v3_view_of_v2(zarray, None).problems)
        return list(v3_view_of_v2(zarray, None, spec.layout).problems)
    except (ConfigurationError, UnsupportedError):
        return []


def zarr3_view(
    view: HierarchyView, infos: Sequence[ArrayInfo], groups: Sequence[str], zarrays: Mapping[str, Mapping[str, Any]]
) -> list[ArrayInfo]:
    """``infos`` with ``v3_readable``/``v3_problems`` saying what zarr-python 3 opening the root does with each array.

    Parameters
    ----------
    view : HierarchyView
        The store; the stored ``zarr.json``, ``.zarray`` and ``.zgroup`` of every
        node and of the groups above it are read in one batch (not the presented ones).
    infos : sequence of ArrayInfo
        Every array of the hierarchy.
    groups : sequence of str
        Every group path ("" for the root).
    zarrays : mapping of str to mapping
        Array path -> its ``.zarray`` as zarr-python 2 sees it (stored or presented).

    Returns
    -------
    list of ArrayInfo
        ``v3_readable``: True when zarr-python 3 reads the array as Zarr v3 (``v3_problems``
        then lists what other v3 readers refuse), False when it does not reach or decode it
        (``v3_problems`` says why; a root without any group document, as tensorstore leaves it,
        is not opened), None when the root is Zarr v2 (zarr-python 3 reads the whole hierarchy
        as Zarr v2).
    """
    paths = [i.path for i in infos]
    nodes = sorted({g for p in [*paths, *groups] for g in group_paths(p)} | set(paths) | set(groups))
    wanted = [join_path(p, n) for p in nodes for n in (ZARR_JSON, ".zarray", ".zgroup")]
    documents = {k: load_json(k, v) for k, v in view.kv.values(wanted).items()}
    documents = {k: d for k, d in documents.items() if isinstance(d, dict)}
    if ZARR_JSON not in documents and (".zgroup" in documents or ".zarray" in documents):
        return [replace(i, v3_readable=None, v3_problems=[]) for i in infos]
    if ZARR_JSON not in documents:  # no node at the root (tensorstore writes no root group): nothing opens it
        no_root = "no group at the root (none written): zarr-python 3 opens the array at its path, not from the root"
        return [replace(i, v3_readable=False, v3_problems=[no_root]) for i in infos]
    unreached = zarr3_unreachable(documents, paths, groups)
    out = []
    for info in infos:
        why = unreached.get(info.path)
        if why is not None:
            out.append(replace(info, v3_readable=False, v3_problems=[why.reason]))
            continue
        doc = documents.get(join_path(info.path, ZARR_JSON))
        out.append(replace(info, v3_readable=True, v3_problems=_other_readers(doc, zarrays.get(info.path), info.path)))
    return out
