"""The destination metadata of ``shardkv convert``: the documents as the proxy stores them, and their order.

Pure functions over metadata documents (no I/O). Each array ``convert`` shards
gets its stored ``zarr.json`` at once (:func:`array_metadata`, the proxy's
:func:`~shardkv.metadata.hierarchy.array_document`); :func:`store_as_v3`
then stores the rest of the hierarchy as the proxy keeps it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from shardkv.cli.convert.listing import ArrayListing
from shardkv.format.layout import ShardLayout
from shardkv.keys.paths import join_path, split_key
from shardkv.metadata.all_v3 import plan_all_v3, plan_root_block, plan_v3_down
from shardkv.metadata.documents import ZARR_JSON, ZMETADATA, dump_json, load_json
from shardkv.metadata.hierarchy import (
    MetadataPlan,
    array_document,
    group_paths,
    plan_opaque_blocks,
    plan_root_array,
    plan_sharded_array,
    plan_v3_groups,
    stored_zmetadata,
    with_consolidated_metadata,
)
from shardkv.metadata.v3_view import sharding_spec_from_v3


def array_metadata(
    keys: ArrayListing, meta: Mapping[str, bytes], layout: ShardLayout, amended: dict[str, dict[str, Any]]
) -> dict[str, bytes]:
    """The destination metadata of a sharded array: its stored ``zarr.json`` in place of ``.zarray``/``.zattrs``.

    A ``/`` separator detected from the keys is recorded in ``amended`` (path ->
    ``.zarray``) for :func:`amend_consolidated`.
    """
    zarray = dict(keys.zarray)
    if keys.separator_detected:
        zarray["dimension_separator"] = keys.separator
        amended[keys.path] = zarray
    zattrs_raw = meta.get(join_path(keys.path, ".zattrs"))
    zattrs = json.loads(bytes(zattrs_raw)) if zattrs_raw is not None else {}
    out = {k: bytes(v) for k, v in meta.items() if split_key(k)[1] not in (".zarray", ".zattrs")}
    key = join_path(keys.path, ZARR_JSON)
    out[key] = dump_json(array_document(zarray, zattrs, layout), key=key)
    return out


def amend_consolidated(meta_out: dict[str, bytes], amended: Mapping[str, dict[str, Any]]) -> None:
    """Put the amended ``.zarray`` documents into the consolidated ``.zmetadata`` above them."""
    if not amended:
        return
    for key in [k for k in meta_out if k.rpartition("/")[2] == ZMETADATA]:
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


_DOCUMENTS = (".zarray", ".zattrs", ".zgroup", ZARR_JSON, ZMETADATA)


def store_as_v3(meta_out: dict[str, bytes], all_v3: bool = False) -> None:
    """Store the hierarchy the way :class:`shardkv.ShardedStore` stores it once an array is sharded, in place.

    In turn: the groups above each sharded array stored as v3 only, with a
    root ``.zmetadata`` zarr-python 2 cannot misread (:func:`_plan_sharded`);
    when the root is then a v3 group, the rest described in v3 as the proxy
    does (:func:`~shardkv.metadata.all_v3.plan_v3_down`), else, with
    ``all_v3``, every node given a ``zarr.json`` beside its v2 documents
    (:func:`~shardkv.metadata.all_v3.plan_all_v3`); the root's consolidated
    block listing every v3 node; a block in each group on the path of an
    array no v3 reader decodes (:func:`~shardkv.metadata.hierarchy.plan_opaque_blocks`).
    """
    _apply(meta_out, _plan_sharded(_documents(meta_out)))
    docs = _documents(meta_out)
    if docs.get(ZARR_JSON, {}).get("node_type") == "group":
        _apply(meta_out, plan_v3_down(docs)[0])
    elif all_v3 and ZARR_JSON not in docs:
        _apply(meta_out, plan_all_v3(docs))
    _apply(meta_out, plan_root_block(_documents(meta_out)))
    _apply(meta_out, plan_opaque_blocks(_documents(meta_out)))


def _plan_sharded(docs: Mapping[str, Any]) -> MetadataPlan:
    """The groups above every sharded array stored as v3 only, and the root ``.zmetadata`` made safe.

    An array copied from an already sharded source comes with the
    ``.zarray``/``.zattrs`` its view presents: it is stored as the arrays
    :func:`array_metadata` shards are. The root's consolidated block is
    filled by :func:`~shardkv.metadata.all_v3.plan_root_block`.
    """
    plan = MetadataPlan()
    sharded: list[str] = []
    for key, doc in sorted(docs.items()):
        path, name = split_key(key)
        spec = sharding_spec_from_v3(doc, path) if name == ZARR_JSON else None
        if spec is None:
            continue
        sharded.append(path)
        zarray, zattrs = docs.get(join_path(path, ".zarray")), docs.get(join_path(path, ".zattrs"))
        groups = {g: _group_attributes(docs, g) for g in group_paths(path)}
        if zarray is None:
            plan = plan.merged(plan_v3_groups(groups))
        elif path:
            plan = plan.merged(plan_sharded_array(path, zarray, zattrs, spec.layout, groups))
        else:
            plan = plan.merged(plan_root_array(zarray, zattrs, spec.layout))
    zmetadata = docs.get(ZMETADATA)
    if zmetadata is not None and plan.writes.get(ZARR_JSON, {}).get("node_type") == "group":
        root = with_consolidated_metadata(plan.writes[ZARR_JSON], {})
        plan = plan.merged(MetadataPlan({ZMETADATA: stored_zmetadata(zmetadata, sharded), ZARR_JSON: root}))
    return plan


def _group_attributes(docs: Mapping[str, Any], group: str) -> Mapping[str, Any] | None:
    """A group's attributes: its v3 ``zarr.json``'s, else its ``.zattrs``."""
    zjson = docs.get(join_path(group, ZARR_JSON))
    if zjson is not None and zjson.get("zarr_format") == 3 and zjson.get("node_type") == "group":
        return zjson.get("attributes") or {}
    return docs.get(join_path(group, ".zattrs"))


def _documents(meta_out: Mapping[str, bytes]) -> dict[str, Any]:
    return {k: load_json(k, v) for k, v in meta_out.items() if k.rpartition("/")[2] in _DOCUMENTS}


def _apply(meta_out: dict[str, bytes], plan: MetadataPlan) -> None:
    for key in plan.deletes:
        meta_out.pop(key, None)
    for key, doc in plan.writes.items():
        meta_out[key] = dump_json(doc, key=key)
