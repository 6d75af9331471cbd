"""The destination metadata of ``shardkv convert``: amended documents, ``zarr.json`` views, order.

Pure functions over metadata documents (no I/O): the ``.zarray`` of an array
whose ``/`` separator was detected from its keys, the consolidated
``.zmetadata`` that must say the same, the ``zarr.json`` view of each sharded
array, and the order in which documents are written (metadata last, deepest
first, ``.zarray`` / ``.zgroup`` last in each directory).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from shardkv.cli.convert.listing import ArrayListing
from shardkv.format.layout import ShardLayout
from shardkv.metadata.all_v3 import plan_all_v3, plan_root_block, plan_v3_down
from shardkv.metadata.documents import dump_json, load_json
from shardkv.metadata.hierarchy import ZARR_JSON, MetadataPlan, plan_migration, plan_opaque_blocks
from shardkv.metadata.v3_view import v3_view_of_v2

__all__ = ["array_metadata", "amend_consolidated", "metadata_order", "store_as_v3"]


_MISMATCH = "mismatch"


def array_metadata(
    keys: ArrayListing, meta: Mapping[str, bytes], layout: ShardLayout, amended: dict[str, dict[str, Any]]
) -> dict[str, bytes]:
    """The destination metadata of a sharded array: its documents, amended ``.zarray``, ``zarr.json``."""
    prefix = f"{keys.path}/" if keys.path else ""
    out = {k: bytes(v) for k, v in meta.items()}
    zarray = dict(keys.zarray)
    if keys.separator_detected:
        zarray["dimension_separator"] = keys.separator
        out[prefix + ".zarray"] = dump_json(zarray)
        amended[keys.path] = zarray
    zattrs_raw = meta.get(prefix + ".zattrs")
    zattrs = json.loads(bytes(zattrs_raw)) if zattrs_raw is not None else {}
    out[prefix + "zarr.json"] = dump_json(v3_view_of_v2(zarray, zattrs, layout).metadata)
    return out


def amend_consolidated(meta_out: dict[str, bytes], amended: Mapping[str, dict[str, Any]]) -> None:
    """Put the amended ``.zarray`` documents into the consolidated ``.zmetadata`` above them."""
    if not amended:
        return
    for key in [k for k in meta_out if k.rpartition("/")[2] == ".zmetadata"]:
        group = key.rpartition("/")[0]
        doc = json.loads(meta_out[key])
        entries = doc.get("metadata")
        if not isinstance(entries, dict):
            continue
        changed = False
        for path, zarray in amended.items():
            if group and not path.startswith(group + "/"):
                continue
            rel = path[len(group) + 1 :] if group else path
            entry = f"{rel}/.zarray" if rel else ".zarray"
            if entry in entries:
                entries[entry] = zarray
                changed = True
        if changed:
            meta_out[key] = dump_json(doc)


def metadata_order(key: str) -> tuple[int, int, str]:
    """Deepest documents first, and in each directory ``.zarray`` / ``.zgroup`` / ``zarr.json`` last."""
    name = key.rpartition("/")[2]
    return (-key.count("/"), name in (".zarray", ".zgroup", ZARR_JSON), key)


_DOCUMENTS = (".zarray", ".zattrs", ".zgroup", ZARR_JSON, ".zmetadata")


def store_as_v3(meta_out: dict[str, bytes], all_v3: bool = False) -> None:
    """Store the hierarchy the way :class:`shardkv.ShardedStore` stores it once an array is sharded, in place.

    ``meta_out`` holds the documents of the old layout (a ``.zarray`` beside
    each sharded array's ``zarr.json``). In turn:

    1. :func:`shardkv.metadata.hierarchy.plan_migration`: each sharded array
       and the groups above it stored as v3 only, a ``.zmetadata``
       that zarr-python 2 cannot misread, the root's consolidated block;
    2. when the root is then a v3 group (an array is sharded), the rest is
       described in v3 as the proxy does (:func:`shardkv.metadata.all_v3.plan_v3_down`):
       every v2 group stored as a v3 group, every unsharded array given a
       ``zarr.json`` mirror beside its kept ``.zarray``/``.zattrs``, so zarr-python 3
       finds every node from the root; when no array is sharded the hierarchy
       stays Zarr v2 unless ``all_v3``: then every node also gets a ``zarr.json``
       beside its kept v2 documents (:func:`shardkv.metadata.all_v3.plan_all_v3`);
    3. the root's consolidated block, if it has one, lists every v3 node
       (:func:`shardkv.metadata.all_v3.plan_root_block`);
    4. each group on the path of an array no v3 reader decodes gets a block
       that leaves it out (:func:`shardkv.metadata.hierarchy.plan_opaque_blocks`),
       as the proxy keeps one: v3 readers list its siblings.
    """
    _apply(meta_out, plan_migration(_documents(meta_out)))
    docs = _documents(meta_out)
    if docs.get(ZARR_JSON, {}).get("node_type") == "group":
        _apply(meta_out, plan_v3_down(docs)[0])
    elif all_v3 and ZARR_JSON not in docs:
        _apply(meta_out, MetadataPlan(plan_all_v3(docs).writes))
    _apply(meta_out, plan_root_block(_documents(meta_out)))
    _apply(meta_out, plan_opaque_blocks(_documents(meta_out)))


def _documents(meta_out: Mapping[str, bytes]) -> dict[str, Any]:
    return {k: load_json(k, v) for k, v in meta_out.items() if k.rpartition("/")[2] in _DOCUMENTS}


def _apply(meta_out: dict[str, bytes], plan: MetadataPlan) -> None:
    for key in plan.deletes:
        meta_out.pop(key, None)
    for key, doc in plan.writes.items():
        meta_out[key] = dump_json(doc, key=key)
