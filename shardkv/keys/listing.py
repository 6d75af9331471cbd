"""Chunk keys of listings, built from shard indexes with one string join per key. Pure."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from math import prod

import numpy as np

from shardkv.keys.space import ShardedArray

DENSE_GRID_FACTOR = 4  # sorted_chunk_names masks the whole grid up to this many times the listed shards' chunks


def _local_extent(arr: ShardedArray, shard_coords: Sequence[int], in_grid_only: bool) -> list[range]:
    """The chunk coords each dimension of a shard spans (clipped to the grid when asked and known)."""
    grid = arr.chunk_grid_shape if in_grid_only else None
    out = []
    for d, (s, n) in enumerate(zip(shard_coords, arr.chunks_per_shard, strict=True)):
        start = s * n
        stop = start + n if grid is None else min(start + n, grid[d])
        out.append(range(start, max(start, stop)))
    return out


def _product_keys(head: str, sep: str, strings: Sequence[Sequence[str]]) -> list[str]:
    """``head + sep.join(row)`` for every row of the product of ``strings``, in row-major order."""
    prefixes = [head]
    for texts in strings[:-1]:
        with_sep = [t + sep for t in texts]
        prefixes = [p + t for p in prefixes for t in with_sep]
    return [p + t for p in prefixes for t in strings[-1]]


def shard_chunk_keys(
    arr: ShardedArray, shard_coords: Sequence[int], present: np.ndarray, in_grid_only: bool = True
) -> list[str]:
    """Keys of the chunks a shard stores, row-major (outside the grid left out when ``in_grid_only``).

    ``present`` is the shard's :meth:`~shardkv.format.layout.ShardIndex.present_mask`
    (bool, shape ``chunks_per_shard``).
    """
    extent = _local_extent(arr, shard_coords, in_grid_only)
    mask = present[tuple(slice(0, len(r)) for r in extent)]
    form = arr.chunk_key_form
    if form is None or not mask.size:
        offset = np.asarray([r.start for r in extent], dtype=np.int64)
        return [arr.chunk_key(row) for row in (np.argwhere(mask) + offset).tolist()]
    n_present = int(np.count_nonzero(mask))
    if n_present * 8 < mask.size:  # sparse shard: build only the stored keys
        head, sep = form
        offset = np.asarray([r.start for r in extent], dtype=np.int64)
        return [head + sep.join(map(str, row)) for row in (np.argwhere(mask) + offset).tolist()]
    keys = _product_keys(*form, [[str(c) for c in r] for r in extent])
    if n_present == mask.size:
        return keys
    return list(itertools.compress(keys, mask.ravel().tolist()))


def shard_chunk_count(
    arr: ShardedArray, shard_coords: Sequence[int], present: np.ndarray, in_grid_only: bool = True
) -> int:
    """How many keys :func:`shard_chunk_keys` gives for the shard (none is built)."""
    extent = _local_extent(arr, shard_coords, in_grid_only)
    return int(np.count_nonzero(present[tuple(slice(0, len(r)) for r in extent)]))


def sorted_chunk_names(
    arr: ShardedArray, shards: Iterable[tuple[Sequence[int], np.ndarray]], max_shards: int
) -> list[str] | None:
    """zarr 2's sorted ``listdir`` names of the chunks of ``shards`` ((coords, present mask), at most ``max_shards``).

    Built in string order without a sort, for ``v2`` keys with separator
    ``"."`` and a known grid at most :data:`DENSE_GRID_FACTOR` times what the
    shards hold; ``None`` otherwise (the caller sorts).
    """
    grid = arr.chunk_grid_shape
    if arr.chunk_key_form != (arr.key_prefix, "."):
        return None
    if grid is None or prod(grid) > DENSE_GRID_FACTOR * max(1, max_shards) * prod(arr.chunks_per_shard):
        return None
    held = np.zeros(grid, dtype=bool)
    for shard_coords, present in shards:
        extent = _local_extent(arr, shard_coords, True)
        if any(not len(r) for r in extent):
            continue
        held[tuple(slice(r.start, r.stop) for r in extent)] = present[tuple(slice(0, len(r)) for r in extent)]
    orders = [sorted(range(n), key=str) for n in grid]  # coords in the order of their strings
    held = held[np.ix_(*orders)]
    names = _product_keys("", ".", [[str(c) for c in order] for order in orders])
    if held.all():
        return names
    return list(itertools.compress(names, held.ravel().tolist()))
