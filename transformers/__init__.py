"""Storage transformers (installed as ``shardkv.transformers``).

The 2022 draft sharding storage transformer, the draft's abstract store
interface, the adapter at the bottom of a stack and the registry that builds
a stack from an array's ``storage_transformers`` metadata.
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
