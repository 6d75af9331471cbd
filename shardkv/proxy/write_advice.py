"""A warning, once per array, when write-through writes keep rewriting partly covered shards.

Without ``buffer_bytes`` a write call that covers part of a shard reads,
merges and rewrites it whole, so a dask or xarray write of one chunk per task
rewrites every shard once per chunk. :class:`WriteAdvisor` counts those
calls per array and warns at ``threshold``, naming the two one-line fixes
(user guide, "Chunk-by-chunk writes: ``buffer_bytes`` or ``rechunk_to_shards``").
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from collections.abc import Mapping
from types import FrameType
from typing import Any

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
            warnings.warn(
                PartialShardWriteWarning(_message(change.array, count), path, count), stacklevel=_caller_level()
            )

    def rewrites(self, path: str) -> int:
        """Partial-shard rewrites counted so far for the array at ``path`` (counting stops after the warning)."""
        return self._counts.get(path, 0)


def _caller_level(limit: int = 64) -> int:
    """The ``stacklevel`` of the first frame outside shardkv and zarr: the warning names the user's line.

    Counted from the caller of :func:`warnings.warn` (level 1 is the frame that warns); a frame
    limit keeps the walk bounded.
    """
    dirs = tuple(
        os.path.dirname(os.path.abspath(path)) + os.sep
        for m in (sys.modules.get("shardkv"), sys.modules.get("zarr"))
        if m is not None and (path := getattr(m, "__file__", None))
    )
    frame: FrameType | None = sys._getframe(2)  # the frame that called warn's caller
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
