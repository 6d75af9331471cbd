"""Metadata writes through the proxy: the ``zarr.json`` view kept beside each sharded ``.zarray``.

When code above the proxy writes an array's ``.zarray``, :class:`MetadataMirror`
decides whether the array is sharded (already sharded in the store, or new
and named by ``chunks_per_shard``) and writes the ``zarr.json`` view of
:func:`~shardkv.metadata.v3_view.v3_view_of_v2` beside it; a resize updates
the view's shape and drops the chunks a shrink left outside the grid; a
``.zattrs`` write is mirrored into the view's ``attributes``. Deleting a
``.zarray`` deletes its view.
"""

from __future__ import annotations

import itertools
from typing import Literal

from shardkv.errors import ConfigurationError, ReservedKeyError
from shardkv.format.layout import ShardLayout
from shardkv.keys.paths import join_path, split_key
from shardkv.keys.space import ShardedArray
from shardkv.metadata.chunks_per_shard import ChunksPerShardRule
from shardkv.metadata.documents import dump_json, load_json
from shardkv.metadata.v3_view import v3_view_of_v2
from shardkv.proxy.nodes import NOT_ARRAY, UNSHARDED, NodeCache, ShardedNode, UnshardedArray, sharded_node
from shardkv.proxy.writes import ShardWriter
from shardkv.storage.adapters import StoreAdapter

__all__ = ["MetadataMirror"]

_HIDDEN_REASON = "the zarr.json of a sharded array is managed by shardkv"


class MetadataMirror:
    """Stores metadata documents written through the proxy, keeping each sharded array's view.

    Parameters
    ----------
    base : StoreAdapter
        The base store.
    nodes : NodeCache
        Node states, updated as documents are written.
    writer : ShardWriter
        Flushes and trims shards around metadata changes.
    rule : ChunksPerShardRule
        Which new arrays are sharded.
    index_location, index_checksum
        Index options of new sharded arrays.
    """

    def __init__(
        self,
        base: StoreAdapter,
        nodes: NodeCache,
        writer: ShardWriter,
        rule: ChunksPerShardRule,
        index_location: Literal["start", "end"],
        index_checksum: bool,
    ) -> None:
        self._base, self._nodes, self._writer, self._rule = base, nodes, writer, rule
        self.index_location = index_location
        self.index_checksum = index_checksum

    def set(self, key: str, value: bytes) -> None:
        """Store a metadata document (``.zarray``, ``.zattrs``, ``.zgroup``, ...).

        Raises
        ------
        ReservedKeyError
            For the ``zarr.json`` of a sharded array.
        ConfigurationError
            If a ``.zarray`` changes the chunks of a sharded array, or its sharding is invalid.
        MetadataError
            If a ``.zarray`` or a mirrored ``.zattrs`` is not JSON.
        """
        path, name = split_key(key)
        if name == ".zarray":
            self._on_zarray(path, value)
            return
        if name == "zarr.json" and self._nodes.is_hidden(key):
            raise ReservedKeyError(key, _HIDDEN_REASON)
        if name == ".zattrs":
            node = self._nodes.sharded(path)
            if node is not None:
                view = {**node.view, "attributes": load_json(key, value)}
                zjson_key = join_path(path, "zarr.json")
                self._base.set_many({key: value, zjson_key: dump_json(view, key=zjson_key, strict=True)})
                self._nodes.set(path, ShardedNode(node.array, view))
                return
        if name == ".zgroup":
            self._nodes.set(path, NOT_ARRAY)
        self._base.set(key, value)

    def before_delete(self, key: str) -> None:
        """Forget what a deleted ``.zarray`` / ``.zgroup`` described; a ``.zarray`` takes its view along.

        Raises
        ------
        ReservedKeyError
            For the ``zarr.json`` of a sharded array.
        """
        path, name = split_key(key)
        if name == "zarr.json" and self._nodes.is_hidden(key):
            raise ReservedKeyError(key, _HIDDEN_REASON)
        if name not in (".zarray", ".zgroup"):
            return
        self._nodes.forget(path)
        if name == ".zarray":
            self._writer.discard_under(path)
            self._base.delete_many([join_path(path, "zarr.json")])

    def _on_zarray(self, path: str, raw: bytes) -> None:
        zarray_key = join_path(path, ".zarray")
        zarray = load_json(zarray_key, raw)
        state = self._nodes.state(path)
        if isinstance(state, ShardedNode):
            self._resize(path, state, zarray, raw)
            return
        if isinstance(state, UnshardedArray):
            self._base.set(zarray_key, raw)
            return
        cps = self._rule.for_array(path, len(zarray["shape"]))
        if cps is None:
            self._base.set(zarray_key, raw)
            self._nodes.set(path, UNSHARDED)
            return
        layout = ShardLayout.v3(cps, self.index_location, "little", self.index_checksum)
        try:
            attrs = load_json(join_path(path, ".zattrs"), self._base.get(join_path(path, ".zattrs")))
        except KeyError:
            attrs = {}
        view = v3_view_of_v2(zarray, attrs, layout).metadata
        zjson_key = join_path(path, "zarr.json")
        self._base.set_many({zarray_key: raw, zjson_key: dump_json(view, key=zjson_key, strict=True)})
        self._nodes.set(path, sharded_node(path, zarray, view))

    def _resize(self, path: str, node: ShardedNode, zarray: dict, raw: bytes) -> None:
        """A new ``.zarray`` for a sharded array: same chunks, maybe another shape."""
        self._writer.flush(path)
        old = node.array
        if list(zarray["chunks"]) != list(old.chunks):
            raise ConfigurationError(
                f"cannot change the chunks of a sharded array from {list(old.chunks)} to {zarray['chunks']}; "
                "delete the array first",
                path,
            )
        view = {**node.view, "shape": [int(s) for s in zarray["shape"]]}
        new = old.with_shape(zarray["shape"])
        zjson_key = join_path(path, "zarr.json")
        self._base.set_many({zjson_key: dump_json(view, key=zjson_key, strict=True), join_path(path, ".zarray"): raw})
        self._nodes.set(path, ShardedNode(new, view))
        if any(n < o for n, o in zip(new.shape, old.shape)):
            self._trim(old, new)

    def _trim(self, old: ShardedArray, new: ShardedArray) -> None:
        """Drop the chunks a shrinking resize left outside the chunk grid."""
        grid = new.chunk_grid_shape
        affected = {}
        for coords in itertools.product(*(range(n) for n in old.shard_grid_shape)):
            if any((s + 1) * c > g for s, c, g in zip(coords, new.chunks_per_shard, grid)):
                affected[new.shard_key(coords)] = (new, coords, {})
        self._writer.write_now(affected)
