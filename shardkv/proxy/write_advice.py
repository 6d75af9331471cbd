"""A warning, once per array, when write-through chunk-by-chunk writes keep rewriting partly covered shards.

Without ``buffer_bytes`` every write call that covers only part of a shard
reads the shard, merges the new chunks and writes it back whole. That is
correct, and cheap for one call, but a dask or xarray write whose tasks each
store one chunk rewrites every shard once per chunk (measured on issue 12: an
xarray dataset written in 9.5 s against 1.7 s for plain zarr 2). Either fix
is one line for the user: ``buffer_bytes=`` (write-back, each shard written
once on flush/close) or :func:`shardkv.rechunk_to_shards` (each dask task
writes whole shards). :class:`WriteAdvisor` counts, per array, the calls
that rewrote a partly covered shard and warns once the count reaches
``threshold``; calls that cover whole shards, and write-back stores, are
never counted.

The cost per write call is one length comparison per shard touched, done
only in write-through mode, next to a shard read and a shard write.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from typing import Any, Mapping

from shardkv.engine.merge import ShardChange

__all__ = ["PartialShardWriteWarning", "WriteAdvisor", "DEFAULT_THRESHOLD"]

DEFAULT_THRESHOLD = 16
"""Partial-shard rewrites of one array before the warning (one 4 x 4 shard written chunk by chunk)."""


class PartialShardWriteWarning(UserWarning):
    """Many write calls each rewrote a partly covered shard of one array (write-through mode).

    Attributes
    ----------
    path : str
        The array's path in the store ('' for a root array).
    rewrites : int
        Partial-shard rewrites counted when the warning was given.
    """

    def __init__(self, message: str, path: str, rewrites: int) -> None:
        super().__init__(message)
        self.path = path
        self.rewrites = rewrites


class WriteAdvisor:
    """Counts partial-shard rewrites per array and warns once per array.

    Parameters
    ----------
    threshold : int
        Rewrites of partly covered shards of one array after which the
        warning is given; 0 turns the advice off.
    """

    def __init__(self, threshold: int = DEFAULT_THRESHOLD) -> None:
        self.threshold = threshold
        self._counts: dict[str, int] = {}
        self._warned: set[str] = set()
        self._lock = threading.Lock()

    def observe(self, changes: Mapping[str, ShardChange]) -> None:
        """Count the shards of one write-through call that it covers only partly; warn at the threshold."""
        if not self.threshold:
            return
        for change in changes.values():
            path = change.array.path
            if path in self._warned or change.covers_shard():
                continue
            with self._lock:
                count = self._counts.get(path, 0) + 1
                self._counts[path] = count
                if count < self.threshold or path in self._warned:
                    continue
                self._warned.add(path)
            warnings.warn(PartialShardWriteWarning(_message(change.array, count), path, count), stacklevel=_caller_level())

    def rewrites(self, path: str) -> int:
        """Partial-shard rewrites counted so far for the array at ``path`` (counting stops after the warning)."""
        return self._counts.get(path, 0)


def _caller_level(limit: int = 64) -> int:
    """The ``stacklevel`` of the first frame outside shardkv and zarr: the warning names the user's line.

    Counted from the caller of :func:`warnings.warn` (level 1 is the frame that warns); a frame
    limit keeps the walk bounded.
    """
    dirs = tuple(
        os.path.dirname(os.path.abspath(m.__file__)) + os.sep
        for m in (sys.modules.get("shardkv"), sys.modules.get("zarr"))
        if m is not None and getattr(m, "__file__", None)
    )
    frame = sys._getframe(2)  # the frame that called warn's caller
    level = 2
    while frame is not None and level < limit:
        if not os.path.abspath(frame.f_code.co_filename).startswith(dirs):
            return level
        frame = frame.f_back
        level += 1
    return 1


def _message(arr: Any, count: int) -> str:
    name = arr.path or "the root array"
    return (
        f"shardkv: {count} write calls on {name!r} each rewrote a partly covered shard "
        f"({'x'.join(map(str, arr.chunks_per_shard))} chunks per shard), so every shard is read and "
        "rewritten once per chunk. For chunk-by-chunk writes (dask, xarray to_zarr) either open the "
        "store with ShardedStore(..., buffer_bytes=N) and close() or flush() it when done (each shard "
        "written once; single process or threads), or rechunk the dask array with "
        "shardkv.rechunk_to_shards(array, target) so that each task writes whole shards."
    )
