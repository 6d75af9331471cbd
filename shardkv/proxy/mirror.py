"""Metadata writes through the proxy: sharded arrays and their groups stored as Zarr v3 only (issue 11).

Code above the proxy writes zarr-python 2 documents; :class:`MetadataMirror`
turns them into the stored v3 documents with the pure plans of
:mod:`shardkv.metadata.hierarchy`, applied by
:meth:`shardkv.proxy.presenting.PresentingAdapter.apply`:

=====================================  ==============================================
written through the proxy              stored
=====================================  ==============================================
``.zarray`` of a new sharded array     its ``zarr.json`` and one for every group above
                                       (:func:`plan_sharded_array`); no ``.zarray``
``.zarray`` of a sharded array         its ``zarr.json`` (:func:`plan_zarray_update`);
                                       a shrink drops the chunks left outside the grid
``.zattrs`` of a v3 node               inside its ``zarr.json`` (:func:`plan_attributes`)
``.zgroup`` under a v3 root            a v3 group ``zarr.json`` (:func:`plan_group`)
``.zmetadata``                         :func:`stored_zmetadata`, and the root
                                       ``zarr.json`` with consolidated metadata
anything else                          as it is (unsharded arrays, v2 hierarchies)
=====================================  ==============================================

A ``.zattrs`` written before its node's ``.zarray`` is stored as it is and
taken into the ``zarr.json`` when the ``.zarray`` arrives. Arrays written by
zarr-python 3 or tensorstore (another chunk key encoding than ``v2``) keep
read-only metadata.
"""

from __future__ import annotations

import itertools
from typing import Any, Literal

from shardkv.errors import ConfigurationError, MetadataError, ReservedKeyError
from shardkv.format.layout import ShardLayout
from shardkv.keys.paths import join_path, path_prefix, split_key
from shardkv.keys.space import ShardedArray
from shardkv.metadata.chunks_per_shard import ChunksPerShardRule
from shardkv.metadata.documents import load_object, load_zarray
from shardkv.metadata.hierarchy import (
    ZARR_JSON,
    MetadataPlan,
    group_paths,
    plan_attributes,
    plan_group,
    plan_root_array,
    plan_sharded_array,
    plan_zarray_update,
    stored_zmetadata,
    with_consolidated_metadata,
)
from shardkv.metadata.v3_view import v2_dimension_separator
from shardkv.proxy.nodes import (
    NOT_ARRAY,
    UNSHARDED,
    NodeCache,
    ShardedNode,
    UnshardedArray,
    chunkish_under,
    sharded_node,
)
from shardkv.proxy.presenting import PresentingAdapter, V3Node
from shardkv.engine.merge import ShardChange
from shardkv.engine.writeback import WriteBack

__all__ = ["MetadataMirror"]

_HIDDEN_REASON = "the zarr.json of a sharded array is managed by shardkv"
_READ_ONLY = "the metadata of a Zarr v3 array written by another library is read-only; change it with a v3 library"


def _writable(doc: dict[str, Any]) -> bool:
    """Whether zarr-python 2 may change this v3 document through the proxy (groups, shardkv's arrays)."""
    if doc.get("node_type") != "array":
        return True
    return (doc.get("chunk_key_encoding") or {}).get("name") == "v2"


class MetadataMirror:
    """Stores metadata documents written through the proxy (see the module docstring).

    Parameters
    ----------
    base : PresentingAdapter
        The base store, presenting v3 nodes.
    nodes : NodeCache
        Node states, updated as documents are written.
    writer : WriteBack
        Flushes and trims shards around metadata changes.
    rule : ChunksPerShardRule
        Which new arrays are sharded.
    index_location, index_checksum
        Index options of new sharded arrays.
    """

    def __init__(
        self,
        base: PresentingAdapter,
        nodes: NodeCache,
        writer: WriteBack,
        rule: ChunksPerShardRule,
        index_location: Literal["start", "end"],
        index_checksum: bool,
    ) -> None:
        self._base, self._nodes, self._writer, self._rule = base, nodes, writer, rule
        self.index_location = index_location
        self.index_checksum = index_checksum

    def _presented(self, path: str) -> V3Node | None:
        node = self._base.node(path)
        return node if node is not None and node.documents else None

    def set(self, key: str, value: bytes) -> None:
        """Store a metadata document (``.zarray``, ``.zattrs``, ``.zgroup``, ``.zmetadata``, ...).

        Raises
        ------
        ReservedKeyError
            For the ``zarr.json`` of a presented node, or metadata of a v3
            array written by another library.
        ConfigurationError
            If a ``.zarray`` changes the chunks or the separator of a sharded
            array, or its sharding is invalid.
        MetadataError
            If a document is not JSON, or a ``.zarray`` field has the wrong type.
        """
        path, name = split_key(key)
        if name == ZARR_JSON and self._nodes.is_hidden(key):
            raise ReservedKeyError(key, _HIDDEN_REASON)
        handler = {
            ".zarray": self._on_zarray, ".zattrs": self._on_zattrs, ".zgroup": self._on_zgroup,
            ".zmetadata": self._on_zmetadata,
        }.get(name)  # fmt: skip
        if handler is None:
            self._base.set(key, value)
        else:
            handler(path, key, value)

    def delete(self, key: str) -> None:
        """Delete a metadata document; a sharded array's ``.zarray`` takes its ``zarr.json`` along.

        Raises
        ------
        KeyError
            If nothing is stored (or presented) at ``key``.
        ReservedKeyError
            For the ``zarr.json`` of a presented node, or metadata of a v3
            array written by another library.
        """
        path, name = split_key(key)
        if name == ZARR_JSON and self._nodes.is_hidden(key):
            raise ReservedKeyError(key, _HIDDEN_REASON)
        node = self._presented(path) if name in (".zarray", ".zattrs", ".zgroup") else None
        if name == ".zarray":
            self._writer.discard_under(path)
        if name in (".zarray", ".zgroup"):
            self._nodes.forget(path)
        if node is None or name not in node.documents:
            self._base.delete(key)
            return
        if not _writable(node.doc):
            raise ReservedKeyError(key, _READ_ONLY)
        if name == ".zattrs":
            self._apply(plan_attributes(path, node.doc, {}))
        else:
            self._apply(MetadataPlan(deletes=frozenset({join_path(path, ZARR_JSON)})))
        self._nodes.forget(path)

    def _apply(self, plan: MetadataPlan) -> None:
        self._base.apply(plan)

    # -- attributes and groups ------------------------------------------------

    def _group_attributes(self, paths: list[str]) -> dict[str, dict[str, Any] | None]:
        """Each group's attributes: from its v3 ``zarr.json``, else its stored ``.zattrs`` (one batch each)."""
        v3 = self._base.nodes(paths)
        out: dict[str, dict[str, Any] | None] = {p: v3[p].doc.get("attributes") or {} for p in v3}
        legacy = [join_path(p, ".zattrs") for p in paths if p not in v3]
        for key, raw in self._base.get_many(legacy).items():
            out[split_key(key)[0]] = load_object(key, raw)
        return out

    def _on_zattrs(self, path: str, key: str, raw: bytes) -> None:
        attrs = load_object(key, raw)
        node = self._presented(path)
        if node is None:
            self._base.set(key, raw)  # a v2 node, or held until its .zarray / .zgroup arrives
            return
        if not _writable(node.doc):
            raise ReservedKeyError(key, _READ_ONLY)
        plan = plan_attributes(path, node.doc, attrs)
        self._apply(plan)
        state = self._nodes.state(path)
        if isinstance(state, ShardedNode):
            self._nodes.set(path, ShardedNode(state.array, plan.writes[join_path(path, ZARR_JSON)]))

    def _on_zgroup(self, path: str, key: str, raw: bytes) -> None:
        load_object(key, raw)
        root = self._base.node("")
        if root is None or root.doc.get("node_type") != "group":
            self._base.set(key, raw)
        else:
            own = self._group_attributes([path])
            self._apply(plan_group(path, own.get(path), self._group_attributes(group_paths(path))))
        self._nodes.set(path, NOT_ARRAY)

    def _on_zmetadata(self, path: str, key: str, raw: bytes) -> None:
        """Store a ``.zmetadata`` that opens no back door, and the v3 consolidated block beside it."""
        doc = load_object(key, raw)
        entries = doc.get("metadata")
        if not isinstance(entries, dict):
            raise MetadataError(key, "field 'metadata' must be a JSON object")
        paths = {k.rpartition("/")[0] for k in entries if k.rpartition("/")[2] in (".zarray", ".zgroup")}
        found = self._base.nodes(join_path(path, p) for p in paths)
        v3 = {p: found[join_path(path, p).strip("/")].doc for p in paths if join_path(path, p).strip("/") in found}
        sharded = [p for p, d in v3.items() if d.get("node_type") == "array"]
        stored = stored_zmetadata(doc, sharded) if sharded else doc
        plan = MetadataPlan({key: stored})
        root = v3.get("")
        if root is not None and root.get("node_type") == "group":
            below = {p: d for p, d in v3.items() if p}
            plan = plan.merged(MetadataPlan({join_path(path, ZARR_JSON): with_consolidated_metadata(root, below)}))
        self._apply(plan)

    # -- arrays -------------------------------------------------------------

    def _on_zarray(self, path: str, key: str, raw: bytes) -> None:
        zarray = load_zarray(key, raw)
        state = self._nodes.state(path)
        if isinstance(state, ShardedNode):
            self._update(path, key, state, zarray)
            return
        if isinstance(state, UnshardedArray):
            self._base.set(key, raw)
            return
        cps = self._rule.for_array(path, len(zarray["shape"]))
        if cps is None:
            self._base.set(key, raw)
            self._nodes.set(path, UNSHARDED)
            return
        layout = ShardLayout.v3(cps, self.index_location, "little", self.index_checksum)
        self._remove_leftovers(path)
        attrs = self._base.get_many([join_path(path, ".zattrs")]).get(join_path(path, ".zattrs"))
        zattrs = load_object(join_path(path, ".zattrs"), attrs) if attrs is not None else None
        if path:
            plan = plan_sharded_array(path, zarray, zattrs, layout, self._group_attributes(group_paths(path)))
        else:
            plan = plan_root_array(zarray, zattrs, layout)
        self._apply(plan)
        self._nodes.set(path, sharded_node(path, zarray, plan.writes[join_path(path, ZARR_JSON)]))

    def _remove_leftovers(self, path: str) -> None:
        """Delete shards an earlier array at ``path`` left (its metadata deleted by hand): never reinterpret them."""
        self._writer.discard_under(path)
        stale = [k for k in self._base.iter_keys(path_prefix(path)) if chunkish_under(path, k)]
        if stale:
            self._base.delete_many(stale)
            self._writer.engine.forget()

    def _update(self, path: str, key: str, node: ShardedNode, zarray: dict[str, Any]) -> None:
        """A new ``.zarray`` for a sharded array: same chunks and separator, maybe another shape."""
        old = node.array
        separator = v2_dimension_separator(zarray)
        if separator != old.chunk_key_encoding.separator:  # type: ignore[attr-defined]
            raise ConfigurationError(
                f"{key}: cannot change the dimension_separator of a sharded array from "
                f"{old.chunk_key_encoding.separator!r} to {separator!r}; delete the array first",  # type: ignore[attr-defined]
                path,
            )
        if [int(c) for c in zarray["chunks"]] != list(old.chunks):
            raise ConfigurationError(
                f"{key}: cannot change the chunks of a sharded array from {list(old.chunks)} to {zarray['chunks']}; "
                "delete the array first",
                path,
            )
        if not _writable(node.view):
            raise ReservedKeyError(key, _READ_ONLY)
        self._writer.flush(path)
        plan = plan_zarray_update(path, node.view, zarray)
        self._apply(plan)
        new = old.with_shape(zarray["shape"])
        self._nodes.set(path, ShardedNode(new, plan.writes[join_path(path, ZARR_JSON)]))
        if any(n < o for n, o in zip(new.shape, old.shape)):
            self._trim(old, new)

    def _trim(self, old: ShardedArray, new: ShardedArray) -> None:
        """Drop the chunks a shrinking resize left outside the chunk grid."""
        grid = new.chunk_grid_shape
        affected = {}
        for coords in itertools.product(*(range(n) for n in old.shard_grid_shape)):
            if any((s + 1) * c > g for s, c, g in zip(coords, new.chunks_per_shard, grid)):
                affected[new.shard_key(coords)] = ShardChange(new, coords)
        self._writer.write_now(affected)
