"""Storage transformers (installed as ``shardkv.transformers``).

The 2022 draft sharding storage transformer, the draft's abstract store
interface, the adapter over the store the shards live in and the registry
that builds an array's transformers from its ``storage_transformers``
metadata (one sharding transformer, directly over the store).
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
