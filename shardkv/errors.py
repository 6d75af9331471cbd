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

__all__ = [
    "ShardKVError",
    "InvalidKeyError",
    "ChunkOutOfGridError",
    "ReservedKeyError",
    "ConfigurationError",
    "CorruptShardError",
    "ChecksumError",
    "UnsupportedError",
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
