"""A :class:`~shardkv.storage.kv.KVStore` over an fsspec filesystem (other than local directories and S3).

Local files reached through a filesystem other than fsspec's own
``LocalFileSystem`` (a subclass, a ``DirFileSystem`` over one) keep the files'
generations (a ``stat`` before and after each read; writes are a
:class:`~shardkv.storage.local.LocalStore`'s); any other filesystem
(``memory://``, gcsfs, http, ...) has process stamps. Reads are one
``cat_ranges`` per call, writes one ``pipe``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any

import fsspec
from fsspec.implementations.dirfs import DirFileSystem

from shardkv._types import BytesLike
from shardkv.errors import ConcurrentUpdateError
from shardkv.storage.files import join_parts
from shardkv.storage.kv import (
    LOCK_DIR,
    MISSING_RESULT,
    STAMPS,
    Capabilities,
    Fetched,
    Generation,
    KVStore,
    ReadRequest,
    ReadResult,
    StoreLocation,
    Value,
    hidden,
    read_stamped,
    write_stamped,
)
from shardkv.storage.local import LocalStore, stat_generation
from shardkv.storage.objects import child_names

_LOCAL_READ_ROUNDS = 8  # reads of a local file replaced while it is read, before ConcurrentUpdateError
BUCKET_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oss"})
"""Protocols whose first path segment is a bucket (or container) that must already exist."""


def _not_found(got: list[Any]) -> bool:
    """True when a range of a read came back "not found"; any other error fetched is raised."""
    errors = [d for d in got if isinstance(d, BaseException)]
    if any(isinstance(e, FileNotFoundError) for e in errors):
        return True
    if errors:
        raise errors[0]
    return False


def _protocols(fs: Any) -> tuple[str, ...]:
    """The protocols of an fsspec filesystem, as a tuple."""
    return fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)


def fs_location(fs: Any, root: str) -> StoreLocation:
    """The location of ``root`` inside an fsspec filesystem ``fs`` (local paths resolved, endpoints named)."""
    protocols = _protocols(fs)
    protocol = protocols[0]
    if isinstance(fs, DirFileSystem):  # its target
        return fs_location(fs.fs, fs._join(root))
    stripped = fs._strip_protocol(root).rstrip("/")
    if "file" in protocols or "local" in protocols:
        real = os.path.realpath(stripped or "/")
        return StoreLocation(("file",), real, real)
    if protocol == "memory":
        return StoreLocation(("memory",), stripped)
    endpoint = getattr(fs, "endpoint_url", None) or (getattr(fs, "client_kwargs", None) or {}).get("endpoint_url")
    return StoreLocation((str(protocol), None if endpoint is None else str(endpoint)), stripped)


class FsspecStore(KVStore):
    """An fsspec filesystem under a root path as a :class:`KVStore`.

    Parameters
    ----------
    fs : fsspec.AbstractFileSystem
        The filesystem (any but s3fs and fsspec's own local one).
    root : str
        The root path inside ``fs`` (a trailing ``/`` is dropped).

    Attributes
    ----------
    files : LocalStore or None
        For local files, the store of their directory: it writes them, and its
        generations are this store's.
    """

    def __init__(self, fs: fsspec.AbstractFileSystem, root: str) -> None:
        self.fs = fs
        self.root = fs._strip_protocol(root).rstrip("/") if root else ""
        self.location = fs_location(fs, self.root)
        local_dir = self.location.local_dir
        self.files = None if local_dir is None else LocalStore(local_dir)
        if self.files is not None:
            self.caps = Capabilities(ranged=True, stamps="native", lock_dir=True)
        else:
            in_memory = self.location.namespace == ("memory",)  # memory://, a DirFileSystem over it
            self.caps = Capabilities(ranged=True, round_trips=not in_memory, stamps="process", in_process=in_memory)

    def __repr__(self) -> str:
        return f"FsspecStore({type(self.fs).__name__}, {self.root!r})"

    def _path(self, key: str) -> str:
        """The path of ``key`` (``""``: of the root) in the filesystem."""
        return f"{self.root}/{key}" if self.root and key else key or self.root or "/"

    # -- reads ----------------------------------------------------------------

    def _cat(self, reads: Sequence[ReadRequest], indices: Iterable[int]) -> dict[int, list[Any]]:
        """One ``cat_ranges`` of the reads at ``indices``: per read found, the bytes of its ranges in order."""
        requests: list[tuple[int, str, int | None, int | None]] = []
        for i in indices:
            key, ranges, _ = reads[i]
            # a whole read is the range "from byte 0"; a zero-range read fetches one byte to see the key
            for r in ranges or (None,):
                stop = (1 if ranges == [] else None) if r is None else r.stop
                requests.append((i, self._path(key), None if r is None else r.start, stop))
        per_read: dict[int, list[Any]] = {}
        if requests:
            read_of, paths, starts, stops = zip(*requests, strict=True)
            fetched = self.fs.cat_ranges(list(paths), list(starts), list(stops), on_error="return")
            for i, data in zip(read_of, fetched, strict=True):
                per_read.setdefault(i, []).append(data)
        return {i: got for i, got in per_read.items() if not _not_found(got)}

    def get_many(self, reads: Sequence[ReadRequest]) -> list[ReadResult]:
        if self.files is not None:
            return self._local_reads(self.files, reads)
        return read_stamped(self.location, reads, partial(self._fetch_stamped, reads))

    def _local_reads(self, files: LocalStore, reads: Sequence[ReadRequest]) -> list[ReadResult]:
        """Local files: a ``stat`` of each before and after one ``cat_ranges`` of every read.

        The generation is the file's before the read; a file replaced while it
        was read makes a conditional read stale and an unconditional one read
        again (at most :data:`_LOCAL_READ_ROUNDS` rounds), so all ranges of a
        result come from the file of its generation.
        """
        results: list[ReadResult | None] = [None] * len(reads)
        paths = [files.path(key) for key, _, _ in reads]
        pending = list(range(len(reads)))
        for _ in range(_LOCAL_READ_ROUNDS):
            seen: dict[int, tuple[Generation, int | None]] = {}
            for i in pending:
                _, ranges, cond = reads[i]
                generation, size = stat_generation(paths[i])
                if generation.is_missing:
                    results[i] = MISSING_RESULT
                elif cond.is_missing or (not cond.is_any and generation != cond):
                    results[i] = ReadResult("stale", None, generation, size)
                elif ranges == []:
                    results[i] = ReadResult("value", [], generation, size)
                else:
                    seen[i] = (generation, size)
            per_read = self._cat(reads, seen)
            pending = []
            for i, (generation, size) in seen.items():
                got = per_read.get(i)
                after, _ = stat_generation(paths[i])
                if got is None or after != generation:  # replaced (or removed) while it was read
                    if reads[i][2].is_any:
                        pending.append(i)
                    else:
                        results[i] = MISSING_RESULT if after.is_missing else ReadResult("stale", None, after)
                    continue
                results[i] = ReadResult("value", [bytes(d) for d in got], generation, size)
            if not pending:
                return [r for r in results if r is not None]
        raise ConcurrentUpdateError(reads[pending[0]][0], _LOCAL_READ_ROUNDS, _LOCAL_READ_ROUNDS, "read")

    def _fetch_stamped(self, reads: Sequence[ReadRequest], indices: list[int]) -> dict[int, Fetched]:
        fetched: dict[int, Fetched] = {}
        for i, got in self._cat(reads, indices).items():
            key, ranges, _ = reads[i]
            values: list[BytesLike] = [] if ranges == [] else [bytes(d) for d in got]
            size = len(values[0]) if ranges is None else None
            if size is None and self.caps.in_process:  # free for in-process data: the engine reads exactly a chunk
                try:
                    size = self.fs.size(self._path(key))
                except FileNotFoundError:  # deleted since it was read
                    continue
            fetched[i] = (values, size)
        return fetched

    # -- writes ---------------------------------------------------------------

    def put_many(self, writes: Mapping[str, tuple[Value | None, Generation]]) -> dict[str, Generation | None]:
        if self.files is not None:  # local files: written as a LocalStore writes them, with its generations
            return self.files.put_many(writes)
        return write_stamped(self.location, writes, lambda key: self.fs.isfile(self._path(key)), self._write_fs)

    def _write_fs(self, values: Mapping[str, Value | None]) -> None:
        """One ``pipe`` of the values to store, then the deletes (missing keys are no error)."""
        stores = {self._path(k): join_parts(v) for k, v in values.items() if v is not None}
        if stores:
            if not self.caps.in_process and not set(_protocols(self.fs)) & BUCKET_PROTOCOLS:
                # in-memory and object stores need no directories (makedirs would create a bucket)
                for parent in {self.fs._parent(p) for p in stores}:
                    self.fs.makedirs(parent, exist_ok=True)
            self.fs.pipe(stores)
        for key, value in values.items():
            if value is None:
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm_file(self._path(key))

    # -- listings -------------------------------------------------------------

    def _key(self, path: str) -> str:
        path = self.fs._strip_protocol(path)
        return path[len(self.root) :].lstrip("/") if self.root else path.lstrip("/")

    def list_prefix(self, prefix: str) -> Iterator[str]:
        try:
            paths = self.fs.find(self._path(prefix.rpartition("/")[0]))
        except FileNotFoundError:
            return
        for path in sorted(paths):
            key = self._key(path)
            if key.startswith(prefix) and not hidden(key):
                yield key

    def contains(self, key: str) -> bool:
        """The file's info (a directory is no value)."""
        return self.size(key) is not None

    def size(self, key: str) -> int | None:
        """The size fsspec reports for the file at ``key``; ``None`` when missing or a directory."""
        try:
            info = self.fs.info(self._path(key))
        except (FileNotFoundError, NotADirectoryError):
            return None
        return None if info.get("type") == "directory" else int(info["size"])

    def list_dir(self, prefix: str) -> tuple[list[str], list[str]]:
        try:
            entries = self.fs.ls(self._path(prefix.rstrip("/")), detail=True)
        except (FileNotFoundError, NotADirectoryError):
            return [], []
        # a file lists as itself: it has no children
        entries = [e for e in entries if not prefix or self._key(e["name"]).rstrip("/") != prefix.rstrip("/")]
        dirs = [e["name"] for e in entries if e.get("type") == "directory"]
        return child_names(e["name"] for e in entries if e.get("type") != "directory"), child_names(dirs)

    def delete_prefix(self, prefix: str) -> None:
        """Delete every key under ``prefix``; a path (``prefix`` ending in ``/``, or ``""``) goes recursively.

        For ``""`` everything goes but the root's lock directory.
        """
        if prefix and not prefix.endswith("/"):
            super().delete_prefix(prefix)
            return
        keys = list(self.list_prefix(prefix))
        top = self._path(prefix.rstrip("/"))
        with STAMPS.writing(self.location, keys) as stamped:
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
