"""The v2 documents deleted from zarr-python 2's view of a v3 node that is still stored. Pure.

A ``.zgroup``/``.zarray`` deleted while the node still presents its
``.zattrs`` or chunks is recorded in its ``zarr.json`` (user guide,
"Differences from zarr 2's own stores")::

    "shardkv.v2_deleted": {"must_understand": false, "documents": [".zarray"]}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

V2_DELETED_FIELD = "shardkv.v2_deleted"
RECORDED = (".zarray", ".zgroup")  # a .zattrs delete empties the attributes instead


def deleted_documents(doc: Mapping[str, Any] | None) -> frozenset[str]:
    """The v2 documents (among :data:`RECORDED`) a stored ``zarr.json`` records as deleted; none if malformed."""
    record = (doc or {}).get(V2_DELETED_FIELD)
    if not isinstance(record, Mapping):
        return frozenset()
    names = record.get("documents")
    if not isinstance(names, list):
        return frozenset()
    return frozenset(n for n in names if n in RECORDED)


def with_deleted(doc: Mapping[str, Any], name: str) -> dict[str, Any]:
    """``doc`` with the v2 document ``name`` (``.zarray`` or ``.zgroup``) recorded as deleted.

    Raises
    ------
    ValueError
        If ``name`` is not one of :data:`RECORDED`.
    """
    if name not in RECORDED:
        raise ValueError(f"only {list(RECORDED)} are recorded as deleted, not {name!r}")
    names = sorted(deleted_documents(doc) | {name})
    return {**doc, V2_DELETED_FIELD: {"must_understand": False, "documents": names}}
