"""Storage transformers (installed as ``shardkv.transformers``).

The 2022 draft sharding storage transformer over the draft's abstract store
interface, a store adapter for the bottom of a stack, and the registry that
turns an array's ``storage_transformers`` metadata into a stack. The
transformer keeps keys and the draft API only; shard reads and writes are
the shard engine's (:class:`shardkv.engine.engine.ShardEngine`), over the
underlying store seen as a :class:`~shardkv.storage.kv.KVStore`
(:class:`~shardkv.transformers.adapter.UnderlyingKV`).
"""

from .adapter import AdapterStore
from .api import AbstractStore, KeyRange, KeyStartValue
from .registry import (
    build_stack,
    register,
    registered,
    resolve,
    storage_transformer_entries,
)
from .sharding import DATA_ROOT, SHARDING_EXTENSION, ShardingStorageTransformer

__all__ = [
    "AbstractStore",
    "AdapterStore",
    "KeyRange",
    "KeyStartValue",
    "ShardingStorageTransformer",
    "SHARDING_EXTENSION",
    "DATA_ROOT",
    "register",
    "registered",
    "resolve",
    "build_stack",
    "storage_transformer_entries",
]
