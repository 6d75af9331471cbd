"""Merging chunk updates into a shard: the one rule every path follows (pure).

An update of one inner chunk is its new encoded bytes, ``None`` (delete) or a :class:`ChunkPatch` (byte writes
inside its old bytes). A shard's stored chunks inside the chunk grid are kept, then the updates applied in
order; changes of one shard made one after another join into one (:func:`join_changes`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from shardkv._types import BytesLike, LocalCoords
from shardkv.keys.space import ChunkRef, ShardedArray


def apply_partial_writes(key: str, old: BytesLike | None, writes: Sequence[tuple[int, BytesLike]]) -> bytes:
    """The old value of ``key`` (``None``: not stored) after ``(start, value)`` writes, in order.

    ``start`` is in bytes from the beginning, or negative from the current end (the value then ends the result).

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
    """Byte writes ``(start, bytes)`` inside one chunk's old bytes, in order (:func:`apply_partial_writes`)."""

    chunk_key: str
    writes: list[tuple[int, BytesLike]] = field(default_factory=list)

    def apply(self, old: BytesLike | None) -> bytes:
        return apply_partial_writes(self.chunk_key, old, self.writes)


ChunkUpdate = BytesLike | ChunkPatch | None  # one inner chunk's change: new encoded bytes, a patch, None (delete)

UpdateT = TypeVar("UpdateT", bound=ChunkUpdate)


@dataclass
class ShardChange(Generic[UpdateT]):
    """The changes of one shard's inner chunks: the unit every write path hands the engine.

    ``chunks`` maps local coords to a :data:`ChunkUpdate` (chunks not named keep their stored bytes);
    ``nbytes`` counts the bytes it holds (kept by the write-back buffer, whose changes are
    ``ShardChange[bytes | None]``).
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
    """True when no value is ``None`` or a :class:`ChunkPatch` (types collected at C speed first)."""
    if set(map(type, values)) <= _WHOLE_TYPES:
        return True
    return all(v is not None and not isinstance(v, ChunkPatch) for v in values)


def out_of_grid(arr: ShardedArray, shard_coords: Sequence[int], present: Iterable[LocalCoords]) -> list[LocalCoords]:
    """The local coords among ``present`` outside the chunk grid (``present`` not iterated for a shard inside it)."""
    if arr.shard_in_grid(shard_coords):
        return []
    return [local for local in present if not arr.in_grid(arr.chunk_coords(shard_coords, local))]


def merge_chunks(
    arr: ShardedArray,
    shard_coords: Sequence[int],
    old: Mapping[LocalCoords, BytesLike],
    updates: Mapping[LocalCoords, Any],
) -> dict[LocalCoords, BytesLike]:
    """The chunks of a shard after ``updates`` to its stored chunks ``old`` (``ValueError``: a patch leaves a gap)."""
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
    """The changes of one shard (at least one), in order, as one change (``ValueError``: a patch leaves a gap)."""
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
