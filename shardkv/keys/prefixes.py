"""Key *prefixes* of a sharded array: chunk-key prefixes <-> shard-key prefixes. Pure.

For the 2022 draft transformer's ``list_prefix``, ``list_dir`` and
``erase_prefix`` (draft "API implementation": a prefix naming part of the
chunk grid is translated to the shards holding those chunks). A chunk key
suffix is a fixed *head* (``c`` for the draft, ``c/`` for v3 ``default``,
nothing for v2) followed by coordinates joined by the separator.
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
    """The complete chunk coords a prefix names inside the chunk-grid part of the keys.

    Parameters
    ----------
    arr : ShardedArray
        The array.
    prefix : str
        A key prefix.

    Returns
    -------
    None or (list of int, bool)
        ``None`` when ``prefix`` does not reach past the array's key prefix;
        else ``(coords, ok)``: the leading chunk coords complete in the prefix
        (a trailing partial coordinate is left out: ``c1`` may continue as
        ``c10``), and ``ok`` False when no chunk key of the array can start
        with ``prefix``.
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
    """Chunk-key prefixes covering a listed partial shard key (``None`` if ``listed`` is not one).

    Parameters
    ----------
    arr : ShardedArray
        The array; only ``/``-separated keys have partial keys ending in ``/``.
    listed : str
        A prefix (``.../c1/``) a directory listing of the shards returned.
    fixed : sequence of int
        Chunk coords the listing already named (they stay fixed).

    Returns
    -------
    list of str or None
        Every chunk-key prefix of the same depth the shards below ``listed``
        can hold (clipped to the grid when known; not checked to be stored).
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
