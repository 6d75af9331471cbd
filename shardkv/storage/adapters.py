"""Adapters over the base store: the only module of shardkv that does I/O.

:func:`adapt` turns whatever the user passes (a ``dict`` or any
``MutableMapping``, a zarr-python 2 store, an fsspec ``FSMap``, an fsspec URL
or a local path) into a :class:`StoreAdapter`, a small uniform interface of
batch reads, ranged reads, batch writes and listings.

* :class:`FSMapAdapter` uses the filesystem directly: ranged and suffix reads
  (``cat_file(path, start, end)`` / ``cat_ranges``), concurrent batch reads and
  writes (``cat`` / ``pipe``) and, on local disks, atomic writes (a temporary
  file, fsync'd, renamed over the target, the directory fsync'd: a crash
  never leaves a torn shard), positional updates included (:meth:`FSMapAdapter.write_at`).
* :class:`MappingAdapter` works with any ``MutableMapping``; it cannot read
  ranges, so a ranged read fetches the whole value once and slices it. It uses
  a zarr-python 2 store's own ``getitems``/``setitems``/``delitems``/``listdir``
  when it has them.

"Not found" becomes ``KeyError`` (chained with ``from``); every other error of
the base store (permissions, network) propagates unchanged.
"""

from __future__ import annotations

import contextlib
import errno
import os
import uuid
from abc import ABC, abstractmethod
from collections.abc import MutableMapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Hashable, Iterable, Iterator, Mapping, Sequence

import fsspec
from fsspec.implementations.memory import MemoryFileSystem
from fsspec.mapping import FSMap

from shardkv.format.ranges import ByteRange
from shardkv.storage.location import StoreLocation, fs_location

__all__ = ["StoreAdapter", "MappingAdapter", "FSMapAdapter", "adapt", "TEMP_MARKER", "LOCK_DIR"]

TEMP_MARKER = ".shardkv-tmp-"
"""Part of the name of the temporary files of atomic local writes; never listed."""

LOCK_DIR = ".shardkv-locks"
"""Directory in a store root that holds the cross-process lock files (shardkv.engine.locks); never listed."""


def _hidden(key: str) -> bool:
    """True for the files shardkv keeps in a store for itself (temporary writes, lock files)."""
    return TEMP_MARKER in key or key == LOCK_DIR or key.startswith(LOCK_DIR + "/") or f"/{LOCK_DIR}/" in key


FSYNC = True
"""Default of :attr:`FSMapAdapter.fsync`: atomic local writes fsync the temporary file
before the rename and the directory after it (power-loss durability)."""


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    """Write all of ``data`` at ``offset`` of ``fd`` (the one place local shard bytes are written)."""
    while len(data):
        n = os.pwrite(fd, data, offset)
        data, offset = data[n:], offset + n


def _copy_all(src: int, dst: int, size: int) -> None:
    """Copy the first ``size`` bytes of ``src`` to the same offsets of ``dst``."""
    done = 0
    try:
        if not hasattr(os, "copy_file_range"):  # not Linux: copy through user space
            raise OSError(errno.ENOSYS, "copy_file_range is not available")
        while done < size:
            n = os.copy_file_range(src, dst, size - done, done, done)
            if n == 0:
                break
            done += n
        return
    except OSError as exc:  # no copy_file_range across these files: copy through user space
        if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
            raise
    while done < size:
        block = os.pread(src, min(size - done, 8 * 2**20), done)
        if not block:
            break
        _pwrite_all(dst, memoryview(block), done)
        done += len(block)


def _patch_copy(src: int, dst: int, size: int, writes: Sequence[tuple[int, bytes]]) -> None:
    _copy_all(src, dst, size)
    for offset, data in writes:
        _pwrite_all(dst, memoryview(data).cast("B"), offset)


def _replace_atomically(path: str, fill: Any, fsync: bool) -> None:
    """Write a temporary file beside ``path`` with ``fill(fd)``, fsync it, rename it over ``path``.

    The directory is not fsync'd here (see :func:`_fsync_dirs`), so a batch pays that once.
    """
    tmp = os.path.join(os.path.dirname(path), f"{TEMP_MARKER}{uuid.uuid4().hex}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        try:
            fill(fd)
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise


def _fsync_dirs(paths: Iterable[str]) -> None:
    """fsync the directories holding ``paths`` (each once): makes their renames durable."""
    for directory in sorted({os.path.dirname(p) for p in paths}):
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _slice(value: bytes | memoryview, byte_range: ByteRange) -> bytes:
    view = memoryview(value)
    start, stop = byte_range.resolve(len(view))
    return bytes(view[start:stop])


class StoreAdapter(ABC):
    """Uniform access to a base key/value store. Keys are ``/``-separated str.

    Attributes
    ----------
    supports_ranges : bool
        True when :meth:`get_ranges` reads only the bytes asked for.
    """

    supports_ranges: bool = False

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
    def get_ranges(self, requests: Sequence[tuple[str, ByteRange]]) -> list[bytes | None]:
        """Byte ranges of values, in request order; ``None`` where the key is missing.

        A range past the end of a value returns fewer bytes (callers check).
        """

    @abstractmethod
    def set_many(self, values: Mapping[str, bytes]) -> None:
        """Store several values (one batch where the store allows)."""

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

    def set(self, key: str, value: bytes) -> None:
        """Store one value."""
        self.set_many({key: value})

    def delete(self, key: str) -> None:
        """Delete one key. Raises ``KeyError`` if it is not stored."""
        if not self.contains(key):
            raise KeyError(key)
        self.delete_many([key])

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


class MappingAdapter(StoreAdapter):
    """A ``MutableMapping`` as base store (dict, zarr-python 2 store, user mapping).

    Parameters
    ----------
    mapping : MutableMapping
        The base store. Values may be any bytes-like object.
    """

    supports_ranges = False

    def __init__(self, mapping: MutableMapping) -> None:
        self.mapping = mapping

    # -- identity and pickling (issue 9) --------------------------------------

    @property
    def location(self) -> StoreLocation:
        """This mapping object's data: stores over the same mapping object share locks."""
        return StoreLocation(("mapping", id(self.mapping)), "")

    def __reduce__(self) -> tuple[Any, ...]:
        # the mapping pickles itself (a dict is copied: the copy is a new location)
        return (type(self), (self.mapping,))

    # -- I/O ------------------------------------------------------------------

    def get(self, key: str) -> bytes:
        return self.mapping[key]

    def get_many(self, keys: Sequence[str]) -> dict[str, bytes]:
        getitems = getattr(self.mapping, "getitems", None)
        if getitems is not None and not isinstance(self.mapping, FSMap):
            return dict(getitems(list(keys), contexts={}))
        out = {}
        for k in keys:
            try:
                out[k] = self.mapping[k]
            except KeyError:
                continue
        return out

    def get_ranges(self, requests: Sequence[tuple[str, ByteRange]]) -> list[bytes | None]:
        values = self.get_many(list(dict.fromkeys(k for k, _ in requests)))
        return [None if k not in values else _slice(values[k], r) for k, r in requests]

    def set_many(self, values: Mapping[str, bytes]) -> None:
        if not values:
            return
        setitems = getattr(self.mapping, "setitems", None)
        if setitems is not None:
            setitems(dict(values))
        else:
            for k, v in values.items():
                self.mapping[k] = v

    def delete_many(self, keys: Iterable[str]) -> None:
        for k in keys:
            try:
                del self.mapping[k]
            except KeyError:
                continue

    def contains(self, key: str) -> bool:
        return key in self.mapping

    def iter_keys(self, prefix: str = "") -> Iterator[str]:
        for k in list(self.mapping.keys()):
            if k.startswith(prefix):
                yield k

    def list_dir(self, path: str = "") -> list[str]:
        listdir = getattr(self.mapping, "listdir", None)
        if listdir is not None:
            return sorted(listdir(path))
        prefix = f"{path}/" if path else ""
        return sorted({k[len(prefix) :].split("/", 1)[0] for k in self.iter_keys(prefix)})

    def rmdir(self, path: str) -> None:
        rmdir = getattr(self.mapping, "rmdir", None)
        if rmdir is not None:
            rmdir(path)
        else:
            super().rmdir(path)

    def size(self, key: str) -> int:
        return memoryview(self.mapping[key]).nbytes

    def close(self) -> None:
        close = getattr(self.mapping, "close", None)
        if close is not None:
            close()


class FSMapAdapter(StoreAdapter):
    """An fsspec filesystem under a root path as base store, with ranged reads.

    Parameters
    ----------
    fs : fsspec.AbstractFileSystem
        The filesystem.
    root : str
        The root path inside ``fs`` (no trailing ``/``).
    missing_exceptions : tuple of exception types
        Errors that mean "not found" (become ``KeyError``); by default those of
        ``fsspec.FSMap``: ``FileNotFoundError``, ``IsADirectoryError``,
        ``NotADirectoryError``.
    """

    supports_ranges = True
    fsync: bool = FSYNC
    """Local files: fsync each written shard before its rename and, once per batch, the
    directories after (durable against power loss when a write returns). Set it False on an
    instance for bulk writes that are redone after a crash (then sync once at the end):
    writes stay atomic against killed processes either way."""

    def __init__(
        self,
        fs: fsspec.AbstractFileSystem,
        root: str,
        missing_exceptions: tuple[type[BaseException], ...] = (
            FileNotFoundError,
            IsADirectoryError,
            NotADirectoryError,
        ),
    ) -> None:
        self.fs = fs
        self.root = root.rstrip("/")
        self.missing_exceptions = missing_exceptions
        self._local = "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))

    @classmethod
    def from_fsmap(cls, fsmap: FSMap) -> FSMapAdapter:
        return cls(fsmap.fs, fsmap.root, tuple(fsmap.missing_exceptions))

    # -- identity and pickling (issue 9) --------------------------------------

    @property
    def location(self) -> StoreLocation:
        """The data under the root: protocol (and endpoint) plus the resolved root path."""
        return fs_location(self.fs, self.root)

    def __reduce__(self) -> tuple[Any, ...]:
        # fsspec filesystems pickle as (class, storage options); nothing else is carried
        return (type(self), (self.fs, self.root, self.missing_exceptions))

    # -- I/O ------------------------------------------------------------------

    def _path(self, key: str) -> str:
        return f"{self.root}/{key}" if key else self.root

    def _key(self, path: str) -> str:
        path = self.fs._strip_protocol(path)
        root = self.fs._strip_protocol(self.root)
        return path[len(root) :].lstrip("/")

    def _check(self, key: str, result: Any) -> bytes | None:
        if isinstance(result, BaseException):
            if isinstance(result, self.missing_exceptions):
                return None
            raise result
        return result

    def get(self, key: str) -> bytes:
        try:
            return self.fs.cat_file(self._path(key))
        except self.missing_exceptions as exc:
            raise KeyError(key) from exc

    def get_many(self, keys: Sequence[str]) -> dict[str, bytes]:
        if not keys:
            return {}
        paths = [self._path(k) for k in keys]
        results = self.fs.cat(paths, on_error="return")
        if not isinstance(results, dict):  # a single path returns bytes
            results = {paths[0]: results}
        out = {}
        for k, p in zip(keys, paths):
            value = self._check(k, results.get(p, FileNotFoundError(p)))
            if value is not None:
                out[k] = value
        return out

    def get_ranges(self, requests: Sequence[tuple[str, ByteRange]]) -> list[bytes | None]:
        if not requests:
            return []
        paths = [self._path(k) for k, _ in requests]
        starts = [r.start for _, r in requests]
        stops = [r.stop for _, r in requests]
        if self._local and len(requests) > 1:
            # local reads release the GIL: run them side by side (async filesystems
            # already run cat_ranges concurrently)
            def one(i: int) -> Any:
                try:
                    return self.fs.cat_file(paths[i], starts[i], stops[i])
                except Exception as exc:  # returned, then sorted into missing / raised by _check
                    return exc

            with ThreadPoolExecutor(max_workers=min(8, len(requests))) as pool:
                results = list(pool.map(one, range(len(requests))))
        else:
            results = self.fs.cat_ranges(paths, starts, stops, on_error="return")
        return [self._check(k, res) for (k, _), res in zip(requests, results)]

    @property
    def supports_append(self) -> bool:
        return self._local

    def write_at(self, key: str, writes: Sequence[tuple[int, bytes]]) -> None:
        """Apply ``(offset, bytes)`` writes to a stored local file, atomically (copy on write).

        The live file is never written: its bytes are copied into a temporary
        file beside it (``os.copy_file_range``: a reflink on file systems that
        share extents, an in-kernel copy elsewhere), the writes are applied to
        the copy, the copy is fsync'd and renamed over the shard, and the
        directory is fsync'd. A failed or killed writer leaves the previous
        shard whole (and at most a temporary file, see
        :func:`shardkv.engine.verify.remove_stale_temporaries`).

        Raises
        ------
        KeyError
            If the file does not exist.
        OSError
            Any error of the file system; the stored shard is then unchanged.
        """
        path = self.fs._strip_protocol(self._path(key))
        try:
            src = os.open(path, os.O_RDONLY)
        except FileNotFoundError as exc:
            raise KeyError(key) from exc
        try:
            size = os.fstat(src).st_size
            _replace_atomically(path, lambda fd: _patch_copy(src, fd, size, writes), self.fsync)
        finally:
            os.close(src)
        if self.fsync:
            _fsync_dirs([path])

    def validator(self, key: str) -> Hashable:
        if not self._local:
            return None
        try:
            st = os.stat(self.fs._strip_protocol(self._path(key)))
        except FileNotFoundError:
            return "missing"
        # the inode too: an atomic rewrite (temporary file renamed over the shard) gets a new
        # one, so a same-size rewrite within the file system's timestamp granularity is seen
        return (st.st_size, st.st_mtime_ns, st.st_ino)

    def set_many(self, values: Mapping[str, bytes]) -> None:
        if not values:
            return
        if self._local:
            for k, v in values.items():
                self._atomic_local_write(self._path(k), v)
            if self.fsync:
                _fsync_dirs(self.fs._strip_protocol(self._path(k)) for k in values)
            return
        paths = {self._path(k): (bytes(v) if not isinstance(v, bytes) else v) for k, v in values.items()}
        if not _has_buckets(self.fs):  # object stores need no directories; makedirs would create a bucket
            for parent in {self.fs._parent(p) for p in paths}:
                self.fs.makedirs(parent, exist_ok=True)
        self.fs.pipe(paths)

    def _atomic_local_write(self, path: str, value: bytes) -> None:
        path = self.fs._strip_protocol(path)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        _replace_atomically(path, lambda fd: _pwrite_all(fd, memoryview(value).cast("B"), 0), self.fsync)

    def delete_many(self, keys: Iterable[str]) -> None:
        paths = [self._path(k) for k in keys]
        for p in paths:
            try:
                self.fs.rm_file(p)
            except self.missing_exceptions:
                continue

    def contains(self, key: str) -> bool:
        return self.fs.isfile(self._path(key))

    def iter_keys(self, prefix: str = "") -> Iterator[str]:
        base = self._path(prefix.rstrip("/")) if prefix else self.root
        try:
            paths = self.fs.find(base)
        except self.missing_exceptions:
            return
        for p in sorted(paths):
            key = self._key(p)
            if key.startswith(prefix) and not _hidden(key):
                yield key

    def list_dir(self, path: str = "") -> list[str]:
        try:
            entries = self.fs.ls(self._path(path), detail=False)
        except self.missing_exceptions:
            return []
        names = []
        for e in entries:
            name = self._key(e).rsplit("/", 1)[-1]
            if name and not _hidden(name):
                names.append(name)
        return sorted(set(names))

    def rmdir(self, path: str) -> None:
        target = self._path(path)
        try:
            if path:
                self.fs.rm(target, recursive=True)
            else:
                for child in self.fs.ls(target, detail=False):
                    self.fs.rm(child, recursive=True)
        except self.missing_exceptions:
            return

    def size(self, key: str) -> int:
        try:
            return int(self.fs.size(self._path(key)))
        except self.missing_exceptions as exc:
            raise KeyError(key) from exc

    def size_if_free(self, key: str) -> int | None:
        try:
            if self._local:
                return os.stat(self.fs._strip_protocol(self._path(key))).st_size
            if isinstance(self.fs, MemoryFileSystem):
                return int(self.fs.size(self._path(key)))
        except self.missing_exceptions:
            return None
        return None


_BUCKET_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oss"})


def _has_buckets(fs: fsspec.AbstractFileSystem) -> bool:
    """True for object stores whose first path segment is a bucket (never created by shardkv)."""
    protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    return bool(_BUCKET_PROTOCOLS.intersection(protocols))


def adapt(store: Any, storage_options: Mapping[str, Any] | None = None) -> StoreAdapter:
    """Wrap a user's store in the best adapter for it.

    Parameters
    ----------
    store : str, os.PathLike, fsspec.FSMap, MutableMapping or StoreAdapter
        An fsspec URL (``"s3://bucket/data.zarr"``) or local path; an fsspec
        mapper; a zarr-python 2 ``DirectoryStore`` or ``FSStore`` (their files
        are read directly, with ranges); any other ``MutableMapping``.
    storage_options : mapping, optional
        Passed to fsspec for a URL.

    Raises
    ------
    TypeError
        If ``store`` is none of these.
    """
    if isinstance(store, StoreAdapter):
        return store
    if isinstance(store, os.PathLike):
        store = os.fspath(store)
    if isinstance(store, str):
        return FSMapAdapter.from_fsmap(fsspec.get_mapper(store, **(storage_options or {})))
    if isinstance(store, FSMap):
        return FSMapAdapter.from_fsmap(store)
    cls = type(store).__name__
    if cls == "DirectoryStore" and isinstance(getattr(store, "path", None), str):
        return FSMapAdapter(fsspec.filesystem("file"), store.path)
    if cls == "FSStore" and getattr(store, "key_separator", None) is None and hasattr(store, "map"):
        return FSMapAdapter.from_fsmap(store.map)
    if isinstance(store, MutableMapping):
        return MappingAdapter(store)
    raise TypeError(
        f"cannot use {cls} as a store: pass a MutableMapping, an fsspec FSMap, a URL or a path"
    )
