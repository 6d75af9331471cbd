"""Buffers and local file I/O of the stores (no fsspec, no network).

* A *value* to store is one bytes-like object or a ``list``/``tuple`` of its
  parts in order (:data:`Value`); :func:`byte_parts` gives the parts as flat
  byte views without copying, :func:`join_parts` joins them once for stores
  that need one object.
* :func:`write_parts` writes parts to a file descriptor with ``os.writev``
  (resuming after short writes); :func:`pread_exact` reads a byte range of a
  descriptor with one ``pread``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

from shardkv._types import BytesLike
from shardkv.format.ranges import ByteRange

Value = BytesLike | Sequence[BytesLike]
"""A value to store: one bytes-like object, or a ``list``/``tuple`` of its parts in order."""

IOV_MAX = 1024  # buffers per writev call (Linux's IOV_MAX; os.sysconf may not know it)
_POOL: ThreadPoolExecutor | None = None


def read_pool() -> ThreadPoolExecutor:
    """One thread pool for concurrent local reads, made on first use (threads are not free)."""
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=8, thread_name_prefix="shardkv-read")
    return _POOL


def _forget_pool_in_child() -> None:
    """A forked child has none of the parent's threads: it makes its own pool on first use."""
    global _POOL
    _POOL = None


os.register_at_fork(after_in_child=_forget_pool_in_child)


def byte_parts(value: Value) -> list[memoryview]:
    """The parts of ``value`` as flat byte views (no copy); one part for a plain bytes-like value."""
    parts = value if isinstance(value, (list, tuple)) else (value,)
    out = []
    for part in parts:
        view = memoryview(part)
        if view.ndim != 1 or view.format != "B":
            view = view.cast("B")  # a contiguous array of another item type
        if view.nbytes:
            out.append(view)
    return out


def join_parts(value: Value) -> bytes:
    """``value`` as one ``bytes`` object: joined when it is parts, unchanged when it already is ``bytes``."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, (list, tuple)):
        if len(value) == 1 and isinstance(value[0], bytes):
            return value[0]
        return b"".join(value)
    return memoryview(cast(BytesLike, value)).tobytes()  # a bytearray or memoryview (parts were joined above)


def slice_value(value: Any, byte_range: ByteRange) -> bytes | memoryview:
    """``value[byte_range]``: a view when ``value`` is immutable ``bytes`` (no copy), else a copy."""
    view = memoryview(value)
    if view.ndim != 1 or view.format != "B":
        view = view.cast("B")
    if byte_range.is_suffix:
        part = view[max(0, len(view) + byte_range.start) :]
    else:
        part = view[byte_range.start : byte_range.stop]
    return part if isinstance(value, bytes) else bytes(part)


def write_parts(fd: int, parts: list[memoryview]) -> None:
    """Write every part to ``fd`` with as few ``writev`` calls as the kernel allows."""
    while parts:
        batch = parts[:IOV_MAX]
        written = os.writev(fd, batch)
        # drop the parts written in full, keep the rest of a part written in part
        i = 0
        while i < len(batch) and written >= batch[i].nbytes:
            written -= batch[i].nbytes
            i += 1
        rest = parts[i:]
        if written:
            rest[0] = rest[0][written:]
        parts = rest


def pread_exact(fd: int, start: int, stop: int) -> bytes:
    """Bytes ``[start, stop)`` of ``fd`` (absolute offsets): one ``pread``, more only after a short read."""
    want = stop - start
    if want <= 0:
        return b""
    data = os.pread(fd, want, start)
    if len(data) == want or not data:
        return data
    pieces, got = [data], len(data)
    while got < want:  # a short read (a file growing, a slow device, a signal): read the rest
        more = os.pread(fd, want - got, start + got)
        if not more:
            break
        pieces.append(more)
        got += len(more)
    return b"".join(pieces)
