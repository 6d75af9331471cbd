"""Counting fsspec filesystems and local-write probes for the performance tests.

Vocabulary used by the tests:

* a **request** is one call that moves the bytes of one stored object:
  ``cat_file`` (a whole or ranged read) or ``pipe_file`` (a whole write);
  local writes made outside fsspec (the atomic writes of
  :class:`shardkv.storage.local.LocalStore`) are recorded as requests too, by
  :func:`record_local_writes`;
* a **batch** is one call the proxy makes on the filesystem: ``cat``,
  ``cat_ranges``, ``pipe``, or a ``cat_file`` / ``pipe_file`` that no batch
  call made.

Every request records the key (path relative to the root), the requested
``start``/``end`` and the bytes actually moved, so tests assert both request
counts and byte counts.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import fsspec
import pytest
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem

__all__ = [
    "Request",
    "CountingMemoryFS",
    "CountingLocalFS",
    "memory_mapper",
    "local_mapper",
    "record_local_writes",
    "is_meta",
    "CountingDict",
]

_META = (".zarray", ".zgroup", ".zattrs", ".zmetadata", "zarr.json")


def is_meta(key: str) -> bool:
    """True for metadata keys (``.zarray``, ``zarr.json``, ...), false for shard and chunk keys."""
    return key.rsplit("/", 1)[-1] in _META


@dataclass(frozen=True)
class Request:
    """One request on one stored object (``nbytes``: bytes read or written)."""

    op: Literal["read", "write"]
    key: str
    start: int | None
    end: int | None
    nbytes: int


class _CountingMixin:
    """Records requests and batches; put it before an fsspec filesystem class."""

    count_root: str = ""

    def _counting_init(self) -> None:
        self.requests: list[Request] = []
        self.batches: list[str] = []
        self._depth = threading.local()
        self._log_lock = threading.Lock()

    def reset(self) -> None:
        with self._log_lock:
            self.requests.clear()
            self.batches.clear()

    def _key(self, path: str) -> str:
        path = self._strip_protocol(path)  # type: ignore[attr-defined]
        root = self._strip_protocol(self.count_root)  # type: ignore[attr-defined]
        return path[len(root) :].lstrip("/") if path.startswith(root) else path

    def _enter(self, name: str) -> bool:
        depth = getattr(self._depth, "n", 0)
        self._depth.n = depth + 1
        if depth == 0:
            with self._log_lock:
                self.batches.append(name)
        return depth == 0

    def _leave(self) -> None:
        self._depth.n -= 1

    def _record(self, request: Request) -> None:
        with self._log_lock:
            self.requests.append(request)

    def _wrap(self, name: str, call: Callable[[], Any]) -> Any:
        self._enter(name)
        try:
            return call()
        finally:
            self._leave()

    # -- the recorded methods --------------------------------------------------

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        def call() -> bytes:
            data = super(_CountingMixin, self).cat_file(path, start, end, **kwargs)  # type: ignore[misc]
            self._record(Request("read", self._key(path), start, end, len(data)))
            return data

        return self._wrap("cat_file", call)

    def cat_ranges(self, paths: Any, starts: Any, ends: Any, *args: Any, **kwargs: Any) -> Any:
        parent = super()
        return self._wrap("cat_ranges", lambda: parent.cat_ranges(paths, starts, ends, *args, **kwargs))  # type: ignore[misc]

    def cat(self, path: Any, *args: Any, **kwargs: Any) -> Any:
        return self._wrap("cat", lambda: super(_CountingMixin, self).cat(path, *args, **kwargs))  # type: ignore[misc]

    def pipe_file(self, path: str, value: bytes, *args: Any, **kwargs: Any) -> Any:
        def call() -> Any:
            out = super(_CountingMixin, self).pipe_file(path, value, *args, **kwargs)  # type: ignore[misc]
            self._record(Request("write", self._key(path), None, None, len(value)))
            return out

        return self._wrap("pipe_file", call)

    def pipe(self, path: Any, *args: Any, **kwargs: Any) -> Any:
        return self._wrap("pipe", lambda: super(_CountingMixin, self).pipe(path, *args, **kwargs))  # type: ignore[misc]

    # -- summaries -------------------------------------------------------------

    def reads(self, data_only: bool = True) -> list[Request]:
        """Read requests (of shard/chunk objects only, unless ``data_only`` is false)."""
        return [r for r in self.requests if r.op == "read" and not (data_only and is_meta(r.key))]

    def writes(self, data_only: bool = True) -> list[Request]:
        """Write requests (of shard/chunk objects only, unless ``data_only`` is false)."""
        return [r for r in self.requests if r.op == "write" and not (data_only and is_meta(r.key))]


class CountingMemoryFS(_CountingMixin, MemoryFileSystem):
    """fsspec's in-memory filesystem, counting requests (no ``write_at``: strategies fall back)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._counting_init()


class CountingLocalFS(_CountingMixin, LocalFileSystem):
    """fsspec's local filesystem, counting read requests made through fsspec."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._counting_init()


def memory_mapper() -> tuple[fsspec.FSMap, CountingMemoryFS]:
    """A fresh counting in-memory filesystem and an ``FSMap`` on a unique root.

    The memory filesystem's store is global: callers remove the root when done
    (``fs.rm(fs.count_root, recursive=True)``).
    """
    fs = CountingMemoryFS(skip_instance_cache=True)
    fs.count_root = f"/shardkv-perf-{uuid.uuid4().hex}"
    fs.mkdir(fs.count_root)
    return fsspec.FSMap(fs.count_root, fs), fs


def local_mapper(root: str) -> tuple[fsspec.FSMap, CountingLocalFS]:
    """A counting local filesystem and an ``FSMap`` on the directory ``root``."""
    fs = CountingLocalFS(skip_instance_cache=True)
    fs.count_root = root
    fs.makedirs(root, exist_ok=True)
    return fsspec.FSMap(root, fs), fs


def record_local_writes(monkeypatch: pytest.MonkeyPatch, root: str | None = None) -> list[Request]:
    """Record the local writes made outside fsspec (``storage.local.atomic_write``).

    Every atomic whole-object write becomes ``Request("write", key, None,
    None, n)``; keys are paths relative to ``root`` (absolute paths when it
    is ``None``).
    """
    log: list[Request] = []

    # the engine's shard writes: storage.local.atomic_write (LocalStore, and FsspecStore on local files through one)
    from shardkv.storage import local as local_store

    real_atomic = local_store.atomic_write

    def recording_atomic_write(path: str, parts: Any, fsync: bool, create_only: bool = False) -> Any:
        generation = real_atomic(path, parts, fsync, create_only)
        key = path if root is None else os.path.relpath(path, root)
        log.append(Request("write", key, None, None, sum(memoryview(p).nbytes for p in parts)))
        return generation

    monkeypatch.setattr(local_store, "atomic_write", recording_atomic_write)
    return log


class CountingDict(dict):
    """A dict base store that counts reads per key (``reads``: hits and misses alike)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.reads: Counter[str] = Counter()

    def __getitem__(self, key: str) -> Any:
        self.reads[key] += 1
        return super().__getitem__(key)
