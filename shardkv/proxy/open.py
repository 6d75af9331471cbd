"""``open_store``: the proxy for a base store of any layout, and the one place a layout is detected.

``"v2"``: Zarr v2 hierarchies (sharded arrays stored as v3 ``zarr.json``) and
v3 arrays sharded by other libraries, :class:`shardkv.ShardedStore`;
``"draft2022"``: 2022 draft hierarchies with the sharding storage transformer,
:class:`~shardkv.proxy.draft.DraftShardedStore`. Detection reads the root
``zarr.json`` alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, get_args

from shardkv.errors import ConfigurationError
from shardkv.metadata.chunks_per_shard import ChunksPerShardOption
from shardkv.metadata.documents import ZARR_JSON, is_draft_entry_point, load_json
from shardkv.proxy.draft import DRAFT_OPTIONS, DraftShardedStore
from shardkv.proxy.store import ShardedStore
from shardkv.storage.open import open_kv
from shardkv.transformers import AbstractStore

Layout = Literal["v2", "draft2022"]
LAYOUTS: tuple[str, ...] = get_args(Layout)


def _root_entry_point(store: Any, storage_options: Mapping[str, Any] | None) -> bytes | None:
    """The stored root ``zarr.json`` of ``store`` (one read), or ``None``."""
    if isinstance(store, AbstractStore):
        try:
            return bytes(store.get(ZARR_JSON))
        except KeyError:
            return None
    result = open_kv(store, storage_options).get(ZARR_JSON)
    return bytes(result.whole()) if result.found else None


def _is_draft(raw: bytes | None) -> bool:
    if raw is None:
        return False
    try:
        return is_draft_entry_point(load_json(ZARR_JSON, raw))
    except ValueError:  # not JSON: not a draft entry point (the v2 proxy reports it when it reads it)
        return False


def is_draft_hierarchy(store: Any, storage_options: Mapping[str, Any] | None = None) -> bool:
    """True when ``store`` holds the root ``zarr.json`` of a 2022 draft hierarchy (one read)."""
    return _is_draft(_root_entry_point(store, storage_options))


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
        option does not apply to the layout; or if zarr-python 3 or later is
        installed, which uses neither proxy (the message says what to use).
    TypeError
        If ``store`` cannot be used as a store.

    Examples
    --------
    >>> import shardkv
    >>> proxy = shardkv.open_store({}, chunks_per_shard=4)
    >>> type(proxy).__name__
    'ShardedStore'
    """
    if layout is not None and layout not in LAYOUTS:
        raise ConfigurationError(
            f"layout must be one of {list(LAYOUTS)} or None (detect from the store), got {layout!r}"
        )
    root = None
    if layout is None:
        root = _root_entry_point(store, options.get("storage_options"))
        layout = "draft2022" if _is_draft(root) else "v2"
    if layout == "draft2022":
        unknown = sorted(set(options) - DRAFT_OPTIONS)
        if unknown:
            raise ConfigurationError(
                f"option(s) {unknown} do not apply to the 2022 draft mode (it takes {sorted(DRAFT_OPTIONS)})"
            )
        return DraftShardedStore(store, chunks_per_shard, **options)
    proxy = ShardedStore(store, chunks_per_shard, **options)
    if root is not None:
        proxy._nodes.prime("", root)  # the root zarr.json just read is not read again
    return proxy
