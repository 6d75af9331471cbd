"""``open_store``: the proxy for a base store of any layout.

The one explicit entry point that picks the proxy: give it a base store and,
optionally, the layout; it returns :class:`shardkv.ShardedStore` (Zarr v2
hierarchies sharded with the v1.0 ``sharding_indexed`` layout, and Zarr v3
sharded arrays presented as v2) or :class:`shardkv.proxy.draft.DraftShardedStore`
(2022 draft hierarchies with the sharding storage transformer).
``ShardedStore(store, ...)`` makes the same choice through the same code
(:func:`shardkv.proxy.layouts.open_unless_v2`).
"""

from __future__ import annotations

from typing import Any

from shardkv.metadata.chunks_per_shard import ChunksPerShardOption
from shardkv.proxy.draft import DraftShardedStore
from shardkv.proxy.layouts import Layout, open_unless_v2
from shardkv.proxy.store import ShardedStore

__all__ = ["open_store"]


def open_store(
    store: Any, chunks_per_shard: ChunksPerShardOption = None, *, layout: Layout | None = None, **options: Any
) -> ShardedStore | DraftShardedStore:
    """Open the sharding proxy over a base store, for whichever layout the store holds.

    Parameters
    ----------
    store : MutableMapping, fsspec.FSMap, str or os.PathLike
        The base store: a ``dict``, a zarr-python 2 store, an fsspec mapper,
        or an fsspec URL / local path.
    chunks_per_shard : int, tuple of int, mapping or None
        Sharding of arrays created through the proxy (see :class:`shardkv.ShardedStore`).
    layout : {"v2", "draft2022"} or None
        ``None`` (default) detects it with one read of the root ``zarr.json``:
        a 2022 draft entry point means ``"draft2022"``; anything else
        (empty, Zarr v2, Zarr v3) ``"v2"``. Give it to create a new draft
        hierarchy, or to skip the read.
    **options
        Further options of the chosen proxy (:class:`shardkv.ShardedStore`;
        the draft proxy takes ``index_location``, ``index_checksum`` and
        ``storage_options`` only).

    Returns
    -------
    ShardedStore or DraftShardedStore
        A zarr-python 2 store (``DraftShardedStore`` is a zarr-python 2.18 ``StoreV3``).

    Raises
    ------
    ConfigurationError
        If ``layout`` is unknown, ``chunks_per_shard`` is invalid, or an
        option does not apply to the layout.
    TypeError
        If ``store`` cannot be used as a store.

    Examples
    --------
    >>> import shardkv
    >>> proxy = shardkv.open_store({}, chunks_per_shard=4)
    >>> type(proxy).__name__
    'ShardedStore'
    """
    draft = open_unless_v2(store, layout, (chunks_per_shard,), options)
    if draft is not None:
        return draft
    return ShardedStore(store, chunks_per_shard, layout="v2", **options)
