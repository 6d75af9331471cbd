"""The abstract store interface over a shardkv :class:`~shardkv.storage.kv.KVStore` (the store under a transformer).

Each operation of :class:`AdapterStore` is one batched call on the store (``set_partial_values``: one read of
the old values, one put); the sharding transformer's engine works on the same ``KVStore``
(:attr:`AdapterStore.kv`): its generations, its location, hence its locks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from shardkv._types import BytesLike
from shardkv.engine.merge import apply_partial_writes
from shardkv.format.ranges import ByteRange
from shardkv.storage.kv import ANY, KVStore
from shardkv.storage.open import open_kv

from .api import AbstractStore, KeyRange, KeyStartValue, normalize_prefix


class AdapterStore(AbstractStore):
    """A :class:`~shardkv.storage.kv.KVStore` seen through the abstract store interface.

    Parameters
    ----------
    store : KVStore or anything :func:`shardkv.storage.open.open_kv` takes
        The storage the shards live in (every operation goes to its ``kv``).
    storage_options : mapping, optional
        fsspec options when ``store`` is a URL.

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
        for i, (key, byte_range) in enumerate(key_ranges):
            if not isinstance(byte_range, ByteRange):
                raise TypeError(f"range for {key!r} must be a ByteRange, got {type(byte_range).__name__}")
            by_key.setdefault(key, []).append(i)
        if not by_key:
            return []
        results = self.kv.get_many([(key, [key_ranges[i][1] for i in at], ANY) for key, at in by_key.items()])
        out: list[bytes | None] = [None] * len(key_ranges)
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
