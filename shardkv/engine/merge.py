"""Merging chunk updates into a shard: the one rule every path follows. Pure.

An update of one inner chunk is its new encoded bytes, ``None`` (delete), or
a :class:`ChunkPatch` (byte writes inside the chunk's old bytes: the 2022
draft's ``set_partial_values`` on a chunk key). A shard is merged as:

1. the stored chunks that lie inside the array's chunk grid (when the grid
   is known; chunks a shrinking resize, or a writer with a larger shape,
   left outside it are dropped);
2. then the updates, in order: set, delete, or patch the old bytes.

A shard whose every available chunk is set whole needs no old bytes
(:func:`covers_shard`). Changes of one shard made one after another are one
change (:func:`join_changes`): each chunk's updates in order, a later value
or delete replacing, a later patch applied to what came before.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from shardkv._types import BytesLike, LocalCoords
from shardkv.keys.space import ChunkRef, ShardedArray


def apply_partial_writes(key: str, old: BytesLike | None, writes: Sequence[tuple[int, BytesLike]]) -> bytes:
    """Apply ``(start, value)`` writes, in order, to the old value of ``key``.

    Parameters
    ----------
    key : str
        Named in errors.
    old : bytes-like or None
        The stored value, or ``None`` when ``key`` is not stored (then the
        first write must start at byte 0).
    writes : sequence of (int, bytes-like)
        ``start`` in bytes from the beginning, or negative from the current end
        (the value then ends the result).

    Returns
    -------
    bytes
        The new value.

    Raises
    ------
    ValueError
        If a write starts beyond the end of the current value (a gap), or a
        negative start reaches before its beginning.
    """
    buf = bytearray(old) if old is not None else bytearray()
    for start, value in writes:
        value = memoryview(value).cast("B")
        if start < 0:
            if -start > len(buf):
                raise ValueError(f"cannot write at start {start} of {key!r}: the value is only {len(buf)} bytes long")
            buf[len(buf) + start :] = value
            continue
        if start > len(buf):
            raise ValueError(
                f"cannot write at start {start} of {key!r}: beyond its end at {len(buf)} bytes "
                "(writes may not leave a gap)"
            )
        buf[start : start + len(value)] = value
    return bytes(buf)


@dataclass
class ChunkPatch:
    """Byte writes inside one chunk's old bytes (see :func:`apply_partial_writes`).

    Attributes
    ----------
    chunk_key : str
        Named in errors.
    writes : list of (int, bytes-like)
        ``(start, bytes)`` in order; ``start`` in bytes, negative from the end.
    """

    chunk_key: str
    writes: list[tuple[int, BytesLike]] = field(default_factory=list)

    def apply(self, old: BytesLike | None) -> bytes:
        return apply_partial_writes(self.chunk_key, old, self.writes)


ChunkUpdate = BytesLike | ChunkPatch | None
"""One inner chunk's change: its new encoded bytes, a :class:`ChunkPatch`, or ``None`` (delete)."""

UpdateT = TypeVar("UpdateT", bound=ChunkUpdate)


@dataclass
class ShardChange(Generic[UpdateT]):
    """The changes of one shard's inner chunks: the unit every write path hands the engine.

    Generic in the kind of change it holds: ``ShardChange[bytes | None]`` (whole chunks and deletions,
    what the write-back buffer holds) or any :data:`ChunkUpdate` (a bare ``ShardChange``).

    Attributes
    ----------
    array : ShardedArray
        The array the shard belongs to (layout, grid, key encodings).
    shard_coords : tuple of int
        The shard's coords in the shard grid.
    chunks : dict of tuple of int to bytes-like, ChunkPatch or None
        Inner chunk (local coords inside the shard) -> its new encoded bytes,
        byte writes inside its old bytes (:class:`ChunkPatch`), or ``None`` to
        delete it. Chunks not named keep their stored bytes.
    nbytes : int
        Bytes of chunk data held in ``chunks`` (kept by the write-back buffer).
    """

    array: ShardedArray
    shard_coords: tuple[int, ...]
    chunks: dict[LocalCoords, UpdateT] = field(default_factory=dict)
    nbytes: int = 0

    def covers_shard(self) -> bool:
        """True when every available chunk of the shard is set whole (the write needs no old bytes)."""
        n = self.array.n_chunks_in_shard(self.shard_coords)
        return n > 0 and len(self.chunks) == n and _all_whole(self.chunks.values())

    def copy(self) -> ShardChange[UpdateT]:
        """A copy whose ``chunks`` dict is its own (the values are shared)."""
        return ShardChange(self.array, self.shard_coords, dict(self.chunks), self.nbytes)

    def chunk_key(self, local_coords: LocalCoords) -> str:
        """The chunk key of one inner chunk of this shard."""
        return self.array.chunk_key(self.array.chunk_coords(self.shard_coords, local_coords))


_WHOLE_TYPES = frozenset({bytes, bytearray, memoryview})


def _all_whole(values: Collection[Any]) -> bool:
    """True when no value is ``None`` or a :class:`ChunkPatch` (every value sets its chunk whole).

    The types are collected in one pass at C speed; a value of another
    bytes-like type (a numpy array) is checked one by one.
    """
    if set(map(type, values)) <= _WHOLE_TYPES:
        return True
    return all(v is not None and not isinstance(v, ChunkPatch) for v in values)


def out_of_grid(arr: ShardedArray, shard_coords: Sequence[int], present: Iterable[LocalCoords]) -> list[LocalCoords]:
    """The local coords among ``present`` whose chunks lie outside the chunk grid (none if it is unknown).

    ``present`` is not iterated for a shard wholly inside the grid (every
    shard but the last ones along a dimension a resize shrank), so a caller
    may pass a lazy iterator of a stored index's chunks.
    """
    if arr.shard_in_grid(shard_coords):
        return []
    return [local for local in present if not arr.in_grid(arr.chunk_coords(shard_coords, local))]


def merge_chunks(
    arr: ShardedArray,
    shard_coords: Sequence[int],
    old: Mapping[LocalCoords, BytesLike],
    updates: Mapping[LocalCoords, Any],
) -> dict[LocalCoords, BytesLike]:
    """The chunks of a shard after ``updates`` (see the module docstring for the rule).

    Parameters
    ----------
    arr : ShardedArray
        The array (its grid decides which old chunks are kept).
    shard_coords : sequence of int
        The shard's coords.
    old : mapping of local coords to bytes-like
        The stored chunks (empty for a shard not stored).
    updates : mapping of local coords to bytes-like, None or ChunkPatch
        The changes.

    Raises
    ------
    ValueError
        If a patch would leave a gap in its chunk.
    """
    if not old and _all_whole(updates.values()):
        return dict(updates)  # a new shard, or one written whole: nothing to merge
    dropped = set(out_of_grid(arr, shard_coords, list(old)))
    chunks: dict[LocalCoords, BytesLike] = {local: v for local, v in old.items() if local not in dropped}
    for local, value in updates.items():
        if value is None:
            chunks.pop(local, None)
        elif isinstance(value, ChunkPatch):
            chunks[local] = value.apply(chunks.get(local))
        else:
            chunks[local] = value
    return chunks


def _then(earlier: ChunkUpdate, later: ChunkUpdate) -> ChunkUpdate:
    """One chunk's update ``earlier`` followed by ``later``, as one update."""
    if not isinstance(later, ChunkPatch):
        return later  # a value or a delete replaces what came before
    if isinstance(earlier, ChunkPatch):
        return ChunkPatch(later.chunk_key, [*earlier.writes, *later.writes])
    return later.apply(earlier)  # patching a value set, or a chunk deleted (``None``: no old bytes)


def join_changes(changes: Sequence[ShardChange]) -> ShardChange:
    """The changes of one shard, made in the order given, as one change (what merging them in turn would give).

    Parameters
    ----------
    changes : sequence of ShardChange
        At least one, all of the same shard.

    Returns
    -------
    ShardChange
        ``changes[0]`` itself when there is one; else a new change whose
        chunks hold, for each chunk, its updates joined in order.

    Raises
    ------
    ValueError
        If a patch of a chunk that an earlier change set or deleted would leave a gap in it.
    """
    first = changes[0]
    if len(changes) == 1:
        return first
    chunks = dict(first.chunks)
    for change in changes[1:]:
        for local, value in change.chunks.items():
            chunks[local] = _then(chunks[local], value) if local in chunks else value
    return ShardChange(first.array, first.shard_coords, chunks, sum(c.nbytes for c in changes))


def group_by_shard(refs: Sequence[ChunkRef], values: Iterable[ChunkUpdate]) -> dict[str, ShardChange]:
    """The :class:`ShardChange` of each shard that located chunk changes touch, in order (``None`` deletes)."""
    by_shard: dict[str, ShardChange] = {}
    shard_key = None
    chunks: dict[LocalCoords, ChunkUpdate] = {}
    for ref, value in zip(refs, values, strict=False):  # values may be longer (itertools.repeat(None))
        if ref.shard_key != shard_key:  # keys come in runs of one shard (zarr: a row of its chunks)
            shard_key = ref.shard_key
            change = by_shard.get(shard_key)
            if change is None:
                change = by_shard[shard_key] = ShardChange(ref.array, ref.shard_coords)
            chunks = change.chunks
        chunks[ref.local_coords] = value
    return by_shard
