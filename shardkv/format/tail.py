"""Updates written after a stored shard's bytes (O(chunk) updates), and the intent record of an in-place append. Pure.

Changed chunks go after the shard's chunk data, a new index points at them,
unchanged chunks keep their offsets, and no byte before the first write
changes (docs/architecture.md, "The write path")::

    "clone" (a reflink copy of the shard renamed over it, or S3's server-side copy of the kept bytes):
      index at the end:   | old chunk data | new chunks | new index |
                                           ^ the old index is overwritten (the copy is private)
      index at the start: | new index | old chunk data | new chunks |
                            ^ overwritten in the copy
    "append" (in place, on the live file; index at the end only):
                          | old chunk data | old index | new chunks | new index |
                                                       ^ the old size
      two writes: the new chunks, then the new index (made durable in that order)

Replaced chunks and old indexes are dead bytes (:func:`dead_fraction`). An
append is recorded first as an :class:`AppendIntent`; :func:`recovered_nbytes`
decides what recovery does with it.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from shardkv._types import BytesLike, LocalCoords
from shardkv.format.layout import ShardIndex, ShardLayout, crc32c_of

TailHow = Literal["clone", "append"]
INTENT_MAGIC = b"SKVAPND2"
OLD_TAIL_NBYTES = 4096  # bytes before the old size whose CRC32C an intent records (fewer in a smaller file)

# magic, inode, old size, new size, crc32c of the old tail, crc32c of the appended bytes, path length
_HEAD = struct.Struct("<8sQQQIII")
_CRC = struct.Struct("<I")
_MAX_PATH_NBYTES = 16384

INTENT_MAX_NBYTES = _HEAD.size + _MAX_PATH_NBYTES + _CRC.size
"""Largest encoded :class:`AppendIntent` (bytes): what a reader of an intent reads."""


def parts_crc32c(parts: Iterable[BytesLike]) -> int:
    """CRC32C (Castagnoli, unsigned 32-bit) of the concatenation of ``parts``, without joining them."""
    value = 0
    for part in parts:
        value = crc32c_of(part, value)
    return value


@dataclass(frozen=True)
class TailPlan:
    """The writes of one O(chunk) update of a stored shard, and the shard they make.

    Attributes
    ----------
    writes : list of (int, list of bytes-like)
        ``(offset, parts)``, in order: the parts' concatenation goes at byte
        ``offset``. For ``"append"``, the new chunks and the new index are two writes.
    index : ShardIndex
        The new index.
    nbytes : int
        The shard's size after the update (bytes).
    used_nbytes : int
        Bytes of the new shard its index and chunks use; the rest are dead.
    """

    writes: list[tuple[int, list[BytesLike]]]
    index: ShardIndex
    nbytes: int
    used_nbytes: int

    @property
    def kept_nbytes(self) -> int:
        """Leading bytes of the stored shard the update keeps as they are (before its first write)."""
        return min(offset for offset, _ in self.writes)

    @property
    def new_nbytes(self) -> int:
        """Bytes written (new chunks and the new index)."""
        return sum(memoryview(p).nbytes for _, parts in self.writes for p in parts)


def plan_tail_update(
    layout: ShardLayout,
    index: ShardIndex,
    shard_nbytes: int,
    updates: Mapping[LocalCoords, BytesLike | None],
    how: TailHow,
) -> TailPlan:
    """The writes that apply whole-chunk ``updates`` to a stored shard without moving its other chunks.

    Parameters
    ----------
    layout : ShardLayout
        The shard's layout.
    index : ShardIndex
        The stored shard's index (not modified).
    shard_nbytes : int
        The stored shard's size (bytes).
    updates : mapping of local coords to bytes-like or None
        Each changed inner chunk's new encoded bytes, or ``None`` to delete it.
    how : {"clone", "append"}
        ``"clone"``: into a private copy (an end index is overwritten);
        ``"append"``: to the live file after every old byte (end index only).

    Returns
    -------
    TailPlan

    Raises
    ------
    ValueError
        For ``how="append"`` with the index at the start, or a shard shorter than its index.
    """
    n_index = layout.index_nbytes
    if shard_nbytes < n_index:
        raise ValueError(f"a shard of {shard_nbytes} bytes is shorter than its {n_index}-byte index")
    if how == "append" and layout.index_location == "start":
        raise ValueError("an in-place append needs the index at the end (a start index would be overwritten)")
    start = shard_nbytes - n_index if how == "clone" and layout.index_location == "end" else shard_nbytes
    new_index = index.copy()
    chunks: list[BytesLike] = []
    at = start
    for local in sorted(updates):
        value = updates[local]
        if value is None:
            new_index.clear(local)
            continue
        nbytes = memoryview(value).nbytes
        new_index.set(local, at, nbytes)
        chunks.append(value)
        at += nbytes
    encoded = layout.encode_index(new_index)
    used = new_index.used_nbytes() + n_index
    if layout.index_location == "end":
        if how == "append" and chunks:
            return TailPlan([(start, chunks), (at, [encoded])], new_index, at + n_index, used)
        return TailPlan([(start, [*chunks, encoded])], new_index, at + n_index, used)
    writes: list[tuple[int, list[BytesLike]]] = [(0, [encoded])]
    if chunks:
        writes.append((start, chunks))
    return TailPlan(writes, new_index, at, used)


def dead_fraction(plan: TailPlan) -> float:
    """The fraction of the updated shard's bytes that nothing uses (replaced chunks, old indexes)."""
    return (plan.nbytes - plan.used_nbytes) / plan.nbytes if plan.nbytes else 0.0


@dataclass(frozen=True)
class AppendIntent:
    """The write-ahead record of one in-place append to a shard file.

    Attributes
    ----------
    path : str
        The shard file's real path.
    inode : int
        Its inode.
    old_nbytes, new_nbytes : int
        Its size before and after the append (bytes).
    old_tail_crc32c : int
        CRC32C of :func:`old_tail_range` before the append: with the inode, what
        tells the file appended to from a later one given the same inode number.
    crc32c : int
        CRC32C of the appended bytes ``[old_nbytes, new_nbytes)``.

    Notes
    -----
    Encoded, little endian (the last field covers all before it: a torn record reads as none)::

        | magic "SKVAPND2" | inode u64 | old u64 | new u64 | old tail crc32c u32 | crc32c u32 |
        | path length u32 | path UTF-8 | crc32c u32 |
    """

    path: str
    inode: int
    old_nbytes: int
    new_nbytes: int
    old_tail_crc32c: int
    crc32c: int

    def encode(self) -> bytes:
        """The record's bytes (see Notes); ValueError for a path over 16384 bytes in UTF-8."""
        path = self.path.encode("utf-8", "surrogateescape")
        if len(path) > _MAX_PATH_NBYTES:
            raise ValueError(f"shard path of {len(path)} bytes is too long for an append intent: {self.path!r}")
        head = (self.inode, self.old_nbytes, self.new_nbytes, self.old_tail_crc32c, self.crc32c, len(path))
        body = _HEAD.pack(INTENT_MAGIC, *head) + path
        return body + _CRC.pack(crc32c_of(body))

    @classmethod
    def decode(cls, data: BytesLike) -> AppendIntent | None:
        """The record stored in ``data`` (the start of a lock file), or ``None`` when there is none or it is torn."""
        view = memoryview(data).cast("B")
        if len(view) < _HEAD.size + _CRC.size or bytes(view[:8]) != INTENT_MAGIC:
            return None
        magic, inode, old, new, old_tail_crc, crc, n_path = _HEAD.unpack_from(view)
        end = _HEAD.size + n_path
        if n_path > _MAX_PATH_NBYTES or len(view) < end + _CRC.size:
            return None
        if _CRC.unpack_from(view, end)[0] != crc32c_of(view[:end]) or new < old:
            return None
        path = bytes(view[_HEAD.size : end]).decode("utf-8", "surrogateescape")
        return cls(path, inode, old, new, old_tail_crc, crc)


def old_tail_range(old_nbytes: int) -> tuple[int, int]:
    """``(start, stop)``: the bytes before ``old_nbytes`` whose CRC32C an :class:`AppendIntent` records."""
    return max(0, old_nbytes - OLD_TAIL_NBYTES), old_nbytes


def recovered_nbytes(intent: AppendIntent, nbytes: int, old_tail_holds: bool, appended_holds: bool) -> int | None:
    """The size to cut a file that ``intent`` names back to, or ``None`` to leave the file as it is.

    Parameters
    ----------
    intent : AppendIntent
        The record of the append (its inode already found to be the file's).
    nbytes : int
        The file's size now (bytes).
    old_tail_holds, appended_holds : bool
        Whether :func:`old_tail_range` matches ``intent.old_tail_crc32c``, and
        the bytes ``[old_nbytes, new_nbytes)`` are all there and match ``intent.crc32c``.

    Returns
    -------
    int or None
        ``intent.old_nbytes`` for a torn append (a size between old and new,
        or the new size with bytes that do not check); ``None`` for a complete
        append and for a file that is no longer the one appended to (shorter
        than the old size, other bytes before it, or longer than the new size:
        a later writer's bytes).
    """
    old, new = intent.old_nbytes, intent.new_nbytes
    if nbytes <= old or nbytes > new or not old_tail_holds or (nbytes == new and appended_holds):
        return None
    return old
