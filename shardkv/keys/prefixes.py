"""Chunk-key prefixes <-> shard-key prefixes, for the draft transformer's listings and erases. Pure.

Draft "API implementation": a prefix naming part of the chunk grid is
translated to the shards holding those chunks.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from shardkv.keys.space import ShardedArray


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
