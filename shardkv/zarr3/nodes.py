"""What each path and key is for :class:`shardkv.zarr3.ShardedStore`: nodes read from ``zarr.json`` once and kept.

A node is a transparently sharded array, another array, or ``None`` (a group
or nothing); documents are turned between their presented and stored forms.
"""

from __future__ import annotations

import functools
import json
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from zarr.abc.store import Store
from zarr.core.buffer import default_buffer_prototype

from shardkv.engine.options import Options
from shardkv.errors import ChunkOutOfGridError, InvalidKeyError
from shardkv.keys.paths import chunk_owner_paths, join_path, split_key
from shardkv.keys.space import ChunkRef, ShardedArray
from shardkv.metadata.hierarchy import ZARR_JSON
from shardkv.metadata.nodes import NodeCache
from shardkv.zarr3.metadata import (
    consolidated_children,
    map_consolidated,
    parse_document,
    presented_document,
    resharded,
    stored_document,
    transparent_array,
)


@dataclass(frozen=True)
class _Other:
    """A path whose ``zarr.json`` exists and is not a group nor a transparently sharded array (another array)."""


_OTHER = _Other()
Node = ShardedArray | _Other | None  # None: a group, or no zarr.json at the path (owns no chunk key)


def meta_path(key: str) -> str | None:
    """The node path of a ``zarr.json`` key, or ``None`` for any other key."""
    path, name = split_key(key)
    return path if name == ZARR_JSON else None


def _dump(doc: Mapping[str, Any]) -> bytes:
    """A ``zarr.json`` document as zarr-python 3 writes it (indented JSON)."""
    return json.dumps(doc, indent=2).encode()


_is_node: Callable[[Node], bool] = functools.partial(operator.is_not, None)
"""True for a node that decides what the keys below it are (an array; a group or nothing is passed over)."""


_ROUTE_MEMO_LIMIT = 16_384
"""Keys whose routes a node table remembers while its nodes stay as they are (all forgotten past that)."""

_BUILT_NODES = 64
"""How many nodes built from (path, stored ``zarr.json`` bytes) the process keeps (:func:`_build`)."""


@functools.lru_cache(maxsize=_BUILT_NODES)
def _build(path: str, raw: bytes | None) -> Node:
    """The node at ``path`` from its stored ``zarr.json`` (``None``: none); raises as :func:`transparent_array`.

    Kept per (path, bytes) for the process: a dask task unpickles a new store, which then parses nothing again.
    """
    if raw is None:
        return None
    doc = parse_document(raw)
    if doc is not None and doc.get("node_type") == "group":  # a group is passed over when keys look for an owner
        return None
    return (transparent_array(path, doc) if doc is not None else None) or _OTHER


def _route_in(node: Node, key: str) -> ChunkRef | None:
    """What ``key`` is in the node that decides it: a chunk of a sharded array, or ``None`` (passed through).

    Raises
    ------
    ChunkOutOfGridError
        For a chunk key of a sharded array outside its chunk grid.
    """
    if not isinstance(node, ShardedArray):
        return None
    try:
        return node.locate(key)
    except ChunkOutOfGridError:
        raise
    except InvalidKeyError:  # under the array but no chunk key of it: passed through
        return None


class NodeTable:
    """Node kinds by path, read lazily from the ``zarr.json`` documents of ``base``, and the documents' two forms."""

    def __init__(self, base: Store, options: Options) -> None:
        self.base = base
        self.options = options
        self.cache: NodeCache[Node] = NodeCache()  # forget_under(path) after deletes, ("") on refresh
        self._routes: tuple[int, dict[str, ChunkRef | None]] = (self.cache.generation, {})  # see route

    # -- node kinds ---------------------------------------------------------------

    async def node(self, path: str) -> Node:
        """The sharded array at ``path``, another array, or ``None`` (a group or nothing; read once, then cached)."""
        kept = self.cache.kept([path])
        return kept[path] if kept else (await self._read(path))[1]

    async def _read(self, path: str) -> tuple[bytes | None, Node]:
        """The ``zarr.json`` stored at ``path`` (``None``: none), and the node to answer with (a write's wins)."""
        since = self.cache.generation  # a write meanwhile: what is read here is not kept
        raw = await self.base.get(join_path(path, ZARR_JSON), prototype=default_buffer_prototype())
        data = None if raw is None else raw.to_bytes()
        return data, self.cache.load({path: _build(path, data)}, since)[path]

    async def _first(self, paths: list[str]) -> ShardedArray | None:
        """The first node among ``paths`` that is not a group or nothing, if a sharded array (the cache's walk)."""
        for _ in range(2 * len(paths) + 1):  # each round reads one more path (or one again a write changed meanwhile)
            walked = self.cache.walk(paths, _is_node)
            if walked.unread is None:
                return walked.node if isinstance(walked.node, ShardedArray) else None
            await self.node(walked.unread)
        return None

    async def sharded(self, path: str) -> ShardedArray | None:
        """The transparently sharded array at ``path``, or ``None``."""
        node = await self.node(path)
        return node if isinstance(node, ShardedArray) else None

    def remember(self, path: str, raw: bytes | None) -> None:
        """Record the node at ``path`` from the ``zarr.json`` just stored there (``None``: there is none)."""
        self.cache.set(path, _build(path, raw))

    async def route(self, key: str) -> ChunkRef | None:
        """The chunk of a transparently sharded array that ``key`` names, or ``None`` (passed through).

        Raises
        ------
        ChunkOutOfGridError
            For a chunk key of such an array outside its chunk grid.
        """
        generation = self.cache.generation  # read before routing: a later change makes this memo stale
        kept, routes = self._routes
        if kept == generation and key in routes:
            return routes[key]
        ref = _route_in(await self._first(chunk_owner_paths(key)), key)
        if kept != generation or len(routes) >= _ROUTE_MEMO_LIMIT:
            routes = {}
            self._routes = (generation, routes)
        routes[key] = ref
        return ref

    def route_now(self, key: str, read: Callable[[str], bytes | None]) -> ChunkRef | None:
        """:meth:`route`, blocking, reading documents with ``read`` (a journal's replay, outside zarr's event loop)."""
        walked = self.cache.first(chunk_owner_paths(key), _is_node, lambda p: _build(p, read(join_path(p, ZARR_JSON))))
        return _route_in(walked.node, key)

    async def array_of_shard(self, key: str) -> ShardedArray | None:
        """The sharded array whose shard the stored key ``key`` is, or ``None``."""
        node = await self._first(chunk_owner_paths(key))
        return node if node is not None and node.shard_coords_of(key) is not None else None

    async def owner_of_prefix(self, prefix: str) -> ShardedArray | None:
        """The sharded array whose chunk keys ``prefix`` reaches into (past ``path/``), or ``None`` (the owner rule)."""
        return await self._first(chunk_owner_paths(prefix + "0"))  # the owners of the keys starting with prefix

    # -- documents ----------------------------------------------------------------

    async def read_document(self, path: str) -> bytes | None:
        """The ``zarr.json`` at ``path`` as presented above the store, or ``None`` when not stored."""
        data, _ = await self._read(path)
        if data is None:
            return None
        doc = parse_document(data)
        if doc is None:
            return data
        presented = presented_document(doc)
        if presented is not None:
            return _dump(presented)
        # a group's consolidated documents of sharded arrays: presented unsharded as well
        views = {r: view for r, child in consolidated_children(doc).items() if (view := presented_document(child))}
        return _dump(map_consolidated(doc, views)) if views else data

    async def stored_form(self, path: str, raw: bytes) -> bytes:
        """What to store for the ``zarr.json`` ``raw`` written at ``path`` (an array document sharded)."""
        doc = parse_document(raw)
        if doc is None:
            return raw
        stored = stored_document(path, doc, self.options)
        if stored is None:
            consolidated = await self._stored_consolidated(path, doc)
            stored = map_consolidated(doc, consolidated) if consolidated else None
        return raw if stored is None else _dump(stored)

    async def _stored_consolidated(self, path: str, doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """The stored (sharded) documents of the sharded arrays a group document consolidates, by relative path."""
        out: dict[str, dict[str, Any]] = {}
        for rel, child in consolidated_children(doc).items():
            raw, _ = await self._read(join_path(path, rel))
            stored = None if raw is None else parse_document(raw)
            sharded = None if stored is None else resharded(child, stored)
            if sharded is not None:
                out[rel] = sharded
        return out
