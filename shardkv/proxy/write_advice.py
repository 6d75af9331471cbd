"""A warning, once per store, when write-through writes keep rewriting partly covered shards.

Without ``buffer_bytes`` a write call that covers part of a shard reads,
merges and rewrites it whole, so a dask or xarray write of one chunk per task
rewrites every shard once per chunk. That does not hold where the update of a
stored shard writes only its changed chunks and an index (``shard_updates``: a
clone on file systems with reflinks, an opt-in append elsewhere): the
advisor is told which shards are rewritten whole (``rewrites_whole``) and
counts only those. :class:`WriteAdvisor` counts those
calls per array and warns when one array reaches ``threshold``, naming the
one-line fixes (user guide, "Chunk-by-chunk writes: ``buffer_bytes`` or
``rechunk_to_shards``"): a buffer, or blocks of whole shards, for a dask array
with ``rechunk_to_shards`` and for an xarray Dataset with ``ds.chunk`` to the
array's shard shape. The advice is the same for every array of the store,
so it is given once per store: an xarray write of several variables warns once.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from shardkv.engine.merge import ShardChange

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
    """Counts partial-shard rewrites per array and warns once per store, at :data:`DEFAULT_THRESHOLD` of one array.

    Parameters
    ----------
    rewrites_whole : callable of (str, ShardedArray) to bool, optional
        Whether a write covering part of the shard (shard key, its array) rewrites it whole
        (default: always); shards updated in O(chunk) are not counted.
    """

    def __init__(self, rewrites_whole: Callable[[str, Any], bool] | None = None) -> None:
        self._rewrites_whole = rewrites_whole
        self._counts: dict[str, int] = {}
        self._warned = False
        self._lock = threading.Lock()

    def observe(self, changes: Mapping[str, ShardChange]) -> None:
        """Count the shards of one write-through call that it covers only partly; warn at the threshold."""
        if self._warned:
            return
        for shard_key, change in changes.items():
            if change.covers_shard() or (
                self._rewrites_whole is not None and not self._rewrites_whole(shard_key, change.array)
            ):
                continue
            path = change.array.path
            with self._lock:
                if self._warned:
                    return
                count = self._counts.get(path, 0) + 1
                self._counts[path] = count
                if count < DEFAULT_THRESHOLD:
                    continue
                self._warned = True
            _warn_outside_libraries(PartialShardWriteWarning(_message(change.array, count), path, count))
            return

    def rewrites(self, path: str) -> int:
        """Partial-shard rewrites counted so far for the array at ``path`` (counting stops after the warning)."""
        return self._counts.get(path, 0)


def _warn_outside_libraries(warning: PartialShardWriteWarning) -> None:
    """Warn at the first caller outside shardkv and zarr (Python >= 3.12), else at the store's write call.

    Python 3.11 has no ``skip_file_prefixes``: the warning then names the shardkv line that
    called the advisor, a plainer location, rather than walking the interpreter's frames.
    """
    if sys.version_info >= (3, 12):
        dirs = tuple(
            os.path.dirname(os.path.abspath(path)) + os.sep
            for m in (sys.modules.get("shardkv"), sys.modules.get("zarr"))
            if m is not None and (path := getattr(m, "__file__", None))
        )
        warnings.warn(warning, skip_file_prefixes=dirs)
    else:
        warnings.warn(warning, stacklevel=3)


def _message(arr: Any, count: int) -> str:
    name = repr(arr.path) if arr.path else "the root array"
    cps = "x".join(map(str, arr.chunks_per_shard))
    variable = repr(arr.path.rpartition("/")[2]) if arr.path else "name"
    shape = tuple(arr.shard_shape) if arr.shard_shape is not None else "shard_shape"
    return (
        f"shardkv: {count} writes to {name} each rewrote a partly covered {cps}-chunk shard. Write whole shards: "
        "ShardedStore(..., buffer_bytes=N) then close(); dask: shardkv.rechunk_to_shards(x, target); "
        f"xarray: ds.chunk(dict(zip(ds[{variable}].dims, {shape}))). Shown once per store."
    )
