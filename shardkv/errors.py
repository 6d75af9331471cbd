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
    """A valid feature that this version of shardkv does not implement (named in the message).

    Also what a store that cannot replace a stored value (zarr 3's
    ``ZipStore``) cannot do through shardkv: write a shard already stored
    (the message names the shard and the store, and what to do instead).
    """


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


class LockTimeoutError(ShardKVError, TimeoutError):
    """A lock that was not obtained in time: a shard lock another writer holds, or a write-back journal
    open in another process (one writer per journal; not waited for).

    Attributes
    ----------
    what : str
        The lock: a lock file path, the stripe and location of an in-process lock, or ``journal '<path>'``.
    timeout : float
        How long (seconds) shardkv waited (0 for a journal).
    path : str or None
        The journal file, for a journal; the lock file, for a shard lock held by another process.
    shard_key : str or None
        The shard whose lock it is (one of them, when a lock serves several), for a shard lock.
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
        if self.timeout:
            super().__init__(f"could not lock {lock} within {self.timeout:g} s: {reason}")
        else:
            super().__init__(f"could not lock {lock}: {reason}")


class ConcurrentUpdateError(ShardKVError, RuntimeError):
    """A conditional operation on one value that kept losing to other writers.

    A conditional update (compare-and-swap) wrote nothing: the stored value is
    some other writer's complete one. A conditional read returned nothing: the
    value changed between every read of its index and of its bytes.

    Attributes
    ----------
    key : str
        The key of the value (a shard key) in the base store.
    attempts : int
        How many rounds were tried (read-merge-write rounds, or read rounds).
    precondition_failures : int
        How many of them the store refused because the value had changed.
    operation : {"update", "read"}
        What kept losing.
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


class KeyBelowKeyError(ShardKVError, KeyError):
    """A key that would be stored below another stored key (``a/b/c`` when ``a/b`` holds a value).

    zarr-python 2's ``MemoryStore`` and ``DirectoryStore`` refuse such a key
    with ``KeyError``, and so does the proxy over a mapping or a local directory.

    Attributes
    ----------
    key : str
        The key that was to be stored.
    leaf : str
        The stored key above it.
    """

    def __init__(self, key: str, leaf: str) -> None:
        self.key = key
        self.leaf = leaf
        super().__init__(f"cannot store {key!r}: {leaf!r} is a stored key, not a path that can hold keys")

    def __str__(self) -> str:
        return str(self.args[0])
