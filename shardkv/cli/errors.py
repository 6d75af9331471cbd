"""The errors of the command line only: conditions of ``shardkv convert``/``unshard``/``info``/``verify``/``demo``.

The library's own errors live in :mod:`shardkv.errors`; these belong to the
commands (a destination that is not empty, a store that cannot be reached, a
progress manifest of another conversion) and are printed by
:func:`shardkv.cli.main.main` as one line naming the URL or path.
"""

from __future__ import annotations

from collections.abc import Sequence

from shardkv.errors import ConfigurationError, ShardKVError

__all__ = [
    "NotAHierarchyError",
    "DestinationNotEmptyError",
    "SameLocationError",
    "DemoError",
    "StoreAccessError",
    "DestinationIsFileError",
    "ChunksPerShardMismatchError",
    "ArrayNotFoundError",
    "ManifestMismatchError",
    "ReservedNameError",
    "ConversionIncompleteError",
]


class NotAHierarchyError(ConfigurationError):
    """A store that is missing, empty, or not a Zarr v2 hierarchy (no root ``.zgroup`` or ``.zarray``)."""


class UnfinishedRunError(NotAHierarchyError):
    """A store that holds an interrupted ``convert`` or ``unshard``: not a hierarchy yet.

    Attributes
    ----------
    store : str
        The store, as named.
    command : {"convert", "unshard"}
        The run that was interrupted.
    resume_command : str
        The command line that resumes it (:meth:`shardkv.cli.manifest.UnfinishedRun.resume_command`).
    """

    def __init__(self, store: str, command: str, resume_command: str, message: str) -> None:
        self.store, self.command, self.resume_command = store, command, resume_command
        super().__init__(message)


class DestinationNotEmptyError(ShardKVError, FileExistsError):
    """The destination of a conversion already holds keys (pass ``overwrite=True`` to replace them).

    Attributes
    ----------
    dst : str
        The destination, as given.
    """

    def __init__(self, dst: str) -> None:
        self.dst = dst
        super().__init__(f"destination {dst} is not empty (use --overwrite / overwrite=True to replace it)")


class SameLocationError(ShardKVError, ValueError):
    """Source and destination of a conversion are the same place, or one lies inside the other."""


class DemoError(ShardKVError, FileExistsError):
    """The demo's input or output directory exists and was not made by the demo."""


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
        super().__init__(
            f"destination {dst} is a regular file, not a hierarchy; refusing to replace it (remove it yourself)"
        )


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


class ReservedNameError(ConfigurationError):
    """A node to convert named like shardkv's hidden files (``*.shardkv-tmp-*``, ``.shardkv-locks``): refused,
    as it would vanish from every listing. Attributes: ``store`` (the source as named), ``path`` (the node)."""

    def __init__(self, store: str, path: str) -> None:
        self.store = store
        super().__init__(
            f"{store}: the node {path!r} is named like shardkv's own files (names containing "
            "'.shardkv-tmp-' or equal to '.shardkv-locks' are hidden from listings); rename it first"
        )
        self.path = path


class ConversionIncompleteError(ShardKVError, RuntimeError):
    """A conversion whose output lacks nodes of its source. Attributes: ``dst``, ``missing`` (their paths)."""

    def __init__(self, dst: str, missing: Sequence[str], what: str = "arrays or groups") -> None:
        self.dst, self.missing = dst, list(missing)
        shown = ", ".join(self.missing[:10]) + (", ..." if len(self.missing) > 10 else "")
        super().__init__(f"{dst}: {len(self.missing)} {what} of the source missing from the output: {shown}")
