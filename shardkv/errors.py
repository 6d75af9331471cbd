"""The shardkv error hierarchy.

Every error shardkv raises on its own account derives from :class:`ShardKVError`
and from the builtin it resembles, so ``except ValueError`` keeps working for
callers that do not know shardkv. Errors carry the data that explains them
(``.key``, ``.shard_key``, ``.reason``, ``.stored``, ``.computed``).

A chunk that is not stored is a plain ``KeyError(key)``: that is the
MutableMapping contract, and zarr relies on it to substitute the fill value.
Errors of the underlying store other than "not found" (permissions, network)
are never turned into ``KeyError``; they propagate unchanged.
"""

from __future__ import annotations

import errno
import pickle
from typing import Any, Sequence

__all__ = [
    "ShardKVError",
    "InvalidKeyError",
    "ChunkOutOfGridError",
    "ReservedKeyError",
    "ConfigurationError",
    "CorruptShardError",
    "ChecksumError",
    "UnsupportedError",
    "MetadataError",
    "UnknownStorageTransformerError",
    "LockTimeoutError",
    "ConcurrentUpdateError",
    "UnflushedWritesError",
    "LostRaceError",
    "JournalCorruptError",
    "JournalMismatchError",
    "JournalLockedError",
    "ChunkExpansionError",
    "PreconditionFailedError",
]


class ShardKVError(Exception):
    """Root of every error raised by shardkv itself."""


class InvalidKeyError(ShardKVError, ValueError):
    """A key breaks a rule of the key space (malformed chunk key, ``..``, empty segment).

    Attributes
    ----------
    key : str
        The offending key, as received.
    reason : str
        The rule it breaks.
    """

    def __init__(self, key: str, reason: str) -> None:
        self.key = key
        self.reason = reason
        super().__init__(f"invalid key {key!r}: {reason}")


class ChunkOutOfGridError(InvalidKeyError):
    """A chunk key whose chunk coords lie outside the array's chunk grid."""

    def __init__(self, key: str, chunk_coords: tuple[int, ...], grid_shape: tuple[int, ...]) -> None:
        self.chunk_coords = tuple(chunk_coords)
        self.grid_shape = tuple(grid_shape)
        super().__init__(
            key,
            f"chunk coords {self.chunk_coords} lie outside the chunk grid of shape {self.grid_shape}",
        )


class ReservedKeyError(InvalidKeyError):
    """A key that shardkv manages itself (for example the ``zarr.json`` view of a sharded v2 array)."""


class ConfigurationError(ShardKVError, ValueError):
    """A sharding configuration or array metadata document that cannot be used.

    Attributes
    ----------
    reason : str
        What is wrong, with the received value.
    path : str or None
        The array path the configuration belongs to, where known.
    """

    def __init__(self, reason: str, path: str | None = None) -> None:
        self.reason = reason
        self.path = path
        where = f"array {path!r}: " if path is not None else ""
        super().__init__(f"{where}{reason}")


class CorruptShardError(ShardKVError, ValueError):
    """A stored shard whose bytes cannot be trusted (truncated, index out of range).

    Attributes
    ----------
    shard_key : str
        The key of the shard in the underlying store.
    reason : str
        What was found, and what was expected.
    """

    def __init__(self, shard_key: str, reason: str) -> None:
        self.shard_key = shard_key
        self.reason = reason
        super().__init__(f"corrupt shard {shard_key!r}: {reason}")


class ChecksumError(CorruptShardError):
    """A CRC32C checksum that does not match the bytes it protects.

    Attributes
    ----------
    stored : int
        The checksum read from the shard (unsigned 32-bit).
    computed : int
        The checksum computed over the bytes read (unsigned 32-bit).
    """

    def __init__(self, shard_key: str, stored: int, computed: int, what: str = "index") -> None:
        self.stored = int(stored)
        self.computed = int(computed)
        super().__init__(
            shard_key,
            f"crc32c mismatch in {what}: stored 0x{self.stored:08x}, computed 0x{self.computed:08x}",
        )


class UnsupportedError(ShardKVError, NotImplementedError):
    """A valid feature that this version of shardkv does not implement (named in the message)."""


class MetadataError(ConfigurationError):
    """A stored metadata document that cannot be read (not JSON, or not a JSON object).

    Attributes
    ----------
    key : str
        The key of the document in the store.
    """

    def __init__(self, key: str, reason: str, path: str | None = None) -> None:
        self.key = key
        super().__init__(f"metadata document {key!r}: {reason}", path)


class UnknownStorageTransformerError(UnsupportedError):
    """A ``storage_transformers`` entry that no registered transformer implements.

    Attributes
    ----------
    extension : str
        The entry's ``extension`` URI, as stored.
    type : str
        The entry's ``type``, as stored.
    path : str or None
        The array the entry belongs to, where known.
    """

    def __init__(self, extension: Any, type: Any, path: str | None = None, known: Sequence[str] = ()) -> None:
        self.extension = extension
        self.type = type
        self.path = path
        where = f"array {path!r}: " if path is not None else ""
        choices = ", ".join(known) or "none"
        super().__init__(
            f"{where}storage transformer {extension!r} of type {type!r} is not supported, so the array "
            f"cannot be read or written safely (registered: {choices})"
        )


class LockTimeoutError(ShardKVError, TimeoutError):
    """A shard lock that was not obtained in time (another writer holds it).

    Attributes
    ----------
    what : str
        The lock: a lock file path, or the stripe and location of an in-process lock.
    timeout : float
        How long (seconds) shardkv waited.
    """

    def __init__(self, what: str, timeout: float) -> None:
        self.what = what
        self.timeout = float(timeout)
        super().__init__(f"could not lock {what} within {self.timeout:g} s (another writer holds it)")


class ConcurrentUpdateError(ShardKVError, RuntimeError):
    """A conditional (compare-and-swap) update that kept losing to other writers.

    Nothing was written by the failed update; the stored value is some other
    writer's complete one.

    Attributes
    ----------
    key : str
        The key of the value (a shard key) in the base store.
    attempts : int
        How many read-merge-write rounds were tried.
    precondition_failures : int
        How many of them the store refused because the value had changed.
    """

    def __init__(self, key: str, attempts: int, precondition_failures: int) -> None:
        self.key = key
        self.attempts = int(attempts)
        self.precondition_failures = int(precondition_failures)
        super().__init__(
            f"conditional update of {key!r} failed: {self.precondition_failures} of {self.attempts} attempts "
            "found the value changed by another writer (raise max_attempts, or write shard-aligned)"
        )


class UnflushedWritesError(ShardKVError, pickle.PicklingError):
    """A store asked to pickle itself while it holds buffered (write-back) writes.

    Pickling never flushes as a side effect and never drops data: call
    ``flush()`` first.

    Attributes
    ----------
    n_shards : int
        Shards with buffered writes.
    nbytes : int
        Bytes of buffered chunk data.
    """

    def __init__(self, n_shards: int, nbytes: int) -> None:
        self.n_shards = int(n_shards)
        self.nbytes = int(nbytes)
        super().__init__(
            f"cannot pickle a store with unflushed writes ({self.n_shards} shards, {self.nbytes} bytes): "
            "call flush() first"
        )


class LostRaceError(ShardKVError, RuntimeError):
    """A conditional write inside a shard-write transaction found its value changed by another writer.

    Control flow inside :func:`shardkv.engine.cas.run_conditionally`, which
    re-runs the write; it escapes only from a write run outside it.

    Attributes
    ----------
    key : str
        The key (a shard key) whose value changed since it was read.
    """

    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(f"{key!r} changed since it was read (another writer): read, merge and write again")


class JournalCorruptError(ShardKVError, ValueError):
    """A write-back journal damaged before its last record (not a torn tail), or not a journal at all.

    Attributes
    ----------
    path : str
        The journal file.
    offset : int
        Byte offset of the first frame that does not check (bytes from the file start).
    reason : str
        What was found there.
    """

    def __init__(self, path: str, offset: int, reason: str) -> None:
        self.path = path
        self.offset = int(offset)
        self.reason = reason
        super().__init__(f"corrupt journal {path!r} at byte {self.offset}: {reason}")


class PreconditionFailedError(ShardKVError, RuntimeError):
    """A conditional write refused because the stored value is not the one expected.

    Attributes
    ----------
    key : str
        The key written.
    reason : {"exists", "changed"}
        ``"exists"``: a create-only write found the key stored; ``"changed"``:
        the stored value was rewritten since the version given was read.
    """

    def __init__(self, key: str, reason: str) -> None:
        self.key = key
        self.reason = reason
        expected = "no stored value" if reason == "exists" else "the version read before"
        super().__init__(f"conditional write of {key!r} refused: expected {expected}, the store says {reason!r}")


class JournalMismatchError(ConfigurationError):
    """A write-back journal holding records of another store: replaying it here would overwrite this store.

    Attributes
    ----------
    path : str
        The journal file.
    recorded : str
        What the journal belongs to (a store: location, store id, layout; or an array layout).
    given : str
        What it was opened for.
    records : int
        Acknowledged records the journal holds (not replayed).
    """

    def __init__(self, path: str, recorded: str, given: str, records: int) -> None:
        self.path = path
        self.recorded = recorded
        self.given = given
        self.records = int(records)
        super().__init__(
            f"journal {path!r} holds {self.records} record(s) of {recorded}, not of {given}: "
            "refused (open the store it belongs to, or delete the journal to give its writes up)"
        )


class JournalLockedError(ShardKVError, BlockingIOError):
    """A write-back journal already open in another process (one writer per journal).

    Attributes
    ----------
    path : str
        The journal file.
    """

    def __init__(self, path: str, reason: str = "it is open in another process (one writer per journal)") -> None:
        self.path = path
        super().__init__(errno.EWOULDBLOCK, f"journal {path!r} is locked: {reason}")

    def __str__(self) -> str:
        return str(self.strerror)


class ChunkExpansionError(CorruptShardError):
    """A stored chunk that decodes (or says it decodes) to more bytes than its declared size: decoding stopped.

    Attributes
    ----------
    shard_key : str
        The key of the chunk or shard.
    stated : int or None
        The size the stream states, when it states one.
    limit : int
        The most bytes the chunk may decode to (shape times item size).
    """

    def __init__(self, shard_key: str, stated: int | None, limit: int, what: str | None = None) -> None:
        self.stated = stated
        self.limit = int(limit)
        if what is None:
            grows = f"states it decodes to {stated} bytes" if stated is not None else "expands"
            what = f"decoding stopped: the chunk {grows}, beyond the {self.limit} bytes its declared size allows"
        else:
            what = f"decoding refused: {what}"
        super().__init__(shard_key, what)


