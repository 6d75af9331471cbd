"""A :class:`StoreAdapter` over an fsspec filesystem: ranged and suffix reads, batched reads and writes.

On local disks it bypasses fsspec's file objects: reads are ``open`` + ``pread`` +
``close``, and every write is atomic (a temporary file beside the target written
from the value's parts, fsync'd, renamed over the target, the directory fsync'd),
positional updates included (copy on write, :meth:`FSMapAdapter.write_at`).
:func:`_pwrite_all` is the one low-level write of single buffers and
:func:`~shardkv.storage.buffers.write_parts` (looked up here) the one of parts
(the crash and fault-injection tests replace both)."""

from __future__ import annotations

import contextlib
import errno
import os
import uuid
import weakref
from typing import Any, Hashable, Iterable, Iterator, Mapping, Sequence

import fsspec
from fsspec.implementations.dirfs import DirFileSystem
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem
from fsspec.mapping import FSMap

from shardkv.format.ranges import ByteRange
from shardkv.storage.base import LOCK_DIR, MISSING, TEMP_MARKER, StoreAdapter, file_validator
from shardkv.storage.base import hidden as _hidden
from shardkv.storage.buffers import (
    Value,
    byte_parts,
    join_parts,
    pread_file,
    read_pool,
    write_parts,
)
from shardkv.storage.location import StoreLocation, fs_location

__all__ = ["FSMapAdapter", "FSYNC"]

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
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(tmp, flags, 0o666)
    except FileNotFoundError:  # the directory is made only when it is missing (no stat per write)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(tmp, flags, 0o666)
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


class _Identity:
    """A validator equal only to a validator of the very same stored object (``is``, not ``==``).

    It holds a weak reference: a cached validator keeps no replaced shard
    alive, and a dead reference (the object was replaced and freed) equals
    nothing, so a recycled ``id`` is never mistaken for the old object.
    """

    __slots__ = ("_ref", "_id")

    def __init__(self, obj: Any) -> None:
        self._ref = weakref.ref(obj)
        self._id = id(obj)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _Identity):
            return NotImplemented
        mine = self._ref()
        return mine is not None and mine is other._ref()

    def __hash__(self) -> int:
        return self._id


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
        # reads bypass fsspec's file objects (open + pread + close) only on fsspec's own
        # local filesystem: a subclass may change what a read does (or count it)
        self._direct_reads = type(fs) is LocalFileSystem
        self._remote = not self._local and not isinstance(fs, MemoryFileSystem)
        self.round_trips = self._remote

    @classmethod
    def from_fsmap(cls, fsmap: FSMap) -> FSMapAdapter:
        """The adapter of an fsspec mapper.

        A ``DirFileSystem`` over the local file system is looked through: the
        adapter is a plain local one over the directory it points to, so it
        gets what any local directory gets (atomic writes, lock files,
        validators of cached indexes).
        """
        fs, root = fsmap.fs, fsmap.root
        inner, prefix = getattr(fs, "fs", None), getattr(fs, "path", None)
        if isinstance(fs, DirFileSystem) and isinstance(inner, LocalFileSystem) and isinstance(prefix, str):
            fs, root = inner, fs._join(root)
        return cls(fs, root, tuple(fsmap.missing_exceptions))

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

    def _local_path(self, key: str) -> str:
        return self.fs._strip_protocol(self._path(key))

    def _local_read(self, key: str, start: int = 0, stop: int | None = None) -> Any:
        """A local read as ``cat_file`` would do it, errors returned (sorted by :meth:`_check`)."""
        try:
            return pread_file(self._local_path(key), start, stop)
        except Exception as exc:  # returned, then sorted into missing / raised by _check
            return exc

    def _fs_read(self, key: str, byte_range: ByteRange) -> Any:
        """One ranged read through the filesystem's ``cat_file``, errors returned."""
        try:
            return self.fs.cat_file(self._path(key), byte_range.start, byte_range.stop)
        except Exception as exc:  # returned, then sorted into missing / raised by _check
            return exc

    def _local_reads(self, requests: Sequence[tuple[str, int, int | None]]) -> list[Any]:
        if len(requests) == 1:
            return [self._local_read(*requests[0])]
        # local reads release the GIL: run them side by side
        return list(read_pool().map(lambda r: self._local_read(*r), requests))

    def _whole_again(self, path: str, result: Any) -> Any:
        """A whole-object read that failed as a range other than by a missing key, read plainly.

        (A range of an empty object is unsatisfiable on S3.)
        """
        if isinstance(result, BaseException) and not isinstance(result, self.missing_exceptions):
            try:
                return self.fs.cat_file(path)
            except Exception as exc:  # returned, then sorted into missing / raised by _check
                return exc
        return result

    def get(self, key: str) -> bytes:
        if self._direct_reads:
            value = self._check(key, self._local_read(key))
            if value is None:
                raise KeyError(key)
            return value
        if self._remote:
            value = self._check(key, self.get_many([key]).get(key, FileNotFoundError(key)))
            if value is None:
                raise KeyError(key)
            return value
        try:
            return self.fs.cat_file(self._path(key))
        except self.missing_exceptions as exc:
            raise KeyError(key) from exc

    def get_many(self, keys: Sequence[str]) -> dict[str, bytes]:
        if not keys:
            return {}
        if self._direct_reads:
            results = self._local_reads([(k, 0, None) for k in keys])
            return {k: v for k, v in ((k, self._check(k, r)) for k, r in zip(keys, results)) if v is not None}
        paths = [self._path(k) for k in keys]
        if self._remote:
            # one GET per key, as the range "from byte 0": ``cat`` would first expand the
            # paths and s3fs sizes a whole-object read first (a HEAD per key, and a LIST
            # per missing one)
            found = self.fs.cat_ranges(paths, [0] * len(paths), [None] * len(paths), on_error="return")
            results = {p: self._whole_again(p, r) for p, r in zip(paths, found)}
        else:
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
        if self._direct_reads:
            results = self._local_reads([(k, r.start, r.stop) for k, r in requests])
        elif self._local and len(requests) > 1:
            results = list(read_pool().map(lambda req: self._fs_read(*req), requests))
        else:  # async filesystems run cat_ranges concurrently
            paths = [self._path(k) for k, _ in requests]
            starts = [r.start for _, r in requests]
            stops = [r.stop for _, r in requests]
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
        :func:`shardkv.proxy.verify.remove_stale_temporaries`).

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
        """A cheap fingerprint that changes when the value is rewritten; ``None`` where there is none.

        Local files: ``(size, mtime_ns, inode)`` (``"missing"`` when absent).
        ``memory://``: the identity of the stored file object (every write
        stores a new one; ``"missing"`` when absent). Remote filesystems:
        ``None`` (their readers pin chunk reads to generations instead,
        :mod:`shardkv.engine.generation_reads`).
        """
        if isinstance(self.fs, MemoryFileSystem):
            stored = self.fs.store.get(self.fs._strip_protocol(self._path(key)))
            return MISSING if stored is None else _Identity(stored)
        if not self._local:
            return None
        return file_validator(self.fs._strip_protocol(self._path(key)))

    def set_many(self, values: Mapping[str, Value]) -> None:
        if not values:
            return
        if self._local:
            for k, v in values.items():
                self._atomic_local_write(self._path(k), v)
            if self.fsync:
                _fsync_dirs(self.fs._strip_protocol(self._path(k)) for k in values)
            return
        paths = {self._path(k): join_parts(v) for k, v in values.items()}
        if not _has_buckets(self.fs):  # object stores need no directories; makedirs would create a bucket
            for parent in {self.fs._parent(p) for p in paths}:
                self.fs.makedirs(parent, exist_ok=True)
        self.fs.pipe(paths)

    def _atomic_local_write(self, path: str, value: Value) -> None:
        """Write ``value`` (bytes-like or parts) to a temporary file, then rename it over ``path``.

        The parts go to the kernel with ``os.writev``, never joined; the parent
        directory is made only when the first ``open`` finds it missing.
        """
        path = self.fs._strip_protocol(path)
        parts = byte_parts(value)
        if len(parts) == 1:  # one buffer: the one injectable low-level write (crash and fault tests patch it)
            fill = lambda fd: _pwrite_all(fd, parts[0], 0)  # noqa: E731
        else:
            fill = lambda fd: write_parts(fd, parts)  # noqa: E731
        _replace_atomically(path, fill, self.fsync)

    def delete_many(self, keys: Iterable[str]) -> None:
        paths = [self._path(k) for k in keys]
        for p in paths:
            try:
                self.fs.rm_file(p)
            except self.missing_exceptions:
                continue

    def contains(self, key: str) -> bool:
        if not self._remote:
            return self.fs.isfile(self._path(key))
        # an object store: one ranged GET of the first byte, where ``isfile`` costs a HEAD
        # and, for a missing key (zarr probes many), a LIST too
        try:
            self.fs.cat_file(self._path(key), 0, 1)
        except self.missing_exceptions:
            return False
        except OSError:  # an empty object (a range of it is unsatisfiable) or a store that refuses ranges
            return self.fs.isfile(self._path(key))
        return True

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
            else:  # everything but the lock files, which writers in other processes may hold
                for child in self.fs.ls(target, detail=False):
                    if child.rstrip("/").rsplit("/", 1)[-1] != LOCK_DIR:
                        self.fs.rm(child, recursive=True)
        except self.missing_exceptions:
            return

    def prune_empty_dirs(self, path: str) -> None:
        if not self._local or not path:
            return
        top = self.fs._strip_protocol(self._path(path))
        for dirpath, _, names in os.walk(top, topdown=False):
            if os.path.basename(dirpath) == LOCK_DIR and all(n.endswith(".lock") for n in names):
                for name in names:
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(os.path.join(dirpath, name))
            with contextlib.suppress(OSError):  # not empty (a racing writer's file): kept
                os.rmdir(dirpath)

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


