"""The interface every storage adapter implements (:class:`StoreAdapter`) and the names of shardkv's own files in a store."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from typing import Hashable, Iterable, Iterator, Mapping, Sequence

from shardkv.format.ranges import ByteRange
from shardkv.storage.buffers import (
    Value,
)

__all__ = ["StoreAdapter", "TEMP_MARKER", "LOCK_DIR", "hidden", "file_validator"]

TEMP_MARKER = ".shardkv-tmp-"
"""Part of the name of the temporary files of atomic local writes; never listed."""

LOCK_DIR = ".shardkv-locks"
"""Directory in a store root that holds the cross-process lock files (shardkv.engine.locks); never listed."""


def hidden(key: str) -> bool:
    """True for the files shardkv keeps in a store for itself (temporary writes, lock files)."""
    return TEMP_MARKER in key or key == LOCK_DIR or key.startswith(LOCK_DIR + "/") or f"/{LOCK_DIR}/" in key


MISSING = "missing"
"""The validator of a key that is not stored (never cached with an index: see the planner)."""


def file_validator(path: str) -> Hashable:
    """The validator of a local file (:meth:`StoreAdapter.validator`): ``(size, mtime_ns, inode)``, or ``"missing"``.

    The inode too: an atomic rewrite (a temporary file renamed over the target)
    gets a new one, so a same-size rewrite within the file system's timestamp
    granularity is seen.

    Raises
    ------
    OSError
        Errors of ``os.stat`` other than a missing file (permissions).
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return MISSING
    return (st.st_size, st.st_mtime_ns, st.st_ino)


class StoreAdapter(ABC):
    """Uniform access to a base key/value store. Keys are ``/``-separated str.

    Attributes
    ----------
    supports_ranges : bool
        True when :meth:`get_ranges` reads only the bytes asked for.
    round_trips : bool
        True when every request is a round trip over the network (object
        stores): the engine then reads a shard of which a batch wants most
        chunks whole, index included, rather than its index first.
    """

    supports_ranges: bool = False
    round_trips: bool = False

    @property
    def supports_append(self) -> bool:
        """True when :meth:`write_at` can update a stored value in place (local files)."""
        return False

    def write_at(self, key: str, writes: Sequence[tuple[int, bytes]]) -> None:
        """Write ``(offset, bytes)`` pieces inside a stored value; only where :attr:`supports_append`."""
        raise NotImplementedError(f"{type(self).__name__} cannot write inside a stored value ({key!r})")

    @abstractmethod
    def get(self, key: str) -> bytes:
        """The whole value. Raises ``KeyError`` if ``key`` is not stored."""

    @abstractmethod
    def get_many(self, keys: Sequence[str]) -> dict[str, bytes]:
        """The values of the stored keys among ``keys``; missing keys are left out."""

    @abstractmethod
    def get_ranges(self, requests: Sequence[tuple[str, ByteRange]]) -> list[bytes | memoryview | None]:
        """Byte ranges of values, in request order; ``None`` where the key is missing.

        A range past the end of a value returns fewer bytes (callers check).
        A range may come back as a read-only ``memoryview`` into a buffer the
        adapter holds (no copy).
        """

    @abstractmethod
    def set_many(self, values: Mapping[str, Value]) -> None:
        """Store several values (one batch where the store allows).

        Parameters
        ----------
        values : mapping of str to bytes-like or sequence of bytes-like
            Each value is one bytes-like object or a ``list``/``tuple`` of its
            parts in order, stored as their concatenation.
        """

    @abstractmethod
    def delete_many(self, keys: Iterable[str]) -> None:
        """Delete the stored keys among ``keys``; missing ones are ignored."""

    @abstractmethod
    def contains(self, key: str) -> bool:
        """True if ``key`` is stored."""

    @abstractmethod
    def iter_keys(self, prefix: str = "") -> Iterator[str]:
        """Every stored key that starts with ``prefix`` (a path ending in ``/``, or ``""``)."""

    @abstractmethod
    def list_dir(self, path: str = "") -> list[str]:
        """Names of the immediate children (keys and sub-paths) of ``path``."""

    def set(self, key: str, value: Value) -> None:
        """Store one value (bytes-like, or a ``list``/``tuple`` of its parts)."""
        self.set_many({key: value})

    def delete(self, key: str) -> None:
        """Delete one key. Raises ``KeyError`` if it is not stored."""
        if not self.contains(key):
            raise KeyError(key)
        self.delete_many([key])

    def prune_empty_dirs(self, path: str) -> None:
        """Remove the directories left empty under ``path``, and ``path`` itself if empty.

        Never removes a file but lock files (in a ``.shardkv-locks`` directory
        with nothing else). Stores without directories (object stores,
        mappings) have nothing to do.
        """

    def rmdir(self, path: str) -> None:
        """Delete every key under ``path`` (everything, for ``""``)."""
        prefix = f"{path}/" if path else ""
        self.delete_many(list(self.iter_keys(prefix)))

    def size(self, key: str) -> int:
        """Size of a stored value in bytes. Raises ``KeyError`` if missing."""
        return len(self.get(key))

    def size_if_free(self, key: str) -> int | None:
        """Size (bytes) of a stored value when the store knows it without a request, else ``None``.

        Lets an index read on its own (a suffix read) be checked against the
        shard's real size, so a truncated shard is reported rather than served
        (local files, in-memory filesystems). ``None`` for missing keys and for
        stores where asking would cost a request.
        """
        return None

    def validator(self, key: str) -> Hashable:
        """A cheap fingerprint of a stored value that changes when it is rewritten, or ``None``.

        Only stores where it costs no request give one (local files: size,
        modification time and inode); ``None`` means "cannot tell cheaply".
        """
        return None

    def close(self) -> None:
        """Release resources of the base store, if it has any."""


