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


# -- command line and store access (issue 12) -----------------------------------------


class StoreAccessError(ShardKVError, OSError):
    """A store that cannot be reached or used: no endpoint, no bucket, no credentials, no permission.

    Attributes
    ----------
    url : str
        The store, as named by the user (URL or path).
    reason : str
        What went wrong, in one line (the backend's own message included).
    """

    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        self.reason = reason
        super().__init__(f"{url}: {reason}")


class DestinationIsFileError(ShardKVError, FileExistsError):
    """The destination of a conversion is a regular file; it is never deleted, not even with ``--overwrite``.

    Attributes
    ----------
    dst : str
        The destination, as given.
    """

    def __init__(self, dst: str) -> None:
        self.dst = dst
        super().__init__(f"destination {dst} is a regular file, not a hierarchy; refusing to replace it (remove it yourself)")


class ChunksPerShardMismatchError(ConfigurationError):
    """A ``chunks_per_shard`` that does not fit some (or every) array of a hierarchy.

    Attributes
    ----------
    mismatched : list of (str, str)
        ``(array path, why it does not fit)`` for each array it does not fit.
    fits_none : bool
        True when it fits no array at all.
    """

    def __init__(self, chunks_per_shard: str, mismatched: list[tuple[str, str]], fits_none: bool) -> None:
        self.mismatched = list(mismatched)
        self.fits_none = fits_none
        listed = ", ".join(f"{p or '/'} ({why})" for p, why in self.mismatched[:10])
        more = f", ... and {len(self.mismatched) - 10} more" if len(self.mismatched) > 10 else ""
        what = "fits no array" if fits_none else f"does not fit {len(self.mismatched)} arrays"
        hint = " (--skip-mismatched copies them unsharded)"
        super().__init__(f"chunks per shard {chunks_per_shard} {what}{hint}: {listed}{more}")


class ArrayNotFoundError(ShardKVError, LookupError):
    """No (sharded) array at the path named in a store.

    Attributes
    ----------
    store : str
        The store, as named by the user.
    path : str
        The array path looked for.
    """

    def __init__(self, store: str, path: str, what: str = "array") -> None:
        self.store = store
        self.path = path
        super().__init__(f"no {what} at {path!r} in {store}")


class ManifestMismatchError(ConfigurationError):
    """The destination holds the progress manifest of a different conversion (other source or options)."""


__all__ += [
    "StoreAccessError",
    "DestinationIsFileError",
    "ChunksPerShardMismatchError",
    "ArrayNotFoundError",
    "ManifestMismatchError",
]
