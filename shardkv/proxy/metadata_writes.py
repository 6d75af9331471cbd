"""Metadata writes through the v2 proxy: sharded arrays and their groups stored as Zarr v3 only (issue 11).

Code above the proxy writes zarr-python 2 documents; :class:`MetadataWriter`
turns them into the stored v3 documents with the pure plans of
:mod:`shardkv.metadata.hierarchy`, writes them through the ``write`` callable
it is given, and records the written nodes in the
:class:`~shardkv.proxy.nodes.NodeTable` (no read back):

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
read-only metadata. A node whose name is one of shardkv's internal names
(``*.shardkv-tmp-*``, ``.shardkv-locks``) is refused (issue 20, item 6).
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Iterable, Mapping

from shardkv.errors import ConfigurationError, MetadataError, ReservedKeyError
from shardkv.format.layout import ShardLayout
from shardkv.keys.paths import join_path, split_key
from shardkv.keys.space import ShardedArray
from shardkv.metadata.documents import dump_json, load_object, load_zarray
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
from shardkv.proxy.nodes import Node, NodeTable, ReadValues, build_node, chunkish_under, sharded_array_of
from shardkv.proxy.options import Options
from shardkv.engine.merge import ShardChange
from shardkv.engine.writeback import WriteBack
from shardkv.storage.kv import ANY, LOCK_DIR, TEMP_MARKER, KVStore

__all__ = ["MetadataWriter", "WriteValues", "check_not_reserved", "writes_to"]

WriteValues = Callable[[Mapping[str, "bytes | memoryview | None"]], None]
"""Writes values to the base store (``None``: delete; deleting a missing key is no error)."""

_HIDDEN_REASON = "the zarr.json of a sharded array is managed by shardkv"
_READ_ONLY = "the metadata of a Zarr v3 array written by another library is read-only; change it with a v3 library"


def writes_to(kv: KVStore) -> WriteValues:
    """The :data:`WriteValues` of a store: one unconditional batch (``None`` deletes)."""

    def write(values: Mapping[str, Any]) -> None:
        if values:
            kv.put_many({key: (value, ANY) for key, value in values.items()})

    return write


def check_not_reserved(key: str) -> None:
    """Refuse a key whose path names one of shardkv's internal files (issue 20, item 6).

    Raises
    ------
    ReservedKeyError
        If a segment of ``key`` is ``.shardkv-locks`` or contains ``.shardkv-tmp-``:
        such an array or group would be hidden from every listing, and its
        files taken for shardkv's temporaries or lock files.
    """
    for segment in key.split("/"):
        if segment == LOCK_DIR or TEMP_MARKER in segment:
            raise ReservedKeyError(
                key,
                f"{segment!r} is a name shardkv keeps for its own files ({LOCK_DIR!r}, '*{TEMP_MARKER}*'); "
                "choose another name for this array or group",
            )


class MetadataWriter:
    """Stores metadata documents written through the proxy (see the module docstring).

    Parameters
    ----------
    nodes : NodeTable
        Node states, updated as documents are written.
    read, write : callable
        Whole values from the base store (:data:`~shardkv.proxy.nodes.ReadValues`)
        and writes to it (:data:`WriteValues`).
    list_keys : callable
        Every stored key under a prefix (to remove shards an earlier array left).
    writer : WriteBack
        Flushes, discards and trims shards around metadata changes.
    options : Options
        Which new arrays are sharded, and their index options.
    """

    def __init__(
        self,
        nodes: NodeTable,
        read: ReadValues,
        write: WriteValues,
        list_keys: Callable[[str], Iterable[str]],
        writer: WriteBack,
        options: Options,
    ) -> None:
        self._nodes, self._read, self._write, self._list = nodes, read, write, list_keys
        self._writer, self._options = writer, options

    def set(self, key: str, value: bytes) -> None:
        """Store a metadata document (``.zarray``, ``.zattrs``, ``.zgroup``, ``.zmetadata``, ...).

        Raises
        ------
        ReservedKeyError
            For the ``zarr.json`` of a presented node, metadata of a v3 array
            written by another library, or a node named like shardkv's own files.
        ConfigurationError
            If a ``.zarray`` changes the chunks or the separator of a sharded
            array, or its sharding is invalid.
        MetadataError
            If a document is not JSON, or a ``.zarray`` field has the wrong type.
        """
        check_not_reserved(key)
        path, name = split_key(key)
        if name == ZARR_JSON and self._nodes.is_hidden(key):
            raise ReservedKeyError(key, _HIDDEN_REASON)
        if name == ".zarray":
            self._on_zarray(path, key, value)
        elif name == ".zattrs":
            self._on_zattrs(path, key, value)
        elif name == ".zgroup":
            self._on_zgroup(path, key, value)
        elif name == ".zmetadata":
            self._on_zmetadata(path, key, value)
        else:
            self._store({key: value})

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
        node = self._nodes.presented(path) if name in (".zarray", ".zattrs", ".zgroup") else None
        if name == ".zarray":
            self._writer.discard_under(path)
        if name in (".zarray", ".zgroup"):
            self._nodes.forget(path)
        if node is None or name not in node.documents:
            if key not in self._read([key]):
                raise KeyError(key)
            self._store({key: None})
            return
        if not node.writable:
            raise ReservedKeyError(key, _READ_ONLY)
        if name == ".zattrs":
            self._apply(plan_attributes(path, node.doc or {}, {}))
        else:
            self._apply(MetadataPlan(deletes=frozenset({join_path(path, ZARR_JSON)})))
        self._nodes.forget(path)

    # -- writing ---------------------------------------------------------------------

    def _store(self, values: Mapping[str, bytes | None]) -> None:
        """Write plain metadata values; the nodes they describe are read again on next use."""
        self._write(values)
        for key in values:
            path, name = split_key(key)
            if name in (".zarray", ".zgroup", ZARR_JSON):
                self._nodes.forget(path)

    def _apply(self, plan: MetadataPlan, arrays: Mapping[str, ShardedArray | None] | None = None) -> dict[str, Node]:
        """Write and delete what ``plan`` says (v3 documents first); the written nodes recorded, not read back.

        ``arrays``: the key mappings of the arrays written, by path, as built from the ``.zarray`` given.
        """
        values = {k: dump_json(doc, key=k, strict=split_key(k)[1] == ZARR_JSON) for k, doc in plan.writes.items()}
        for key in plan.deletes:
            self._nodes.forget(split_key(key)[0])
        if values:
            self._write(values)
        if plan.deletes:
            self._write(dict.fromkeys(sorted(plan.deletes)))
        written: dict[str, Node] = {}
        for key, raw in values.items():
            path, name = split_key(key)
            if name == ZARR_JSON:
                written[path] = self._nodes.keep_written(path, raw, plan.writes[key], (arrays or {}).get(path))
        return written

    # -- attributes and groups ------------------------------------------------------------

    def _group_attributes(self, paths: list[str]) -> dict[str, dict[str, Any] | None]:
        """Each group's attributes: from its v3 ``zarr.json``, else its stored ``.zattrs`` (one batch each)."""
        v3 = self._nodes.v3_nodes(paths)
        out: dict[str, dict[str, Any] | None] = {p: (n.doc or {}).get("attributes") or {} for p, n in v3.items()}
        legacy = [join_path(p, ".zattrs") for p in paths if p not in v3]
        for key, raw in self._read(legacy).items():
            out[split_key(key)[0]] = load_object(key, raw)
        return out

    def _on_zattrs(self, path: str, key: str, raw: bytes) -> None:
        attrs = load_object(key, raw)
        node = self._nodes.presented(path)
        if node is None:
            self._store({key: raw})  # a v2 node, or held until its .zarray / .zgroup arrives
            return
        if not node.writable:
            raise ReservedKeyError(key, _READ_ONLY)
        self._apply(plan_attributes(path, node.doc or {}, attrs), {path: node.array})

    def _on_zgroup(self, path: str, key: str, raw: bytes) -> None:
        load_object(key, raw)
        root = self._nodes.node("")
        if root.doc is None or root.doc.get("node_type") != "group":
            self._store({key: raw})
            self._nodes.set(Node(path))
        else:
            own = self._group_attributes([path])
            self._apply(plan_group(path, own.get(path), self._group_attributes(group_paths(path))))

    def _on_zmetadata(self, path: str, key: str, raw: bytes) -> None:
        """Store a ``.zmetadata`` that opens no back door, and the v3 consolidated block beside it."""
        doc = load_object(key, raw)
        entries = doc.get("metadata")
        if not isinstance(entries, dict):
            raise MetadataError(key, "field 'metadata' must be a JSON object")
        paths = {k.rpartition("/")[0] for k in entries if k.rpartition("/")[2] in (".zarray", ".zgroup")}
        found = self._nodes.v3_nodes(join_path(path, p) for p in paths)
        v3: dict[str, dict[str, Any]] = {}
        for p in paths:
            node = found.get(join_path(path, p).strip("/"))
            if node is not None and node.doc is not None:
                v3[p] = node.doc
        sharded = [p for p, d in v3.items() if d.get("node_type") == "array"]
        stored = stored_zmetadata(doc, sharded) if sharded else doc
        self._write({key: dump_json(stored, key=key)})
        root = v3.get("")
        if root is not None and root.get("node_type") == "group":
            below = {p: d for p, d in v3.items() if p}
            self._apply(MetadataPlan({join_path(path, ZARR_JSON): with_consolidated_metadata(root, below)}))

    # -- arrays ---------------------------------------------------------------------------

    def _on_zarray(self, path: str, key: str, raw: bytes) -> None:
        zarray = load_zarray(key, raw)
        node = self._nodes.node(path)
        if node.array is not None:
            self._update(path, key, node, zarray)
            return
        if node.unsharded:
            self._write({key: raw})  # still an unsharded array
            return
        cps = self._options.chunks_per_shard.for_array(path, len(zarray["shape"]))
        if cps is None:
            self._write({key: raw})
            self._nodes.set(build_node(path, None, raw))
            return
        layout = ShardLayout.v3(cps, self._options.index_location, "little", self._options.index_checksum)
        self._remove_leftovers(path)
        attrs_key = join_path(path, ".zattrs")
        attrs = self._read([attrs_key]).get(attrs_key)
        zattrs = load_object(attrs_key, attrs) if attrs is not None else None
        if path:
            plan = plan_sharded_array(path, zarray, zattrs, layout, self._group_attributes(group_paths(path)))
        else:
            plan = plan_root_array(zarray, zattrs, layout)
        self._apply(plan, {path: sharded_array_of(path, zarray, plan.writes[join_path(path, ZARR_JSON)])})

    def _remove_leftovers(self, path: str) -> None:
        """Delete shards an earlier array at ``path`` left (its metadata deleted by hand): never reinterpret them."""
        self._writer.discard_under(path)
        stale = [k for k in self._list(f"{path}/" if path else "") if chunkish_under(path, k)]
        if stale:
            self._write(dict.fromkeys(stale))
            self._writer.engine.forget()

    def _update(self, path: str, key: str, node: Node, zarray: dict[str, Any]) -> None:
        """A new ``.zarray`` for a sharded array: same chunks and separator, maybe another shape."""
        old = node.array
        if old is None:  # pragma: no cover - the caller checked
            raise ConfigurationError(f"{key}: {path!r} is not a sharded array", path)
        separator = v2_dimension_separator(zarray)
        old_separator = getattr(old.chunk_key_encoding, "separator", None)
        if separator != old_separator:
            raise ConfigurationError(
                f"{key}: cannot change the dimension_separator of a sharded array from "
                f"{old_separator!r} to {separator!r}; delete the array first",
                path,
            )
        old_chunks = list(old.chunks or ())
        if [int(c) for c in zarray["chunks"]] != old_chunks:
            raise ConfigurationError(
                f"{key}: cannot change the chunks of a sharded array from {old_chunks} to {zarray['chunks']}; "
                "delete the array first",
                path,
            )
        if not node.writable:
            raise ReservedKeyError(key, _READ_ONLY)
        self._writer.flush(path)
        new = old.with_shape(zarray["shape"])
        self._apply(plan_zarray_update(path, node.doc or {}, zarray), {path: new})
        if new.shape is not None and old.shape is not None and any(
            n < o for n, o in zip(new.shape, old.shape)
        ):
            self._trim(old, new)

    def _trim(self, old: ShardedArray, new: ShardedArray) -> None:
        """Drop the chunks a shrinking resize left outside the chunk grid."""
        grid = new.chunk_grid_shape
        cps = new.chunks_per_shard
        if grid is None or cps is None or old.shard_grid_shape is None:
            return
        affected: dict[str, ShardChange] = {}
        for coords in itertools.product(*(range(n) for n in old.shard_grid_shape)):
            if any((s + 1) * c > g for s, c, g in zip(coords, cps, grid)):
                affected[new.shard_key(coords)] = ShardChange(new, coords)
        self._writer.write_now(affected)
