"""The v3 ``zarr.json`` of unsharded v2 arrays and v2 groups (``--all-v3``; the proxy once one is sharded). Pure.

An unsharded array's ``zarr.json`` reads the same chunk objects as its kept
``.zarray`` (user guide, "The whole hierarchy at its root"); an opaque one
gets none.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from shardkv.errors import ConfigurationError, UnsupportedError
from shardkv.keys.paths import join_path, split_key
from shardkv.metadata.hierarchy import (
    ZARR_JSON,
    MetadataPlan,
    consolidated_nodes,
    group_document,
    group_paths,
    has_consolidated,
    is_opaque,
    plan_v3_groups,
    with_consolidated_metadata,
)
from shardkv.metadata.v2_codecs import v3_encoding_of_v2
from shardkv.metadata.v3_view import sharding_spec_from_v3, v3_view_of_v2


def _v2_nodes(
    documents: Mapping[str, Mapping[str, Any]],
) -> tuple[dict[str, Mapping[str, Any] | None], dict[str, dict[str, Any]], dict[str, str]]:
    """The v2 nodes without a ``zarr.json``: groups (path -> ``.zattrs``), arrays (path -> v3 document), refused."""
    groups: dict[str, Mapping[str, Any] | None] = {}
    arrays: dict[str, dict[str, Any]] = {}
    refused: dict[str, str] = {}
    for key in sorted(documents):
        path, name = split_key(key)
        if name not in (".zarray", ".zgroup") or join_path(path, ZARR_JSON) in documents:
            continue
        zattrs = documents.get(join_path(path, ".zattrs"))
        if name == ".zgroup":
            groups[path] = zattrs
            continue
        view = v3_view_of_v2(documents[key], zattrs)
        if view.metadata:
            arrays[path] = view.metadata
        else:
            refused[path] = "; ".join(view.problems)
    return groups, arrays, refused


def may_mirror(doc: Mapping[str, Any] | None) -> bool:
    """True for an unsharded v3 array with the ``v2`` chunk key encoding (a mirror when a ``.zarray`` is beside it)."""
    if doc is None or doc.get("zarr_format") != 3 or doc.get("node_type") != "array":
        return False
    encoding = doc.get("chunk_key_encoding")
    if not isinstance(encoding, Mapping) or encoding.get("name") != "v2":
        return False
    try:
        return sharding_spec_from_v3(doc) is None
    except (ConfigurationError, UnsupportedError):
        return False


def plan_v3_down(
    documents: Mapping[str, Mapping[str, Any]], v3_paths: Iterable[str] = ()
) -> tuple[MetadataPlan, dict[str, str]]:
    """The plan that describes every v2 node of a hierarchy in v3 once one of its arrays is sharded.

    Unlike :func:`plan_all_v3`, a v2 group is stored as a v3 group only, and
    every group on the path of a described array gets one too; an unsharded
    array gains a ``zarr.json`` mirror. ``documents``: parsed documents by
    store key (a path with a ``zarr.json`` is v3, as are ``v3_paths``).
    Returns the plan and the arrays left without a ``zarr.json`` (path -> why).
    """
    known = {p.strip("/") for p in v3_paths}
    docs = {k: v for k, v in documents.items() if split_key(k)[0] not in known}
    docs.update({join_path(p, ZARR_JSON): {} for p in known})
    groups, arrays, refused = _v2_nodes(docs)
    have_v3 = {split_key(k)[0] for k in docs if split_key(k)[1] == ZARR_JSON}
    for path in arrays:
        for group in group_paths(path):
            if group not in have_v3 and group not in groups:
                groups[group] = docs.get(join_path(group, ".zattrs"))
    plan = plan_v3_groups(groups)
    return plan.merged(MetadataPlan({join_path(p, ZARR_JSON): d for p, d in arrays.items()})), refused


def plan_all_v3(documents: Mapping[str, Mapping[str, Any]]) -> MetadataPlan:
    """``--all-v3``: a ``zarr.json`` beside every v2 node of ``documents`` (parsed, by store key) without one."""
    groups, arrays, _refused = _v2_nodes(documents)
    writes = {join_path(path, ZARR_JSON): group_document(attrs) for path, attrs in groups.items()}
    writes.update((join_path(path, ZARR_JSON), doc) for path, doc in arrays.items())
    return MetadataPlan(writes)


def plan_root_block(documents: Mapping[str, Mapping[str, Any]]) -> MetadataPlan:
    """The root ``zarr.json`` with its block listing every v3 node of ``documents``; empty if none or in step."""
    root = documents.get(ZARR_JSON)
    if not has_consolidated(root):
        return MetadataPlan()
    current = dict(root or {})
    nodes = {
        split_key(k)[0]: v
        for k, v in documents.items()
        if split_key(k)[1] == ZARR_JSON and k != ZARR_JSON and v.get("zarr_format") == 3
    }
    new = with_consolidated_metadata(current, nodes)
    return MetadataPlan({ZARR_JSON: new}) if new != current else MetadataPlan()


@dataclass(frozen=True)
class Unreached:
    """Why zarr-python 3 does not reach a node from the root; ``opaque`` when no v3 reader decodes its data type."""

    reason: str
    opaque: bool = False


def _why_no_v3_document(zarray: Mapping[str, Any] | None) -> Unreached:
    """Why a node under a v3 root has no ``zarr.json``: its data type no v3 reader decodes, or none known."""
    if zarray is not None:
        try:
            encoding = v3_encoding_of_v2(zarray)
        except (ConfigurationError, UnsupportedError) as exc:
            return Unreached(f"its .zarray has no v3 equivalent ({exc})")
        if encoding.opaque:
            return Unreached("; ".join(encoding.problems), opaque=True)
    return Unreached("no zarr.json under a Zarr v3 root")


def zarr3_unreachable(
    documents: Mapping[str, Mapping[str, Any]], arrays: Iterable[str], groups: Iterable[str]
) -> dict[str, Unreached]:
    """The ``arrays`` and ``groups`` (paths) zarr-python 3 opening the root does not reach, and why.

    Under a v3 root it finds a node only through a ``zarr.json`` of the right
    ``node_type`` below v3 groups, listed in any consolidated block above it,
    with a data type it decodes; a v2 root is opened as Zarr v2.
    ``documents``: the parsed ``zarr.json``, ``.zarray`` and ``.zgroup`` of
    the nodes and the groups above them, by store key.
    """
    wanted = {p.strip("/"): "array" for p in arrays}
    wanted.update({p.strip("/"): "group" for p in groups})
    out: dict[str, Unreached] = {}
    v3_root = ZARR_JSON in documents
    for path, node_type in sorted(wanted.items()):
        if not v3_root:
            if join_path(path, ".zarray" if node_type == "array" else ".zgroup") not in documents:
                out[path] = Unreached(f"no {'.zarray' if node_type == 'array' else '.zgroup'} (the root is Zarr v2)")
            continue
        doc = documents.get(join_path(path, ZARR_JSON))
        if doc is None:
            out[path] = _why_no_v3_document(documents.get(join_path(path, ".zarray")))
            continue
        if doc.get("node_type") != node_type:
            out[path] = Unreached(f"its zarr.json is a {doc.get('node_type')!r} node, not a {node_type}")
            continue
        if is_opaque(doc):
            dtype = (doc["data_type"].get("configuration") or {}).get("dtype")
            out[path] = Unreached(f"dtype {dtype!r}: no Zarr v3 reader decodes it", opaque=True)
            continue
        for group in group_paths(path):
            above = documents.get(join_path(group, ZARR_JSON))
            if above is None or above.get("node_type") != "group":
                out[path] = Unreached(f"the group {group or '/'} above it is not a Zarr v3 group")
                break
            relative = path[len(group) + 1 :] if group else path
            if has_consolidated(above) and relative not in (consolidated_nodes(above) or ()):
                out[path] = Unreached(f"the consolidated metadata of {group or '/'} does not list it")
                break
    return out
