"""The 2022 draft hierarchy: its entry point test (one read) and what the proxy knows about one array.

Used by :mod:`shardkv.proxy.draft` and :mod:`shardkv.proxy.layouts`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from shardkv.errors import MetadataError
from shardkv.metadata.documents import load_json
from shardkv.transformers import DATA_ROOT, AbstractStore, AdapterStore

__all__ = ["DRAFT_ZARR_FORMAT", "META_ROOT", "DraftArray", "is_draft_hierarchy"]

DRAFT_ZARR_FORMAT = "https://purl.org/zarr/spec/protocol/core/3.0"
"""The ``zarr_format`` of a 2022 draft hierarchy's root ``zarr.json``."""
META_ROOT = "meta/root/"


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
