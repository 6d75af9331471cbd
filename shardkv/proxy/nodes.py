"""The node table of the v2 proxy: what each path of the hierarchy is, and the v2 documents it presents.

One :class:`Node` per path, built from its stored ``zarr.json`` (and
``.zarray`` where that does not decide), read once and kept until forgotten:

* a v3 node (a ``zarr.json`` with ``zarr_format`` 3) is presented to
  zarr-python 2 as the ``.zarray``/``.zgroup`` and ``.zattrs`` documents that
  :func:`shardkv.metadata.hierarchy.present` derives from it, kept as dicts
  and served as JSON bytes dumped once; the sharded array's key mapping is
  built from the same dicts (no v3 -> v2 bytes -> parsed-again round trip);
* an array with a stored ``.zarray`` and no presentable ``zarr.json`` is
  *unsharded*: its chunk keys pass through;
* an unsharded array whose ``zarr.json`` *mirrors* its ``.zarray`` (a v3
  array, not sharded, ``v2`` chunk key encoding, with a ``.zarray`` beside
  it, so that v3 readers list the whole hierarchy: :func:`shardkv.metadata.all_v3.plan_v3_down`) is
  unsharded too: zarr-python 2 sees the ``.zarray``/``.zattrs`` as stored and
  not the ``zarr.json``, which is for v3 readers;
* anything else (a v2 group, nothing) is no array.

The table reads only through the ``read`` callable it is given
(``KVStore.values``). Nothing wraps the base store: the proxy asks the table
about metadata keys, and sends every other key straight to the store.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from shardkv.errors import ConfigurationError, MetadataError
from shardkv.keys.paths import chunk_owner_paths, is_chunk_segment, join_path, owner_candidates, split_key
from shardkv.keys.space import ShardedArray, V2ChunkKeyEncoding
from shardkv.metadata.all_v3 import may_mirror
from shardkv.metadata.documents import ZMETADATA, dump_json, load_json
from shardkv.metadata.hierarchy import REFUSED_ZARRAY, ZARR_JSON, present, presented_zmetadata
from shardkv.metadata.nodes import NodeCache
from shardkv.metadata.v2_deletes import deleted_documents
from shardkv.metadata.v3_view import sharding_spec_from_v3, v2_dimension_separator

ReadValues = Callable[[Sequence[str]], Mapping[str, Any]]
"""Reads whole values of keys from the base store; missing keys are left out of the result."""

PRESENTED = (".zarray", ".zattrs", ".zgroup")
"""The v2 documents a v3 node is presented as."""

_MEMO_LIMIT = 100_000  # parents whose owner is remembered before the memo starts over


@dataclass(frozen=True, eq=False)
class Node:
    """One path of the hierarchy as the proxy knows it (replace it, never mutate it).

    Attributes
    ----------
    path : str
        The node's path (``""`` for the root).
    doc : dict or None
        Its stored v3 ``zarr.json`` document (``zarr_format`` 3), or ``None``.
    raw : bytes or None
        The stored ``zarr.json`` bytes (any format), or ``None`` when none is stored.
    presented : dict of str to dict
        The v2 documents presenting ``doc`` (``.zarray``/``.zgroup`` and
        ``.zattrs``); empty when there is no v3 node or it cannot be presented.
    documents : dict of str to bytes
        ``presented`` as served (JSON bytes, dumped once).
    array : ShardedArray or None
        The key mapping of a sharded array.
    unsharded : bool
        An array whose chunks are stored one per key (passed through).
    mirrored : bool
        An unsharded array whose ``zarr.json`` (``doc``) mirrors its stored
        ``.zarray`` for v3 readers (hidden from zarr-python 2).
    deleted : frozenset of str
        The presented documents deleted from zarr-python 2's view (``.zarray``,
        ``.zgroup``: :mod:`shardkv.metadata.v2_deletes`); left out of
        ``documents``, while ``presented`` and ``array`` still describe the node.
    """

    path: str
    doc: dict[str, Any] | None = field(default=None, repr=False)
    raw: bytes | None = field(default=None, repr=False)
    presented: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)
    documents: dict[str, bytes] = field(default_factory=dict, repr=False)
    array: ShardedArray | None = None
    unsharded: bool = False
    mirrored: bool = False
    deleted: frozenset[str] = frozenset()

    @property
    def is_array(self) -> bool:
        """True for an array, sharded or not."""
        return self.array is not None or self.unsharded

    @property
    def hides_zarr_json(self) -> bool:
        """True when zarr-python 2 sees this node through its presented documents, not its ``zarr.json``."""
        return self.array is not None or bool(self.documents) or self.mirrored or bool(self.deleted)

    @property
    def writable(self) -> bool:
        """Whether zarr-python 2 may change the v3 document through the proxy (groups, shardkv's own arrays)."""
        if self.doc is None or self.doc.get("node_type") != "array":
            return True
        return (self.doc.get("chunk_key_encoding") or {}).get("name") == "v2"

    def cannot_be_stored(self, name: str) -> bool:
        """True for a v2 document no store holds beside this presented node (answered without a request).

        Only an array's ``.zattrs`` may be stored beside its ``zarr.json`` (the older layout).
        """
        return (
            bool(self.documents)
            and name not in self.documents
            and not (name == ".zattrs" and ".zarray" in self.documents)
        )


def sharded_array_of(path: str, zarray: Mapping[str, Any], doc: Any) -> ShardedArray | None:
    """The key mapping of the array ``zarray`` describes, sharded as ``doc`` says (``None``: not sharded).

    Raises
    ------
    ConfigurationError
        If the document's inner ``chunk_shape`` differs from the ``.zarray``
        chunks, or the sharding configuration is invalid.
    UnsupportedError
        If the sharding configuration is valid but not supported.
    """
    spec = sharding_spec_from_v3(doc, path)
    if spec is None:
        return None
    if list(spec.chunks) != list(zarray["chunks"]):
        raise ConfigurationError(
            f"zarr.json inner chunk_shape {list(spec.chunks)} differs from .zarray chunks {zarray['chunks']}", path
        )
    shape = tuple(int(s) for s in zarray["shape"])
    return spec.array_at(path, V2ChunkKeyEncoding(v2_dimension_separator(zarray)), shape)


def build_node(path: str, raw_json: Any | None, raw_zarray: Any | None = None) -> Node:
    """The node at ``path`` from its stored ``zarr.json`` and ``.zarray`` bytes (``None``: not stored).

    Raises
    ------
    MetadataError
        If the ``zarr.json`` (or a ``.zarray`` a sharded array needs) is not JSON.
    ConfigurationError, UnsupportedError
        If the node's sharding cannot be used.
    """
    return with_deletes_applied(_build_node(path, raw_json, raw_zarray))


def with_deletes_applied(node: Node) -> Node:
    """``node`` without the presented documents its ``zarr.json`` records as deleted (the rest as it was)."""
    names = deleted_documents(node.doc) if node.documents or node.array is not None else frozenset()
    if not names:
        return node
    documents = {n: d for n, d in node.documents.items() if n not in names}
    return replace(node, documents=documents, deleted=frozenset(names))


def _build_node(path: str, raw_json: Any | None, raw_zarray: Any | None = None) -> Node:
    """:func:`build_node` before the record of deleted documents is applied."""
    if raw_json is None:
        return Node(path, unsharded=raw_zarray is not None)
    raw = bytes(raw_json)
    parsed = load_json(join_path(path, ZARR_JSON), raw)
    doc = parsed if isinstance(parsed, dict) and parsed.get("zarr_format") == 3 else None
    if raw_zarray is not None and may_mirror(doc):
        load_json(join_path(path, ".zarray"), raw_zarray)
        return Node(path, doc, raw, unsharded=True, mirrored=True)
    presented, documents = _presented(path, doc)
    if presented:
        zarray = presented.get(".zarray")
    elif raw_zarray is not None:  # a zarr.json stored beside a .zarray (the older layout)
        zarray = load_json(join_path(path, ".zarray"), raw_zarray)
    else:
        zarray = None
    return _array_node(Node(path, doc, raw, presented, documents), zarray, parsed)


def _presented(path: str, doc: dict[str, Any] | None) -> tuple[dict[str, dict[str, Any]], dict[str, bytes]]:
    """The v2 documents presenting a v3 node, and their JSON bytes (both empty: none, or it cannot be shown).

    A v3 node that zarr-python 2 cannot be shown passes its keys through
    (a stored one), or stays sharded for this session as written (one shardkv wrote).
    """
    if doc is None:
        return {}, {}
    try:
        presented = present(doc, path)
        return presented, {
            name: dump_json(d, key=join_path(path, name), strict=name != ".zattrs") for name, d in presented.items()
        }
    except MetadataError:
        return {}, {}


def _array_node(node: Node, zarray: Mapping[str, Any] | None, doc: Any) -> Node:
    """``node`` as the array ``zarray`` describes, sharded as ``doc`` says (unchanged when ``zarray`` is ``None``)."""
    if zarray is None:
        return node
    array = sharded_array_of(node.path, zarray, doc)
    return replace(node, array=array, unsharded=array is None)


class NodeTable:
    """Nodes by path (a :class:`~shardkv.metadata.nodes.NodeCache`), read lazily in batches, and key owners.

    Parameters
    ----------
    read : callable
        Whole values of keys from the base store, missing keys left out
        (:data:`ReadValues`).

    Notes
    -----
    Thread-safe: the cache's lock guards the nodes and the owners.
    """

    def __init__(self, read: ReadValues) -> None:
        self._read = read
        self._cache: NodeCache[Node] = NodeCache()
        self._owners: dict[str, ShardedArray | None] = {}  # by parent path, for the cache's generation
        self._owners_generation = 0
        self.lock = self._cache.lock

    @property
    def generation(self) -> int:
        """Counts the changes that may change a key's owner (a node recorded, forgotten or cleared).

        Memos of routed keys (the proxy's) are valid while it stays the same.
        """
        return self._cache.generation

    # -- nodes ------------------------------------------------------------------------

    def node(self, path: str) -> Node:
        """The node at ``path`` (read on first use, then kept).

        Raises
        ------
        MetadataError
            If its ``zarr.json`` or ``.zarray`` is not JSON.
        ConfigurationError, UnsupportedError
            If its sharding cannot be used.
        """
        found = self._cache.kept([path])
        return found[path] if found else self.nodes([path])[path]

    def nodes(self, paths: Iterable[str]) -> dict[str, Node]:
        """The nodes at ``paths``; the ones not kept yet are read in one batch of ``zarr.json`` reads.

        A ``.zarray`` is read (one more batch) only where the ``zarr.json``
        does not decide the node: missing, or not a v3 node zarr-python 2 can
        be shown (a v3 node never needs one, so opening it is one request).
        """
        paths = list(dict.fromkeys(p.strip("/") for p in paths))
        missing = self._cache.unread(paths)
        if missing:
            since = self._cache.generation  # a write meanwhile: what is read here is not kept
            found = self._read([join_path(p, ZARR_JSON) for p in missing])
            raw_json = {p: found.get(join_path(p, ZARR_JSON)) for p in missing}
            built: dict[str, Node] = {}
            undecided: list[str] = []
            for p in missing:
                node = _decided_by_zarr_json(p, raw_json[p])
                if node is None:
                    undecided.append(p)
                else:
                    built[p] = node
            if undecided:
                zarrays = self._read([join_path(p, ".zarray") for p in undecided])
                for p in undecided:
                    built[p] = build_node(p, raw_json[p], zarrays.get(join_path(p, ".zarray")))
            found_nodes = {**self._cache.kept(paths), **self._cache.load(built, since)}
            return {p: found_nodes[p] for p in paths if p in found_nodes}  # in the order asked, read or cached
        return self._cache.kept(paths)

    def v3_nodes(self, paths: Iterable[str]) -> dict[str, Node]:
        """The nodes among ``paths`` that have a v3 ``zarr.json`` (one batch for those not kept)."""
        return {p: n for p, n in self.nodes(paths).items() if n.doc is not None}

    def presented(self, path: str) -> Node | None:
        """The node at ``path`` if zarr-python 2 sees it through presented documents, else ``None``."""
        return node if (node := self.node(path)).documents else None

    def sharded(self, path: str) -> Node | None:
        """The sharded array node at ``path``, or ``None``."""
        return node if (node := self.node(path)).array is not None else None

    def set(self, node: Node) -> None:
        """Record what ``node.path`` now is (the owners of keys may change)."""
        self._cache.set(node.path, node)

    def keep_written(self, path: str, raw: bytes, doc: dict[str, Any], array: ShardedArray | None = None) -> Node:
        """Record the ``zarr.json`` just written at ``path`` (no read back): the node it makes.

        ``array``: the key mapping the writer built from the ``.zarray`` it was
        given (kept even where zarr-python 2 cannot be shown the v3 document).

        Raises
        ------
        ConfigurationError, UnsupportedError
            If its sharding cannot be used.
        """
        node = build_node(path, raw) if doc.get("node_type") != "array" else _from_written(path, raw, doc, array)
        node = with_deletes_applied(node)
        self.set(node)
        return node

    def keep_mirror(self, path: str, raw: bytes, doc: dict[str, Any]) -> Node:
        """Record the ``zarr.json`` mirror just written for the unsharded array at ``path`` (no read back)."""
        node = Node(path, doc, raw, unsharded=True, mirrored=True)
        self.set(node)
        return node

    def prime(self, path: str, raw_json: Any) -> None:
        """Keep the node at ``path`` from ``zarr.json`` bytes already read, when they alone decide it.

        :func:`shardkv.open_store` hands over the root ``zarr.json`` it read to
        detect the layout, so it is not read twice.
        """
        try:
            node = build_node(path, raw_json)
        except (ConfigurationError, NotImplementedError):  # MetadataError is a ConfigurationError
            return
        if node.documents and not may_mirror(node.doc) and self._cache.unread([path]):
            self._cache.set(path, node)

    def forget(self, path: str) -> None:
        """Forget the node at ``path`` (read again on next use)."""
        self._cache.forget(path.strip("/"))

    def forget_under(self, path: str) -> None:
        """Forget ``path`` and every path below it (everything for ``""``)."""
        self._cache.forget_under(path.strip("/"))

    def clear(self) -> None:
        """Forget everything."""
        self._cache.clear()

    # -- keys -------------------------------------------------------------------------

    def is_hidden(self, key: str) -> bool:
        """True for the ``zarr.json`` of a node presented in v2 (a sharded array, a v3 group)."""
        path, name = split_key(key)
        return name == ZARR_JSON and self.node(path).hides_zarr_json

    def owner(self, key: str) -> ShardedArray | None:
        """The sharded array whose chunk (or shard) ``key`` names, if any.

        The owner rule of :mod:`shardkv.keys.paths`: only the paths that could
        own ``key`` (:func:`~shardkv.keys.paths.chunk_owner_paths`) are read,
        from the highest down, and the first array met owns it; so a chunk of
        ``g/arr`` costs the read of ``g/arr/zarr.json`` alone, as in
        tensorstore and zarr-python 3, which also open an array from its own
        document. Owners are memoised per parent path.
        """
        parent, name = split_key(key)
        if not is_chunk_segment(name):
            return None  # the last segment of a chunk or shard key is always chunk-like
        with self.lock:
            generation = self.generation
            if self._owners_generation != generation:  # nodes changed: every owner may have
                self._owners.clear()
                self._owners_generation = generation
            if parent in self._owners:
                return self._owners[parent]
        walked = self._cache.first(chunk_owner_paths(key), _is_array, self.node)
        owner = None if walked.node is None else walked.node.array  # None for an unsharded array: passed through
        with self.lock:
            if self.generation != generation:  # nodes changed meanwhile: the answer may be stale, keep none
                return owner
            if len(self._owners) > _MEMO_LIMIT:
                self._owners.clear()
            self._owners[parent] = owner
        return owner

    def array_above(self, key: str) -> str | None:
        """The path of the first array (sharded or not) met from the root down among the paths above ``key``.

        Every path above ``key`` is a candidate here, whatever follows it
        (:func:`~shardkv.keys.paths.owner_candidates`): the zarr 2 stores'
        rule that no key is stored below another asks where ``key`` would
        lie inside an array. Nodes are read from the highest down, up to the
        first array.
        """
        return self._cache.first(list(owner_candidates(key)), _is_array, self.node).path

    # -- metadata documents as code above the proxy sees them ------------------------------

    def read_documents(self, keys: Sequence[str]) -> dict[str, Any]:
        """The values of ``keys`` (keys that are not chunks of a sharded array) as zarr-python 2 sees them.

        Presented documents come from the table; a hidden ``zarr.json`` is
        missing; the kept ``zarr.json`` bytes are served without a request; a
        stored ``.zmetadata`` is presented with each sharded array's
        documents; every other key is read from the base store in one batch.
        """
        self.nodes(split_key(k)[0] for k in keys if split_key(k)[1] in PRESENTED)  # one batch of node reads
        out: dict[str, Any] = {}
        rest: list[str] = []
        for key in keys:
            path, name = split_key(key)
            if name in PRESENTED:
                node = self.node(path)
                if name in node.documents:
                    out[key] = node.documents[name]
                elif not node.cannot_be_stored(name):
                    rest.append(key)
                continue
            if name == ZARR_JSON:
                kept = self._cache.kept([path]).get(path)
                if kept is not None:
                    if kept.raw is not None and not kept.hides_zarr_json:
                        out[key] = kept.raw
                    continue
                if self.is_hidden(key):
                    continue
                kept = self.node(path)
                if kept.raw is not None:
                    out[key] = kept.raw
                continue
            rest.append(key)
        if rest:
            for key, value in self._read(rest).items():
                out[key] = self._zmetadata(key, bytes(value)) if split_key(key)[1] == ZMETADATA else value
        return out

    def contains_document(self, key: str) -> bool | None:
        """Whether a metadata ``key`` is there as zarr-python 2 sees it; ``None``: ask the base store."""
        path, name = split_key(key)
        if name == ZARR_JSON:
            return False if self.is_hidden(key) else None
        if name not in PRESENTED:
            return None
        node = self.node(path)
        if name in node.documents:
            return True
        return False if node.cannot_be_stored(name) else None

    def _zmetadata(self, key: str, raw: bytes) -> bytes:
        """A stored ``.zmetadata`` with each sharded array's documents presented."""

        def docs(paths: list[str]) -> dict[str, dict[str, Any]]:
            return {p: n.doc for p, n in self.v3_nodes(paths).items() if n.doc is not None}

        return present_stored_zmetadata(key, raw, docs)

    def listed(self, keys: Iterable[str]) -> Iterator[str]:
        """Base store ``keys`` (no chunks of sharded arrays) as zarr-python 2 lists them.

        Hidden ``zarr.json`` keys are left out; the presented documents of
        each v3 node are added (once, whether or not a v2 copy is stored).
        """
        zarr_jsons: list[str] = []
        v2_meta: set[str] = set()
        for key in keys:
            path, name = split_key(key)
            if name == ZARR_JSON:
                zarr_jsons.append(path)
                continue
            if name in PRESENTED:
                v2_meta.add(key)
            yield key
        for path, node in self.nodes(zarr_jsons).items():
            if not node.hides_zarr_json:
                yield join_path(path, ZARR_JSON)
            for name in node.documents:
                if join_path(path, name) not in v2_meta:
                    yield join_path(path, name)

    def listed_names(self, path: str, names: Iterable[str]) -> list[str]:
        """The names the base store lists directly under ``path``, as zarr-python 2 sees them."""
        out = set(names)
        if ZARR_JSON in out:
            node = self.node(path)
            out |= set(node.documents)
            if node.hides_zarr_json:
                out.discard(ZARR_JSON)
        return sorted(out)


def present_stored_zmetadata(key: str, raw: bytes, docs: Callable[[list[str]], Mapping[str, Any]]) -> bytes:
    """A stored ``.zmetadata`` as zarr-python 2 reads it: each sharded array's documents presented.

    ``docs`` gives the v3 documents of node paths (relative to the store). A
    document that is not a consolidated ``.zmetadata``, or lists no sharded
    array, is served as stored.
    """
    try:
        stored = load_json(key, raw)
    except MetadataError:
        return raw
    meta = stored.get("metadata") if isinstance(stored, dict) else None
    if not isinstance(meta, dict):
        return raw
    refused = [k.rpartition("/")[0] for k, v in meta.items() if v == REFUSED_ZARRAY]
    if not refused:
        return raw
    prefix = split_key(key)[0]
    found = docs([join_path(prefix, p).strip("/") for p in refused])
    by_entry = {p: doc for p in refused if (doc := found.get(join_path(prefix, p).strip("/"))) is not None}
    return dump_json(presented_zmetadata(stored, by_entry), key=key)


def _is_array(node: Node) -> bool:
    """True for the node that owns the chunk keys below it (the owner rule: an array, sharded or not)."""
    return node.is_array


def _decided_by_zarr_json(path: str, raw_json: Any | None) -> Node | None:
    """The node at ``path`` when its ``zarr.json`` alone decides it (a presented v3 node), else ``None``.

    Raises what :func:`build_node` raises.
    """
    if raw_json is None:
        return None
    node = build_node(path, raw_json)
    if node.doc is not None and may_mirror(node.doc):
        return None  # a .zarray beside it makes it a mirror: read it too
    return node if node.documents or node.deleted else None


def _from_written(path: str, raw: bytes, doc: dict[str, Any], array: ShardedArray | None) -> Node:
    """The node of an array ``zarr.json`` shardkv just wrote (its document in hand: no parse)."""
    presented, documents = _presented(path, doc)
    if array is not None:
        return Node(path, doc, raw, presented, documents, array)
    return _array_node(Node(path, doc, raw, presented, documents), presented.get(".zarray"), doc)
