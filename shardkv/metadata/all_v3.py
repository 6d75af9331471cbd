"""``--all-v3``: the v3 ``zarr.json`` of unsharded v2 arrays and of v2 groups. Pure.

``shardkv convert`` stores sharded arrays as Zarr v3 only. With
``--all-v3`` the rest of the hierarchy is described in v3 too, so zarr-python 3
opens every array from the root:

* an unsharded v2 array gets a ``zarr.json`` beside its ``.zarray`` that reads
  the *same chunk objects*: ``regular`` chunk grid of the v2 ``chunks``,
  ``v2`` chunk key encoding with its separator, and the v2
  ``dtype``/``order``/``filters``/``compressor``/``fill_value`` by the one
  mapping of :mod:`shardkv.metadata.v2_codecs` (without ``sharding_indexed``);
* a v2 group gets a v3 group ``zarr.json`` with its ``.zattrs`` as attributes.

The ``.zarray``/``.zattrs``/``.zgroup`` documents are kept: zarr-python 2 reads
them as before, zarr-python 3 prefers ``zarr.json``. An array the mapping makes
opaque (no v3 reader decodes it: msgpack objects, subarray structured dtypes, ...)
gets no ``zarr.json``: zarr-python 3 then reads its ``.zarray`` as zarr 2 wrote it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
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
from shardkv.metadata.v3_view import (
    V3View,
    dimension_names_of,
    mark_v2_encoding,
    sharding_spec_from_v3,
    v3_document_of_v2,
)


def v3_view_of_unsharded_v2(zarray: Mapping[str, Any], zattrs: Mapping[str, Any] | None) -> V3View:
    """The ``zarr.json`` that reads an unsharded v2 array's chunk objects as a v3 array.

    Parameters
    ----------
    zarray : mapping
        The v2 ``.zarray`` document.
    zattrs : mapping or None
        The v2 ``.zattrs`` document (becomes ``attributes``).

    Returns
    -------
    V3View
        The document and the reasons v3 readers other than zarr-python 3 may
        not read it. ``metadata`` is empty when no v3 reader has the data type.

    Raises
    ------
    ConfigurationError
        If the separator or fill value is invalid for the dtype.
    """
    encoding = v3_encoding_of_v2(zarray)
    if encoding.opaque:
        return V3View({}, encoding.problems)
    metadata = v3_document_of_v2(zarray, zattrs, encoding, [int(c) for c in zarray["chunks"]], encoding.codecs)
    names = dimension_names_of(metadata["attributes"].get("_ARRAY_DIMENSIONS"), len(metadata["shape"]))
    if names is not None:  # a malformed one stays an attribute
        metadata["attributes"].pop("_ARRAY_DIMENSIONS")
        metadata["dimension_names"] = names
    mark_v2_encoding(metadata, zarray, encoding)
    return V3View(metadata, encoding.problems)


@dataclass(frozen=True)
class AllV3Plan:
    """The ``zarr.json`` documents ``--all-v3`` adds, and the arrays left without one.

    Attributes
    ----------
    writes : dict of str to dict
        Store key -> v3 document (new ``zarr.json``; the root's, with its
        consolidated block brought up to date, when it had one).
    refused : dict of str to str
        Array path -> why it has no v3 document (no v3 data type).
    """

    writes: dict[str, dict[str, Any]] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)


def _v2_nodes(
    documents: Mapping[str, Mapping[str, Any]],
) -> tuple[dict[str, Mapping[str, Any] | None], dict[str, dict[str, Any]], dict[str, str]]:
    """The v2 nodes of ``documents`` that have no ``zarr.json``: ``(groups, arrays, refused)``.

    ``groups``: path -> ``.zattrs``; ``arrays``: path -> the v3 document that
    reads the array's chunks (:func:`v3_view_of_unsharded_v2`); ``refused``:
    path -> why an array has none.
    """
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
        view = v3_view_of_unsharded_v2(documents[key], zattrs)
        if view.metadata:
            arrays[path] = view.metadata
        else:
            refused[path] = "; ".join(view.problems)
    return groups, arrays, refused


def may_mirror(doc: Mapping[str, Any] | None) -> bool:
    """True for a v3 array document that may mirror an unsharded v2 array's ``.zarray``.

    Not sharded, with the ``v2`` chunk key encoding (:func:`v3_view_of_unsharded_v2`
    writes such documents); whether it *is* a mirror depends on a ``.zarray``
    stored beside it, which stays the array's description for zarr-python 2.
    """
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

    Unlike :func:`plan_all_v3` (``convert --all-v3``), a v2 group is stored as
    a v3 group only (as the groups on the path of a sharded array are, so the
    proxy presents its ``.zgroup``/``.zattrs``), and every group on the path of
    a described array gets a v3 group document too (zarr-python 3 finds a node
    only through v3 groups). An unsharded array keeps its ``.zarray``/``.zattrs``
    (zarr-python 2 with or without shardkv reads them as written) and gains a
    ``zarr.json`` mirror that reads the same chunk objects.

    Parameters
    ----------
    documents : mapping of str to mapping
        Metadata documents by store key, parsed (``.zarray``, ``.zattrs``,
        ``.zgroup``, ``zarr.json``); a path with a ``zarr.json`` is already v3.
    v3_paths : iterable of str
        Paths known to be v3 already (besides those with a ``zarr.json`` in ``documents``).

    Returns
    -------
    (MetadataPlan, dict of str to str)
        The plan, and the arrays left without a ``zarr.json`` (path -> why:
        no v3 reader decodes their data type, so v3 readers do not list them
        and their siblings stay readable).
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


def plan_all_v3(documents: Mapping[str, Mapping[str, Any]]) -> AllV3Plan:
    """The v3 documents of every v2 node of a hierarchy that has no ``zarr.json`` yet.

    Parameters
    ----------
    documents : mapping of str to mapping
        Every metadata document by store key, parsed.

    Returns
    -------
    AllV3Plan
    """
    groups, arrays, refused = _v2_nodes(documents)
    plan = AllV3Plan(refused=refused)
    for path, attrs in groups.items():
        plan.writes[join_path(path, ZARR_JSON)] = group_document(attrs)
    plan.writes.update((join_path(path, ZARR_JSON), doc) for path, doc in arrays.items())
    plan.writes.update(plan_root_block({**documents, **plan.writes}).writes)
    return plan


def plan_root_block(documents: Mapping[str, Mapping[str, Any]]) -> MetadataPlan:
    """The root ``zarr.json`` with its consolidated block listing every v3 node below it, when it holds a block.

    A v3 node missing from the block is not found by zarr-python 3 (``KeyError
    ... not found in consolidated metadata``; see
    :func:`~shardkv.metadata.hierarchy.consolidated_in_step`).

    Parameters
    ----------
    documents : mapping of str to mapping
        Every metadata document by store key, parsed, as it will be stored.

    Returns
    -------
    MetadataPlan
        The root ``zarr.json`` to write; empty when the root holds no block or it is in step.
    """
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
    """Why zarr-python 3 does not reach a node from the root (:func:`zarr3_unreachable`).

    Attributes
    ----------
    reason : str
        What is missing or refused, in words.
    opaque : bool
        True when the cause is the array's data type, which no v3 reader decodes
        (zarr-python 2 reads it; nothing a v3 document could change).
    """

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


def _consolidated_paths(doc: Mapping[str, Any]) -> set[str]:
    return set(consolidated_nodes(doc) or ())


def zarr3_unreachable(
    documents: Mapping[str, Mapping[str, Any]], arrays: Iterable[str], groups: Iterable[str]
) -> dict[str, Unreached]:
    """The nodes a zarr-python 3 reader opening the hierarchy at its root does not reach, and why.

    zarr-python 3 opens a root with a ``zarr.json`` as Zarr v3: it then finds a
    node only through a ``zarr.json`` of the right ``node_type`` whose groups
    above are v3 groups, and, below a group holding a consolidated block, only
    when the block lists it; it decodes no opaque data type
    (:func:`~shardkv.metadata.hierarchy.is_opaque`). A root without one is
    opened as Zarr v2, where ``.zarray``/``.zgroup`` are what count.

    Parameters
    ----------
    documents : mapping of str to mapping
        The stored metadata documents by store key, parsed (at least the
        ``zarr.json``, ``.zarray`` and ``.zgroup`` of the nodes and of the groups above them).
    arrays, groups : iterable of str
        Paths of the nodes a reader should find ("" for the root).

    Returns
    -------
    dict of str to Unreached
        Path -> why zarr-python 3 does not reach it (empty when it reaches every node).
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
            if has_consolidated(above) and relative not in _consolidated_paths(above):
                out[path] = Unreached(f"the consolidated metadata of {group or '/'} does not list it")
                break
    return out
