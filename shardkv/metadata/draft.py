"""The 2022 Zarr v3 draft hierarchy: names of its entry point and metadata area, and the entry point test. Pure.

Which proxy a store needs is decided by :func:`shardkv.open_store`
(:mod:`shardkv.proxy.open`), which reads the root ``zarr.json`` and asks
:func:`is_draft_entry_point`.
"""

from __future__ import annotations

from typing import Any

DRAFT_ZARR_FORMAT = "https://purl.org/zarr/spec/protocol/core/3.0"
"""The ``zarr_format`` of a 2022 draft hierarchy's root ``zarr.json``."""
META_ROOT = "meta/root/"


def is_draft_entry_point(doc: Any) -> bool:
    """True when ``doc`` (a parsed root ``zarr.json``) is the entry point of a 2022 draft hierarchy."""
    return isinstance(doc, dict) and doc.get("zarr_format") == DRAFT_ZARR_FORMAT
