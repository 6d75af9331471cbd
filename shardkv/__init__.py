"""shardkv: transparent sharding for chunked-array stores.

Public names only; see the README for an overview.
"""

from shardkv._version import __version__
from shardkv.codecs.sharding import ShardingCodec
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
from shardkv.format.index import EMPTY, ShardIndex
from shardkv.format.layout import ShardLayout
from shardkv.proxy.open import open_store
from shardkv.proxy.store import PartialShardWriteWarning, ShardedStore
from shardkv.rechunk import rechunk_to_shards

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
