"""A :class:`~shardkv.storage.kv.KVStore` over any ``MutableMapping``: a dict, a zarr-python 2 store, a user's mapping.

Whole values (a ranged read fetches the value once and slices it) and process
stamps. Where a mapping keeps its data (:attr:`MappingStore.kind`, by
``isinstance`` against zarr 2's ``zarr.storage`` when the process imported it)
decides what ``concurrency="auto"`` resolves to:

* ``"memory"``: a ``dict`` (or a subclass), zarr 2's ``MemoryStore``: the data
  lives in this process (``in_process``);
* ``"directory"``: zarr 2's ``DirectoryStore`` and its subclasses, an
  ``LMDBStore`` whose ``path`` is a directory: lock files can be taken there;
* ``"persistent"``: every other mapping (zarr 2's ``SQLiteStore``, ``ZipStore``,
  ``LRUStoreCache``..., a user's): other processes may share its data.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from functools import partial
from types import ModuleType
from typing import Any

from shardkv._types import BytesLike
from shardkv.storage.files import join_parts, slice_value
from shardkv.storage.kv import (
    STAMPS,
    Capabilities,
    Fetched,
    Generation,
    KVStore,
    ReadRequest,
    ReadResult,
    StoreLocation,
    Value,
    hidden,
    read_stamped,
    write_stamped,
)


def zarr2_storage() -> ModuleType | None:
    """zarr-python 2's ``zarr.storage`` if this process imported it, else ``None`` (zarr 3's: no DirectoryStore)."""
    module = sys.modules.get("zarr.storage")
    return module if module is not None and isinstance(getattr(module, "DirectoryStore", None), type) else None


def _where(mapping: Any) -> tuple[str, str | None]:
    """``(kind, local directory or None)`` of a mapping (see the module docstring)."""
    zs = zarr2_storage()
    if isinstance(mapping, dict) or (zs is not None and isinstance(mapping, zs.MemoryStore)):
        return "memory", None
    path = getattr(mapping, "path", None) if zs and isinstance(mapping, (zs.DirectoryStore, zs.LMDBStore)) else None
    # an LMDBStore made with subdir=False keeps a file, not a directory
    if zs and isinstance(path, str) and path and (isinstance(mapping, zs.DirectoryStore) or os.path.isdir(path)):
        return "directory", path
    return "persistent", None


class MappingStore(KVStore):
    """A ``MutableMapping`` as a process-stamped :class:`KVStore` (whole values, sliced for ranges).

    Parameters
    ----------
    mapping : MutableMapping
        The base store (``str`` keys, bytes-like values). A zarr-python 2
        store's ``getitems``/``setitems``/``delitems`` are used when it has them.

    Attributes
    ----------
    kind : {"memory", "directory", "persistent"}
        Where the mapping keeps its data (module docstring).
    """

    def __init__(self, mapping: MutableMapping) -> None:
        self.mapping = mapping
        self.kind, directory = _where(mapping)
        local_dir = os.path.realpath(directory) if directory is not None else None
        if local_dir is not None:
            self.location = StoreLocation(("file",), local_dir, local_dir)
        else:
            self.location = StoreLocation(("mapping", id(mapping)), "")
        self.caps = Capabilities(lock_dir=local_dir is not None, in_process=self.kind == "memory")

    def __reduce__(self) -> tuple[Any, ...]:
        # the mapping pickles itself (a dict is copied: the copy is a new location)
        return (type(self), (self.mapping,))

    def __repr__(self) -> str:
        return f"MappingStore({type(self.mapping).__name__}, kind={self.kind!r})"

    # -- reads ----------------------------------------------------------------

    def get_many(self, reads: Sequence[ReadRequest]) -> list[ReadResult]:
        return read_stamped(self.location, reads, partial(self._fetch_reads, reads))

    def _fetch_reads(self, reads: Sequence[ReadRequest], indices: list[int]) -> dict[int, Fetched]:
        keys = list(dict.fromkeys(reads[i][0] for i in indices))
        zs = zarr2_storage()
        if zs is not None and isinstance(self.mapping, zs.BaseStore):  # one getitems
            found = dict(self.mapping.getitems(keys, contexts={}))
        else:
            found = {}
            for key in keys:
                with contextlib.suppress(KeyError):
                    found[key] = self.mapping[key]
        fetched: dict[int, Fetched] = {}
        for i in indices:
            key, ranges, _ = reads[i]
            if key not in found:
                continue
            value = found[key]
            values: list[BytesLike] = [join_parts(value)] if ranges is None else [slice_value(value, r) for r in ranges]
            fetched[i] = (values, memoryview(value).nbytes)
        return fetched

    # -- writes ---------------------------------------------------------------

    def put_many(self, writes: Mapping[str, tuple[Value | None, Generation]]) -> dict[str, Generation | None]:
        return write_stamped(self.location, writes, self.mapping.__contains__, self._write)

    def _write(self, values: Mapping[str, Value | None]) -> None:
        """Store the values (one ``setitems`` where the mapping has it), then delete the keys given ``None``."""
        stores = {k: join_parts(v) if isinstance(v, (list, tuple)) else v for k, v in values.items() if v is not None}
        if stores:
            setitems = getattr(self.mapping, "setitems", None)
            if setitems is not None:
                setitems(stores)
            else:
                for k, v in stores.items():  # not dict.update, which skips a dict subclass's __setitem__
                    self.mapping[k] = v
        for k in [k for k, v in values.items() if v is None]:
            with contextlib.suppress(KeyError):
                del self.mapping[k]

    def contains(self, key: str) -> bool:
        """``key in mapping`` (no value read)."""
        return key in self.mapping

    def size(self, key: str) -> int | None:
        """The size of the stored value (read whole: a mapping keeps no sizes), ``None`` when missing."""
        try:
            return memoryview(self.mapping[key]).nbytes
        except KeyError:
            return None

    # -- listings -------------------------------------------------------------

    def list_prefix(self, prefix: str) -> Iterator[str]:
        for key in list(self.mapping.keys()):
            if key.startswith(prefix) and not hidden(key):  # not the lock files of a directory
                yield key

    def delete_prefix(self, prefix: str) -> None:
        """Delete the keys under ``prefix``; with a zarr 2 store's ``rmdir`` for a path, or the whole store
        when it keeps no local directory (whose lock files stay)."""
        rmdir = getattr(self.mapping, "rmdir", None)
        if rmdir is None or (prefix and not prefix.endswith("/")) or (not prefix and self.caps.lock_dir):
            super().delete_prefix(prefix)
            return
        with STAMPS.writing(self.location, list(self.list_prefix(prefix))) as stamped:
            stamped.begin(list(stamped.before))
            rmdir(prefix.rstrip("/"))

    def close(self) -> None:
        close = getattr(self.mapping, "close", None)
        if close is not None:
            close()
