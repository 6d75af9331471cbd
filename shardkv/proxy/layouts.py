"""Which proxy a base store needs: layout names, detection, and opening the 2022 draft mode.

Two layouts, two proxies:

``"v2"``
    Zarr v2 hierarchies whose arrays are sharded with the v1.0
    ``sharding_indexed`` layout (a ``zarr.json`` view beside each sharded
    ``.zarray``); Zarr v3 arrays sharded by other libraries (zarr-python 3,
    tensorstore) are presented as v2 arrays too.
    :class:`shardkv.ShardedStore`.
``"draft2022"``
    2022 Zarr v3 draft hierarchies (root ``zarr.json`` whose ``zarr_format``
    is the draft's URI) with the draft's sharding storage transformer.
    :class:`shardkv.proxy.draft.DraftShardedStore`.

Detection reads one key, the root ``zarr.json``. This module sits below both
:mod:`shardkv.proxy.store` and :mod:`shardkv.proxy.factory`, so both open
draft hierarchies the same way without importing each other.
"""

from __future__ import annotations

from typing import Any, Literal, Mapping, get_args

from shardkv.errors import ConfigurationError
from shardkv.metadata.draft import is_draft_hierarchy
from shardkv.proxy.draft import DRAFT_OPTIONS, DraftShardedStore

__all__ = ["Layout", "LAYOUTS", "detect_layout", "resolve_layout", "open_unless_v2"]

Layout = Literal["v2", "draft2022"]
LAYOUTS: tuple[str, ...] = get_args(Layout)


def detect_layout(store: Any, storage_options: Mapping[str, Any] | None = None) -> Layout:
    """The layout of the hierarchy in ``store``: ``"draft2022"`` for a draft root ``zarr.json``, else ``"v2"``.

    An empty store, a Zarr v2 hierarchy and a Zarr v3 hierarchy are all ``"v2"``
    (the proxy that creates v2 arrays and presents v3 ones). One read.
    """
    return "draft2022" if is_draft_hierarchy(store, storage_options) else "v2"


def resolve_layout(store: Any, layout: str | None, storage_options: Mapping[str, Any] | None = None) -> Layout:
    """``layout`` checked, or detected from ``store`` when ``None``.

    Raises
    ------
    ConfigurationError
        If ``layout`` is not ``None``, ``"v2"`` or ``"draft2022"``.
    """
    if layout is None:
        return detect_layout(store, storage_options)
    if layout not in LAYOUTS:
        raise ConfigurationError(f"layout must be one of {list(LAYOUTS)} or None (detect from the store), got {layout!r}")
    return layout  # type: ignore[return-value]


def open_unless_v2(
    store: Any, layout: str | None, args: tuple[Any, ...], options: Mapping[str, Any]
) -> DraftShardedStore | None:
    """The draft-mode proxy when the (given or detected) layout is ``"draft2022"``; ``None`` for ``"v2"``.

    Parameters
    ----------
    store : any
        The base store.
    layout : {"v2", "draft2022"} or None
        The layout, or ``None`` to detect it (one read).
    args, options : tuple, mapping
        The remaining positional and keyword arguments of the proxy.

    Raises
    ------
    ConfigurationError
        If ``layout`` is unknown, or an option does not apply to the draft mode.
    """
    if resolve_layout(store, layout, options.get("storage_options")) != "draft2022":
        return None
    unknown = sorted(set(options) - DRAFT_OPTIONS)
    if unknown:
        raise ConfigurationError(f"option(s) {unknown} do not apply to the 2022 draft mode (it takes {sorted(DRAFT_OPTIONS)})")
    return DraftShardedStore(store, *args, **options)
