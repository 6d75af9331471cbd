"""Which metadata documents a sharded hierarchy stores, and which v2 documents it presents. Pure.

Every sharded array is stored as a Zarr v3 array only (docs/architecture.md,
"Metadata documents"); a :class:`MetadataPlan` lists the keys to write and to
delete, and the proxy applies it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shardkv.errors import ConfigurationError
from shardkv.format.layout import ShardLayout
from shardkv.keys.paths import join_path, split_key
from shardkv.metadata.documents import ZARR_JSON
from shardkv.metadata.v2_codecs import OPAQUE_DATA_TYPE
from shardkv.metadata.v2_view import v2_view_of_v3
from shardkv.metadata.v3_view import dimension_names_of, sharding_spec_from_v3, v3_view_of_v2

_DIMENSIONS = "_ARRAY_DIMENSIONS"  # xarray's v2 attribute; v3 has dimension_names

REFUSED_ZARRAY: dict[str, Any] = {
    "zarr_format": 3,
    "node_type": "array",
    "shardkv": "a sharded array: its zarr.json is a Zarr v3 array; read it with a v3 reader or through shardkv",
}
"""The ``.zarray`` a stored ``.zmetadata`` holds for a sharded array: zarr-python 2
refuses it (``zarr_format`` is not 2), so consolidated reads raise, never misread."""


@dataclass(frozen=True)
class MetadataPlan:
    """Keys to write (store key -> JSON document) and keys to delete in the base store, applied together."""

    writes: dict[str, dict[str, Any]] = field(default_factory=dict)
    deletes: frozenset[str] = frozenset()

    def merged(self, other: MetadataPlan) -> MetadataPlan:
        """Both plans, ``other``'s writes winning; a key written is never deleted."""
        writes = {**self.writes, **other.writes}
        return MetadataPlan(writes, frozenset((self.deletes | other.deletes) - writes.keys()))


def group_paths(path: str) -> list[str]:
    """The groups on the path of a node, root first: ``"a/b/c"`` -> ``["", "a", "a/b"]``."""
    parts = [p for p in path.split("/") if p]
    return ["/".join(parts[:i]) for i in range(len(parts))]


def group_document(attributes: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The v3 group ``zarr.json`` holding ``attributes`` (the group's ``.zattrs``)."""
    return {"zarr_format": 3, "node_type": "group", "attributes": dict(attributes or {})}


def array_document(zarray: Mapping[str, Any], zattrs: Mapping[str, Any] | None, layout: ShardLayout) -> dict[str, Any]:
    """The stored v3 ``zarr.json`` of a sharded array written as ``.zarray`` + ``.zattrs``.

    ``_ARRAY_DIMENSIONS`` goes to ``dimension_names``; :func:`present` moves it back.

    Raises
    ------
    ConfigurationError
        If ``layout`` does not fit the array, or ``_ARRAY_DIMENSIONS`` is not
        one string per dimension.
    """
    attrs = dict(zattrs or {})
    names = attrs.pop(_DIMENSIONS, None)
    doc = v3_view_of_v2(zarray, attrs, layout).metadata
    if zarray.get("dimension_separator") is None:  # the v2 default, unnamed: zarr 2 leaves it out of .zarray
        doc["chunk_key_encoding"] = {"name": "v2"}  # separator "." by default (v3 core, chunk_key_encoding)
    return _with_dimension_names(doc, names)


def _with_dimension_names(doc: dict[str, Any], names: Any, path: str | None = None) -> dict[str, Any]:
    """The array document ``doc`` with xarray's ``_ARRAY_DIMENSIONS`` ``names`` as ``dimension_names`` (None: none)."""
    doc.pop("dimension_names", None)
    if names is not None:
        doc["dimension_names"] = dimension_names_of(names, len(doc["shape"]))
        if doc["dimension_names"] is None:
            raise ConfigurationError(f"{_DIMENSIONS} must be one string per dimension, got {names!r}", path)
    return doc


def plan_sharded_array(
    path: str,
    zarray: Mapping[str, Any],
    zattrs: Mapping[str, Any] | None,
    layout: ShardLayout,
    groups: Mapping[str, Mapping[str, Any] | None],
) -> MetadataPlan:
    """The documents to store when a sharded array is created at ``path`` (not the root).

    The array's and every group's ``zarr.json`` are written, their
    ``.zarray``, ``.zattrs`` and ``.zgroup`` deleted. ``groups`` gives the
    attributes of each group on the path (:func:`group_paths`); one missing
    there is stored with none.

    Raises
    ------
    ConfigurationError
        If ``path`` is the root, or the documents are invalid (see :func:`array_document`).
    """
    if not path.strip("/"):
        raise ConfigurationError("the root of a hierarchy is a group; a sharded array needs a path", path)
    own = MetadataPlan(
        {join_path(path, ZARR_JSON): array_document(zarray, zattrs, layout)},
        frozenset({join_path(path, ".zarray"), join_path(path, ".zattrs")}),
    )
    return plan_v3_groups({g: groups.get(g) for g in group_paths(path)}).merged(own)


def plan_v3_groups(groups: Mapping[str, Mapping[str, Any] | None]) -> MetadataPlan:
    """Each of ``groups`` (path -> attributes or ``None``) stored as a v3 group only (no ``.zgroup``/``.zattrs``)."""
    writes: dict[str, dict[str, Any]] = {}
    deletes: set[str] = set()
    for group, attrs in groups.items():
        group = group.strip("/")
        writes[join_path(group, ZARR_JSON)] = group_document(attrs)
        deletes.update({join_path(group, ".zgroup"), join_path(group, ".zattrs")})
    return MetadataPlan(writes, frozenset(deletes))


def plan_root_array(zarray: Mapping[str, Any], zattrs: Mapping[str, Any] | None, layout: ShardLayout) -> MetadataPlan:
    """The documents of a sharded array at the root of a store: its ``zarr.json``, no ``.zarray``/``.zattrs``."""
    return MetadataPlan({ZARR_JSON: array_document(zarray, zattrs, layout)}, frozenset({".zarray", ".zattrs"}))


def plan_attributes(path: str, stored: Mapping[str, Any], zattrs: Mapping[str, Any]) -> MetadataPlan:
    """The documents to store when ``.zattrs`` is written for a node stored as v3.

    Raises
    ------
    ConfigurationError
        If ``stored`` is not a v3 document or ``_ARRAY_DIMENSIONS`` does not fit.
    """
    if stored.get("zarr_format") != 3 or stored.get("node_type") not in ("array", "group"):
        raise ConfigurationError(f"not a v3 array or group document: {dict(stored)!r}", path)
    doc = dict(stored)
    attrs = dict(zattrs)
    if doc["node_type"] == "array":
        doc = _with_dimension_names(doc, attrs.pop(_DIMENSIONS, None), path)
    doc["attributes"] = attrs
    return MetadataPlan({join_path(path, ZARR_JSON): doc}, frozenset({join_path(path, ".zattrs")}))


def plan_group(
    path: str, zattrs: Mapping[str, Any] | None, groups: Mapping[str, Mapping[str, Any] | None]
) -> MetadataPlan:
    """The group and every group above it stored as v3 (``.zgroup`` written under a v3 root).

    zarr-python 3 lists only v3 children of a v3 group; ``groups`` as in :func:`plan_sharded_array`.
    """
    return plan_v3_groups({**{g: groups.get(g) for g in group_paths(path)}, path: zattrs})


def plan_zarray_update(path: str, stored: Mapping[str, Any], zarray: Mapping[str, Any]) -> MetadataPlan:
    """The documents to store when ``.zarray`` is rewritten for a sharded array (resize, append).

    Layout, attributes and ``dimension_names`` are kept; only what ``.zarray`` says changes.

    Raises
    ------
    ConfigurationError
        If ``stored`` is not a sharded v3 array, or the inner chunks change
        (that re-shards every chunk: delete the array first).
    """
    spec = sharding_spec_from_v3(stored, path) if stored.get("node_type") == "array" else None
    if spec is None:
        raise ConfigurationError("not a sharded v3 array document", path)
    if [int(c) for c in zarray["chunks"]] != list(spec.chunks):
        raise ConfigurationError(
            f"cannot change the chunks of a sharded array from {list(spec.chunks)} to {list(zarray['chunks'])}; "
            "delete the array first",
            path,
        )
    attrs = dict(stored.get("attributes") or {})
    if stored.get("dimension_names") is not None:
        attrs[_DIMENSIONS] = list(stored["dimension_names"])
    doc = array_document(zarray, attrs, spec.layout)
    return MetadataPlan({join_path(path, ZARR_JSON): doc}, frozenset({join_path(path, ".zarray")}))


def present(stored: Mapping[str, Any], path: str = "") -> dict[str, dict[str, Any]]:
    """The v2 documents (``.zarray``/``.zgroup``, ``.zattrs``) presenting a stored v3 node; empty when it cannot be.

    A ``v2`` chunk key encoding keeps its separator as ``dimension_separator``
    (zarr-python 2 then uses the keys it wrote).
    """
    docs = {k: dict(v) for k, v in v2_view_of_v3(stored, path).documents.items()}
    encoding = stored.get("chunk_key_encoding") or {}
    if ".zarray" in docs and encoding.get("name") == "v2":
        separator = (encoding.get("configuration") or {}).get("separator")
        if separator is None:
            docs[".zarray"].pop("dimension_separator", None)  # as zarr 2 wrote it: the default, unnamed
        else:
            docs[".zarray"]["dimension_separator"] = separator
    return docs


# -- v2 documents deleted from zarr-python 2's view of a v3 node still stored --------
# A .zgroup/.zarray deleted while the node still presents its .zattrs or chunks is recorded in its
# zarr.json (user guide, "Differences from zarr 2's own stores"):
#     "shardkv.v2_deleted": {"must_understand": false, "documents": [".zarray"]}

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


# -- consolidated metadata ---------------------------------------------------


def stored_zmetadata(presented: Mapping[str, Any], sharded: Iterable[str]) -> dict[str, Any]:
    """The ``.zmetadata`` to store from the one zarr-python 2 wrote: each ``sharded`` path's ``.zarray`` refused.

    zarr-python 2 without shardkv then lists the array and raises on opening
    it (:data:`REFUSED_ZARRAY`); the rest stays as written (a snapshot, as
    zarr 2 keeps it).

    Raises
    ------
    ConfigurationError
        If ``presented`` is not a version 1 consolidated document.
    """
    if presented.get("zarr_consolidated_format") != 1 or not isinstance(presented.get("metadata"), Mapping):
        raise ConfigurationError(f"not a zarr_consolidated_format 1 document: keys {sorted(presented)}")
    metadata = dict(presented["metadata"])
    for path in set(sharded):
        metadata[join_path(path, ".zarray")] = dict(REFUSED_ZARRAY)
    return {**presented, "metadata": metadata}


def presented_zmetadata(stored: Mapping[str, Any], nodes: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The ``.zmetadata`` the proxy presents: the stored one with ``nodes`` (path -> v3 ``zarr.json``) in v2."""
    kept = stored.get("metadata", {})
    metadata = {
        k: v
        for k, v in kept.items()
        if v != REFUSED_ZARRAY and (split_key(k)[0] not in nodes or split_key(k)[1] == ".zattrs")
    }
    for path, doc in nodes.items():
        for name, v2doc in present(doc, path).items():
            if name != ".zattrs" or join_path(path, name) not in kept:  # a stored .zattrs is the snapshot consolidated
                metadata[join_path(path, name)] = v2doc
    return {**stored, "metadata": metadata}


def is_opaque(document: Mapping[str, Any]) -> bool:
    """True for an array document whose data type only shardkv knows (:data:`.v2_codecs.OPAQUE_DATA_TYPE`)."""
    data_type = document.get("data_type")
    return isinstance(data_type, Mapping) and data_type.get("name") == OPAQUE_DATA_TYPE


def _inline(metadata: Mapping[str, Any]) -> dict[str, Any]:
    return {"kind": "inline", "must_understand": False, "metadata": dict(metadata)}


def with_consolidated_metadata(root: Mapping[str, Any], nodes: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The root group's ``zarr.json`` with an inline ``consolidated_metadata`` block of ``nodes``.

    The shape zarr-python 3's ``consolidate_metadata`` writes: every v3 node
    below the root (path -> ``zarr.json``) as :func:`consolidated_entry` makes it.

    Raises
    ------
    ConfigurationError
        If ``root`` is not a v3 group document.
    """
    return consolidated_in_step(root, {**root, "consolidated_metadata": _inline({})}, nodes)


def consolidated_entry(doc: Mapping[str, Any]) -> dict[str, Any] | None:
    """A node's entry in a consolidated block, or ``None`` for an opaque array (zarr-python 3 parses the whole block).

    A group's entry has an empty inline block of its own.
    """
    if is_opaque(doc):
        return None
    entry = {k: v for k, v in doc.items() if k != "consolidated_metadata"}
    if entry.get("node_type") == "group":
        entry["consolidated_metadata"] = _inline({})
    return entry


def has_consolidated(root: Mapping[str, Any] | None) -> bool:
    """True for a v3 group document that holds an inline ``consolidated_metadata`` block."""
    return consolidated_nodes(root) is not None


def consolidated_nodes(root: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The documents (relative path -> document, not a copy) of a v3 group's inline block, or ``None``."""
    if root is None or root.get("zarr_format") != 3 or root.get("node_type") != "group":
        return None
    block = root.get("consolidated_metadata")
    nodes = block.get("metadata") if isinstance(block, Mapping) else None
    return nodes if isinstance(nodes, Mapping) else None


def consolidated_in_step(
    root: Mapping[str, Any], block_of: Mapping[str, Any], changed: Mapping[str, Mapping[str, Any] | None]
) -> dict[str, Any]:
    """``root`` with the consolidated block of ``block_of`` (often ``root``) brought in step with ``changed``.

    ``changed``: node path below the root -> its new v3 document, or ``None``
    for a node deleted (its entry and every entry below it go). zarr-python 3
    takes the block for the whole hierarchy, so the proxy keeps it in step
    with every v3 document it writes or deletes.

    Raises
    ------
    ConfigurationError
        If ``root`` is not a v3 group document or ``block_of`` holds no block.
    """
    if root.get("zarr_format") != 3 or root.get("node_type") != "group":
        raise ConfigurationError(f"the root must be a v3 group document, got {dict(root)!r}")
    if not has_consolidated(block_of):
        raise ConfigurationError("the root document holds no consolidated_metadata block")
    flat = dict(block_of["consolidated_metadata"]["metadata"])
    for path, doc in sorted(((p.strip("/"), d) for p, d in changed.items()), key=lambda i: (i[0].count("/"), i[0])):
        if doc is None:
            prefix = f"{path}/"
            flat = {p: d for p, d in flat.items() if p != path and not p.startswith(prefix)}
            continue
        entry = consolidated_entry(doc)
        if entry is None:
            flat.pop(path, None)
        else:
            flat[path] = entry
    out = {k: v for k, v in root.items() if k != "consolidated_metadata"}
    out["consolidated_metadata"] = {**block_of["consolidated_metadata"], "metadata": dict(sorted(flat.items()))}
    return out


def plan_opaque_blocks(documents: Mapping[str, Mapping[str, Any]], released: Iterable[str] = ()) -> MetadataPlan:
    """The consolidated blocks that keep a hierarchy listable by v3 readers around its opaque arrays.

    One opaque array makes zarr-python 3's listing of its group raise for
    every sibling; a group with a block is listed from it, opaque arrays left
    out (user guide, "Opaque"). So every group on the path of an opaque array
    gets a block of every v3 node below it; a block is shardkv's own when no
    ``.zmetadata`` stands beside its group, and is dropped from a group in
    ``released`` once no opaque array is left below it.

    Parameters
    ----------
    documents : mapping of str to mapping
        Parsed documents by store key: the ``zarr.json`` of every v3 node under
        the groups to plan, and the ``.zmetadata`` keys stored there.
    released : iterable of str
        Paths of groups whose block was needed before a deletion below them.
    """
    nodes: dict[str, Mapping[str, Any]] = {}
    for key, doc in documents.items():
        path, name = split_key(key)
        if name == ZARR_JSON and doc.get("zarr_format") == 3:
            nodes[path] = doc
    needed = {group for path, doc in nodes.items() if path and is_opaque(doc) for group in group_paths(path)}
    freed = {p.strip("/") for p in released} - needed
    writes: dict[str, dict[str, Any]] = {}
    for group, doc in sorted(nodes.items()):
        if doc.get("node_type") != "group":
            continue
        if group in needed:
            prefix = f"{group}/" if group else ""
            below = {p[len(prefix) :]: d for p, d in nodes.items() if p != group and p.startswith(prefix)}
            new = with_consolidated_metadata(doc, below)
        elif group in freed and has_consolidated(doc) and join_path(group, ".zmetadata") not in documents:
            new = {k: v for k, v in doc.items() if k != "consolidated_metadata"}
        else:
            continue
        if new != doc:
            writes[join_path(group, ZARR_JSON)] = new
    return MetadataPlan(writes)
