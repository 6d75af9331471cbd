"""The abstract store interface over a shardkv store adapter (the bottom of a stack).

:class:`AdapterStore` gives any :class:`shardkv.storage.adapters.StoreAdapter` (a dict,
a zarr-python 2 store, an fsspec mapper, a URL, all through
:func:`shardkv.storage.adapters.adapt`) the operations of
:class:`~shardkv.transformers.api.AbstractStore`. Each operation is one call
on the adapter where the adapter has a batch form:

=======================  ==============================================
operation                adapter call(s)
=======================  ==============================================
``get_partial_values``   1 ``get_ranges`` (ranged reads where supported)
``set_values``           1 ``set_many``
``set_partial_values``   1 ``get_many`` of the old values, 1 ``set_many``;
                         positional ``write_at`` where the adapter has them
``erase_values``         1 ``delete_many``
``erase_prefix``         1 listing, 1 ``delete_many``
``list_prefix``          1 listing
``list_dir``             1 listing
=======================  ==============================================

The adapter's capabilities pass on (``supports_positional_writes`` = its
``supports_append``, ``size_if_free``, ``validator``), so a sharding
transformer over local files gets the append/in-place write strategies and
index cache validation the proxy has.
"""

from __future__ import annotations

from typing import Any, Hashable, Iterable, Iterator, Mapping, Sequence

from shardkv.format.ranges import ByteRange
from shardkv.storage.adapters import StoreAdapter, adapt
from shardkv.storage.buffers import Value, join_parts
from shardkv.storage.kv import (
    ANY, MISSING_RESULT, NO_VALUE, Capabilities, Generation, KVStore, ReadRequest, ReadResult, hidden,
)
from shardkv.storage.location import StoreLocation
from shardkv.storage.open import open_kv
from shardkv.storage.stamps import STAMPS

from .api import AbstractStore, BytesLike, KeyRange, KeyStartValue, apply_partial_writes, normalize_prefix

__all__ = ["AdapterStore", "UnderlyingKV"]


def _in_place(size: int, writes: Sequence[tuple[int, BytesLike]]) -> bool:
    """True when positional writes give what :func:`apply_partial_writes` gives for a value of ``size`` bytes.

    A write may start anywhere up to the end; a negative start must replace
    the value's tail exactly (a positional write cannot shorten a file).
    """
    for start, value in writes:
        nbytes = memoryview(value).nbytes
        if start < 0 and (nbytes != -start or -start > size):
            return False
        if start > size:
            return False
        size = max(size, (start if start >= 0 else size + start) + nbytes)
    return True


class AdapterStore(AbstractStore):
    """A :class:`~shardkv.storage.adapters.StoreAdapter` seen through the abstract store interface.

    Parameters
    ----------
    store : StoreAdapter or anything :func:`shardkv.storage.adapters.adapt` takes
        The storage at the bottom of the stack.
    storage_options : mapping, optional
        fsspec options when ``store`` is a URL.

    Raises
    ------
    TypeError
        If ``store`` cannot be used as a store.
    """

    def __init__(self, store: Any, storage_options: Mapping[str, Any] | None = None) -> None:
        self.adapter: StoreAdapter = adapt(store, storage_options)

    def __repr__(self) -> str:
        return f"AdapterStore({self.adapter!r})"

    def get_partial_values(self, key_ranges: Sequence[KeyRange]) -> list[bytes | None]:
        requests = []
        for key, byte_range in key_ranges:
            if not isinstance(byte_range, ByteRange):
                raise TypeError(f"range for {key!r} must be a ByteRange, got {type(byte_range).__name__}")
            requests.append((key, byte_range))
        if not requests:
            return []
        return [None if v is None else bytes(v) for v in self.adapter.get_ranges(requests)]

    def contains(self, key: str) -> bool:
        return self.adapter.contains(key)

    def get(self, key: str) -> bytes:
        return bytes(self.adapter.get(key))

    def set_values(self, values: Mapping[str, BytesLike]) -> None:
        if values:
            self.adapter.set_many({k: bytes(v) for k, v in values.items()})

    def set_partial_values(self, key_start_values: Sequence[KeyStartValue]) -> None:
        by_key: dict[str, list[tuple[int, BytesLike]]] = {}
        for key, start, value in key_start_values:
            by_key.setdefault(key, []).append((int(start), value))
        if not by_key:
            return
        if self.adapter.supports_append:
            sizes = {k: self.adapter.size(k) for k in by_key if self.adapter.contains(k)}
            if all(k in sizes and _in_place(sizes[k], w) for k, w in by_key.items()):
                for key, writes in by_key.items():
                    self.adapter.write_at(key, [(s if s >= 0 else sizes[key] + s, bytes(v)) for s, v in writes])
                return
        old = self.adapter.get_many(list(by_key))
        self.adapter.set_many({k: apply_partial_writes(k, old.get(k), w) for k, w in by_key.items()})

    @property
    def supports_positional_writes(self) -> bool:
        return self.adapter.supports_append

    def size_if_free(self, key: str) -> int | None:
        return self.adapter.size_if_free(key)

    def validator(self, key: str) -> Hashable:
        return self.adapter.validator(key)

    def erase_values(self, keys: Iterable[str]) -> None:
        self.adapter.delete_many(list(keys))

    def erase_prefix(self, prefix: str) -> None:
        self.adapter.delete_many(self.list_prefix(prefix))

    def list_prefix(self, prefix: str) -> list[str]:
        prefix = normalize_prefix(prefix)
        # the adapter lists by directory; a partial last segment is filtered here
        directory = prefix[: prefix.rfind("/") + 1]
        return [k for k in self.adapter.iter_keys(directory) if k.startswith(prefix)]

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
        if isinstance(store, AdapterStore):  # the data's own location: its lock files, its stamps
            kv = open_kv(store.adapter)
            self._location = kv.location
            self.caps = Capabilities(ranged=True, round_trips=kv.caps.round_trips, stamps="process",
                                     conditional_put=False, lock_dir=kv.caps.lock_dir, in_process=kv.caps.in_process)

    def __repr__(self) -> str:
        return f"UnderlyingKV({self.store!r})"

    @property
    def location(self) -> StoreLocation:
        """A location private to the underlying store object."""
        return self._location

    def get_many(self, reads: Sequence[ReadRequest]) -> list[ReadResult]:
        loc = self._location
        tickets = [STAMPS.begin_read(loc, key) for key, _, _ in reads]
        results: list[ReadResult | None] = [None] * len(reads)
        requests: list[KeyRange] = []
        owners: list[int] = []
        for i, ((key, ranges, cond), ticket) in enumerate(zip(reads, tickets)):
            if not cond.is_any and not cond.is_missing:
                if STAMPS.current(ticket) != cond:
                    results[i] = ReadResult("stale", None, ANY)
                    continue
                if ranges == []:  # the stamp of a value read holds: still that value, no request needed
                    results[i] = ReadResult("value", [], cond)
                    continue
            for r in ([ByteRange(0)] if ranges is None else (ranges or [ByteRange(0, 0)])):
                requests.append((key, r))
                owners.append(i)
        fetched = self.store.get_partial_values(requests) if requests else []
        per_read: dict[int, list[bytes | None]] = {}
        for owner, data in zip(owners, fetched):
            per_read.setdefault(owner, []).append(data)
        for i, ((key, ranges, cond), ticket) in enumerate(zip(reads, tickets)):
            if results[i] is not None:
                continue
            got = per_read.get(i, [])
            if any(v is None for v in got):
                results[i] = MISSING_RESULT
                continue
            generation = STAMPS.end_read(ticket)
            if cond.is_missing or (not cond.is_any and generation != cond):
                results[i] = ReadResult("stale", None, generation)
                continue
            values: list[BytesLike] = [] if ranges == [] else [v for v in got if v is not None]
            if ranges is None:
                size: int | None = len(values[0])
            else:  # free only where the data lives in this process
                size = self.store.size_if_free(key) if self.caps.in_process else None
            results[i] = ReadResult("value", values, generation, size)
        return [r for r in results if r is not None]

    def put_many(self, writes: Mapping[str, tuple[Value | None, Generation]]) -> dict[str, Generation | None]:
        out: dict[str, Generation | None] = {key: None for key in writes}
        if not writes:
            return out
        with STAMPS.writing(self._location, writes) as stamped:
            ok = [k for k, (_, cond) in writes.items()
                  if cond.is_any or (not cond.is_missing and stamped.before[k] == cond)
                  or (cond.is_missing and not self.store.contains(k))]
            stores = {k: join_parts(v) for k in ok if (v := writes[k][0]) is not None}
            deletes = [k for k in ok if writes[k][0] is None]
            stamped.begin(ok)
            if stores:
                self.store.set_values(stores)
            if deletes:
                self.store.erase_values(deletes)
        for key in ok:
            out[key] = NO_VALUE if writes[key][0] is None else stamped.after[key]
        return out

    def patch(self, writes: Sequence[KeyStartValue]) -> None:
        """``set_partial_values`` on the underlying store, stamped as a write of each key it touches."""
        keys = list(dict.fromkeys(key for key, _, _ in writes))
        with STAMPS.writing(self._location, keys) as stamped:
            stamped.begin(keys)
            self.store.set_partial_values(list(writes))

    def list_prefix(self, prefix: str) -> Iterator[str]:
        return iter([k for k in self.store.list_prefix(prefix) if not hidden(k)])
