"""Bytes handed to the local store's low-level I/O, counted by wrapping it on its module.

``shardkv.storage.local`` writes every byte through ``_pwrite_all`` and
``write_parts``, reads shard bytes through ``pread_exact``, and writes whole
files through ``atomic_write``; :meth:`LocalIO.wrappers` gives counting
versions of the four, for a test to install (``monkeypatch.setattr``) or a
dask worker plugin (plain ``setattr``, for the worker's life).
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from types import ModuleType
from typing import Any

__all__ = ["LocalIO"]


class LocalIO:
    """Counts: ``written`` and ``read`` (bytes), ``whole`` (whole-file writes by path)."""

    def __init__(self) -> None:
        self.written = 0
        self.read = 0
        self.whole: collections.Counter[str] = collections.Counter()

    def reset(self) -> None:
        self.written = self.read = 0
        self.whole.clear()

    def wrappers(self, local_mod: ModuleType) -> dict[str, Callable[..., Any]]:
        """Name in ``local_mod`` -> a version of that function that counts into this object."""
        real_pwrite, real_parts = local_mod._pwrite_all, local_mod.write_parts
        real_pread, real_atomic = local_mod.pread_exact, local_mod.atomic_write

        def pwrite_all(fd: int, data: Any, offset: int) -> None:
            self.written += memoryview(data).nbytes
            real_pwrite(fd, data, offset)

        def write_parts(fd: int, parts: Any) -> None:
            self.written += sum(memoryview(p).nbytes for p in parts)
            real_parts(fd, parts)

        def pread_exact(fd: int, start: int, stop: int) -> Any:
            out = real_pread(fd, start, stop)
            self.read += len(out)
            return out

        def atomic_write(path: str, *args: Any, **kwargs: Any) -> Any:
            self.whole[path] += 1
            return real_atomic(path, *args, **kwargs)

        return {
            "_pwrite_all": pwrite_all,
            "write_parts": write_parts,
            "pread_exact": pread_exact,
            "atomic_write": atomic_write,
        }
