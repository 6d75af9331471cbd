"""Listing through the proxy: base store keys in, logical keys out.

Keys outside sharded arrays are listed as zarr-python 2 sees them
(:meth:`NodeTable.listed <shardkv.proxy.nodes.NodeTable.listed>`: the
``zarr.json`` of presented nodes replaced by their v2 documents); each shard is replaced by the chunk keys its index
holds, for chunks inside the array's grid (:meth:`ShardEngine.chunk_keys
<shardkv.engine.engine.ShardEngine.chunk_keys>` reads the indexes in batches,
one request each, and builds each key once from the index with numpy).
Counting (``len``) never builds a key.
"""

from __future__ import annotations

from typing import Iterable, Iterator

from shardkv.engine.engine import ShardEngine
from shardkv.keys.space import ShardedArray
from shardkv.proxy.nodes import NodeTable

__all__ = ["split_shards", "logical_keys", "count_logical_keys"]

def split_shards(nodes: NodeTable, keys: Iterable[str]) -> tuple[list[str], dict[str, ShardedArray]]:
    """Base store keys as ``(plain keys, {shard key: its array})``."""
    plain: list[str] = []
    shards: dict[str, ShardedArray] = {}
    for key in keys:
        arr = nodes.owner(key)
        if arr is not None and arr.shard_coords_of(key) is not None:
            shards[key] = arr
        else:
            plain.append(key)
    return plain, shards


def logical_keys(nodes: NodeTable, engine: ShardEngine, base_keys: Iterable[str]) -> Iterator[str]:
    """The keys code above the proxy sees, for the base store keys ``base_keys`` (enumerated once)."""
    plain, shards = split_shards(nodes, base_keys)
    yield from nodes.listed(plain)
    yield from engine.chunk_keys(shards)  # in-grid chunks; indexes read in batches by the engine


def count_logical_keys(nodes: NodeTable, engine: ShardEngine, base_keys: Iterable[str]) -> int:
    """How many keys :func:`logical_keys` would list (no chunk key is built)."""
    plain, shards = split_shards(nodes, base_keys)
    return sum(1 for _ in nodes.listed(plain)) + engine.count_chunks(shards)
