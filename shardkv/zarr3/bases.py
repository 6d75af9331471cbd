"""What lies under :class:`shardkv.zarr3.ShardedStore`: a zarr 3 store, and the same data for the shard engine.

The store keeps the zarr-python 3 store it wraps for everything that is not a
chunk of a transparently sharded array (``zarr.json`` documents, chunks of
other arrays, any other key), and gives the shard engine the same data through
shardkv's own adapters, so that generations, lock files and conditional writes
are those of the zarr 2 proxy on the same store:

================================  ================================================
zarr 3 store                      the engine's base store
================================  ================================================
``LocalStore(root)``              the directory ``root`` (atomic local writes, lock files)
``FsspecStore(fs, path)``         an ``FSMap`` over the synchronous twin of ``fs``
                                  (s3fs: ETag compare-and-swap; ``memory://``)
``ObjectStore(obstore store)``    that obstore store (``PutMode`` compare-and-swap)
``MemoryStore(dict)``             a bytes view of the same dict (:class:`BufferMapping`)
any other zarr 3 ``Store``        :class:`Zarr3KV` (its own async API, run synchronously; process
                                  stamps; ``concurrency="auto"`` asks for a choice, as for
                                  zarr 2's persistent stores)
================================  ================================================
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from typing import Any, Iterator, Mapping

from fsspec.mapping import FSMap

from shardkv.errors import ConfigurationError
from shardkv.storage.kv import Capabilities
from shardkv.storage.location import StoreLocation
from shardkv.storage.mapping import MappingStore

__all__ = ["zarr3_store", "engine_base", "same_store", "BufferMapping", "StoreMapping", "Zarr3KV"]


def zarr3_store(store: Any, storage_options: Mapping[str, Any] | None = None, read_only: bool = False) -> Any:
    """The zarr 3 store for what the user passed: a zarr 3 ``Store`` as it is, or a path / URL.

    Parameters
    ----------
    store : zarr.abc.store.Store, str or os.PathLike
        A zarr-python 3 store, a local path, or an fsspec URL (``s3://...``, ``memory://...``).
    storage_options : mapping, optional
        fsspec options for a URL (endpoint, credentials).
    read_only : bool
        Open a path or URL read-only.

    Raises
    ------
    TypeError
        If ``store`` is none of these (a zarr-python 2 store or an fsspec mapper: use
        :class:`shardkv.ShardedStore`, the zarr 2 proxy).
    ConfigurationError
        If ``storage_options`` is given with a store object or a local path.
    """
    from zarr.abc.store import Store
    from zarr.storage import FsspecStore, LocalStore

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
    """What the shard engine opens for the data of the zarr 3 store ``store`` (see the module table)."""
    from zarr.storage import FsspecStore, LocalStore, MemoryStore

    if isinstance(store, LocalStore):
        return os.fspath(store.root)
    if isinstance(store, FsspecStore):
        fs = _sync_filesystem(store.fs)
        if "file" in _protocols(fs):
            return os.path.abspath(store.path)
        return FSMap(store.path, fs, check=False, create=False)
    if type(store).__name__ == "ObjectStore" and hasattr(store, "store"):
        return store.store
    if isinstance(store, MemoryStore):
        return BufferMapping(store._store_dict, getattr(store, "path", ""))
    return Zarr3KV(store)


def same_store(a: Any, b: Any) -> bool:
    """Whether the zarr 3 stores ``a`` and ``b`` are the same store.

    The stores' own ``==``, except that a ``MemoryStore`` compares its dict by
    value, so two stores of equal contents would be one: those are the same
    store only when they hold the same dict (and prefix), the rule zarr
    itself applies before copying between stores.
    """
    from zarr.storage import MemoryStore

    if not a == b:
        return False
    if isinstance(a, MemoryStore) and isinstance(b, MemoryStore):
        return bool(engine_base(a) == engine_base(b))
    return True


def _protocols(fs: Any) -> tuple[str, ...]:
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


class BufferMapping(MutableMapping[str, bytes]):
    """The dict of a zarr 3 ``MemoryStore`` (values are zarr ``Buffer`` objects) as a mapping of bytes.

    Parameters
    ----------
    store_dict : MutableMapping
        ``MemoryStore._store_dict``: keys to ``zarr.core.buffer.Buffer``.
    path : str
        The key prefix of a ``ManagedMemoryStore`` (``""`` for a plain ``MemoryStore``).
    """

    def __init__(self, store_dict: MutableMapping[str, Any], path: str = "") -> None:
        self.store_dict = store_dict
        self.prefix = f"{path.strip('/')}/" if path.strip("/") else ""

    def __getitem__(self, key: str) -> bytes:
        return self.store_dict[self.prefix + key].to_bytes()  # type: ignore[no-any-return]

    def __setitem__(self, key: str, value: Any) -> None:
        from zarr.core.buffer import default_buffer_prototype

        self.store_dict[self.prefix + key] = default_buffer_prototype().buffer.from_bytes(bytes(value))

    def __delitem__(self, key: str) -> None:
        del self.store_dict[self.prefix + key]

    def __iter__(self) -> Iterator[str]:
        n = len(self.prefix)
        return iter([k[n:] for k in list(self.store_dict) if k.startswith(self.prefix)])

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BufferMapping) and other.store_dict is self.store_dict and other.prefix == self.prefix

    __hash__ = None  # type: ignore[assignment]


class StoreMapping(MutableMapping[str, bytes]):
    """Any zarr 3 store as a blocking mapping of bytes (its async methods run on zarr's event loop).

    Called from worker threads only (never from zarr's event loop thread).
    Generations are shardkv's process stamps: writers in other processes are not seen.
    """

    def __init__(self, store: Any) -> None:
        self.store = store

    def __getitem__(self, key: str) -> bytes:
        from zarr.core.buffer import default_buffer_prototype
        from zarr.core.sync import sync

        value = sync(self.store.get(key, prototype=default_buffer_prototype()))
        if value is None:
            raise KeyError(key)
        return value.to_bytes()  # type: ignore[no-any-return]

    def __setitem__(self, key: str, value: Any) -> None:
        from zarr.core.buffer import default_buffer_prototype
        from zarr.core.sync import sync

        sync(self.store.set(key, default_buffer_prototype().buffer.from_bytes(bytes(value))))

    def __delitem__(self, key: str) -> None:
        from zarr.core.sync import sync

        if not sync(self.store.exists(key)):
            raise KeyError(key)
        sync(self.store.delete(key))

    def __iter__(self) -> Iterator[str]:
        from zarr.core.sync import _collect_aiterator, sync

        return iter(sync(_collect_aiterator(self.store.list())))

    def __len__(self) -> int:
        return sum(1 for _ in self)


class Zarr3KV(MappingStore):
    """Any other zarr 3 store as a process-stamped KVStore (whole values, sliced for ranges).

    Where it keeps its data is unknown (a zip file, a database, a service):
    no lock files, no conditional writes, so ``concurrency="auto"`` asks for
    ``"process"`` or ``"none"``, as for zarr 2's persistent stores. Stores of
    the same data (equal ``str(store)``) share process stamps.
    """

    def __init__(self, store: Any) -> None:
        super().__init__(StoreMapping(store))
        self.kind = "persistent"
        self.caps = Capabilities(ranged=False, round_trips=False, stamps="process")
        self._zarr3_location = StoreLocation(("zarr3", type(store).__module__, type(store).__name__), str(store))

    @property
    def location(self) -> StoreLocation:
        """The zarr 3 store's class and ``str()``: the identity of its data."""
        return self._zarr3_location
