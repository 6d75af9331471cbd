"""The shard index: where each inner chunk of a shard lives.

The index is a ``uint64`` array of shape ``(*chunks_per_shard, 2)`` in
row-major (C) order; entry ``[*local_coords, 0]`` is the chunk's byte
``offset`` inside the shard and ``[*local_coords, 1]`` its ``nbytes``. An
empty inner chunk has both fields set to ``2**64 - 1`` (draft 2022 "Binary
shard format"; v1.0 codec "Binary shard format"). This module is pure: no I/O,
no byte order (that is the layout's job, see :mod:`shardkv.format.layout`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from shardkv.errors import CorruptShardError

EMPTY = np.uint64(2**64 - 1)
"""The value of both ``offset`` and ``nbytes`` for an empty inner chunk."""

MAX_SHARD_NBYTES = 2**43
"""Largest ``offset + nbytes`` (bytes) an index entry may reach (8 TiB): above the largest
object of the common object stores (S3: 5 TiB), below the largest file ext4 allows
(16 TiB), so a bogus offset is a :class:`CorruptShardError`, never ``EINVAL`` from a seek."""

DEFAULT_MAX_CHUNK_NBYTES = 2**31
"""Default bound (bytes) on an entry's ``nbytes`` when the shard's size is unknown."""

_MAX = np.uint64(MAX_SHARD_NBYTES)
_EMPTY_INT = int(EMPTY)  # EMPTY as the Python int ``ndarray.item`` gives


class ShardIndex:
    """Offsets and sizes of the inner chunks of one shard.

    Parameters
    ----------
    entries : numpy.ndarray
        ``uint64`` array of shape ``(*chunks_per_shard, 2)``; ``[..., 0]`` is the
        offset (bytes from the start of the shard), ``[..., 1]`` the nbytes.

    Raises
    ------
    ValueError
        If ``entries`` is not of shape ``(..., 2)``.
    """

    __slots__ = ("entries",)

    def __init__(self, entries: np.ndarray) -> None:
        entries = np.asarray(entries, dtype=np.uint64)
        if entries.ndim < 1 or entries.shape[-1] != 2:
            raise ValueError(f"a shard index has shape (*chunks_per_shard, 2), got {entries.shape}")
        self.entries = entries

    @classmethod
    def empty(cls, chunks_per_shard: Sequence[int]) -> ShardIndex:
        """An index with every inner chunk empty."""
        return cls(np.full((*tuple(chunks_per_shard), 2), EMPTY, dtype=np.uint64))

    @property
    def chunks_per_shard(self) -> tuple[int, ...]:
        """Number of inner chunks along each dimension."""
        return tuple(self.entries.shape[:-1])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ShardIndex) and np.array_equal(self.entries, other.entries)

    def __repr__(self) -> str:
        return f"ShardIndex(chunks_per_shard={self.chunks_per_shard}, present={self.count_present()})"

    def copy(self) -> ShardIndex:
        """An independent copy."""
        return ShardIndex(self.entries.copy())

    def get(self, local_coords: Sequence[int]) -> tuple[int, int] | None:
        """``(offset, nbytes)`` of an inner chunk, or ``None`` when it is empty."""
        entries = self.entries  # ``item`` gives Python ints: no numpy scalars on the per-chunk path
        offset, nbytes = entries.item(*local_coords, 0), entries.item(*local_coords, 1)
        if offset == _EMPTY_INT and nbytes == _EMPTY_INT:
            return None
        return offset, nbytes

    def set(self, local_coords: Sequence[int], offset: int, nbytes: int) -> None:
        """Point an inner chunk at ``nbytes`` bytes starting at byte ``offset``."""
        self.entries[tuple(local_coords)] = (offset, nbytes)

    def clear(self, local_coords: Sequence[int]) -> None:
        """Mark an inner chunk empty."""
        self.entries[tuple(local_coords)] = (EMPTY, EMPTY)

    def present_mask(self) -> np.ndarray:
        """Boolean array of shape ``chunks_per_shard``: True where a chunk is stored."""
        return ~((self.entries[..., 0] == EMPTY) & (self.entries[..., 1] == EMPTY))

    def present(self) -> list[tuple[int, ...]]:
        """Local coords of the stored inner chunks, in row-major order."""
        return [tuple(c) for c in np.argwhere(self.present_mask()).tolist()]

    def stored_entries(self) -> list[tuple[tuple[int, ...], int, int]]:
        """``(local_coords, offset, nbytes)`` of the stored inner chunks, in row-major order (bytes)."""
        mask = self.present_mask()
        spans = self.entries[mask].tolist()
        return [(tuple(c), o, n) for c, (o, n) in zip(np.argwhere(mask).tolist(), spans, strict=True)]

    def count_present(self) -> int:
        """Number of stored inner chunks."""
        return int(self.present_mask().sum())

    def is_empty(self) -> bool:
        """True when no inner chunk is stored."""
        return not bool(self.present_mask().any())

    def used_nbytes(self) -> int:
        """Total bytes referenced by the stored inner chunks (overlaps counted twice)."""
        mask = self.present_mask()
        return int(self.entries[..., 1][mask].sum())

    def validate(
        self,
        shard_key: str,
        data_start: int,
        data_stop: int | None,
        max_chunk_nbytes: int | None = None,
    ) -> None:
        """Check every entry against the bytes available for chunk data, before any read.

        Parameters
        ----------
        shard_key : str
            Named in the error.
        data_start, data_stop : int, int or None
            The half-open byte range (bytes from the shard start) where chunk
            data may lie; ``data_stop=None`` when the shard size is not known.
        max_chunk_nbytes : int, optional
            Largest plausible encoded inner chunk (bytes), checked when
            ``data_stop`` is None (default :data:`DEFAULT_MAX_CHUNK_NBYTES`),
            so a bogus entry never turns into a huge read or allocation.

        Raises
        ------
        CorruptShardError
            If an entry has exactly one field set to ``2**64 - 1``; if
            ``offset + nbytes`` overflows or passes :data:`MAX_SHARD_NBYTES`;
            if it points outside ``[data_start, data_stop)``; or, with the size
            unknown, if ``nbytes`` exceeds ``max_chunk_nbytes``.
        """
        off = self.entries[..., 0]
        nb = self.entries[..., 1]
        off_empty = off == EMPTY
        nb_empty = nb == EMPTY
        half = off_empty ^ nb_empty
        if half.any():
            where = tuple(int(c) for c in np.argwhere(half)[0])
            raise CorruptShardError(shard_key, f"index entry {where} has only one of offset/nbytes set to 2**64-1")
        present = ~off_empty
        if not present.any():
            return
        offs = off[present]
        nbs = nb[present]
        # compared before adding, so nothing wraps: offset + nbytes <= MAX_SHARD_NBYTES
        bad = (offs < data_start) | (offs > _MAX) | (nbs > _MAX - np.minimum(offs, _MAX))
        if data_stop is not None:
            stop = np.uint64(max(data_stop, 0))
            bad |= (offs > stop) | (nbs > stop - np.minimum(offs, stop))
        else:
            limit = DEFAULT_MAX_CHUNK_NBYTES if max_chunk_nbytes is None else int(max_chunk_nbytes)
            bad |= nbs > np.uint64(limit)
        if bad.any():
            k = int(np.argmax(bad))
            where = tuple(int(c) for c in np.argwhere(present)[k])
            o, n = int(offs[k]), int(nbs[k])
            if data_stop is None:
                region = f"[{data_start}, {MAX_SHARD_NBYTES}) with nbytes <= {limit}"
            else:
                region = f"[{data_start}, {data_stop})"
            raise CorruptShardError(
                shard_key,
                f"index entry {where} points at bytes [{o}, {o + n}) outside the chunk data region {region}",
            )

    def overlaps(self) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """Local coords of two stored chunks whose byte ranges overlap, or ``None``.

        Zero-length chunks overlap nothing. Valid shards written by shardkv
        never have overlapping entries; :mod:`shardkv.proxy.verify` reports them.
        """
        spans = sorted((offset, nbytes, local) for local, offset, nbytes in self.stored_entries() if nbytes > 0)
        for (o1, n1, c1), (o2, _, c2) in itertools.pairwise(spans):
            if o2 < o1 + n1:
                return c1, c2
        return None
