"""The 2022 Zarr v3 draft hierarchy: its entry point and metadata area (:func:`shardkv.open_store` asks). Pure."""

from __future__ import annotations

from typing import Any

DRAFT_ZARR_FORMAT = "https://purl.org/zarr/spec/protocol/core/3.0"  # its root zarr.json's zarr_format
META_ROOT = "meta/root/"


def is_draft_entry_point(doc: Any) -> bool:
    """True when ``doc`` (a parsed root ``zarr.json``) is the entry point of a 2022 draft hierarchy."""
    return isinstance(doc, dict) and doc.get("zarr_format") == DRAFT_ZARR_FORMAT
