"""Listing through the proxy: base store keys in, logical keys out (docs/architecture.md, "The read path").

Keys outside sharded arrays are listed as zarr-python 2 sees them; each shard
is replaced by the chunk keys its index holds inside the grid. ``len`` never
builds a chunk key; ``list(store.keys())`` lists once (:class:`ListedKeys`).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Iterator, KeysView, Mapping
from typing import Any

from shardkv.engine.engine import ShardEngine
from shardkv.keys.listing import sorted_chunk_names
from shardkv.keys.space import ShardedArray
from shardkv.proxy.nodes import NodeTable
from shardkv.storage.kv import Generation, KVStore

Listed = Iterable[tuple[str, "Generation | None"]]
"""A base store listing: ``(key, generation or None)`` pairs, as :meth:`KVStore.list_generations
<shardkv.storage.kv.KVStore.list_generations>` yields them."""


def base_listing(kv: KVStore, engine: ShardEngine, prefix: str) -> Listed:
    """The base store keys under ``prefix``, with the generations the listing returns for the cached shards.

    The engine takes a cached index whose generation equals the listed one
    as current without a request (:meth:`~shardkv.engine.reads.ShardReader.read_indexes`);
    only cached shards are asked for (a local ``stat`` each), and object
    stores return them with the listing anyway.
    """
    return kv.list_generations(prefix, engine.cache.__contains__)


def split_shards(nodes: NodeTable, listed: Listed) -> tuple[list[str], dict[str, ShardedArray], dict[str, Generation]]:
    """A base store listing as ``(plain keys, {shard key: its array}, {shard key: its listed generation})``."""
    plain: list[str] = []
    shards: dict[str, ShardedArray] = {}
    generations: dict[str, Generation] = {}
    for key, generation in listed:
        arr = nodes.owner(key)
        if arr is not None and arr.shard_coords_of(key) is not None:
            shards[key] = arr
            if generation is not None:
                generations[key] = generation
        else:
            plain.append(key)
    return plain, shards, generations


def logical_keys(nodes: NodeTable, engine: ShardEngine, listed: Listed) -> Iterator[str]:
    """The keys code above the proxy sees, for the base store listing ``listed`` (enumerated once, lazily)."""
    plain, shards, generations = split_shards(nodes, listed)
    yield from nodes.listed(plain)
    yield from engine.reads.chunk_keys(shards, generations=generations)  # in-grid chunks; indexes read in batches


def count_logical_keys(nodes: NodeTable, engine: ShardEngine, listed: Listed) -> int:
    """How many keys :func:`logical_keys` would list (no chunk key is built)."""
    plain, shards, generations = split_shards(nodes, listed)
    return sum(1 for _ in nodes.listed(plain)) + engine.reads.count_chunks(shards, generations=generations)


def child_names(nodes: NodeTable, engine: ShardEngine, prefix: str, listed: Listed) -> list[str]:
    """Sorted names of the children of the path ``prefix`` names (``"path/"``), from the base keys under it.

    Parameters
    ----------
    nodes : NodeTable
        The hierarchy's nodes.
    engine : ShardEngine
        Reads the indexes of the listed shards.
    prefix : str
        ``"path/"`` (``""`` for the root).
    listed : iterable of (str, Generation or None)
        The base store listing under ``prefix``, or under the array ``prefix`` lies in
        (enumerated once; see :func:`base_listing`): a shard of a ``/``-separated
        array holds chunks under several sub-paths, and only the keys under
        ``prefix`` give names.

    Notes
    -----
    When the shards all belong to one array whose chunk keys are
    ``<prefix><c0>.<c1>...`` (zarr-python 2's ``listdir`` of a sharded array,
    as ``nchunks_initialized`` asks for it), the chunk names come from the
    indexes already sorted (:func:`~shardkv.keys.listing.sorted_chunk_names`)
    and only the few other names are placed among them.
    """
    plain, shards, generations = split_shards(nodes, listed)
    arrays = {id(arr): arr for arr in shards.values()}
    if len(arrays) == 1:
        (arr,) = arrays.values()
        if arr.key_prefix == prefix:
            names = sorted_chunk_names(arr, engine.reads.present_masks(shards, generations=generations), len(shards))
            if names is not None:
                for name in sorted({_child(k, prefix) for k in nodes.listed(plain)}):
                    at = bisect.bisect_left(names, name)
                    if at == len(names) or names[at] != name:
                        names.insert(at, name)
                return names
    keys = itertools.chain(nodes.listed(plain), engine.reads.chunk_keys(shards, generations=generations))
    return sorted({_child(k, prefix) for k in keys if k.startswith(prefix)})


def _child(key: str, prefix: str) -> str:
    """The first segment of ``key`` after ``prefix``."""
    return key[len(prefix) :].split("/", 1)[0]


class ListedKeys(KeysView[str]):
    """A store's ``keys()``: the keys listed once when it is made, with the store's own ``in``.

    Iteration and ``len`` use that one listing (``list(store.keys())``
    enumerates the base store once, where a plain ``KeysView`` would count the
    keys, then list them again); ``in`` asks the store (current, no
    listing). Set operations work as on any ``KeysView``.

    Parameters
    ----------
    store : Mapping
        The store (its ``__contains__`` answers ``in``).
    keys : iterable of str
        Its keys, enumerated here once.
    """

    __slots__ = ("_listed",)

    def __init__(self, store: Mapping[str, Any], keys: Iterable[str]) -> None:
        super().__init__(store)
        self._listed = list(iter(keys))  # iter first: list() would ask a mapping for its len (a second listing)

    def __iter__(self) -> Iterator[str]:
        return iter(self._listed)

    def __len__(self) -> int:
        return len(self._listed)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._listed!r})"
