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
    extent = arr.extent(shard_coords, in_grid_only)
    mask = present[tuple(slice(0, len(r)) for r in extent)]
    form = arr.chunk_key_form
    n_present = int(np.count_nonzero(mask))
    if form is None or n_present * 8 < mask.size:  # 0-d, or a sparse shard: build only the stored keys
        rows = (np.argwhere(mask) + np.asarray([r.start for r in extent], dtype=np.int64)).tolist()
        if form is None:
            return [arr.chunk_key(row) for row in rows]
        head, sep = form
        return [head + sep.join(map(str, row)) for row in rows]
    keys = _product_keys(*form, [[str(c) for c in r] for r in extent])
    if n_present == mask.size:
        return keys
    return list(itertools.compress(keys, mask.ravel().tolist()))


def shard_chunk_count(
    arr: ShardedArray, shard_coords: Sequence[int], present: np.ndarray, in_grid_only: bool = True
) -> int:
    """How many keys :func:`shard_chunk_keys` gives for the shard (none is built)."""
    extent = arr.extent(shard_coords, in_grid_only)
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
        extent = arr.extent(shard_coords)
        held[tuple(slice(r.start, r.stop) for r in extent)] = present[tuple(slice(0, len(r)) for r in extent)]
    orders = [sorted(range(n), key=str) for n in grid]  # coords in the order of their strings
    held = held[np.ix_(*orders)]
    names = _product_keys("", ".", [[str(c) for c in order] for order in orders])
    if held.all():
        return names
    return list(itertools.compress(names, held.ravel().tolist()))


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
    head = arr.chunk_key_encoding.head
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
    head = arr.chunk_key_encoding.head
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
    head = arr.chunk_key_encoding.head
    if arr.shard_key_encoding.separator != "/" or not part.startswith(head.rstrip("/")):
        return None
    parsed = [_canonical_int(p) for p in part[len(head.rstrip("/")) :].lstrip("/").split("/")]
    coords = [c for c in parsed if c is not None]
    if len(coords) != len(parsed) or not 0 < len(coords) < arr.ndim:
        return None
    choices: list[Sequence[int]] = [*arr.extent(coords)]  # leading shard coords: the leading dimensions
    for d, f in enumerate(fixed[: len(coords)]):
        choices[d] = [f] if f // arr.chunks_per_shard[d] == coords[d] else []
    return [arr.key_prefix + head + "/".join(map(str, c)) + "/" for c in itertools.product(*choices)]
