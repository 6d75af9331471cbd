"""shardkv: transparent sharding for chunked-array stores.

Public names only; see the README for an overview.
"""

from ._version import __version__
from .codec import ShardingCodec
from .errors import (
    ChecksumError,
    ChunkOutOfGridError,
    ConfigurationError,
    CorruptShardError,
    InvalidKeyError,
    ReservedKeyError,
    ShardKVError,
    UnsupportedError,
)
from .index import EMPTY, ShardIndex
from .layout import ShardLayout
from .mapping import ShardedStore

__all__ = [
    "__version__",
    "ShardedStore",
    "ShardingCodec",
    "ShardIndex",
    "ShardLayout",
    "EMPTY",
    "ShardKVError",
    "InvalidKeyError",
    "ChunkOutOfGridError",
    "ReservedKeyError",
    "ConfigurationError",
    "CorruptShardError",
    "ChecksumError",
    "UnsupportedError",
]
