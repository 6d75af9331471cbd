"""A :class:`~shardkv.storage.kv.KVStore` over an fsspec filesystem (other than local directories and S3).

* ``memory://``: every write stores a new file object, so the generation of a
  value is the identity of the stored object (a serial number it keeps for
  life); it sees every write in the process, shardkv's or not.
* any other filesystem (gcsfs, http, a ``LocalFileSystem`` subclass, ...):
  process stamps (:mod:`shardkv.storage.stamps`); reads are one ``cat_ranges``
  per call, writes ``pipe``, except local files, written atomically as
  :class:`~shardkv.storage.local.LocalStore` writes them.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any

import fsspec
from fsspec.implementations.memory import MemoryFileSystem

from shardkv._types import BytesLike
from shardkv.storage.buffers import Value, byte_parts, join_parts
from shardkv.storage.kv import (
    LOCK_DIR,
    MISSING_RESULT,
    NO_VALUE,
    Capabilities,
    Generation,
    KVStore,
    ReadRequest,
    ReadResult,
    hidden,
)
from shardkv.storage.local import FSYNC, atomic_write, fsync_dirs
from shardkv.storage.location import StoreLocation, fs_location
from shardkv.storage.stamps import STAMPS, Fetched, read_stamped, write_stamped

__all__ = ["FsspecStore", "MEMORY_CAPS", "BUCKET_PROTOCOLS"]

MEMORY_CAPS = Capabilities(
    ranged=True,
    round_trips=False,
    stamps="native",
    conditional_put=False,
    conditional_delete=False,
    lock_dir=False,
    in_process=True,
)
"""``memory://``: ranged, generations from the stored objects, data only in this process."""

_SERIALS = itertools.count(1)
_SERIAL_LOCK = threading.Lock()
_SERIAL_ATTR = "_shardkv_serial"
_LOCAL_PROTOCOLS = frozenset({"file", "local"})
BUCKET_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oss"})
"""Protocols whose first path segment is a bucket (or container) that must already exist."""


def _identity(stored: Any) -> Generation:
    """The generation of a stored ``memory://`` file object: a serial number it keeps for life."""
    serial = getattr(stored, _SERIAL_ATTR, None)
    if serial is None:
        with _SERIAL_LOCK:
            serial = getattr(stored, _SERIAL_ATTR, None)
            if serial is None:
                serial = next(_SERIALS)
                setattr(stored, _SERIAL_ATTR, serial)
    return Generation(("memory", serial))


_Request = tuple[int, str, "int | None", "int | None"]  # (index of the read, key, start, stop) of one range


def _not_found(got: list[Any]) -> bool:
    """True when a range of a read came back "not found"; any other error fetched is raised."""
    errors = [d for d in got if isinstance(d, BaseException)]
    if any(isinstance(e, FileNotFoundError) for e in errors):
        return True
    if errors:
        raise errors[0]
    return False


def _protocols(fs: Any) -> tuple[str, ...]:
    return fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)


class FsspecStore(KVStore):
    """An fsspec filesystem under a root path as a :class:`KVStore`.

    Parameters
    ----------
    fs : fsspec.AbstractFileSystem
        The filesystem (``memory://`` or any other but s3fs and fsspec's own local one).
    root : str
        The root path inside ``fs`` (a trailing ``/`` is dropped).
    """

    def __init__(self, fs: fsspec.AbstractFileSystem, root: str) -> None:
        self.fs = fs
        self.root = fs._strip_protocol(root).rstrip("/") if root else ""
        self._memory = isinstance(fs, MemoryFileSystem)
        self._local = bool(set(_protocols(fs)) & _LOCAL_PROTOCOLS)
        self.fsync = FSYNC
        """Local files: fsync written files and their directories (as :attr:`LocalStore.fsync`)."""
        self._location = fs_location(fs, self.root)
        if self._memory:
            self.caps = MEMORY_CAPS
        else:
            in_memory = self._location.namespace == ("memory",)  # a DirFileSystem over memory://, say
            self.caps = Capabilities(
                ranged=True,
                round_trips=not (self._local or in_memory),
                stamps="process",
                lock_dir=self._location.local_dir is not None,
                in_process=in_memory,
            )

    @property
    def location(self) -> StoreLocation:
        """The protocol (and endpoint) and the root path inside it."""
        return self._location

    def __reduce__(self) -> tuple[Any, ...]:
        # fsspec filesystems pickle as (class, storage options)
        return (type(self), (self.fs, self.root))

    def __repr__(self) -> str:
        return f"FsspecStore({type(self.fs).__name__}, {self.root!r})"

    def _path(self, key: str) -> str:
        return f"{self.root}/{key}" if self.root else key

    # -- reads ----------------------------------------------------------------

    def _cat(self, requests: Sequence[_Request]) -> dict[int, list[Any]]:
        """One ``cat_ranges`` of every request: per read, the bytes (or the errors) of its ranges in order."""
        per_read: dict[int, list[Any]] = {}
        if requests:
            _, keys, starts, stops = zip(*requests, strict=True)
            fetched = self.fs.cat_ranges([self._path(k) for k in keys], list(starts), list(stops), on_error="return")
            for (i, _, _, _), data in zip(requests, fetched, strict=True):
                per_read.setdefault(i, []).append(data)
        return per_read

    def get_many(self, reads: Sequence[ReadRequest]) -> list[ReadResult]:
        if self._memory:
            return self._memory_reads(reads)
        return read_stamped(self._location, reads, partial(self._fetch_stamped, reads))

    def _memory_reads(self, reads: Sequence[ReadRequest]) -> list[ReadResult]:
        """``memory://``: one ``cat_ranges`` of every range (what request-counting filesystems see), each
        result checked to come from the object looked up before it: one generation for all ranges of a read."""
        looked = [self.fs.store.get(self._path(key)) for key, _, _ in reads]
        results: list[ReadResult | None] = [None] * len(reads)
        requests: list[_Request] = []
        sizes: list[int] = [0] * len(reads)
        for i, ((key, ranges, cond), stored) in enumerate(zip(reads, looked, strict=True)):
            if stored is not None:
                with stored.getbuffer() as view:
                    sizes[i] = view.nbytes
                if cond.is_missing or (not cond.is_any and cond != _identity(stored)):
                    results[i] = ReadResult("stale", None, _identity(stored), sizes[i])
                    continue
            elif ranges == [] or (not cond.is_any and not cond.is_missing):
                results[i] = MISSING_RESULT
                continue
            for r in [None] if ranges is None else ranges:
                requests.append((i, key, None if r is None else r.start, None if r is None else r.stop))
        per_read = self._cat(requests)
        for i, (key, _, _) in enumerate(reads):
            if results[i] is not None:
                continue
            stored = looked[i]
            got = per_read.get(i, [])
            if stored is None or _not_found(got):
                results[i] = (
                    MISSING_RESULT
                    if self.fs.store.get(self._path(key)) is None
                    else ReadResult("stale", None, self._memory_generation(key))
                )
                continue
            if self.fs.store.get(self._path(key)) is not stored:  # replaced meanwhile
                results[i] = ReadResult("stale", None, self._memory_generation(key))
                continue
            results[i] = ReadResult("value", [bytes(d) for d in got], _identity(stored), sizes[i])
        return [r for r in results if r is not None]

    def _fetch_stamped(self, reads: Sequence[ReadRequest], indices: list[int]) -> dict[int, Fetched]:
        requests: list[_Request] = []
        for i in indices:
            key, ranges, _ = reads[i]
            # a whole read is the range "from byte 0"; a zero-range read fetches one byte to see the key
            for r in ranges if ranges else [None]:
                stop = (1 if ranges == [] else None) if r is None else r.stop
                requests.append((i, key, None if r is None else r.start, stop))
        fetched: dict[int, Fetched] = {}
        for i, got in self._cat(requests).items():
            key, ranges, _ = reads[i]
            if _not_found(got):
                continue
            values: list[BytesLike] = [] if ranges == [] else [bytes(d) for d in got]
            size = len(values[0]) if ranges is None else (self.fs.size(self._path(key)) if self._local else None)
            fetched[i] = (values, size)
        return fetched

    # -- writes ---------------------------------------------------------------

    def _memory_generation(self, key: str) -> Generation:
        stored = self.fs.store.get(self._path(key))
        return NO_VALUE if stored is None else _identity(stored)

    def _holds(self, key: str, cond: Generation, before: Generation) -> bool:
        if cond.is_any:
            return True
        if self._memory:
            return self._memory_generation(key) == cond
        if cond.is_missing:
            return not self.fs.isfile(self._path(key))
        return before == cond

    def put_many(self, writes: Mapping[str, tuple[Value | None, Generation]]) -> dict[str, Generation | None]:
        out = write_stamped(self._location, writes, self._holds, self._write_local if self._local else self._write_fs)
        if self._memory:  # memory:// values carry generations of their own
            return {
                k: self._memory_generation(k) if g is not None and writes[k][0] is not None else g
                for k, g in out.items()
            }
        return out

    def _write_fs(self, values: Mapping[str, Value | None]) -> None:
        """One ``pipe`` of the values to store, then the deletes (missing keys are no error)."""
        stores = {self._path(k): join_parts(v) for k, v in values.items() if v is not None}
        if stores:
            if not self._memory and not set(_protocols(self.fs)) & BUCKET_PROTOCOLS:
                # object stores need no directories (makedirs would create a bucket)
                for parent in {self.fs._parent(p) for p in stores}:
                    self.fs.makedirs(parent, exist_ok=True)
            self.fs.pipe(stores)
        for key, value in values.items():
            if value is None:
                try:
                    self.fs.rm_file(self._path(key))
                except FileNotFoundError:
                    continue

    def _write_local(self, values: Mapping[str, Value | None]) -> None:
        """Local files written as :class:`~shardkv.storage.local.LocalStore` writes them (atomic, durable)."""
        written = []
        for key, value in values.items():
            path = self.fs._strip_protocol(self._path(key))
            if value is None:
                try:
                    os.remove(path)
                except (FileNotFoundError, NotADirectoryError):
                    continue
            else:
                atomic_write(path, byte_parts(value), self.fsync)
                written.append(path)
        if self.fsync and written:
            fsync_dirs(written)

    # -- listings -------------------------------------------------------------

    def _key(self, path: str) -> str:
        path = self.fs._strip_protocol(path)
        return path[len(self.root) :].lstrip("/") if self.root else path.lstrip("/")

    def list_prefix(self, prefix: str) -> Iterator[str]:
        head = prefix.rpartition("/")[0]
        base = self._path(head) if head else self.root
        try:
            paths = self.fs.find(base or "/")
        except FileNotFoundError:
            return
        for path in sorted(paths):
            key = self._key(path)
            if key.startswith(prefix) and not hidden(key):
                yield key

    def list_generations(
        self, prefix: str, wanted: Callable[[str], bool] | None = None
    ) -> Iterator[tuple[str, Generation | None]]:
        """Every key under ``prefix``; ``memory://`` values with their identity (a look-up), others with ``None``."""
        for key in self.list_prefix(prefix):
            yield key, (self._memory_generation(key) if self._memory else None)

    def contains(self, key: str) -> bool:
        """A lookup of the stored object (``memory://``), else the file's info (a directory is no value)."""
        if self._memory:
            return self.fs.store.get(self._path(key)) is not None
        return self.size(key) is not None

    def size(self, key: str) -> int | None:
        """The size fsspec reports for the file at ``key``; ``None`` when missing or a directory."""
        try:
            info = self.fs.info(self._path(key))
        except (FileNotFoundError, NotADirectoryError):
            return None
        return None if info.get("type") == "directory" else int(info["size"])

    def list_dir(self, prefix: str) -> tuple[list[str], list[str]]:
        base = self._path(prefix.rstrip("/")) if prefix else (self.root or "/")
        try:
            entries = self.fs.ls(base, detail=True)
        except (FileNotFoundError, NotADirectoryError):
            return [], []
        keys: list[str] = []
        dirs: list[str] = []
        for entry in entries:
            key = self._key(entry["name"]).rstrip("/")
            if prefix and key == prefix.rstrip("/"):  # a file lists as itself: it has no children
                continue
            name = key.rsplit("/", 1)[-1]
            if not name or hidden(name):
                continue
            (dirs if entry.get("type") == "directory" else keys).append(name)
        return sorted(set(keys)), sorted(set(dirs))

    def delete_prefix(self, prefix: str) -> None:
        """Delete every key under ``prefix``; a path (``prefix`` ending in ``/``, or ``""``) goes recursively.

        For ``""`` everything goes but the root's lock directory.
        """
        if prefix and not prefix.endswith("/"):
            super().delete_prefix(prefix)
            return
        keys = list(self.list_prefix(prefix))
        top = self._path(prefix.rstrip("/")) if prefix else (self.root or "/")
        with STAMPS.writing(self._location, keys) as stamped:
            stamped.begin(keys)
            try:
                if prefix:
                    if self.fs.isdir(top):
                        self.fs.rm(top, recursive=True)
                    return
                for child in self.fs.ls(top, detail=False):
                    if child.rstrip("/").rsplit("/", 1)[-1] != LOCK_DIR:
                        self.fs.rm(child, recursive=True)
            except FileNotFoundError:
                return

    def close(self) -> None:
        """Nothing to release (the filesystem is fsspec's to cache)."""
