"""What each path of a Zarr v2 hierarchy is, as the proxy knows it, and which array owns a key.

A path is one of three node states: :data:`NOT_ARRAY` (a group, or nothing),
:data:`UNSHARDED` (an array stored chunk per key, passed through) or a
:class:`ShardedNode` (an array whose chunks live in shards: its key mapping
:class:`~shardkv.keys.space.ShardedArray` and the ``zarr.json`` document that
describes it). :class:`NodeCache` learns a path's state with one batched read
of its ``.zarray`` and ``zarr.json`` and keeps it until told otherwise.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from typing import Any, Mapping, Union

from shardkv.errors import ConfigurationError
from shardkv.keys.encodings import V2ChunkKeyEncoding
from shardkv.keys.paths import join_path, owner_candidates, split_key
from shardkv.keys.space import ShardedArray
from shardkv.metadata.documents import META_NAMES, load_json
from shardkv.metadata.hierarchy import present
from shardkv.metadata.v3_view import sharding_spec_from_v3, v2_dimension_separator
from shardkv.storage.adapters import StoreAdapter

__all__ = ["NotArray", "UnshardedArray", "ShardedNode", "NodeState", "NOT_ARRAY", "UNSHARDED", "NodeCache", "META_NAMES", "chunkish_under"]

# chunk-like key segments; signs included so "-1.0" is refused as a malformed chunk key, not stored
_CHUNKISH = re.compile(r"c|c?[0-9.+-]+")  # "c" alone: v3 default shard keys c/1/2
_MEMO_LIMIT = 100_000  # parents whose owner is remembered before the memo starts over


def chunkish_under(path: str, key: str) -> bool:
    """True if ``key`` lies under ``path`` and every segment after it is chunk-like (a chunk or shard key)."""
    prefix = f"{path}/" if path else ""
    if not key.startswith(prefix) or len(key) == len(prefix):
        return False
    return all(_CHUNKISH.fullmatch(s) for s in key[len(prefix) :].split("/"))


@dataclass(frozen=True)
class NotArray:
    """A path that holds no array (a group, or nothing)."""


@dataclass(frozen=True)
class UnshardedArray:
    """An array stored one chunk per key; the proxy passes its keys through."""


@dataclass(frozen=True, eq=False)
class ShardedNode:
    """An array whose chunks live in shards.

    Attributes
    ----------
    array : ShardedArray
        Its key mapping (chunk key -> shard key and local coords).
    view : dict
        Its ``zarr.json`` document as stored (do not mutate; replace the node).
    """

    array: ShardedArray
    view: dict[str, Any] = field(repr=False)


NodeState = Union[NotArray, UnshardedArray, ShardedNode]
NOT_ARRAY = NotArray()
UNSHARDED = UnshardedArray()


def sharded_node(path: str, zarray: Mapping[str, Any], view: dict[str, Any]) -> NodeState:
    """The state of an array from its ``.zarray`` and ``zarr.json`` (``UNSHARDED`` if the view shards nothing).

    Raises
    ------
    ConfigurationError
        If the view's inner ``chunk_shape`` differs from the ``.zarray`` chunks,
        or the sharding configuration is invalid.
    UnsupportedError
        If the sharding configuration is valid but not supported.
    """
    spec = sharding_spec_from_v3(view, path)
    if spec is None:
        return UNSHARDED
    if list(spec.chunks) != list(zarray["chunks"]):
        raise ConfigurationError(
            f"zarr.json inner chunk_shape {list(spec.chunks)} differs from .zarray chunks {zarray['chunks']}", path
        )
    array = ShardedArray(
        path=path,
        key_prefix=f"{path}/" if path else "",
        shape=tuple(int(s) for s in zarray["shape"]),
        chunks=spec.chunks,
        layout=spec.layout,
        chunk_key_encoding=V2ChunkKeyEncoding(v2_dimension_separator(zarray)),  # type: ignore[arg-type]
        shard_key_encoding=spec.shard_key_encoding,
    )
    return ShardedNode(array, view)


class NodeCache:
    """Node states by path, read lazily from the base store, and the owner of each key.

    Parameters
    ----------
    base : StoreAdapter
        Where ``.zarray`` and ``zarr.json`` documents are read.

    Notes
    -----
    Thread-safe: one lock guards the maps; a state read from the store may be
    read twice by racing threads (same result).
    """

    def __init__(self, base: StoreAdapter) -> None:
        self._base = base
        self._states: dict[str, NodeState] = {}
        self._owners: dict[str, ShardedArray | None] = {}
        self.lock = threading.RLock()

    def state(self, path: str) -> NodeState:
        """What ``path`` is (read on first use).

        Raises
        ------
        MetadataError
            If its ``.zarray`` or ``zarr.json`` is not JSON.
        ConfigurationError, UnsupportedError
            If its sharding cannot be used.
        """
        with self.lock:
            if path in self._states:
                return self._states[path]
        zarray_key, zjson_key = join_path(path, ".zarray"), join_path(path, "zarr.json")
        found = self._base.get_many([zarray_key, zjson_key])
        state: NodeState = NOT_ARRAY
        if zjson_key in found:
            view = load_json(zjson_key, found[zjson_key])
            if zarray_key in found:  # presented from zarr.json, or (before issue 11) stored beside it
                state = sharded_node(path, load_json(zarray_key, found[zarray_key]), view)
            elif isinstance(view, dict) and ".zarray" in (docs := present(view, path)):  # zarr.json alone
                state = sharded_node(path, docs[".zarray"], view)
        elif zarray_key in found:
            state = UNSHARDED
        with self.lock:
            self._states[path] = state
        return state

    def sharded(self, path: str) -> ShardedNode | None:
        """The sharded node at ``path``, or ``None``."""
        state = self.state(path)
        return state if isinstance(state, ShardedNode) else None

    def set(self, path: str, state: NodeState) -> None:
        """Record what ``path`` now is (owners of keys may change)."""
        with self.lock:
            self._states[path] = state
            self._owners.clear()

    def forget(self, path: str) -> None:
        """Forget what ``path`` is (read again on next use)."""
        with self.lock:
            self._states.pop(path, None)
            self._owners.clear()
        self._forget_documents(path, below=False)

    def _forget_documents(self, path: str, below: bool = True) -> None:
        """Drop the documents the base adapter keeps (a :class:`PresentingAdapter`) for ``path``."""
        forget = getattr(self._base, "forget", None)
        if forget is not None and below:
            forget(path)
        elif forget is not None:
            self._base.forget_node(path)  # type: ignore[attr-defined]

    def forget_under(self, path: str) -> None:
        """Forget ``path`` and every path below it (everything for ``""``)."""
        with self.lock:
            for p in [p for p in self._states if not path or p == path or p.startswith(f"{path}/")]:
                self._states.pop(p)
            self._owners.clear()
        self._forget_documents(path)

    def clear(self) -> None:
        """Forget everything."""
        with self.lock:
            self._states.clear()
            self._owners.clear()
        self._forget_documents("")

    def is_hidden(self, key: str) -> bool:
        """True for the ``zarr.json`` of a node presented in v2 (a sharded array, a v3 group)."""
        path, name = split_key(key)
        if name != "zarr.json":
            return False
        if isinstance(self.state(path), ShardedNode):
            return True
        node = getattr(self._base, "node", None)
        presented = node(path) if node is not None else None
        return presented is not None and bool(presented.documents)

    def owner(self, key: str) -> ShardedArray | None:
        """The sharded array whose chunk (or shard) ``key`` names, if any.

        The first array met walking the key's prefixes from the root owns it
        (arrays have no children), provided every segment after the array's
        path is chunk-like (``/``-separated chunk keys have several).
        """
        parent, name = split_key(key)
        if name in META_NAMES or not _CHUNKISH.fullmatch(name):
            return None  # the last segment of a chunk or shard key is always chunk-like
        with self.lock:
            if parent in self._owners:
                return self._owners[parent]
        owner = self._owner_of_parent(parent)
        with self.lock:
            if len(self._owners) > _MEMO_LIMIT:
                self._owners.clear()
            self._owners[parent] = owner
        return owner

    def _owner_of_parent(self, parent: str) -> ShardedArray | None:
        """:meth:`owner` for every key ``parent/<chunk-like name>`` (memoised by the caller)."""
        for path in owner_candidates(join_path(parent, "0")):
            state = self.state(path)
            if isinstance(state, NotArray):
                continue
            rest = parent[len(path) :].strip("/")
            if isinstance(state, UnshardedArray) or any(not _CHUNKISH.fullmatch(s) for s in rest.split("/") if rest):
                return None
            return state.array
        return None
