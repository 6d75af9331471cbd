"""shardkv: transparent sharding for chunked-array stores.

Public names only; see the README for an overview. The error classes are
imported here; the other names when first used (:data:`_LAZY`), so that
``import shardkv`` and the command line do not import numpy, numcodecs or
fsspec before a job needs them.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from shardkv._version import __version__
from shardkv.errors import (
    ChecksumError,
    ChunkOutOfGridError,
    ConcurrentUpdateError,
    ConfigurationError,
    CorruptShardError,
    InvalidKeyError,
    JournalCorruptError,
    JournalMismatchError,
    KeyBelowKeyError,
    LockTimeoutError,
    MetadataError,
    ReservedKeyError,
    ShardKVError,
    UnflushedWritesError,
    UnsupportedError,
)

if TYPE_CHECKING:
    from shardkv.codecs.sharding import ShardingCodec
    from shardkv.format.layout import EMPTY, ShardIndex, ShardLayout
    from shardkv.proxy.open import open_store
    from shardkv.proxy.store import PartialShardWriteWarning, ShardedStore
    from shardkv.rechunk import rechunk_to_shards

_LAZY = {  # public name -> the module that defines it, imported on first use (PEP 562)
    "ShardedStore": "shardkv.proxy.store",
    "open_store": "shardkv.proxy.open",
    "rechunk_to_shards": "shardkv.rechunk",
    "PartialShardWriteWarning": "shardkv.proxy.store",
    "ShardingCodec": "shardkv.codecs.sharding",
    "ShardIndex": "shardkv.format.layout",
    "ShardLayout": "shardkv.format.layout",
    "EMPTY": "shardkv.format.layout",
}

__all__ = [
    "__version__",
    "ShardedStore",
    "open_store",
    "rechunk_to_shards",
    "PartialShardWriteWarning",
    "ShardingCodec",
    "ShardIndex",
    "ShardLayout",
    "EMPTY",
    # every error class shardkv raises (README, "Errors"); the command line's own are in shardkv.cli.errors
    "ShardKVError",
    "InvalidKeyError",
    "ChunkOutOfGridError",
    "ReservedKeyError",
    "KeyBelowKeyError",
    "ConfigurationError",
    "MetadataError",
    "CorruptShardError",
    "ChecksumError",
    "UnsupportedError",
    "LockTimeoutError",
    "ConcurrentUpdateError",
    "UnflushedWritesError",
    "JournalCorruptError",
    "JournalMismatchError",
]


def __getattr__(name: str) -> Any:  # lazy public names only: any other name is an AttributeError
    if name not in _LAZY:
        raise AttributeError(f"module 'shardkv' has no attribute {name!r}")
    value = getattr(import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
