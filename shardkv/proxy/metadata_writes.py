"""Metadata writes through the v2 proxy: zarr-python 2 documents stored as Zarr v3 where arrays are sharded.

What each written document becomes, deletes, and the "v3 all the way down"
rule: docs/architecture.md, "Metadata writes of the zarr 2 proxy".
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shardkv.engine.locks import ShardLocks
from shardkv.engine.merge import ShardChange
from shardkv.engine.options import Options
from shardkv.engine.retry import WRITE_ATTEMPTS, WRITE_BACKOFF, attempts
from shardkv.engine.writeback import WriteBack
from shardkv.errors import ConcurrentUpdateError, ConfigurationError, MetadataError, ReservedKeyError, UnsupportedError
from shardkv.format.layout import ShardLayout
from shardkv.keys.paths import chunkish_under, join_path, path_prefix, split_key
from shardkv.keys.space import ShardedArray
from shardkv.metadata.all_v3 import plan_v3_down
from shardkv.metadata.documents import dump_json, load_json, load_object, load_zarray
from shardkv.metadata.hierarchy import (
    ZARR_JSON,
    MetadataPlan,
    consolidated_in_step,
    group_paths,
    has_consolidated,
    is_opaque,
    plan_attributes,
    plan_group,
    plan_opaque_blocks,
    plan_root_array,
    plan_sharded_array,
    plan_v3_groups,
    plan_zarray_update,
    stored_zmetadata,
    with_consolidated_metadata,
    with_deleted,
)
from shardkv.metadata.v3_view import v2_dimension_separator, v3_view_of_v2
from shardkv.proxy.nodes import Node, NodeTable, build_node, sharded_array_of
from shardkv.storage.kv import ANY, NO_VALUE, Generation, KVStore, check_not_reserved

_HIDDEN_REASON = "the zarr.json of a sharded array is managed by shardkv"
_READ_ONLY = "the metadata of a Zarr v3 array written by another library is read-only; change it with a v3 library"
_V2_NAMES = (".zarray", ".zattrs", ".zgroup", ZARR_JSON)


@dataclass(frozen=True)
class _BlockChange:
    """This write's change to the consolidated block of one group, re-applied to what is stored there.

    Attributes
    ----------
    doc : dict or None
        The group's own document this write stores (its block is the stored
        one brought in step); ``None``: the stored document, only its block
        brought in step.
    below : dict
        Node path relative to the group -> its new v3 document, ``None`` for a
        node deleted (:func:`~shardkv.metadata.hierarchy.consolidated_in_step`).
    """

    doc: dict[str, Any] | None
    below: dict[str, dict[str, Any] | None] = field(default_factory=dict)

    def applied(self, stored: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """The group document to store over ``stored`` (read now); ``None``: nothing to write.

        A group that lost its block meanwhile (or was deleted) gets only the
        document this write stores, as it is.
        """
        if stored is None or not has_consolidated(stored):
            return self.doc
        return consolidated_in_step(stored if self.doc is None else self.doc, stored, self.below)


def _grid_change(old: ShardedArray, zarray: Mapping[str, Any]) -> str | None:
    """What ``zarray`` changes of the sharded array ``old``'s chunks or separator (a message), ``None``: nothing."""
    separator, old_separator = v2_dimension_separator(zarray), getattr(old.chunk_key_encoding, "separator", None)
    if separator != old_separator:
        return f"the dimension_separator of a sharded array from {old_separator!r} to {separator!r}"
    if [int(c) for c in zarray["chunks"]] != list(old.chunks or ()):
        return f"the chunks of a sharded array from {list(old.chunks or ())} to {zarray['chunks']}"
    return None


def _json_object(key: str, raw: Any) -> dict[str, Any] | None:
    """The JSON object stored at ``key`` (``None``: not JSON, or not an object: no reader takes it as a node)."""
    try:
        doc = load_json(key, raw)
    except MetadataError:
        return None
    return doc if isinstance(doc, dict) else None


def _json_objects(values: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The values among ``values`` (by key) that are JSON objects, parsed (:func:`_json_object`)."""
    return {key: doc for key, raw in values.items() if (doc := _json_object(key, raw)) is not None}


class MetadataWriter:
    """Stores metadata documents written through the proxy (docs/architecture.md, "Metadata writes").

    Parameters
    ----------
    nodes : NodeTable
        Node states, updated as documents are written.
    writer : WriteBack
        The proxy's write-back layer (flushes, discards and trims shards around
        metadata changes); its engine gives the base store, locks and options.

    Notes
    -----
    A consolidated block changed by a write is merged into the group
    ``zarr.json`` read fresh under the engine's lock of that key and put
    conditioned on its generation (at most
    :data:`~shardkv.engine.retry.WRITE_ATTEMPTS` rounds). Across processes
    this holds where the engine's guarantee does (mode ``"files"``,
    conditional puts); in modes ``"process"``/``"conditional"`` over data in
    this process, within the process; in mode ``"none"`` the conditional put alone.
    """

    def __init__(self, nodes: NodeTable, writer: WriteBack) -> None:
        self._nodes, self._writer = nodes, writer
        self._kv: KVStore = writer.engine.kv
        self._locks: ShardLocks = writer.engine.locks
        self._options: Options = writer.engine.options

    def _put(self, values: Mapping[str, bytes | memoryview | None]) -> None:
        """Write ``values`` unconditionally in one batch (``None`` deletes; a missing key is no error)."""
        if values:
            self._kv.put_many({key: (value, ANY) for key, value in values.items()})

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
        """Delete a metadata document, that document alone (:meth:`_delete_presented` for a v3 node's).

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
        node = self._nodes.node(path) if name in (".zarray", ".zattrs", ".zgroup") else None
        mirrored = name in (".zarray", ".zattrs") and self._nodes.node(path).mirrored
        if name in (".zarray", ".zgroup"):
            self._nodes.forget(path)
        if node is None or name not in node.documents:
            if key not in self._kv.values([key]):
                raise KeyError(key)  # nothing deleted: buffered chunk writes stay too
            if name == ".zarray":  # the array goes: what write-back holds of it must not be written after
                self._writer.discard_under(path)
            self._store({key: None})
            if mirrored and name == ".zarray":  # the array is gone for v3 readers too
                self._apply(MetadataPlan(deletes=frozenset({join_path(path, ZARR_JSON)})))
            elif mirrored:
                self._mirror(path, {".zattrs": None})
            return
        if not node.writable:
            raise ReservedKeyError(key, _READ_ONLY)
        self._delete_presented(path, name, node)

    def _delete_presented(self, path: str, name: str, node: Node) -> None:
        """Delete the presented document ``name`` of ``node``; its ``zarr.json`` goes with the last thing it presents.

        The root group's stays (it keeps the hierarchy v3).
        """
        attrs = name == ".zattrs"
        # the node stays while it presents its .zarray/.zgroup, or attributes beside the one deleted
        stays = (attrs and not node.deleted) or (not attrs and ".zattrs" in node.documents)
        if path and not stays and not self._still_seen(path, node):  # nothing of the node is left
            self._drop(path)
            return
        doc = node.doc or {}
        if attrs:
            plan = plan_attributes(path, doc, {})
        else:
            plan = MetadataPlan({join_path(path, ZARR_JSON): with_deleted(doc, name)})
        self._apply(plan, {path: node.array})

    def emptied(self, path: str) -> None:
        """Delete the ``zarr.json`` of the sharded array at ``path`` once it presents nothing (last chunk gone)."""
        node = self._nodes.node(path)
        if node.array is not None and not node.documents and node.deleted and not self._still_seen(path, node):
            self._drop(path)

    def _drop(self, path: str) -> None:
        """Delete the ``zarr.json`` of a node that presents nothing any more."""
        self._apply(MetadataPlan(deletes=frozenset({join_path(path, ZARR_JSON)})))
        self._nodes.forget(path)
        self._opaque_blocks(removed=path)

    def _still_seen(self, path: str, node: Node) -> bool:
        """Whether the sharded array ``node`` still has chunks, or an entry in a stored ``.zmetadata`` above it."""
        if node.array is None:
            return False
        for key, raw in self._kv.values([join_path(g, ".zmetadata") for g in group_paths(path)]).items():
            metadata = (_json_object(key, raw) or {}).get("metadata")
            if (
                isinstance(metadata, dict)
                and join_path(path[len(path_prefix(split_key(key)[0])) :], ".zarray") in metadata
            ):
                return True
        return self._has_chunks(path)

    def _has_chunks(self, path: str) -> bool:
        """Whether chunk-like keys are stored under ``path`` (what write-back holds of it written first)."""
        self._writer.flush(path)
        return any(chunkish_under(path, k) for k in self._kv.list_prefix(path_prefix(path)))

    def removed(self, path: str) -> None:
        """Bring the consolidated blocks above ``path`` in step after ``rmdir`` deleted everything under it."""
        path = path.strip("/")
        if not path:
            return
        _, blocks = self._in_step(MetadataPlan(deletes=frozenset({join_path(path, ZARR_JSON)})))
        self._write_blocks(blocks)
        self._opaque_blocks(removed=path)

    # -- writing ---------------------------------------------------------------------

    def _store(self, values: Mapping[str, bytes | None]) -> None:
        """Write plain metadata values; the nodes they describe are read again on next use."""
        self._put(values)
        for key in values:
            path, name = split_key(key)
            if name in (".zarray", ".zgroup", ZARR_JSON):
                self._nodes.forget(path)

    def _apply(
        self,
        plan: MetadataPlan,
        arrays: Mapping[str, ShardedArray | None] | None = None,
        mirrors: Iterable[str] = (),
        unblocked: Iterable[str] = (),
    ) -> None:
        """Write and delete what ``plan`` says, then the consolidated blocks above; record the written nodes.

        ``arrays``: key mappings of the arrays written, by path; ``mirrors``:
        paths whose ``zarr.json`` mirrors an unsharded array; ``unblocked``:
        groups whose document drops its consolidated block on purpose.
        """
        root = plan.writes.get(ZARR_JSON)
        becomes_v3 = root is not None and root.get("node_type") == "group" and not self._hierarchy_is_v3()
        plan, blocks = self._in_step(plan, frozenset(unblocked))
        values = {k: dump_json(doc, key=k) for k, doc in plan.writes.items()}
        for key in plan.deletes:
            self._nodes.forget(split_key(key)[0])
        self._put(values)
        written = self._write_blocks(blocks)
        self._put(dict.fromkeys(sorted(plan.deletes)))
        mirrored = set(mirrors)
        for key, raw in values.items():
            path, name = split_key(key)
            if name == ZARR_JSON:
                array = (arrays or {}).get(path)
                written[path] = self._nodes.keep_written(path, raw, plan.writes[key], array, path in mirrored)
        if becomes_v3:
            self._describe_v2_nodes()
        self._opaque_blocks(written=[p for p, n in written.items() if p and n.doc is not None and is_opaque(n.doc)])

    # -- v3 all the way down ------------------------------------------

    def _hierarchy_is_v3(self) -> bool:
        """True when the store's root is a v3 group (some array below it is sharded, or was)."""
        root = self._nodes.node("").doc
        return root is not None and root.get("node_type") == "group"

    def _in_step(
        self, plan: MetadataPlan, unblocked: frozenset[str] = frozenset()
    ) -> tuple[MetadataPlan, dict[str, _BlockChange]]:
        """``(plan, blocks)``: the group ``zarr.json`` keys whose stored block ``plan`` changes, taken out of it.

        A group document written with a block of its own is brought in step in
        ``plan``; one written without keeps its stored block unless ``unblocked``.
        """
        changed: dict[str, dict[str, Any] | None] = {
            split_key(k)[0]: doc for k, doc in plan.writes.items() if split_key(k)[1] == ZARR_JSON
        }
        changed.update((split_key(k)[0], None) for k in plan.deletes if split_key(k)[1] == ZARR_JSON)
        candidates = {g for p in changed for g in group_paths(p)}
        candidates.update(p for p, d in changed.items() if d is not None and d.get("node_type") == "group")
        if not changed or not candidates:
            return plan, {}
        stored = {g: n.doc for g, n in self._nodes.nodes(sorted(candidates)).items()}
        extra: dict[str, dict[str, Any]] = {}
        blocks: dict[str, _BlockChange] = {}
        for group in sorted(candidates):
            before = stored.get(group)
            if not has_consolidated(before) or group in unblocked or (group in changed and changed[group] is None):
                continue
            prefix = path_prefix(group)
            below = {p[len(prefix) :]: d for p, d in changed.items() if p != group and p.startswith(prefix)}
            new = changed.get(group)
            if not below and new is None:
                continue
            key = join_path(group, ZARR_JSON)
            if new is not None and has_consolidated(new):  # the plan's own block (a .zmetadata written)
                extra[key] = consolidated_in_step(new, new, below)
            else:
                blocks[key] = _BlockChange(new, below)
        kept = MetadataPlan({k: d for k, d in plan.writes.items() if k not in blocks}, plan.deletes)
        return (kept.merged(MetadataPlan(extra)) if extra else kept), blocks

    def _write_blocks(self, blocks: Mapping[str, _BlockChange]) -> dict[str, Node]:
        """Read-modify-write the group documents of ``blocks`` under the engine's locks; the nodes written.

        ``ConcurrentUpdateError`` (naming the key) if a group's put lost in every round.
        """
        if not blocks:
            return {}
        todo = dict(blocks)
        written: dict[str, Node] = {}
        lost = 0
        # each group's lock file in its own directory: the same file whatever root the store was opened at
        with self._locks.hold(sorted(todo), {key: path_prefix(split_key(key)[0]) for key in todo}):
            for _ in attempts(WRITE_ATTEMPTS, WRITE_BACKOFF):
                keys = sorted(todo)
                puts: dict[str, tuple[bytes, Generation]] = {}
                docs: dict[str, dict[str, Any]] = {}
                for key, result in zip(keys, self._kv.get_many([(k, None, ANY) for k in keys]), strict=True):
                    doc = todo[key].applied(_json_object(key, result.whole()) if result.found else None)
                    if doc is None:  # nothing to bring in step any more
                        self._nodes.forget(split_key(key)[0])
                        continue
                    docs[key] = doc
                    puts[key] = (dump_json(doc, key=key), result.generation if result.found else NO_VALUE)
                won = self._kv.put_many(puts) if puts else {}
                for key, generation in won.items():
                    if generation is not None:
                        path = split_key(key)[0]
                        written[path] = self._nodes.keep_written(path, puts[key][0], docs[key])
                todo = {k: todo[k] for k, g in won.items() if g is None}
                if not todo:
                    return written
                lost += 1
        raise ConcurrentUpdateError(sorted(todo)[0], WRITE_ATTEMPTS, lost)

    def _opaque_blocks(self, written: Iterable[str] = (), removed: str | None = None) -> None:
        """Keep a consolidated block at each group on the path of an opaque array, and only there.

        ``written``: opaque arrays just written; ``removed``: a path just deleted
        (why: :func:`~shardkv.metadata.hierarchy.plan_opaque_blocks`).
        """
        above = sorted({g for p in written for g in group_paths(p)})
        lacking = [g for g, n in self._nodes.nodes(above).items() if n.doc is not None and not has_consolidated(n.doc)]
        released: list[str] = []
        if removed is not None:
            with_block = [g for g, n in self._nodes.v3_nodes(group_paths(removed)).items() if has_consolidated(n.doc)]
            if with_block:
                found = self._kv.values([join_path(g, ".zmetadata") for g in with_block])
                released = [g for g in with_block if join_path(g, ".zmetadata") not in found]
        concerned = lacking + released
        if not concerned:
            return
        prefix = path_prefix(posixpath.commonpath(concerned))  # the deepest group above them all
        keys = [k for k in self._kv.list_prefix(prefix) if split_key(k)[1] in (ZARR_JSON, ".zmetadata")]
        # a .zmetadata counts by its key alone (it marks a block the user asked for): not read
        documents: dict[str, Mapping[str, Any]] = {k: {} for k in keys if split_key(k)[1] != ZARR_JSON}
        documents.update(_json_objects(self._kv.values([k for k in keys if split_key(k)[1] == ZARR_JSON])))
        plan = plan_opaque_blocks(documents, released)
        self._apply(plan, unblocked=[split_key(k)[0] for k, doc in plan.writes.items() if not has_consolidated(doc)])

    def _describe_v2_nodes(self) -> None:
        """Describe every v2 group and unsharded array in v3, once, as the root becomes a v3 group."""
        keys = [k for k in self._kv.list_prefix("") if split_key(k)[1] in _V2_NAMES]
        plan, _refused = plan_v3_down(_json_objects(self._kv.values(keys)))
        self._apply_v3_down(plan)

    def _apply_v3_down(self, plan: MetadataPlan) -> None:
        """Apply a :func:`~shardkv.metadata.all_v3.plan_v3_down` plan (its arrays are mirrors)."""
        self._apply(plan, mirrors=[split_key(k)[0] for k, d in plan.writes.items() if d.get("node_type") == "array"])

    def _mirror(self, path: str, written: Mapping[str, Mapping[str, Any] | None]) -> None:
        """Bring the ``zarr.json`` mirror of the unsharded array at ``path`` in step with its v2 documents.

        ``written``: the ``.zarray`` or ``.zattrs`` just written (``None``: deleted) by name; the other is read.
        An array with no v3 data type loses its mirror.
        """
        docs = dict(written)
        for key, raw in self._kv.values([join_path(path, n) for n in (".zarray", ".zattrs") if n not in docs]).items():
            name = split_key(key)[1]
            docs[name] = load_zarray(key, raw) if name == ".zarray" else load_object(key, raw)
        zarray = docs.get(".zarray")
        if zarray is None:
            return
        key = join_path(path, ZARR_JSON)
        try:
            doc = v3_view_of_v2(zarray, docs.get(".zattrs")).metadata
        except (ConfigurationError, UnsupportedError):
            doc = {}
        if not doc:
            if self._nodes.node(path).mirrored:
                self._apply(MetadataPlan(deletes=frozenset({key})))
            return
        above = group_paths(path)
        v3 = self._nodes.v3_nodes(above)
        groups = plan_v3_groups(self._group_attributes([g for g in above if g not in v3]))
        self._apply(groups.merged(MetadataPlan({key: doc})), mirrors=[path])

    # -- attributes and groups ------------------------------------------------------------

    def _group_attributes(self, paths: list[str]) -> dict[str, dict[str, Any] | None]:
        """Each group's attributes: from its v3 ``zarr.json``, else its stored ``.zattrs`` (one batch each)."""
        v3 = self._nodes.v3_nodes(paths)
        out: dict[str, dict[str, Any] | None] = {p: (n.doc or {}).get("attributes") or {} for p, n in v3.items()}
        legacy = [join_path(p, ".zattrs") for p in paths if p not in v3]
        for key, raw in self._kv.values(legacy).items():
            out[split_key(key)[0]] = load_object(key, raw)
        return out

    def _on_zattrs(self, path: str, key: str, raw: bytes) -> None:
        attrs = load_object(key, raw)
        node = self._nodes.node(path)  # presented, or deleted from zarr 2's view: the attributes go in its zarr.json
        if not node.documents and not node.deleted:
            self._store({key: raw})  # a v2 node, or held until its .zarray / .zgroup arrives
            if node.unsharded and (node.mirrored or self._hierarchy_is_v3()):
                self._mirror(path, {".zattrs": attrs})
            return
        if not node.writable:
            raise ReservedKeyError(key, _READ_ONLY)
        self._apply(plan_attributes(path, node.doc or {}, attrs), {path: node.array})

    def _on_zgroup(self, path: str, key: str, raw: bytes) -> None:
        load_object(key, raw)
        if (node := self._nodes.node(path)).deleted:
            self._written_again(path, key, node, None)
        if not self._hierarchy_is_v3():
            self._store({key: raw})
            self._nodes.set(Node(path))
        else:
            attrs = self._group_attributes([*group_paths(path), path])  # the group's own and those above it
            self._apply(plan_group(path, attrs.get(path), attrs))

    def _on_zmetadata(self, path: str, key: str, raw: bytes) -> None:
        """Store a ``.zmetadata`` that opens no back door, and the v3 consolidated block beside it."""
        doc = load_object(key, raw)
        entries = doc.get("metadata")
        if not isinstance(entries, dict):
            raise MetadataError(key, "field 'metadata' must be a JSON object")
        paths = {split_key(k)[0] for k in entries if split_key(k)[1] in (".zarray", ".zgroup")}
        found = self._nodes.v3_nodes(join_path(path, p) for p in paths)
        if self._hierarchy_is_v3() and len(found) < len(paths):  # v2 nodes it lists: described from it
            listed = {join_path(path, k): v for k, v in entries.items() if isinstance(v, dict)}
            known = set(found) | set(self._nodes.v3_nodes([*group_paths(path), path]))
            plan, _refused = plan_v3_down(listed, known)
            self._apply_v3_down(plan)
            found = self._nodes.v3_nodes(join_path(path, p) for p in paths)
        nodes = {p: node for p in paths if (node := found.get(join_path(path, p).strip("/"))) is not None}
        v3 = {p: node.doc for p, node in nodes.items() if node.doc is not None}
        sharded = [p for p, d in v3.items() if d.get("node_type") == "array" and not nodes[p].mirrored]
        stored = stored_zmetadata(doc, sharded) if sharded else doc
        self._put({key: dump_json(stored, key=key)})
        root = v3.get("")
        if root is not None and root.get("node_type") == "group":
            below = {p: d for p, d in v3.items() if p}
            self._apply(MetadataPlan({join_path(path, ZARR_JSON): with_consolidated_metadata(root, below)}))

    # -- arrays ---------------------------------------------------------------------------

    def _on_zarray(self, path: str, key: str, raw: bytes) -> None:
        zarray = load_zarray(key, raw)
        node = self._nodes.node(path)
        if node.deleted:
            node = self._written_again(path, key, node, zarray)
        if node.array is not None:
            self._update(path, key, node, node.array, zarray)
            return
        if node.unsharded:
            self._put({key: raw})  # still an unsharded array
            if node.mirrored or self._hierarchy_is_v3():
                self._mirror(path, {".zarray": zarray})
            return
        cps = self._options.chunks_per_shard.for_array(path, len(zarray["shape"]))
        if cps is None:
            self._put({key: raw})
            self._nodes.set(build_node(path, None, raw))
            if path and self._hierarchy_is_v3():
                self._mirror(path, {".zarray": zarray})
            return
        layout = ShardLayout.v3(cps, self._options.index_location, "little", self._options.index_checksum)
        self._remove_leftovers(path)
        attrs_key = join_path(path, ".zattrs")
        attrs = self._kv.values([attrs_key]).get(attrs_key)
        zattrs = load_object(attrs_key, attrs) if attrs is not None else None
        if path:
            plan = plan_sharded_array(path, zarray, zattrs, layout, self._group_attributes(group_paths(path)))
        else:
            plan = plan_root_array(zarray, zattrs, layout)
        self._apply(plan, {path: sharded_array_of(path, zarray, plan.writes[join_path(path, ZARR_JSON)])})

    def _written_again(self, path: str, key: str, node: Node, zarray: Mapping[str, Any] | None) -> Node:
        """The node a ``.zarray`` (``zarray``) or ``.zgroup`` (``None``) written over a deleted one meets.

        The same kind of node (same chunks and separator) is written again;
        anything else replaces it, its attributes kept as a stored ``.zattrs``,
        and is refused (``ConfigurationError``) while the old array's chunks are stored.
        """
        old = node.array
        if old is None and zarray is None and (node.doc or {}).get("node_type") == "group":
            return node
        if old is not None and zarray is not None and _grid_change(old, zarray) is None:
            return node
        if old is not None and self._has_chunks(path):
            what = "a group" if zarray is None else f"an array with chunks {list(zarray['chunks'])}"
            raise ConfigurationError(
                f"{key}: the chunks of the array whose .zarray was deleted (chunks {list(old.chunks or ())}) "
                f"are still stored under {path!r}, and {what} would read its shards; delete those chunks "
                "(or the whole path: rmdir, overwrite=True) first",
                path,
            )
        attrs = (node.doc or {}).get("attributes") or {}
        if attrs:
            attrs_key = join_path(path, ".zattrs")
            self._put({attrs_key: dump_json(attrs, key=attrs_key)})
        self._apply(MetadataPlan(deletes=frozenset({join_path(path, ZARR_JSON)})))
        self._nodes.forget(path)
        return self._nodes.node(path)

    def _remove_leftovers(self, path: str) -> None:
        """Delete shards an earlier array at ``path`` left (its metadata deleted by hand): never reinterpret them."""
        self._writer.discard_under(path)
        stale = [k for k in self._kv.list_prefix(path_prefix(path)) if chunkish_under(path, k)]
        if stale:
            self._put(dict.fromkeys(stale))
            self._writer.engine.forget()

    def _update(self, path: str, key: str, node: Node, old: ShardedArray, zarray: dict[str, Any]) -> None:
        """A new ``.zarray`` for the sharded array ``old``: same chunks and separator, maybe another shape."""
        change = _grid_change(old, zarray)
        if change is not None:
            raise ConfigurationError(f"{key}: cannot change {change}; delete the array first", path)
        if not node.writable:
            raise ReservedKeyError(key, _READ_ONLY)
        self._writer.flush(path)
        new = old.with_shape(zarray["shape"])
        self._apply(plan_zarray_update(path, node.doc or {}, zarray), {path: new})
        if any(n < o for n, o in zip(new.shape or (), old.shape or (), strict=False)):  # the chunks left outside go
            self._writer.write_now({k: ShardChange(new, c) for k, c in old.shard_keys() if not new.shard_in_grid(c)})
