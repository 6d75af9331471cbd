"""Listing through the proxy: base store keys in, logical keys out.

Keys outside sharded arrays are listed as they are (less the ``zarr.json``
views shardkv manages); each shard is replaced by the chunk keys its index
holds, for chunks inside the array's grid. Shard indexes are read in
batches of :data:`INDEX_BATCH` shards (one batched request each).
"""

from __future__ import annotations

from typing import Iterable, Iterator, Mapping

from shardkv.engine.planner import ShardIO
from shardkv.keys.space import ShardedArray
from shardkv.proxy.nodes import NodeCache

__all__ = ["INDEX_BATCH", "split_shards", "chunk_keys_of_shards", "logical_keys"]

INDEX_BATCH = 4096  # shards whose indexes are read in one request batch while listing


def split_shards(nodes: NodeCache, keys: Iterable[str]) -> tuple[list[str], dict[str, ShardedArray]]:
    """Base store keys as ``(plain keys, {shard key: its array})``; managed views are left out."""
    plain: list[str] = []
    shards: dict[str, ShardedArray] = {}
    for key in keys:
        arr = nodes.owner(key)
        if arr is not None and arr.shard_coords_of(key) is not None:
            shards[key] = arr
        elif not nodes.is_hidden(key):
            plain.append(key)
    return plain, shards


def chunk_keys_of_shards(io: ShardIO, shards: Mapping[str, ShardedArray]) -> Iterator[str]:
    """The chunk keys of the in-grid chunks stored in ``shards``.

    Raises
    ------
    CorruptShardError, ChecksumError
        For a damaged shard index.
    """
    keys = list(shards)
    for start in range(0, len(keys), INDEX_BATCH):
        batch = {k: shards[k] for k in keys[start : start + INDEX_BATCH]}
        indexes, _ = io.read_indexes(batch)
        for shard_key, index in indexes.items():
            arr = batch[shard_key]
            shard_coords = arr.shard_coords_of(shard_key)
            grid = arr.chunk_grid_shape
            for local in index.present():
                chunk = tuple(s * n + l for s, n, l in zip(shard_coords, arr.chunks_per_shard, local))  # type: ignore[arg-type]
                if all(c < g for c, g in zip(chunk, grid)):
                    yield arr.chunk_key(chunk)


def logical_keys(nodes: NodeCache, io: ShardIO, base_keys: Iterable[str]) -> Iterator[str]:
    """The keys code above the proxy sees, for the base store keys ``base_keys``."""
    plain, shards = split_shards(nodes, base_keys)
    yield from plain
    yield from chunk_keys_of_shards(io, shards)
