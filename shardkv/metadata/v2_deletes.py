"""The v2 documents deleted from zarr-python 2's view of a v3 node that is still stored.

In any mapping, deleting ``g/.zgroup`` or ``a/.zarray`` deletes that key
alone: ``.zattrs`` stays, and so do an array's chunk keys. Through the proxy
a v3 node is presented to zarr-python 2 as ``.zgroup``/``.zarray`` and
``.zattrs`` from one ``zarr.json``, which a sharded array also needs to present
its shards as chunks. So when ``.zgroup`` or ``.zarray`` is deleted while
something of the node is still presented (its ``.zattrs``, an array's chunks),
the ``zarr.json`` stays and records the deleted document in an extension
member that readers may ignore (core v3.0, "must_understand": false)::

    "shardkv.v2_deleted": {"must_understand": false, "documents": [".zarray"]}

zarr-python 2 through the proxy then sees the remaining keys as they were and
not the deleted document. v3 readers without shardkv (zarr-python 3,
tensorstore) still see the node as stored: the array with the values of its
chunks as zarr-python 2 wrote them, never a shard read as one chunk. A
``.zattrs`` delete needs no record (the node's attributes become empty, which
presents no ``.zattrs``); writing the deleted document again drops the record.
Pure: documents in, documents out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

V2_DELETED_FIELD = "shardkv.v2_deleted"
"""The ``zarr.json`` member that lists the v2 documents deleted from zarr-python 2's view."""

RECORDED = (".zarray", ".zgroup")
"""The v2 documents a record may name (the node documents; ``.zattrs`` is deleted by emptying the attributes)."""


def deleted_documents(doc: Mapping[str, Any] | None) -> frozenset[str]:
    """The names of the v2 documents ``doc`` (a stored ``zarr.json``) records as deleted.

    A missing or malformed record (not an object, ``documents`` not a list)
    records nothing; names other than :data:`RECORDED` are ignored.
    """
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
