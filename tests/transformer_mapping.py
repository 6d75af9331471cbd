"""The draft sharding transformer seen as a MutableMapping, for the mapping contract and stateful tests.

:class:`TransformerMapping` forwards each MutableMapping operation (and the
zarr-style batch methods ``getitems`` / ``setitems`` / ``delitems``) to one
abstract-store operation of a :class:`ShardingStorageTransformer`, so the
suites written for :class:`shardkv.ShardedStore` run unchanged against the
transformer. The chunk grid of the test arrays matches theirs: shape (5, 7),
inner chunks (2, 2), chunks_per_shard (2, 3).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import replace
from typing import Any

from shardkv.format.ranges import ByteRange
from shardkv.storage.kv import Generation, ReadRequest, ReadResult
from shardkv.storage.mapping import MappingStore
from shardkv.transformers import AdapterStore, ShardingStorageTransformer

SHAPE, CHUNKS, CPS = (5, 7), (2, 2), (2, 3)
ARRAY_PATH = "g/a"
META_KEY = "meta/root/g/a.array.json"


def transformer_over(base: Any, **options: Any) -> ShardingStorageTransformer:
    """A transformer for the test array over ``base`` (anything ``AdapterStore`` takes)."""
    under = base if isinstance(base, AdapterStore) else AdapterStore(base)
    return ShardingStorageTransformer(
        under, CPS, array_path=ARRAY_PATH, separator="/", shape=SHAPE, chunk_shape=CHUNKS, **options
    )


def chunk_key(coords: Sequence[int]) -> str:
    return f"data/root/{ARRAY_PATH}/c" + "/".join(str(c) for c in coords)


class _CountingKV(MappingStore):
    """A dict as the transformer's ``KVStore``, ranged (as a local directory or object store is), counting each
    call in the draft's names of the underlying store's operations."""

    def __init__(self, data: dict[str, bytes], count: Callable[[str, object], None]) -> None:
        super().__init__(data)
        self.caps = replace(self.caps, ranged=True)
        self._count = count

    def get_many(self, reads: Sequence[ReadRequest]) -> list[ReadResult]:
        # a zero-range read conditioned on a generation is answered by the process stamp: no request
        fetched = [(key, ranges) for key, ranges, cond in reads if ranges != [] or cond.is_any or cond.is_missing]
        if fetched:
            self._count("get_partial_values", fetched)
        return super().get_many(reads)

    def put_many(self, writes: Mapping[str, tuple[Any, Generation]]) -> dict[str, Generation | None]:
        deletes = all(value is None for value, _ in writes.values())
        self._count("erase_values" if deletes else "set_values", dict(writes))
        return super().put_many(writes)

    def list_prefix(self, prefix: str) -> Iterator[str]:
        self._count("list_prefix", prefix)
        return super().list_prefix(prefix)

    def contains(self, key: str) -> bool:
        self._count("contains", key)
        return super().contains(key)


class CountingAbstractStore(AdapterStore):
    """An AdapterStore over a dict, counting the calls the transformer's engine makes on its ``KVStore``."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.calls: Counter[str] = Counter()
        self.requests: list[tuple[str, object]] = []
        super().__init__(_CountingKV(self.data, self._count))

    def reset(self) -> None:
        self.calls.clear()
        self.requests.clear()

    def _count(self, name: str, arg: object) -> None:
        self.calls[name] += 1
        self.requests.append((name, arg))


class TransformerMapping(MutableMapping):
    """A MutableMapping over a sharding transformer (keys: chunk keys and relayed keys)."""

    def __init__(self, transformer: ShardingStorageTransformer) -> None:
        self.transformer = transformer

    @property
    def base(self) -> Any:
        """The store at the bottom (``list_prefix("")`` lists what is stored)."""
        return self.transformer.underlying.kv  # type: ignore[attr-defined]

    def __getitem__(self, key: str) -> bytes:
        return self.transformer.get(key)

    def __setitem__(self, key: str, value: Any) -> None:
        self.transformer.set(key, bytes(value))

    def __delitem__(self, key: str) -> None:
        self.transformer.erase(key)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.transformer.contains(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self.transformer.list())

    def __len__(self) -> int:
        return len(self.transformer.list())

    def getitems(self, keys: Sequence[str]) -> dict[str, bytes]:
        keys = list(keys)
        values = self.transformer.get_partial_values([(k, ByteRange(0)) for k in keys])
        return {k: v for k, v in zip(keys, values, strict=True) if v is not None}

    def setitems(self, values: Mapping[str, bytes]) -> None:
        self.transformer.set_values(dict(values))

    def delitems(self, keys: Iterable[str]) -> None:
        self.transformer.erase_values(list(keys))

    def flush(self) -> None:
        """Nothing is buffered (the proxy's write-back flush, for shared test code)."""
