"""``shardkv info`` for a 2022 draft hierarchy (arrays with or without the sharding storage transformer).

Reads the hierarchy the way :class:`shardkv.proxy.draft.DraftShardedStore`
does: array metadata at ``meta/root/<path>.array.json``, data under
``data/root/<path>/``. For an array with the sharding transformer, every shard
index is read (one batched ranged read per :data:`shardkv.cli.info._INDEX_BATCH`
shards) to count chunks present and bytes unused, as for v2 arrays. Draft arrays
have no Zarr v3 (final) view, so ``v3_readable`` is ``False`` with the reason.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from shardkv.cli.errors import NotAHierarchyError
from shardkv.cli.info_model import ArrayInfo, shard_stats
from shardkv.cli.view import sizes
from shardkv.keys.space import grid_shape
from shardkv.metadata.documents import ZARR_JSON, is_draft_entry_point, load_json
from shardkv.storage.kv import KVStore

if TYPE_CHECKING:
    from shardkv.proxy.draft import DraftShardedStore

__all__ = ["inspect_draft", "is_draft"]

_NO_V3 = "2022 draft metadata (storage transformers); Zarr v3 readers do not read it"


def _owner(key: str, prefixes: dict[str, str]) -> str | None:
    """The array whose data prefix is the longest one ``key`` starts with."""
    best = None
    for path, prefix in prefixes.items():
        if key.startswith(prefix) and (best is None or len(prefix) > len(prefixes[best])):
            best = path
    return best


def is_draft(kv: KVStore) -> bool:
    """True when ``kv`` holds the root ``zarr.json`` of a 2022 draft hierarchy (one read).

    The proxies' layout check (:func:`shardkv.proxy.open.is_draft_hierarchy`) on a store
    already open, without importing the proxies; a root ``zarr.json`` that is not JSON is no
    draft entry point (the command reading it reports it).
    """
    result = kv.get(ZARR_JSON)
    if not result.found:
        return False
    try:
        return is_draft_entry_point(load_json(ZARR_JSON, result.whole()))
    except ValueError:
        return False


def inspect_draft(kv: KVStore, name: str) -> list[ArrayInfo]:
    """Per-array facts about a 2022 draft hierarchy.

    Parameters
    ----------
    kv : KVStore
        The hierarchy (root ``zarr.json`` of the draft protocol).
    name : str
        How to call it in errors.

    Returns
    -------
    list of ArrayInfo
        One per array, in path order.

    Raises
    ------
    NotAHierarchyError
        If the hierarchy has no array metadata at all.
    UnsupportedError
        If an array names a storage transformer shardkv does not know.
    """
    from shardkv.proxy.draft import DraftShardedStore, draft_options
    from shardkv.transformers import DATA_ROOT

    proxy = DraftShardedStore._reopen(kv, draft_options())  # no zarr-python needed: any zarr installed
    keys = sorted(kv.list_prefix(""))
    arrays = {p: k for k in keys if (p := proxy.array_path_of(k)) is not None}
    if not arrays and not any(k.startswith("meta/") for k in keys):
        raise NotAHierarchyError(f"{name} is a 2022 draft hierarchy without any metadata under meta/")
    prefixes = {p: f"{DATA_ROOT}{p}/" if p else DATA_ROOT for p in arrays}
    data: dict[str, list[str]] = {p: [] for p in arrays}
    for k in keys:
        owner = _owner(k, prefixes) if k.startswith(DATA_ROOT) else None
        if owner is not None:
            data[owner].append(k)
    return [_array_info(kv, proxy, path, arrays[path], data[path]) for path in sorted(arrays)]


def _array_info(store: KVStore, proxy: DraftShardedStore, path: str, meta_key: str, data_keys: list[str]) -> ArrayInfo:
    raw = store.values([meta_key]).get(meta_key)
    if raw is None:
        raise NotAHierarchyError(f"{meta_key}: listed, then gone (the hierarchy changed while it was read)")
    doc: dict[str, Any] = json.loads(bytes(raw))
    shape = tuple(int(s) for s in doc.get("shape", []))
    chunks = tuple(int(c) for c in (doc.get("chunk_grid") or {}).get("chunk_shape", shape))
    from shardkv.transformers import ShardingStorageTransformer

    top = proxy.transformer(path)
    common: dict[str, Any] = dict(path=path, shape=shape, chunks=chunks, dtype=str(doc.get("data_type")))
    if not isinstance(top, ShardingStorageTransformer):
        return ArrayInfo(
            **common,
            shard_shape=None,
            chunks_per_shard=None,
            index_location=None,
            index_checksum=None,
            chunks_present=len(data_keys),
            shards=0,
            objects=len(data_keys),
            bytes_stored=sum(sizes(store, data_keys).values()),
            bytes_unused=0,
            v3_readable=None,
            v3_problems=[],
        )
    layout = top.layout
    shard_keys = [k for k in data_keys if top.array.shard_coords_of(k) is not None]
    grid = grid_shape(shape, chunks)
    present, used, index_bytes, stored = shard_stats(store, shard_keys, top.array.shard_coords_of, layout, grid)
    cps = tuple(layout.chunks_per_shard)
    return ArrayInfo(
        **common,
        shard_shape=tuple(c * n for c, n in zip(chunks, cps, strict=True)),
        chunks_per_shard=cps,
        index_location=layout.index_location,
        index_checksum=layout.index_checksum,
        chunks_present=present,
        shards=len(shard_keys),
        objects=len(shard_keys),
        bytes_stored=stored,
        bytes_unused=stored - index_bytes - used,
        v3_readable=False,
        v3_problems=[_NO_V3],
    )
