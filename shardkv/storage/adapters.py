"""Adapters over the base store: the only module of shardkv that does I/O.

:func:`adapt` turns whatever the user passes (a ``dict`` or any
``MutableMapping``, a zarr-python 2 store, an fsspec ``FSMap``, an fsspec URL
or a local path) into a :class:`StoreAdapter`, a small uniform interface of
batch reads, ranged reads, batch writes and listings.

* :class:`FSMapAdapter` uses the filesystem directly: ranged and suffix reads
  (``cat_file(path, start, end)`` / ``cat_ranges``), concurrent batch reads and
  writes (``cat`` / ``pipe``). On local disks it bypasses fsspec's file
  objects: reads are ``open`` + ``pread`` + ``close`` and writes are atomic (a
  temporary file written with ``os.writev`` from the value's parts, then
  renamed over the target, so a crash never leaves a torn shard).
* :class:`MappingAdapter` works with any ``MutableMapping``; it cannot read
  ranges, so a ranged read fetches the whole value once and slices it. It uses
  a zarr-python 2 store's own ``getitems``/``setitems``/``delitems``/``listdir``
  when it has them.

"Not found" becomes ``KeyError`` (chained with ``from``); every other error of
the base store (permissions, network) propagates unchanged.

A value given to :meth:`StoreAdapter.set_many` is either one bytes-like object
or a ``list``/``tuple`` of them, its *parts* in order (a shard's chunks and
index): adapters that can write parts without joining them (local files,
``os.writev``) do so; the others join them once.
"""

from __future__ import annotations

import os
import uuid
from abc import ABC, abstractmethod
from collections.abc import MutableMapping
from typing import Any, Hashable, Iterable, Iterator, Mapping, Sequence

import fsspec
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem
from fsspec.mapping import FSMap

from shardkv.format.ranges import ByteRange
from shardkv.storage.buffers import (
    Value,
    byte_parts,
    join_parts,
    pread_file,
    read_pool,
    slice_value,
    write_parts,
)

__all__ = ["StoreAdapter", "MappingAdapter", "FSMapAdapter", "adapt", "TEMP_MARKER", "Value", "join_parts", "byte_parts"]

TEMP_MARKER = ".shardkv-tmp-"
"""Part of the name of the temporary files of atomic local writes; never listed."""

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

    def get_ranges(self, requests: Sequence[tuple[str, ByteRange]]) -> list[bytes | memoryview | None]:
        values = self.get_many(list(dict.fromkeys(k for k, _ in requests)))
        return [None if k not in values else slice_value(values[k], r) for k, r in requests]

    def set_many(self, values: Mapping[str, Value]) -> None:
        if not values:
            return
        # a mapping stores one object per key: parts are joined here, once
        joined = {k: join_parts(v) if isinstance(v, (list, tuple)) else v for k, v in values.items()}
        setitems = getattr(self.mapping, "setitems", None)
        if setitems is not None:
            setitems(joined)
        else:
            for k, v in joined.items():
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

    @classmethod
    def from_fsmap(cls, fsmap: FSMap) -> FSMapAdapter:
        return cls(fsmap.fs, fsmap.root, tuple(fsmap.missing_exceptions))

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
        """Write bytes at offsets inside an existing local file (append when offset = size).

        Raises ``KeyError`` if the file does not exist.
        """
        path = self.fs._strip_protocol(self._path(key))
        try:
            f = open(path, "r+b")
        except FileNotFoundError as exc:
            raise KeyError(key) from exc
        with f:
            for offset, data in writes:
                f.seek(offset)
                f.write(data)

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

    def set_many(self, values: Mapping[str, Value]) -> None:
        if not values:
            return
        if self._local:
            for k, v in values.items():
                self._atomic_local_write(self._path(k), v)
            return
        paths = {self._path(k): join_parts(v) for k, v in values.items()}
        for parent in {self.fs._parent(p) for p in paths}:
            self.fs.makedirs(parent, exist_ok=True)
        self.fs.pipe(paths)

    def _atomic_local_write(self, path: str, value: Value) -> None:
        """Write ``value`` (bytes-like or parts) to a temporary file, then rename it over ``path``.

        The parts go to the kernel with ``os.writev``, never joined; the parent
        directory is made only when the first ``open`` finds it missing.
        """
        path = self.fs._strip_protocol(path)
        tmp = os.path.join(os.path.dirname(path), f"{TEMP_MARKER}{uuid.uuid4().hex}")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(tmp, flags, 0o666)
        except FileNotFoundError:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd = os.open(tmp, flags, 0o666)
        try:
            try:
                write_parts(fd, byte_parts(value))
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.remove(tmp)
            raise

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
            if key.startswith(prefix) and TEMP_MARKER not in key:
                yield key

    def list_dir(self, path: str = "") -> list[str]:
        try:
            entries = self.fs.ls(self._path(path), detail=False)
        except self.missing_exceptions:
            return []
        names = []
        for e in entries:
            name = self._key(e).rsplit("/", 1)[-1]
            if name and TEMP_MARKER not in name:
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


def adapt(store: Any, storage_options: Mapping[str, Any] | None = None) -> StoreAdapter:
    """Wrap a user's store in the best adapter for it.

    Parameters
    ----------
    store : str, os.PathLike, fsspec.FSMap, obstore store, MutableMapping or StoreAdapter
        An fsspec URL (``"s3://bucket/data.zarr"``) or local path; an fsspec
        mapper; an obstore store object (``obstore.store.S3Store``, ...); a
        zarr-python 2 ``DirectoryStore`` or ``FSStore`` (their files are read
        directly, with ranges); any other ``MutableMapping``.
    storage_options : mapping, optional
        Passed to fsspec for a URL. With ``"client": "obstore"`` the URL is
        opened with obstore instead, and the other options go to
        ``obstore.store.from_url``.

    Raises
    ------
    TypeError
        If ``store`` is none of these.
    ConfigurationError
        If obstore is asked for and not installed.
    """
    if isinstance(store, StoreAdapter):
        return store
    if isinstance(store, os.PathLike):
        store = os.fspath(store)
    options = dict(storage_options or {})
    if isinstance(store, str) and options.get("client") == "obstore":
        from shardkv.storage.obstore_adapter import from_url

        options.pop("client")
        return from_url(store, options)
    if isinstance(store, str):
        return FSMapAdapter.from_fsmap(fsspec.get_mapper(store, **options))
    if isinstance(store, FSMap):
        return FSMapAdapter.from_fsmap(store)
    cls = type(store).__name__
    from shardkv.storage.obstore_adapter import ObstoreAdapter, is_obstore_store

    if is_obstore_store(store):
        return ObstoreAdapter(store)
    if cls == "DirectoryStore" and isinstance(getattr(store, "path", None), str):
        return FSMapAdapter(fsspec.filesystem("file"), store.path)
    if cls == "FSStore" and getattr(store, "key_separator", None) is None and hasattr(store, "map"):
        return FSMapAdapter.from_fsmap(store.map)
    if isinstance(store, MutableMapping):
        return MappingAdapter(store)
    raise TypeError(
        f"cannot use {cls} as a store: pass a MutableMapping, an fsspec FSMap, a URL or a path"
    )
