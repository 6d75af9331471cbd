"""Chunk keys of listings, built from shard indexes with one string join per key, and listing prefixes. Pure.

Draft "API implementation": a chunk-key prefix naming part of the chunk grid
is translated to the prefix of the shards holding those chunks
(:func:`split_prefix`, :func:`shard_prefix`, :func:`expand_shard_prefix`).
"""

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


def _head(arr: ShardedArray) -> str:
    """The fixed text before the first coordinate of a chunk key suffix (``"c"`` for ``c1/2``)."""
    return arr.chunk_key_encoding.encode((0,))[:-1]


def _canonical_int(text: str) -> int | None:
    if text.isdigit() and text.isascii() and (len(text) == 1 or text[0] != "0"):
        return int(text)
    return None


def split_prefix(arr: ShardedArray, prefix: str) -> tuple[list[int], bool] | None:
    """``(coords, ok)``: the chunk coords complete in ``prefix`` and whether a chunk key can start with it.

    ``None`` when ``prefix`` does not reach past the array's key prefix. A
    trailing partial coordinate is left out (``c1`` may continue as ``c10``).
    """
    if not prefix.startswith(arr.key_prefix) or len(prefix) == len(arr.key_prefix):
        return None
    part = prefix[len(arr.key_prefix) :]
    head = _head(arr)
    if not part.startswith(head):
        return [], head.startswith(part)
    pieces = part[len(head) :].split(arr.chunk_key_encoding.separator)
    coords = []
    for piece in pieces[:-1]:
        value = _canonical_int(piece)
        if value is None:
            return [], False
        coords.append(value)
    if len(coords) >= max(arr.ndim, 1):
        return [], False
    return coords, True


def shard_prefix(arr: ShardedArray, coords: Sequence[int]) -> str:
    """The prefix of the shard keys holding the chunks whose keys start with ``coords``."""
    head = _head(arr)
    if not coords:
        return arr.key_prefix + head
    shard = [c // n for c, n in zip(coords, arr.chunks_per_shard, strict=False)]  # coords may be a leading part
    sep = arr.shard_key_encoding.separator
    return arr.key_prefix + head + sep.join(str(s) for s in shard) + sep


def expand_shard_prefix(arr: ShardedArray, listed: str, fixed: Sequence[int]) -> list[str] | None:
    """Chunk-key prefixes of the depth of ``listed`` (a partial shard key ``.../c1/`` a listing returned).

    Coords in ``fixed`` (named by the listing) stay; the rest span the shards
    below ``listed`` (clipped to the grid when known). ``None`` if ``listed``
    is not a partial shard key.
    """
    part = listed[len(arr.key_prefix) :].rstrip("/")
    head = _head(arr).rstrip("/")
    if arr.shard_key_encoding.separator != "/" or not part.startswith(head):
        return None
    rest = part[len(head) :].lstrip("/")
    parsed = [_canonical_int(p) for p in rest.split("/")]
    coords = [c for c in parsed if c is not None]
    if len(coords) != len(parsed) or not 0 < len(coords) < arr.ndim:
        return None
    grid = arr.chunk_grid_shape
    choices: list[Sequence[int]] = []
    for d, s in enumerate(coords):
        n = arr.chunks_per_shard[d]
        stop = (s + 1) * n if grid is None else min((s + 1) * n, grid[d])
        if d < len(fixed):
            choices.append([fixed[d]] if s * n <= fixed[d] < (s + 1) * n else [])
        else:
            choices.append(range(s * n, stop))
    head = _head(arr)
    return [arr.key_prefix + head + "/".join(map(str, c)) + "/" for c in itertools.product(*choices)]
