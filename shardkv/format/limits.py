"""Limits on what metadata may make shardkv allocate, checked before any allocation. Pure.

A shard's index holds 16 bytes per inner chunk and is allocated whole, so a
layout beyond :data:`MAX_CHUNKS_PER_SHARD` (default ``2**24``: a 256 MiB
index) is refused. It is read when a layout is built (assignable at run
time), and set per process by ``SHARDKV_MAX_CHUNKS_PER_SHARD`` (read on import).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from math import prod

from shardkv.errors import ConfigurationError


def _from_environment(default: int) -> int:
    text = os.environ.get("SHARDKV_MAX_CHUNKS_PER_SHARD", "")
    try:
        return int(text) if text.strip() else default
    except ValueError:
        raise ConfigurationError(f"SHARDKV_MAX_CHUNKS_PER_SHARD must be an integer, got {text!r}") from None


MAX_CHUNKS_PER_SHARD: int = _from_environment(2**24)
"""Most inner chunks one shard may hold (its index is 16 bytes per chunk)."""


def check_chunks_per_shard(chunks_per_shard: Sequence[int], where: str = "") -> int:
    """The number of inner chunks per shard, or ConfigurationError when it exceeds :data:`MAX_CHUNKS_PER_SHARD`.

    Parameters
    ----------
    chunks_per_shard : sequence of int
        Inner chunks per shard along each dimension.
    where : str
        What the layout belongs to (an array path, a metadata key), named in the error.

    Raises
    ------
    ConfigurationError
        If the product exceeds the limit (nothing has been allocated).
    """
    n = prod(int(c) for c in chunks_per_shard)
    if n > MAX_CHUNKS_PER_SHARD:
        at = f" of {where}" if where else ""
        raise ConfigurationError(
            f"chunks_per_shard {tuple(chunks_per_shard)}{at} means {n} chunks per shard (an index of {16 * n} bytes), "
            f"beyond the limit of {MAX_CHUNKS_PER_SHARD} (shardkv.format.limits.MAX_CHUNKS_PER_SHARD, "
            "environment SHARDKV_MAX_CHUNKS_PER_SHARD)"
        )
    return n
