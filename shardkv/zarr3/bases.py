"""What lies under :class:`shardkv.zarr3.ShardedStore`: a zarr 3 store, and the same data for the shard engine.

Everything but the chunks of sharded arrays goes to the zarr 3 store; the
engine reaches the same data through shardkv's own adapters (so generations,
locks and conditional writes are the zarr 2 proxy's), picked by class:

================================  ================================================
zarr 3 store                      the engine's base store
================================  ================================================
``LocalStore(root)``              the directory ``root`` (atomic local writes, lock files)
``FsspecStore(fs, path)``         an ``FSMap`` over the synchronous twin of ``fs``
                                  (s3fs: ETag compare-and-swap; ``memory://``)
``ObjectStore(obstore store)``    that obstore store (``PutMode`` compare-and-swap)
``MemoryStore`` (and subclasses)  :class:`Zarr3KV` with the data in this process (its own
                                  async API; process stamps are a complete guarantee)
any other zarr 3 ``Store``        :class:`Zarr3KV` (its own async API, run synchronously; process
                                  stamps; ``concurrency="auto"`` asks for a choice, as for
                                  zarr 2's persistent stores)
================================  ================================================
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator, Mapping, MutableMapping
from typing import Any

from fsspec.mapping import FSMap
from zarr.abc.store import Store
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync
from zarr.storage import FsspecStore, LocalStore, MemoryStore, ObjectStore

from shardkv.errors import ConfigurationError
from shardkv.storage.kv import Capabilities, StoreLocation
from shardkv.storage.mapping import MappingStore


def zarr3_store(store: Any, storage_options: Mapping[str, Any] | None = None, read_only: bool = False) -> Any:
    """The zarr 3 store for what the user passed: a zarr 3 ``Store`` as it is, or a path / URL (``read_only``).

    Raises as :class:`shardkv.zarr3.ShardedStore` documents (``TypeError``, ``ConfigurationError``).
    """
    if isinstance(store, Store):
        if storage_options:
            raise ConfigurationError(f"storage_options apply to a URL, not to a {type(store).__name__}")
        return store
    if isinstance(store, os.PathLike):
        store = os.fspath(store)
    if isinstance(store, str):
        if "://" in store and not store.startswith("file://"):
            return FsspecStore.from_url(store, storage_options=dict(storage_options or {}), read_only=read_only)
        if storage_options:
            raise ConfigurationError(f"storage_options apply to a URL, not to the local path {store!r}")
        return LocalStore(store.removeprefix("file://"), read_only=read_only)
    raise TypeError(
        f"cannot use {type(store).__name__} as a zarr-python 3 store: pass a zarr.abc.store.Store (LocalStore, "
        "FsspecStore, ObjectStore, MemoryStore, ...), a path or a URL; zarr-python 2 stores and fsspec "
        "mappers go to shardkv.ShardedStore"
    )


def _sync_filesystem(fs: Any) -> Any:
    """The synchronous filesystem reaching what the (async) fsspec filesystem ``fs`` of an FsspecStore reaches."""
    sync_fs = getattr(fs, "sync_fs", None)  # fsspec's AsyncFileSystemWrapper around a synchronous filesystem
    if sync_fs is not None:
        return sync_fs
    if not getattr(fs, "asynchronous", False):
        return fs
    options = {**fs.storage_options, "asynchronous": False}
    options.pop("loop", None)
    return type(fs)(**options)


def engine_base(store: Any) -> Any:
    """What the shard engine opens for the data of the zarr 3 store ``store`` (the module table, in its order)."""
    if isinstance(store, LocalStore):
        return os.fspath(store.root)
    if isinstance(store, FsspecStore):  # its directory when local, else a mapper over the synchronous filesystem
        fs = _sync_filesystem(store.fs)
        protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
        return os.path.abspath(store.path) if "file" in protocols else FSMap(store.path, fs, check=False, create=False)
    if isinstance(store, ObjectStore):
        return store.store  # the obstore store it wraps (public attribute)
    return Zarr3KV(store)


def same_store(a: Any, b: Any) -> bool:
    """Whether the zarr 3 stores ``a`` and ``b`` are one store (``==``; a ``MemoryStore``: the same dict).

    A ``MemoryStore`` compares its dict by value; its ``str()`` names the dict.
    """
    if not a == b:
        return False
    if isinstance(a, MemoryStore) and isinstance(b, MemoryStore):
        return str(a) == str(b)
    return True


class StoreMapping(MutableMapping[str, bytes]):
    """Any zarr 3 store as a blocking mapping of bytes, for worker threads (its async methods on zarr's loop)."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def __getitem__(self, key: str) -> bytes:
        value = sync(self.store.get(key, prototype=default_buffer_prototype()))
        if value is None:
            raise KeyError(key)
        return value.to_bytes()

    def __setitem__(self, key: str, value: Any) -> None:
        sync(self.store.set(key, default_buffer_prototype().buffer.from_bytes(bytes(value))))

    def __delitem__(self, key: str) -> None:
        if not sync(self.store.exists(key)):
            raise KeyError(key)
        sync(self.store.delete(key))

    def __iter__(self) -> Iterator[str]:
        return iter(sync(_collected(self.store.list())))

    def __len__(self) -> int:
        return sum(1 for _ in self)


async def _collected(keys: AsyncIterator[str]) -> list[str]:
    """Every key of an async listing, in a list."""
    return [key async for key in keys]


class Zarr3KV(MappingStore):
    """A zarr 3 store as a process-stamped KVStore (whole values, sliced for ranges), through its async API.

    Parameters
    ----------
    store : zarr.abc.store.Store
        The zarr 3 store; a ``MemoryStore`` (or subclass) keeps its data in this process.

    Notes
    -----
    Stores of equal class and ``str(store)`` share a location (process stamps, locks).
    """

    def __init__(self, store: Any) -> None:
        super().__init__(StoreMapping(store))
        self.zarr3_store = store
        in_process = isinstance(store, MemoryStore)
        self.kind = "memory" if in_process else "persistent"
        self.caps = Capabilities(ranged=False, round_trips=False, stamps="process", in_process=in_process)
        # the identity of the data, for the process stamps and the locks alike
        self.location = StoreLocation(("zarr3", type(store).__module__, type(store).__name__), str(store))

    def __reduce__(self) -> tuple[Any, ...]:
        return (Zarr3KV, (self.zarr3_store,))

    def __repr__(self) -> str:
        return f"Zarr3KV({self.zarr3_store!r}, kind={self.kind!r})"
