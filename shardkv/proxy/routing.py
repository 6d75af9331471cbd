"""Routing many keys at once: the batch path of the proxies' chunk reads and writes (pure)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from shardkv.errors import InvalidKeyError
from shardkv.keys.paths import validate_key
from shardkv.keys.space import ChunkRef, ShardedArray

BATCH_MIN_KEYS = 8
"""Fewer keys are routed one by one (the batch path's fixed cost is a few microseconds)."""

Value = bytes | memoryview | None


def route_batch(owner: Callable[[str], ShardedArray | None], keys: Sequence[str]) -> list[ChunkRef] | None:
    """The chunks ``keys`` name when all are in-grid chunk keys of one sharded array, else ``None``.

    Parameters
    ----------
    owner : callable
        The sharded array that owns a (valid) key, or ``None``
        (:meth:`NodeTable.owner <shardkv.proxy.nodes.NodeTable.owner>`).
    keys : sequence of str
        The keys of one call.

    Notes
    -----
    The first key is validated and its owner looked up as for one key; the
    others are checked and located together by
    :meth:`~shardkv.keys.space.ShardedArray.locate_batch`: a key made of the
    owner's prefix and canonical chunk coords is a valid key with the same
    owner. ``None`` (nothing raised) sends the caller to key-by-key routing,
    which raises the error of the first bad key.
    """
    if len(keys) < BATCH_MIN_KEYS:
        return None
    first = keys[0]
    try:
        validate_key(first)
    except (TypeError, InvalidKeyError):
        return None
    arr = owner(first)
    return None if arr is None else arr.locate_batch(keys)
