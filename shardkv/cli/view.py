"""A hierarchy as the command line reads it: a :class:`~shardkv.storage.kv.KVStore` with v3 nodes presented in v2.

The commands (``info``, ``verify``, ``unshard``, ``compact``, ``convert`` of an
already sharded source) work on Zarr v2 documents. Arrays shardkv shards are
stored as a Zarr v3 ``zarr.json`` and nothing else, so a
:class:`HierarchyView` adds, for each stored v3 node, the ``.zarray`` /
``.zgroup`` / ``.zattrs`` documents that :func:`shardkv.metadata.hierarchy.present`
derives from its ``zarr.json`` (the documents :class:`shardkv.ShardedStore`
presents to zarr-python 2), and serves a stored ``.zmetadata`` with each sharded
array's documents presented. Stored keys are listed and read as they are
(``zarr.json`` included); the view never writes.

Unlike the proxy's node table, the view is tolerant: a ``zarr.json`` that is not
JSON, or not a v3 node zarr-python 2 can be shown, simply presents nothing (the
commands report such nodes themselves).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from shardkv.errors import MetadataError
from shardkv.keys.paths import join_path, split_key
from shardkv.keys.space import ShardedArray
from shardkv.metadata.documents import ZMETADATA, dump_json, load_json
from shardkv.metadata.hierarchy import ZARR_JSON, present
from shardkv.proxy.nodes import PRESENTED, Node, present_stored_zmetadata
from shardkv.storage.kv import ANY, KVStore

__all__ = ["HierarchyView", "sizes", "refuse_shard_directories"]


def _parse(path: str, raw: Any) -> Node | None:
    """The v3 node of stored ``zarr.json`` bytes (its presented documents), or ``None`` (not JSON, not v3).

    Unlike :func:`shardkv.proxy.nodes.build_node`, nothing is raised: a node
    that cannot be presented presents nothing.
    """
    try:
        doc = load_json(join_path(path, ZARR_JSON), raw)
    except MetadataError:
        return None
    if not isinstance(doc, dict) or doc.get("zarr_format") != 3:
        return None
    try:
        presented = present(doc, path)
        documents = {n: dump_json(d, key=join_path(path, n), strict=n != ".zattrs") for n, d in presented.items()}
    except MetadataError:
        presented, documents = {}, {}
    return Node(path, doc, bytes(raw), presented, documents)


class HierarchyView:
    """Read-only access to a hierarchy in a :class:`KVStore`, v3 nodes presented as v2 documents.

    Parameters
    ----------
    kv : KVStore
        The store.
    present : bool
        Present v3 nodes (default); ``False`` reads and lists the store as it is.

    Notes
    -----
    Each node's ``zarr.json`` is read once and kept. Not thread-safe (the
    command line reads from one thread).
    """

    def __init__(self, kv: KVStore, present: bool = True) -> None:
        self.kv = kv
        self.presents = present
        self._nodes: dict[str, Node | None] = {}

    # -- nodes ------------------------------------------------------------------------

    def nodes(self, paths: Iterable[str]) -> dict[str, Node]:
        """The v3 nodes among ``paths`` (the ones not read yet read in one batch)."""
        paths = list(dict.fromkeys(p.strip("/") for p in paths))
        if not self.presents:
            return {}
        missing = [p for p in paths if p not in self._nodes]
        if missing:
            found = self.kv.values([join_path(p, ZARR_JSON) for p in missing])
            for p in missing:
                raw = found.get(join_path(p, ZARR_JSON))
                self._nodes[p] = None if raw is None else _parse(p, raw)
        return {p: n for p in paths if (n := self._nodes.get(p)) is not None}

    def node(self, path: str) -> Node | None:
        """The v3 node at ``path`` (read once), or ``None``."""
        return self.nodes([path]).get(path.strip("/"))

    def documents(self, path: str) -> dict[str, bytes]:
        """The v2 documents presenting the node at ``path`` (empty when it presents none)."""
        node = self.node(path)
        return {} if node is None else node.documents

    # -- reads ------------------------------------------------------------------------

    def values(self, keys: Sequence[str]) -> dict[str, bytes]:
        """The values of ``keys`` as zarr-python 2 reads them through shardkv; missing keys are left out.

        Raises
        ------
        OSError
            As the store raises it (permissions, a directory or FIFO at a key).
        """
        if not self.presents:
            return {k: bytes(v) for k, v in self.kv.values(keys).items()}
        self.nodes(split_key(k)[0] for k in keys if split_key(k)[1] in PRESENTED)  # one batch of node reads
        out: dict[str, bytes] = {}
        rest: list[str] = []
        for key in keys:
            path, name = split_key(key)
            node = self.node(path) if name in PRESENTED else None
            if node is not None and name in node.documents:
                out[key] = node.documents[name]
            elif node is None or not node.cannot_be_stored(name):
                rest.append(key)
        for key, value in (self.kv.values(rest) if rest else {}).items():
            raw = bytes(value)
            out[key] = self._zmetadata(key, raw) if split_key(key)[1] == ZMETADATA else raw
        return out

    def get(self, key: str) -> bytes | None:
        """The value of one key (see :meth:`values`), or ``None`` when missing."""
        return self.values([key]).get(key)

    def contains(self, key: str) -> bool:
        """True when ``key`` is stored or presented (a stored key is probed without reading it)."""
        path, name = split_key(key)
        node = self.node(path) if self.presents and name in PRESENTED else None
        if node is not None:
            if name in node.documents:
                return True
            if node.cannot_be_stored(name):
                return False
        return self.kv.get(key, []).found

    def _zmetadata(self, key: str, raw: bytes) -> bytes:
        return present_stored_zmetadata(
            key, raw, lambda paths: {p: n.doc for p, n in self.nodes(paths).items() if n.doc is not None}
        )

    # -- listings ---------------------------------------------------------------------

    def keys(self, prefix: str = "", presented: set[str] | None = None) -> Iterator[str]:
        """Every stored key under ``prefix``, then the presented documents not stored (streamed).

        ``presented``, when given, receives the keys of the second kind (documents
        zarr-python 2 sees that are not stored objects).
        """
        zarr_jsons: list[str] = []
        v2_meta: set[str] = set()
        for key in self.kv.list_prefix(prefix):
            path, name = split_key(key)
            if name == ZARR_JSON:
                zarr_jsons.append(path)
            elif name in PRESENTED:
                v2_meta.add(key)
            yield key
        for path, node in self.nodes(zarr_jsons).items():
            for name in node.documents:
                if join_path(path, name) not in v2_meta:
                    if presented is not None:
                        presented.add(join_path(path, name))
                    yield join_path(path, name)

    def list_names(self, path: str) -> list[str]:
        """The names of the keys and sub-directories directly under ``path``, presented documents included."""
        files, dirs = self.kv.list_dir(f"{path}/" if path else "")
        names = set(files) | set(dirs)
        if ZARR_JSON in files:
            names |= set(self.documents(path))
        return sorted(names)


def sizes(kv: KVStore, keys: Sequence[str]) -> dict[str, int]:
    """The sizes (bytes) of the stored keys among ``keys``, without reading them where the store can tell.

    Raises
    ------
    OSError
        As the store raises it (permissions, a directory or FIFO at a key).
    """
    out: dict[str, int] = {}
    unknown: list[str] = []
    for key, result in zip(keys, kv.get_many([(k, [], ANY) for k in keys]), strict=True):
        if result.found:
            if result.size is None:
                unknown.append(key)
            else:
                out[key] = result.size
    for key, value in (kv.values(unknown) if unknown else {}).items():
        out[key] = memoryview(value).nbytes
    return out


def refuse_shard_directories(kv: KVStore, arrays: Iterable[ShardedArray]) -> None:
    """Raise the store's error for the first directory standing where a shard of ``arrays`` should be.

    Listings leave directories out, so a command that works from a listing
    (``compact``) would silently pass over one.

    Raises
    ------
    IsADirectoryError
        Naming the shard key.
    """
    from shardkv.proxy.verify import shard_directories

    for arr in arrays:
        for key in shard_directories(kv, arr):
            kv.get(key)  # a directory at a key is damage: the store raises, naming the key
            raise IsADirectoryError(f"key {key!r} is a directory where a shard of {arr.path or '/'!r} should be")
