"""Storage transformers (installed as ``shardkv.transformers``).

The 2022 draft sharding storage transformer, the draft's abstract store interface and the adapter over the
store the shards live in; :func:`build_stack` builds an array's transformer from its ``storage_transformers``
metadata (one sharding transformer, directly over the store).
"""

from .adapter import AdapterStore
from .api import AbstractStore, KeyRange, KeyStartValue
from .sharding import (
    DATA_ROOT,
    SHARDING_EXTENSION,
    ShardingStorageTransformer,
    build_stack,
    storage_transformer_entries,
)

__all__ = [
    "AbstractStore",
    "AdapterStore",
    "KeyRange",
    "KeyStartValue",
    "ShardingStorageTransformer",
    "SHARDING_EXTENSION",
    "DATA_ROOT",
    "build_stack",
    "storage_transformer_entries",
]
