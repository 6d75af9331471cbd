"""Limits on what metadata may make shardkv allocate, checked before any allocation. Pure.

A shard's index is allocated whole (16 bytes per inner chunk), so a layout
beyond :data:`MAX_CHUNKS_PER_SHARD` (default ``2**24``: a 256 MiB index) is
refused. Read when a layout is built; set per process by
``SHARDKV_MAX_CHUNKS_PER_SHARD`` (read on import).
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


def check_chunks_per_shard(chunks_per_shard: Sequence[int]) -> int:
    """``prod(chunks_per_shard)``; ConfigurationError when it exceeds :data:`MAX_CHUNKS_PER_SHARD`."""
    n = prod(int(c) for c in chunks_per_shard)
    if n > MAX_CHUNKS_PER_SHARD:
        raise ConfigurationError(
            f"chunks_per_shard {tuple(chunks_per_shard)} means {n} chunks per shard (an index of {16 * n} bytes), "
            f"beyond the limit of {MAX_CHUNKS_PER_SHARD} (shardkv.format.limits.MAX_CHUNKS_PER_SHARD, "
            "environment SHARDKV_MAX_CHUNKS_PER_SHARD)"
        )
    return n
