"""The node table of the v2 proxy: what each path is, and the v2 documents it presents (docs/architecture.md).

A v3 node is presented to zarr-python 2 as the ``.zarray``/``.zgroup`` and
``.zattrs`` derived from its ``zarr.json``; an array with a stored ``.zarray``
and no presentable ``zarr.json``, or whose ``zarr.json`` only mirrors its
``.zarray`` for v3 readers, is unsharded (its keys pass through).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from operator import attrgetter
from typing import Any

from shardkv.errors import ConfigurationError, MetadataError
from shardkv.keys.paths import chunk_owner_paths, is_chunk_segment, join_path, owner_candidates, split_key
from shardkv.keys.space import ShardedArray, V2ChunkKeyEncoding
from shardkv.metadata.all_v3 import may_mirror
from shardkv.metadata.documents import ZMETADATA, dump_json, load_json
from shardkv.metadata.hierarchy import REFUSED_ZARRAY, ZARR_JSON, deleted_documents, present, presented_zmetadata
from shardkv.metadata.nodes import NodeCache
from shardkv.metadata.v3_view import sharding_spec_from_v3, v2_dimension_separator

ReadValues = Callable[[Sequence[str]], Mapping[str, Any]]
"""Reads whole values of keys from the base store; missing keys are left out of the result."""

PRESENTED = (".zarray", ".zattrs", ".zgroup")
"""The v2 documents a v3 node is presented as."""

_MEMO_LIMIT = 100_000  # parents whose owner is remembered before the memo starts over
_IS_ARRAY = attrgetter("is_array")  # the owner rule: the first array met, sharded or not, owns the keys below it


@dataclass(frozen=True, eq=False)
class Node:
    """One path of the hierarchy as the proxy knows it (frozen).

    ``doc``: the stored v3 ``zarr.json`` (``raw``: its bytes, any format);
    ``presented``: the v2 documents presenting it, ``documents`` their JSON
    bytes; ``array``: a sharded array's key mapping; ``unsharded``: chunks
    stored one per key; ``mirrored``: ``doc`` mirrors a stored ``.zarray`` for
    v3 readers; ``deleted``: presented documents deleted from zarr 2's view
    (left out of ``documents``; :func:`shardkv.metadata.hierarchy.with_deleted`).
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
        """True for a v2 document no store holds beside this presented node (only an array's ``.zattrs`` may be)."""
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
        If the inner ``chunk_shape`` differs from the ``.zarray`` chunks, or the sharding is invalid.
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

    ``MetadataError`` for a document that is not JSON; as :func:`sharded_array_of` for its sharding.
    """
    if raw_json is None:
        return Node(path, unsharded=raw_zarray is not None)
    raw = bytes(raw_json)
    parsed = load_json(join_path(path, ZARR_JSON), raw)
    doc = parsed if isinstance(parsed, dict) and parsed.get("zarr_format") == 3 else None
    if raw_zarray is not None and may_mirror(doc):
        load_json(join_path(path, ".zarray"), raw_zarray)
        return Node(path, doc, raw, unsharded=True, mirrored=True)
    node = _presented_node(path, doc, raw)
    if raw_zarray is not None and not _decides(node):  # a zarr.json zarr 2 is not shown
        load_json(join_path(path, ".zarray"), raw_zarray)  # beside a .zarray: that array, kept as stored
        return replace(node, unsharded=True)
    return node


def _presented_node(path: str, doc: dict[str, Any] | None, raw: bytes, array: ShardedArray | None = None) -> Node:
    """The node a v3 ``zarr.json`` makes, presented in v2 (``array``: its key mapping, when the writer built it)."""
    presented: dict[str, dict[str, Any]] = {}
    documents: dict[str, bytes] = {}
    if doc is not None:
        try:
            presented = present(doc, path)
            documents = {n: dump_json(d, key=join_path(path, n), strict=n != ".zattrs") for n, d in presented.items()}
        except MetadataError:  # it cannot be shown in v2
            presented, documents = {}, {}
    zarray = presented.get(".zarray")
    if array is None and zarray is not None:
        array = sharded_array_of(path, zarray, doc)
    # presented documents its zarr.json records as deleted are left out
    deleted = deleted_documents(doc) if documents or array is not None else frozenset()
    documents = {n: d for n, d in documents.items() if n not in deleted}
    unsharded = zarray is not None and array is None
    return Node(path, doc, raw, presented, documents, array, unsharded=unsharded, deleted=deleted)


def _decides(node: Node) -> bool:
    """Whether a node built from its ``zarr.json`` alone is what zarr 2 sees (it presents or deletes documents)."""
    return bool(node.documents or node.deleted)


class NodeTable:
    """Nodes by path (a :class:`~shardkv.metadata.nodes.NodeCache`), read lazily in batches with ``read``; key owners.

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
        """Counts the changes that may change a key's owner; memos of routed keys are valid while it stays."""
        return self._cache.generation

    # -- nodes ------------------------------------------------------------------------

    def node(self, path: str) -> Node:
        """The node at ``path`` (read on first use, then kept; raises as :func:`build_node`)."""
        found = self._cache.kept([path])
        return found[path] if found else self.nodes([path])[path]

    def nodes(self, paths: Iterable[str]) -> dict[str, Node]:
        """The nodes at ``paths``; those not kept are read in one batch (a ``.zarray`` batch only where needed)."""
        paths = list(dict.fromkeys(p.strip("/") for p in paths))
        missing = self._cache.unread(paths)
        if missing:
            since = self._cache.generation  # a write meanwhile: what is read here is not kept
            found = self._read([join_path(p, ZARR_JSON) for p in missing])
            raw_json = {p: found.get(join_path(p, ZARR_JSON)) for p in missing}
            built = {p: build_node(p, raw) for p, raw in raw_json.items() if raw is not None}
            # no zarr.json, one a .zarray beside it makes a mirror, or one that presents nothing: the .zarray decides
            undecided = [p for p in missing if p not in built or may_mirror(built[p].doc) or not _decides(built[p])]
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

    def sharded(self, path: str) -> Node | None:
        """The sharded array node at ``path``, or ``None``."""
        return node if (node := self.node(path)).array is not None else None

    def set(self, node: Node) -> None:
        """Record what ``node.path`` now is (the owners of keys may change)."""
        self._cache.set(node.path, node)

    def keep_written(
        self, path: str, raw: bytes, doc: dict[str, Any], array: ShardedArray | None = None, mirror: bool = False
    ) -> Node:
        """Record the ``zarr.json`` just written at ``path`` (no read back): the node it makes.

        ``array``: the key mapping the writer built from its ``.zarray``; ``mirror``: the
        document mirrors the ``.zarray`` of an unsharded array for v3 readers.
        """
        node = Node(path, doc, raw, unsharded=True, mirrored=True) if mirror else _presented_node(path, doc, raw, array)
        self.set(node)
        return node

    def prime(self, path: str, raw_json: Any) -> None:
        """Keep the node at ``path`` from ``zarr.json`` bytes ``open_store`` read, if they alone decide it."""
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
        self._cache.forget_under("")

    # -- keys -------------------------------------------------------------------------

    def is_hidden(self, key: str) -> bool:
        """True for the ``zarr.json`` of a node presented in v2 (a sharded array, a v3 group)."""
        path, name = split_key(key)
        return name == ZARR_JSON and self.node(path).hides_zarr_json

    def owner(self, key: str) -> ShardedArray | None:
        """The sharded array whose chunk (or shard) ``key`` names, if any (the owner rule; memoised per parent path)."""
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
        walked = self._cache.first(chunk_owner_paths(key), _IS_ARRAY, self.node)
        owner = None if walked.node is None else walked.node.array  # None for an unsharded array: passed through
        with self.lock:
            if self.generation != generation:  # nodes changed meanwhile: the answer may be stale, keep none
                return owner
            if len(self._owners) > _MEMO_LIMIT:
                self._owners.clear()
            self._owners[parent] = owner
        return owner

    def array_above(self, key: str) -> str | None:
        """The path of the first array (sharded or not) from the root down among all paths above ``key``."""
        return self._cache.first(list(owner_candidates(key)), _IS_ARRAY, self.node).path

    # -- metadata documents as code above the proxy sees them ------------------------------

    def read_documents(self, keys: Sequence[str]) -> dict[str, Any]:
        """The values of ``keys`` (no chunks of a sharded array) as zarr-python 2 sees them (one batch for the rest)."""
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
                node = self.node(path)
                if node.raw is not None and not node.hides_zarr_json:
                    out[key] = node.raw
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
        """Base store ``keys`` (no chunks) as zarr 2 lists them: hidden ``zarr.json`` out, presented in."""
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
    """A stored ``.zmetadata`` with each sharded array's documents presented (``docs``: v3 documents by path)."""
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
