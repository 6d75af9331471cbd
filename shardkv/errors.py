"""The shardkv error hierarchy (README, "Errors").

Every error shardkv raises on its own account derives from :class:`ShardKVError`
and from the builtin a caller would already catch, and carries the data that
explains it. A chunk that is not stored is a plain ``KeyError(key)`` (the
MutableMapping contract); no other store error is ever turned into one.
"""

from __future__ import annotations

import pickle


class ShardKVError(Exception):
    """Root of every error raised by shardkv itself."""


class InvalidKeyError(ShardKVError, ValueError):
    """A key breaks a rule of the key space (malformed chunk key, ``..``, empty segment): ``.key``, ``.reason``."""

    def __init__(self, key: str, reason: str) -> None:
        self.key = key
        self.reason = reason
        super().__init__(f"invalid key {key!r}: {reason}")


class ChunkOutOfGridError(InvalidKeyError):
    """A chunk key whose ``.chunk_coords`` lie outside the array's chunk grid (``.grid_shape``)."""

    def __init__(self, key: str, chunk_coords: tuple[int, ...], grid_shape: tuple[int, ...]) -> None:
        self.chunk_coords = tuple(chunk_coords)
        self.grid_shape = tuple(grid_shape)
        super().__init__(key, f"chunk coords {self.chunk_coords} lie outside the chunk grid of shape {self.grid_shape}")


class ReservedKeyError(InvalidKeyError):
    """A key that shardkv manages itself (for example the ``zarr.json`` view of a sharded v2 array)."""


class ConfigurationError(ShardKVError, ValueError):
    """A sharding configuration or array metadata that cannot be used: ``.reason``, ``.path`` (the array, or None)."""

    def __init__(self, reason: str, path: str | None = None) -> None:
        self.reason = reason
        self.path = path
        where = f"array {path!r}: " if path is not None else ""
        super().__init__(f"{where}{reason}")


class CorruptShardError(ShardKVError, ValueError):
    """A stored shard whose bytes cannot be trusted (truncated, index out of range): ``.shard_key``, ``.reason``."""

    def __init__(self, shard_key: str, reason: str) -> None:
        self.shard_key = shard_key
        self.reason = reason
        super().__init__(f"corrupt shard {shard_key!r}: {reason}")


class ChecksumError(CorruptShardError):
    """A CRC32C that does not match the bytes it protects: ``.stored`` (read) and ``.computed`` (uint32)."""

    def __init__(self, shard_key: str, stored: int, computed: int, what: str = "index") -> None:
        self.stored = int(stored)
        self.computed = int(computed)
        super().__init__(
            shard_key, f"crc32c mismatch in {what}: stored 0x{self.stored:08x}, computed 0x{self.computed:08x}"
        )


class UnsupportedError(ShardKVError, NotImplementedError):
    """A valid feature this version does not implement, or a shard write a store cannot replace (``ZipStore``)."""


class MetadataError(ConfigurationError):
    """A stored metadata document (at ``.key``) that cannot be read (not JSON, or not a JSON object)."""

    def __init__(self, key: str, reason: str, path: str | None = None) -> None:
        self.key = key
        super().__init__(f"metadata document {key!r}: {reason}", path)


class LockTimeoutError(ShardKVError, TimeoutError):
    """A shard lock another writer held past ``lock_timeout``, or a write-back journal open in another process.

    Carries ``.what`` (the lock), ``.timeout`` (seconds waited; 0 for a
    journal), ``.path`` (the journal or lock file) and ``.shard_key`` (for a shard lock).
    """

    def __init__(
        self,
        what: str,
        timeout: float,
        reason: str = "another writer holds it",
        path: str | None = None,
        shard_key: str | None = None,
    ) -> None:
        self.what = what
        self.timeout = float(timeout)
        self.path = path
        self.shard_key = shard_key
        lock = what if shard_key is None else f"shard {shard_key!r} ({what})"
        within = f" within {self.timeout:g} s" if self.timeout else ""
        super().__init__(f"could not lock {lock}{within}: {reason}")


class ConcurrentUpdateError(ShardKVError, RuntimeError):
    """A conditional update (nothing written) or read (nothing returned) of one value that kept losing to writers.

    Carries ``.key``, ``.attempts`` (rounds), ``.precondition_failures`` and ``.operation`` ("update" or "read").
    """

    def __init__(self, key: str, attempts: int, precondition_failures: int, operation: str = "update") -> None:
        self.key = key
        self.attempts = int(attempts)
        self.precondition_failures = int(precondition_failures)
        self.operation = operation
        if operation == "read":
            what = (
                f"conditional read of {key!r} failed: in {self.precondition_failures} of {self.attempts} rounds "
                "the value changed between the read of its index and of its bytes (another writer rewrites it "
                "without pause)"
            )
        else:
            what = (
                f"conditional update of {key!r} failed: {self.precondition_failures} of {self.attempts} attempts "
                "found the value changed by another writer (write shard-aligned blocks, or give each writer its "
                "own shards)"
            )
        super().__init__(what)


class UnflushedWritesError(ShardKVError, pickle.PicklingError):
    """A store pickled while it holds buffered writes (``.n_shards``, ``.nbytes``): pickling never flushes."""

    def __init__(self, n_shards: int, nbytes: int) -> None:
        self.n_shards = int(n_shards)
        self.nbytes = int(nbytes)
        super().__init__(
            f"cannot pickle a store with unflushed writes ({self.n_shards} shards, {self.nbytes} bytes): "
            "call flush() first"
        )


class JournalCorruptError(ShardKVError, ValueError):
    """A write-back journal damaged before its last record, or not a journal: ``.path``, ``.offset``, ``.reason``."""

    def __init__(self, path: str, offset: int, reason: str) -> None:
        self.path = path
        self.offset = int(offset)
        self.reason = reason
        super().__init__(f"corrupt journal {path!r} at byte {self.offset}: {reason}")


class JournalMismatchError(ConfigurationError):
    """A write-back journal (``.path``) holding ``.records`` records of ``.recorded``, opened for ``.given``."""

    def __init__(self, path: str, recorded: str, given: str, records: int) -> None:
        self.path = path
        self.recorded = recorded
        self.given = given
        self.records = int(records)
        super().__init__(
            f"journal {path!r} holds {self.records} record(s) of {recorded}, not of {given}: "
            "refused (open the store it belongs to, or delete the journal to give its writes up)"
        )


class KeyBelowKeyError(ShardKVError, KeyError):
    """A ``.key`` below a stored ``.leaf`` key (``a/b/c`` when ``a/b`` holds a value), as zarr 2's stores refuse it."""

    def __init__(self, key: str, leaf: str) -> None:
        self.key = key
        self.leaf = leaf
        super().__init__(f"cannot store {key!r}: {leaf!r} is a stored key, not a path that can hold keys")

    def __str__(self) -> str:
        return str(self.args[0])
