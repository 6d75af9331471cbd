"""Which metadata documents a sharded hierarchy stores, and which v2 documents it presents. Pure.

Storage never lies: on storage every sharded array is a Zarr v3
array and nothing else, so no reader that bypasses shardkv can take a shard
for a v2 chunk. This module plans the documents; the proxy does the I/O.

Stored (what any reader sees)::

    zarr.json             v3 group, attributes inside, consolidated_metadata (optional)
    .zmetadata            optional; sharded arrays' ".zarray" replaced by REFUSED_ZARRAY
    grp/zarr.json         v3 group on the path of a sharded array (no .zgroup/.zattrs)
    grp/temp/zarr.json    v3 array: sharding_indexed, v2 chunk key encoding,
                          attributes inside, dimension_names from _ARRAY_DIMENSIONS
    grp/temp/0.0          a shard
    plain/.zarray         an unsharded v2 array: untouched

Presented to zarr-python 2 through the proxy: ``.zarray``/``.zattrs`` of each
sharded array and ``.zgroup``/``.zattrs`` of each v3 group, derived from
``zarr.json`` by :func:`shardkv.metadata.v2_view.v2_view_of_v3` (the same path
as arrays written by zarr-python 3 and tensorstore), and the full ``.zmetadata``.

A :class:`MetadataPlan` lists the keys to write and to delete; applying it in
one ``set_many`` + ``delete_many`` is the proxy's job
(:mod:`shardkv.proxy.metadata_writes` tables which write takes which plan).
Reads are presented by :func:`present` and :func:`presented_zmetadata`.
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
    """Keys to write and keys to delete in the base store, applied together.

    Attributes
    ----------
    writes : dict of str to dict
        Store key (``path/zarr.json``) -> JSON document.
    deletes : frozenset of str
        Store keys to remove (``.zarray``/``.zattrs``/``.zgroup`` a v3 document replaces).
    """

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

    :func:`~shardkv.metadata.v3_view.v3_view_of_v2`, with xarray's
    ``_ARRAY_DIMENSIONS`` attribute moved to ``dimension_names`` (where v3
    readers and xarray look); :func:`present` moves it back.

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
    if names is not None:
        dimension_names = dimension_names_of(names, len(doc["shape"]))
        if dimension_names is None:
            raise ConfigurationError(f"{_DIMENSIONS} must be one string per dimension, got {names!r}")
        doc["dimension_names"] = dimension_names
    return doc


def plan_sharded_array(
    path: str,
    zarray: Mapping[str, Any],
    zattrs: Mapping[str, Any] | None,
    layout: ShardLayout,
    groups: Mapping[str, Mapping[str, Any] | None],
) -> MetadataPlan:
    """The documents to store when a sharded array is created or its ``.zarray`` rewritten.

    Parameters
    ----------
    path : str
        The array's path ("" is not allowed: the root is a group).
    zarray, zattrs : mapping
        The v2 documents the client wrote (``zattrs`` None when it has none).
    layout : ShardLayout
        The sharding decision (chunks_per_shard, index options).
    groups : mapping of str to mapping or None
        For each group on the path (:func:`group_paths`), its current
        attributes (from its stored ``zarr.json`` or ``.zattrs``); a group
        missing here is stored with no attributes.

    Returns
    -------
    MetadataPlan
        Writes the array's and every group's ``zarr.json``; deletes their
        ``.zarray``, ``.zattrs`` and ``.zgroup``.

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
    """The documents that store each of ``groups`` as a v3 group only.

    Parameters
    ----------
    groups : mapping of str to mapping or None
        Group path -> its attributes (``None``: none).

    Returns
    -------
    MetadataPlan
        Writes each group's ``zarr.json`` (:func:`group_document`); deletes
        its ``.zgroup`` and ``.zattrs`` (presented from the ``zarr.json``).
    """
    writes: dict[str, dict[str, Any]] = {}
    deletes: set[str] = set()
    for group, attrs in groups.items():
        group = group.strip("/")
        writes[join_path(group, ZARR_JSON)] = group_document(attrs)
        deletes.update({join_path(group, ".zgroup"), join_path(group, ".zattrs")})
    return MetadataPlan(writes, frozenset(deletes))


def plan_root_array(zarray: Mapping[str, Any], zattrs: Mapping[str, Any] | None, layout: ShardLayout) -> MetadataPlan:
    """The documents to store for a sharded array at the root of a store (a store holding one array).

    Its ``zarr.json`` (:func:`array_document`); its ``.zarray`` and ``.zattrs`` deleted.
    """
    return MetadataPlan({ZARR_JSON: array_document(zarray, zattrs, layout)}, frozenset({".zarray", ".zattrs"}))


def plan_attributes(path: str, stored: Mapping[str, Any], zattrs: Mapping[str, Any]) -> MetadataPlan:
    """The documents to store when ``.zattrs`` is written for a node stored as v3.

    ``_ARRAY_DIMENSIONS`` of an array goes to ``dimension_names``.

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
        names = attrs.pop(_DIMENSIONS, None)
        if names is None:
            doc.pop("dimension_names", None)
        elif (dimension_names := dimension_names_of(names, len(doc["shape"]))) is not None:
            doc["dimension_names"] = dimension_names
        else:
            raise ConfigurationError(f"{_DIMENSIONS} must be one string per dimension, got {names!r}", path)
    doc["attributes"] = attrs
    return MetadataPlan({join_path(path, ZARR_JSON): doc}, frozenset({join_path(path, ".zattrs")}))


def plan_group(
    path: str, zattrs: Mapping[str, Any] | None, groups: Mapping[str, Mapping[str, Any] | None]
) -> MetadataPlan:
    """The documents to store when ``.zgroup`` is written inside a hierarchy whose root is v3.

    The group and every group above it are stored as v3 groups (zarr-python 3
    lists only v3 children of a v3 group); ``groups`` gives the attributes of
    the groups above, as in :func:`plan_sharded_array`.
    """
    path = path.strip("/")
    above = plan_v3_groups({g: groups.get(g) for g in group_paths(path)})
    return above.merged(plan_v3_groups({path: zattrs}))


def plan_zarray_update(path: str, stored: Mapping[str, Any], zarray: Mapping[str, Any]) -> MetadataPlan:
    """The documents to store when ``.zarray`` is rewritten for a sharded array (resize, append).

    The new ``.zarray`` is translated with the stored layout, attributes and
    ``dimension_names``; only what ``.zarray`` says changes.

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
    """The v2 documents (``.zarray``/``.zgroup`` and ``.zattrs``) that present a stored v3 node.

    :func:`~shardkv.metadata.v2_view.v2_view_of_v3`; an array stored with the
    ``v2`` chunk key encoding keeps its separator as ``dimension_separator``,
    so the chunk keys zarr-python 2 uses are the keys it wrote. Empty when the
    node cannot be presented (``v2_view_of_v3(...).problems`` says why).
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


# -- consolidated metadata ---------------------------------------------------


def stored_zmetadata(presented: Mapping[str, Any], sharded: Iterable[str]) -> dict[str, Any]:
    """The ``.zmetadata`` to store, from the one zarr-python 2 wrote through the proxy.

    Each sharded array's ``.zarray`` becomes :data:`REFUSED_ZARRAY`:
    zarr-python 2 without shardkv lists the array and raises on opening it.
    Its ``.zattrs``, groups and unsharded arrays stay as written (a
    consolidated snapshot, as zarr 2 keeps it: deleting or changing the
    array's ``.zattrs`` afterwards leaves this copy alone).

    Parameters
    ----------
    presented : mapping
        ``{"zarr_consolidated_format": 1, "metadata": {key: document}}``.
    sharded : iterable of str
        Paths of the sharded arrays.

    Raises
    ------
    ConfigurationError
        If ``presented`` is not a version 1 consolidated document.
    """
    if presented.get("zarr_consolidated_format") != 1 or not isinstance(presented.get("metadata"), Mapping):
        raise ConfigurationError(f"not a zarr_consolidated_format 1 document: keys {sorted(presented)}")
    hidden = set(sharded)
    metadata: dict[str, Any] = {}
    for key, doc in presented["metadata"].items():
        path, name = split_key(key)
        metadata[key] = dict(REFUSED_ZARRAY) if path in hidden and name == ".zarray" else doc
    for path in hidden:
        metadata[join_path(path, ".zarray")] = dict(REFUSED_ZARRAY)
    return {**presented, "metadata": metadata}


def presented_zmetadata(stored: Mapping[str, Any], nodes: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The ``.zmetadata`` the proxy presents: the stored one with v3 nodes presented in v2.

    Parameters
    ----------
    stored : mapping
        The stored ``.zmetadata`` (see :func:`stored_zmetadata`).
    nodes : mapping of str to mapping
        Path -> stored v3 ``zarr.json`` of each sharded array and v3 group.
    """
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
    """The root group's ``zarr.json`` with zarr-python 3's inline ``consolidated_metadata``.

    The same shape zarr-python 3's ``consolidate_metadata`` writes: one flat
    object of every v3 node below the root by path, each entry as
    :func:`consolidated_entry` makes it (opaque arrays left out, so that one
    of them never makes every node unopenable; opening it by its path still
    fails, alone).

    Parameters
    ----------
    root : mapping
        The root's v3 group document.
    nodes : mapping of str to mapping
        Path -> stored v3 ``zarr.json`` of every v3 node below the root (v2 nodes
        are not part of a v3 hierarchy and are left out by the caller).

    Raises
    ------
    ConfigurationError
        If ``root`` is not a v3 group document.
    """
    if root.get("zarr_format") != 3 or root.get("node_type") != "group":
        raise ConfigurationError(f"the root must be a v3 group document, got {dict(root)!r}")
    flat: dict[str, Any] = {}
    for path, doc in nodes.items():
        entry = consolidated_entry(doc)
        if entry is not None:
            flat[path.strip("/")] = entry
    out = {k: v for k, v in root.items() if k != "consolidated_metadata"}
    out["consolidated_metadata"] = _inline(dict(sorted(flat.items())))
    return out


def consolidated_entry(doc: Mapping[str, Any]) -> dict[str, Any] | None:
    """A node's entry in the root's consolidated block (zarr-python 3's shape), or ``None`` to leave it out.

    Arrays no v3 reader decodes (:func:`is_opaque`) are left out: zarr-python 3
    parses the whole block when it opens the root. A group's entry has an
    empty inline block of its own.
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
    """The documents a v3 group document's inline ``consolidated_metadata`` block holds (relative path -> document).

    ``None`` when ``root`` is no v3 group document or holds no such block.
    The block's own ``metadata`` member is returned, not a copy.
    """
    if root is None or root.get("zarr_format") != 3 or root.get("node_type") != "group":
        return None
    block = root.get("consolidated_metadata")
    nodes = block.get("metadata") if isinstance(block, Mapping) else None
    return nodes if isinstance(nodes, Mapping) else None


def consolidated_in_step(
    root: Mapping[str, Any], block_of: Mapping[str, Any], changed: Mapping[str, Mapping[str, Any] | None]
) -> dict[str, Any]:
    """The root's v3 group document with its consolidated block brought in step with ``changed`` nodes.

    zarr-python 3 takes a root's consolidated block for the whole hierarchy
    (a node missing from it is not found, a stale shape is read as it says),
    so the proxy keeps it in step with every v3 document it writes or deletes
    below the root, not only when zarr 2 consolidates again.

    Parameters
    ----------
    root : mapping
        The root's v3 group document to store (its own block, if any, is replaced).
    block_of : mapping
        The root document whose consolidated block is brought up to date
        (:func:`has_consolidated`); often ``root`` itself.
    changed : mapping of str to mapping or None
        Node path (below the root) -> its new v3 document, or ``None`` for a
        node deleted (its entry and every entry below it go).

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
    for path in sorted((p.strip("/") for p in changed), key=lambda p: (p.count("/"), p)):
        doc = changed[path]
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


def opaque_paths(documents: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The paths (below the root) of the arrays no v3 reader decodes (:func:`is_opaque`) among ``documents``.

    ``documents``: metadata documents by store key; only ``zarr.json`` ones count.
    """
    out = []
    for key, doc in documents.items():
        path, name = split_key(key)
        if name == ZARR_JSON and path and doc.get("node_type") == "array" and is_opaque(doc):
            out.append(path)
    return sorted(out)


def plan_opaque_blocks(documents: Mapping[str, Mapping[str, Any]], released: Iterable[str] = ()) -> MetadataPlan:
    """The consolidated blocks that keep a hierarchy listable by v3 readers around its opaque arrays.

    zarr-python 3 lists a group without consolidated metadata by opening the
    ``zarr.json`` of every child, and one array whose data type it does not
    know (:func:`is_opaque`) makes the whole listing raise: ``members()``,
    ``tree()`` and ``xarray.open_zarr`` fail for every sibling. A group that
    holds a consolidated block is listed from the block alone, which leaves
    opaque arrays out (:func:`consolidated_entry`). So every group on the path
    of an opaque array (the root and each group down to the array's parent,
    so a sub-group opened by its own path lists too) gets a block of every v3
    node below it. Such a block is shardkv's own when no ``.zmetadata``
    (what zarr-python 2's ``consolidate_metadata`` writes) is stored beside
    the group: zarr-python 2 never sees it (groups are presented as
    ``.zgroup``/``.zattrs``). Once no opaque array is left below a group in
    ``released``, its own block is dropped and readers list the store again.

    Parameters
    ----------
    documents : mapping of str to mapping
        Metadata documents by store key, parsed: the ``zarr.json`` of every v3
        node under the groups to plan, and the ``.zmetadata`` keys stored there
        (their content is not used). Groups not among them are left as they are.
    released : iterable of str
        Paths of groups whose block was needed before a deletion below them;
        each loses a block shardkv wrote when no opaque array is left below it.

    Returns
    -------
    MetadataPlan
        The group ``zarr.json`` documents that change (none when all are in step).
    """
    nodes: dict[str, Mapping[str, Any]] = {}
    for key, doc in documents.items():
        path, name = split_key(key)
        if name == ZARR_JSON and doc.get("zarr_format") == 3:
            nodes[path] = doc
    needed = {group for path in opaque_paths(documents) for group in group_paths(path)}
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
