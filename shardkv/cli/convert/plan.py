"""Which arrays ``shardkv convert`` shards, and with how many chunks per shard (pure, no I/O).

:func:`plan_array` decides per array from its metadata documents: the
``chunks_per_shard`` to use, or the reason it is copied unsharded (already
sharded, 0-d, a ``chunks_per_shard`` tuple for other dimensions, or a data type
whose sharded form shardkv could not present back as a Zarr v2 array, which
would make the array vanish). :func:`check_fit` refuses a tuple that
fits no array; :func:`warn_nothing_gained` warns when every shard would hold a
single chunk.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from typing import Any

from shardkv.cli.errors import ChunksPerShardMismatchError
from shardkv.errors import ShardKVError
from shardkv.format.layout import IndexLocation, ShardLayout
from shardkv.keys.paths import join_path
from shardkv.metadata.hierarchy import present
from shardkv.metadata.v3_view import sharding_spec_from_v3, v3_view_of_v2

__all__ = ["Plan", "UNMOVABLE", "plan_array", "check_fit", "warn_nothing_gained"]

ChunksPerShard = int | tuple[int, ...]
Plan = tuple[tuple[int, ...] | None, str | None]
"""``(chunks_per_shard, None)`` for an array to shard, ``(None, reason)`` for one copied unsharded."""

UNMOVABLE = "copied as stored: "
"""How the reason of a v3 array whose chunks cannot move into shards as stored begins (it says why)."""

_UNSHARDABLE = ("already sharded", "0-d", "dtype ", UNMOVABLE)  # reasons that are not a chunks_per_shard mismatch


def plan_array(
    path: str,
    zarray: Mapping[str, Any],
    meta: Mapping[str, bytes],
    chunks_per_shard: ChunksPerShard,
    index_location: IndexLocation,
    index_checksum: bool,
) -> Plan:
    """``chunks_per_shard`` for one array, or ``None`` and the reason it stays unsharded.

    An array whose sharded ``zarr.json`` shardkv could not present back as a
    Zarr v2 array (an object dtype, for example) stays unsharded: sharding it
    would make it vanish for every reader.
    """
    ndim = len(zarray["shape"])
    zjson = meta.get(join_path(path, "zarr.json"))
    if zjson is not None and sharding_spec_from_v3(json.loads(bytes(zjson)), path) is not None:
        return None, "already sharded"
    if ndim == 0:
        return None, "0-d"
    if isinstance(chunks_per_shard, int):
        cps = (chunks_per_shard,) * ndim
    elif len(chunks_per_shard) != ndim:
        spec = ",".join(str(c) for c in chunks_per_shard)
        return None, f"{ndim}-d; chunks_per_shard {spec} is for {len(chunks_per_shard)}-d arrays"
    else:
        cps = tuple(chunks_per_shard)
    zattrs_raw = meta.get(join_path(path, ".zattrs"))
    try:
        zattrs = json.loads(bytes(zattrs_raw)) if zattrs_raw is not None else {}
        layout = ShardLayout.v3(cps, index_location, "little", index_checksum)
        readable = ".zarray" in present(v3_view_of_v2(zarray, zattrs, layout).metadata, path)
    except (ShardKVError, ValueError, TypeError):
        readable = False
    if not readable:
        return None, f"dtype {zarray.get('dtype')!r}: shardkv cannot read a sharded form of it back"
    return cps, None


def check_fit(plans: Mapping[str, Plan], cps: ChunksPerShard, skip_mismatched: bool) -> None:
    """Refuse a ``chunks_per_shard`` tuple that fits no array (unless ``skip_mismatched``).

    Raises
    ------
    ChunksPerShardMismatchError
        If ``cps`` is a tuple, ``skip_mismatched`` is false and every array that could be
        sharded has another number of dimensions.
    """
    if isinstance(cps, int) or skip_mismatched:
        return
    candidates = {p: r for p, (c, r) in plans.items() if not (r or "").startswith(_UNSHARDABLE)}
    mismatched = [(p, r) for p, r in candidates.items() if r is not None]
    if candidates and len(mismatched) == len(candidates):
        raise ChunksPerShardMismatchError(",".join(str(c) for c in cps), mismatched, fits_none=True)


def warn_nothing_gained(plans: Mapping[str, Plan]) -> None:
    """Warn when every array would get one chunk per shard: the output has as many objects as the input."""
    planned = [c for c, _ in plans.values() if c is not None]
    if planned and all(all(n == 1 for n in c) for c in planned):
        warnings.warn(
            "chunks per shard of 1 along every dimension: each shard holds one chunk, so the output has "
            "as many objects as the source plus an index in each (nothing is gained); use a larger "
            "--chunks-per-shard",
            UserWarning,
            stacklevel=3,
        )
