"""A :class:`StoreAdapter` over any ``MutableMapping`` (a dict, a zarr-python 2 store): whole values only; ranges are sliced from them.

zarr-python 2 stores are told apart (:func:`zarr2_kind`), for the
guarantee concurrent writers get (:mod:`shardkv.engine.concurrency`):

* ``"directory"``: a ``DirectoryStore`` subclass (``NestedDirectoryStore``,
  ``N5Store``, ``TempStore``), or any mapping whose ``path`` is an existing
  local directory (``LMDBStore``, a local ``FSStore`` with a
  ``key_separator``): the location has a ``local_dir``, so
  ``concurrency="auto"`` takes lock files there, as for any local directory;
* ``"persistent"``: another zarr-python 2 store that keeps its data outside
  this process (``SQLiteStore``, ``DBMStore``, ``ZipStore``, ``RedisStore``,
  ``MongoDBStore``, ``ABSStore``, a remote ``FSStore`` with a
  ``key_separator``, ...): no lock files, no conditional writes, so
  ``"auto"`` asks for an explicit choice;
* ``"memory"``: ``zarr.MemoryStore``, a ``KVStore`` over a ``dict``, an
  ``FSStore`` over ``memory://``, and every mapping that is not a zarr
  store (the in-process emulation of conditional writes applies).
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from typing import Any, Iterable, Iterator, Mapping, Sequence

from fsspec.mapping import FSMap

from shardkv.format.ranges import ByteRange
from shardkv.storage.base import StoreAdapter, hidden
from shardkv.storage.buffers import (
    Value,
    join_parts,
    slice_value,
)
from shardkv.storage.location import StoreLocation

__all__ = ["MappingAdapter", "zarr2_kind"]


def _is_zarr_class(cls: type) -> bool:
    return (cls.__module__ or "").split(".", 1)[0] == "zarr"


def _classify(mapping: Any) -> tuple[str, str | None]:
    """``(kind, directory)`` of a mapping: see :func:`zarr2_kind`; the directory of a ``"directory"`` one."""
    for _ in range(16):  # wrappers nest a few levels at most
        cls = type(mapping)
        path, fs = getattr(mapping, "path", None), getattr(mapping, "fs", None)
        if any(c.__name__ == "DirectoryStore" and _is_zarr_class(c) for c in cls.__mro__):
            return "directory", path if isinstance(path, str) else None
        if getattr(mapping, "key_separator", None) is not None:
            return "persistent", None  # an FSStore that rewrites keys: not a plain directory of ours
        protocol = getattr(fs, "protocol", "file")  # an FSStore's path is inside its filesystem
        protocols = set(protocol if isinstance(protocol, tuple) else (protocol,))
        if protocols & {"file", "local"} and isinstance(path, str) and path and os.path.isdir(path):
            return "directory", path
        if not _is_zarr_class(cls) or cls.__name__ == "MemoryStore" or "memory" in protocols:
            return "memory", None
        inner = getattr(mapping, "_mutable_mapping", None) if cls.__name__ == "KVStore" else None
        if cls.__name__ == "LRUStoreCache":
            inner = getattr(mapping, "_store", None)
        if inner is None:
            return "persistent", None
        mapping = inner
    return "persistent", None


def zarr2_kind(mapping: Any) -> str:
    """``"directory"``, ``"persistent"`` or ``"memory"``: where a mapping keeps its data (see the module docstring).

    Pure but for one ``os.path.isdir`` of a mapping's ``path``. Wrappers of
    zarr-python 2 (``KVStore``, ``LRUStoreCache``) are looked through; an
    ``FSStore`` with a key separator (it rewrites keys) is ``"persistent"``.
    """
    return _classify(mapping)[0]


class MappingAdapter(StoreAdapter):
    """A ``MutableMapping`` as base store (dict, zarr-python 2 store, user mapping).

    Parameters
    ----------
    mapping : MutableMapping
        The base store. Values may be any bytes-like object.
    """

    supports_ranges = False

    def __init__(self, mapping: MutableMapping) -> None:
        self.mapping = mapping
        self.kind, directory = _classify(mapping)
        """Where the mapping keeps its data: ``"directory"``, ``"persistent"`` or ``"memory"`` (:func:`zarr2_kind`)."""
        self._local_dir = os.path.realpath(directory) if directory is not None else None

    # -- identity and pickling (issue 9) --------------------------------------

    @property
    def location(self) -> StoreLocation:
        """The mapping's data: stores over the same data share locks.

        A mapping over a local directory (a zarr ``DirectoryStore`` subclass
        such as ``NestedDirectoryStore``): ``("file",)`` and the resolved
        directory, with that ``local_dir`` (lock files work there). Any other
        mapping: that mapping object.
        """
        if self._local_dir is not None:
            return StoreLocation(("file",), self._local_dir, self._local_dir)
        return StoreLocation(("mapping", id(self.mapping)), "")

    def __reduce__(self) -> tuple[Any, ...]:
        # the mapping pickles itself (a dict is copied: the copy is a new location)
        return (type(self), (self.mapping,))

    # -- I/O ------------------------------------------------------------------

    def get(self, key: str) -> bytes:
        return self.mapping[key]

    def get_many(self, keys: Sequence[str]) -> dict[str, bytes]:
        getitems = getattr(self.mapping, "getitems", None)
        if getitems is not None and not isinstance(self.mapping, FSMap):
            return dict(getitems(list(keys), contexts={}))
        out = {}
        for k in keys:
            try:
                out[k] = self.mapping[k]
            except KeyError:
                continue
        return out

    def get_ranges(self, requests: Sequence[tuple[str, ByteRange]]) -> list[bytes | memoryview | None]:
        values = self.get_many(list(dict.fromkeys(k for k, _ in requests)))
        return [None if k not in values else slice_value(values[k], r) for k, r in requests]

    def set_many(self, values: Mapping[str, Value]) -> None:
        if not values:
            return
        # a mapping stores one object per key: parts are joined here, once
        joined = {k: join_parts(v) if isinstance(v, (list, tuple)) else v for k, v in values.items()}
        setitems = getattr(self.mapping, "setitems", None)
        if setitems is not None:
            setitems(joined)
        else:
            for k, v in joined.items():
                self.mapping[k] = v

    def delete_many(self, keys: Iterable[str]) -> None:
        for k in keys:
            try:
                del self.mapping[k]
            except KeyError:
                continue

    def contains(self, key: str) -> bool:
        return key in self.mapping

    def iter_keys(self, prefix: str = "") -> Iterator[str]:
        for k in list(self.mapping.keys()):
            if k.startswith(prefix) and not hidden(k):  # not the lock files of a directory
                yield k

    def list_dir(self, path: str = "") -> list[str]:
        listdir = getattr(self.mapping, "listdir", None)
        if listdir is not None:
            return sorted(n for n in listdir(path) if not hidden(n))
        prefix = f"{path}/" if path else ""
        return sorted({k[len(prefix) :].split("/", 1)[0] for k in self.iter_keys(prefix)})

    def rmdir(self, path: str) -> None:
        rmdir = getattr(self.mapping, "rmdir", None)
        if rmdir is None:
            super().rmdir(path)
        elif path or self._local_dir is None:
            rmdir(path)
        else:  # everything but the lock files, which writers in other processes may hold
            for name in self.list_dir(""):
                rmdir(name)
                if name in self.mapping:
                    del self.mapping[name]

    def size(self, key: str) -> int:
        return memoryview(self.mapping[key]).nbytes

    def close(self) -> None:
        close = getattr(self.mapping, "close", None)
        if close is not None:
            close()


