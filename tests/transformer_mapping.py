"""The draft sharding transformer seen as a MutableMapping, for the mapping contract and stateful tests.

:class:`TransformerMapping` forwards each MutableMapping operation (and the
zarr-style batch methods ``getitems`` / ``setitems`` / ``delitems``) to one
abstract-store operation of a :class:`ShardingStorageTransformer`, so the
suites written for :class:`shardkv.ShardedStore` run unchanged against the
transformer. The chunk grid of the test arrays matches theirs: shape (5, 7),
inner chunks (2, 2), chunks_per_shard (2, 3).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, MutableMapping, Sequence
from typing import Any

from shardkv.format.ranges import ByteRange
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
