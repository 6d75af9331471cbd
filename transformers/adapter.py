"""The abstract store interface over a shardkv :class:`~shardkv.storage.kv.KVStore` (the bottom of a stack).

:class:`AdapterStore` gives any store :func:`shardkv.storage.open.open_kv`
takes (a dict, a zarr-python 2 store, an fsspec mapper, a URL, an obstore
store, a ``KVStore``) the operations of
:class:`~shardkv.transformers.api.AbstractStore`. Each operation is one call
on the store:

=======================  ==============================================
operation                store call(s)
=======================  ==============================================
``get_partial_values``   1 ``get_many`` (one read per key, all its ranges)
``set_values``           1 ``put_many``
``set_partial_values``   1 ``get_many`` of the old values, 1 ``put_many``
``erase_values``         1 ``put_many`` of deletes
``erase_prefix``         1 listing, 1 ``put_many`` of deletes
``list_prefix``          1 listing
``list_dir``             1 listing
=======================  ==============================================

The sharding transformer reaches the same store through :class:`UnderlyingKV`
(its location, hence its locks).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any

from shardkv._types import BytesLike
from shardkv.format.ranges import ByteRange
from shardkv.storage.buffers import Value, join_parts
from shardkv.storage.kv import (
    ANY,
    Capabilities,
    Generation,
    KVStore,
    ReadRequest,
    ReadResult,
    hidden,
)
from shardkv.storage.location import StoreLocation
from shardkv.storage.open import open_kv
from shardkv.storage.stamps import STAMPS, Fetched, read_stamped, write_stamped

from .api import AbstractStore, KeyRange, KeyStartValue, apply_partial_writes, normalize_prefix

__all__ = ["AdapterStore", "UnderlyingKV"]


class AdapterStore(AbstractStore):
    """A :class:`~shardkv.storage.kv.KVStore` seen through the abstract store interface.

    Parameters
    ----------
    store : KVStore or anything :func:`shardkv.storage.open.open_kv` takes
        The storage at the bottom of the stack.
    storage_options : mapping, optional
        fsspec options when ``store`` is a URL.

    Attributes
    ----------
    kv : KVStore
        The store every operation goes to.

    Raises
    ------
    TypeError
        If ``store`` cannot be used as a store.
    """

    def __init__(self, store: Any, storage_options: Mapping[str, Any] | None = None) -> None:
        self.kv: KVStore = open_kv(store, storage_options)

    def __repr__(self) -> str:
        return f"AdapterStore({self.kv!r})"

    def get_partial_values(self, key_ranges: Sequence[KeyRange]) -> list[bytes | None]:
        by_key: dict[str, list[int]] = {}
        ranges: list[ByteRange] = []
        for i, (key, byte_range) in enumerate(key_ranges):
            if not isinstance(byte_range, ByteRange):
                raise TypeError(f"range for {key!r} must be a ByteRange, got {type(byte_range).__name__}")
            by_key.setdefault(key, []).append(i)
            ranges.append(byte_range)
        if not by_key:
            return []
        results = self.kv.get_many([(key, [ranges[i] for i in at], ANY) for key, at in by_key.items()])
        out: list[bytes | None] = [None] * len(ranges)
        for at, result in zip(by_key.values(), results, strict=True):
            if result.values is not None:
                for i, value in zip(at, result.values, strict=True):
                    out[i] = bytes(value)
        return out

    def contains(self, key: str) -> bool:
        return self.kv.contains(key)

    def get(self, key: str) -> bytes:
        result = self.kv.get(key)
        if not result.found:
            raise KeyError(key)
        return bytes(result.whole())

    def set_values(self, values: Mapping[str, BytesLike]) -> None:
        if values:
            self.kv.put_many({k: (bytes(v), ANY) for k, v in values.items()})

    def set_partial_values(self, key_start_values: Sequence[KeyStartValue]) -> None:
        by_key: dict[str, list[tuple[int, BytesLike]]] = {}
        for key, start, value in key_start_values:
            by_key.setdefault(key, []).append((int(start), value))
        if not by_key:
            return
        old = self.kv.values(list(by_key))
        self.kv.put_many({k: (apply_partial_writes(k, old.get(k), w), ANY) for k, w in by_key.items()})

    def erase_values(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        if keys:
            self.kv.put_many({k: (None, ANY) for k in keys})

    def erase_prefix(self, prefix: str) -> None:
        self.erase_values(self.list_prefix(prefix))

    def list_prefix(self, prefix: str) -> list[str]:
        return list(self.kv.list_prefix(normalize_prefix(prefix)))

    def close(self) -> None:
        """Close the store (what :meth:`KVStore.close <shardkv.storage.kv.KVStore.close>` releases)."""
        self.kv.close()

    def list_dir(self, prefix: str) -> tuple[list[str], list[str]]:
        prefix = normalize_prefix(prefix)
        keys: set[str] = set()
        prefixes: set[str] = set()
        for k in self.list_prefix(prefix):
            rest = k[len(prefix) :]
            if "/" in rest:
                prefixes.add(prefix + rest.split("/", 1)[0] + "/")
            else:
                keys.add(k)
        return sorted(keys), sorted(prefixes)


class UnderlyingKV(KVStore):
    """Any :class:`~shardkv.transformers.api.AbstractStore` (a transformer of a stack, a custom store) as a KVStore.

    The engine of a :class:`~shardkv.transformers.sharding.ShardingStorageTransformer`
    over a store that is not an :class:`AdapterStore` reaches it through this
    adapter. Generations are process stamps (:mod:`shardkv.storage.stamps`,
    per adapter object): they see the writes made through this adapter and
    nothing else, so the transformer's default ``concurrency`` there is
    ``"process"``.

    ====================  ==============================================
    operation             call on the underlying store
    ====================  ==============================================
    ``get_many``          1 ``get_partial_values`` (whole values as ``ByteRange(0)``)
    ``put_many``          1 ``set_values`` and 1 ``erase_values`` at most
    ``list_prefix``       1 ``list_prefix``
    ====================  ==============================================

    Parameters
    ----------
    store : AbstractStore
        The underlying store.
    """

    def __init__(self, store: AbstractStore) -> None:
        self.store = store
        self._location = StoreLocation(("abstract-store", id(store)), "")
        self.caps = Capabilities(ranged=True, round_trips=False, stamps="process")
        self._in_process: KVStore | None = None  # the store whose sizes cost no request
        if isinstance(store, AdapterStore):  # the data's own location: its lock files, its stamps
            kv = store.kv
            self._location = kv.location
            self.caps = Capabilities(
                ranged=True,
                round_trips=kv.caps.round_trips,
                stamps="process",
                conditional_put=False,
                lock_dir=kv.caps.lock_dir,
                in_process=kv.caps.in_process,
            )
            self._in_process = kv if kv.caps.in_process else None

    def __repr__(self) -> str:
        return f"UnderlyingKV({self.store!r})"

    @property
    def location(self) -> StoreLocation:
        """A location private to the underlying store object."""
        return self._location

    def get_many(self, reads: Sequence[ReadRequest]) -> list[ReadResult]:
        return read_stamped(self._location, reads, partial(self._fetch_reads, reads))

    def _fetch_reads(self, reads: Sequence[ReadRequest], indices: list[int]) -> dict[int, Fetched]:
        requests: list[KeyRange] = []
        owners: list[int] = []
        fetched: dict[int, Fetched] = {}
        for i in indices:
            key, ranges, cond = reads[i]
            if ranges == [] and not cond.is_any and not cond.is_missing:
                fetched[i] = ([], None)  # the stamp of a value read holds: still that value, no request needed
                continue
            for r in [ByteRange(0)] if ranges is None else (ranges or [ByteRange(0, 0)]):
                requests.append((key, r))
                owners.append(i)
        per_read: dict[int, list[bytes | None]] = {}
        for owner, data in zip(owners, self.store.get_partial_values(requests) if requests else [], strict=True):
            per_read.setdefault(owner, []).append(data)
        for i, got in per_read.items():
            key, ranges, _ = reads[i]
            if any(v is None for v in got):
                continue
            values: list[BytesLike] = [] if ranges == [] else [v for v in got if v is not None]
            if ranges is None:
                fetched[i] = (values, len(values[0]))
            else:  # the size is free only where the data lives in this process
                fetched[i] = (values, None if self._in_process is None else self._in_process.size(key))
        return fetched

    def contains(self, key: str) -> bool:
        """The underlying store's ``contains`` (a path holding keys, such as a directory, is no value)."""
        return self.store.contains(key)

    def size(self, key: str) -> int | None:
        """The size in bytes of the value at ``key``; ``None`` where the underlying store holds none."""
        return super().size(key) if self.store.contains(key) else None

    def put_many(self, writes: Mapping[str, tuple[Value | None, Generation]]) -> dict[str, Generation | None]:
        return write_stamped(self._location, writes, self._holds, self._write)

    def _holds(self, key: str, cond: Generation, before: Generation) -> bool:
        if cond.is_missing:
            return not self.store.contains(key)
        return cond.is_any or before == cond

    def _write(self, values: Mapping[str, Value | None]) -> None:
        stores = {k: join_parts(v) for k, v in values.items() if v is not None}
        deletes = [k for k, v in values.items() if v is None]
        if stores:
            self.store.set_values(stores)
        if deletes:
            self.store.erase_values(deletes)

    def patch(self, writes: Sequence[KeyStartValue]) -> None:
        """``set_partial_values`` on the underlying store, stamped as a write of each key it touches."""
        keys = list(dict.fromkeys(key for key, _, _ in writes))
        with STAMPS.writing(self._location, keys) as stamped:
            stamped.begin(keys)
            self.store.set_partial_values(list(writes))

    def list_prefix(self, prefix: str) -> Iterator[str]:
        return iter([k for k in self.store.list_prefix(prefix) if not hidden(k)])
