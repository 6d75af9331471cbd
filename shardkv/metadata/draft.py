"""Pieces of the proxy's 2022 draft mode that do no store I/O of their own.

The draft hierarchy's entry point test, the zarr-python 2.18 ``StoreV3``
registration, and what the proxy knows about one array. Used by
:mod:`shardkv.proxy.draft`.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass, field
from typing import Any, Mapping

from shardkv.errors import MetadataError
from shardkv.metadata.documents import load_json
from shardkv.transformers import DATA_ROOT, AbstractStore, AdapterStore

__all__ = ["DRAFT_ZARR_FORMAT", "META_ROOT", "DraftArray", "is_draft_hierarchy", "register_with_zarr2"]

DRAFT_ZARR_FORMAT = "https://purl.org/zarr/spec/protocol/core/3.0"
"""The ``zarr_format`` of a 2022 draft hierarchy's root ``zarr.json``."""
META_ROOT = "meta/root/"
_registered: set[type] = set()


def register_with_zarr2(cls: type) -> None:
    """Make ``cls`` a virtual ``StoreV3`` of zarr-python 2 (if installed) so its v3 API takes it as is."""
    if cls in _registered:
        return
    _registered.add(cls)
    if importlib.util.find_spec("zarr") is None:
        return
    zarr = importlib.import_module("zarr")
    if str(getattr(zarr, "__version__", "")).startswith("2."):
        importlib.import_module("zarr._storage.store").StoreV3.register(cls)


def is_draft_hierarchy(store: Any, storage_options: Mapping[str, Any] | None = None) -> bool:
    """True when ``store`` holds a root ``zarr.json`` of the 2022 draft (``zarr_format`` URI)."""
    base = store if isinstance(store, AbstractStore) else AdapterStore(store, storage_options)
    try:
        doc = load_json("zarr.json", base.get("zarr.json"))
    except (KeyError, MetadataError):
        return False
    return isinstance(doc, dict) and doc.get("zarr_format") == DRAFT_ZARR_FORMAT


@dataclass
class DraftArray:
    """One array of the hierarchy as the proxy knows it."""

    path: str
    stored: dict[str, Any]
    entries: list[dict[str, Any]]
    stack: AbstractStore | None  # None when the entries could not be resolved
    error: Exception | None = None
    key_prefix: str = field(init=False)

    def __post_init__(self) -> None:
        self.key_prefix = f"{DATA_ROOT}{self.path}/" if self.path else DATA_ROOT

    @property
    def sharded(self) -> bool:
        return bool(self.entries)

    def top(self) -> AbstractStore:
        if self.error is not None:
            raise self.error
        return self.stack  # type: ignore[return-value]
