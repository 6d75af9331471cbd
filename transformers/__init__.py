"""Storage transformers (installed as ``shardkv.transformers``).

The 2022 draft sharding storage transformer over the draft's abstract store
interface, a store adapter for the bottom of a stack, and the registry that
turns an array's ``storage_transformers`` metadata into a stack. The
transformer keeps keys and the draft API only; shard reads and writes are
the shard engine's (:class:`shardkv.engine.planner.ShardIO`), over the
underlying store through :class:`UnderlyingBackend`.
"""

from .adapter import AdapterStore
from .api import AbstractStore, KeyRange, KeyStartValue
from .backend import UnderlyingBackend
from .registry import (
    UnknownStorageTransformerError,
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
    "UnderlyingBackend",
    "SHARDING_EXTENSION",
    "DATA_ROOT",
    "UnknownStorageTransformerError",
    "register",
    "registered",
    "resolve",
    "build_stack",
    "storage_transformer_entries",
]
