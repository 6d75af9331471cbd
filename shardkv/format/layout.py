"""The shard format: the index of inner chunks and the binary layouts of a shard. Pure.

:class:`ShardIndex` is a ``uint64`` array of shape ``(*chunks_per_shard, 2)``
(C order): ``[*local_coords, 0]`` the chunk's ``offset``, ``[..., 1]`` its
``nbytes``; an empty chunk has both set to ``2**64 - 1`` (draft 2022 and v1.0
codec "Binary shard format"). :class:`ShardLayout` places chunks and index in
a shard's bytes: the 2022 draft ``indexed`` format (end, little endian, no
checksum) or the v1.0 ``sharding_indexed`` codec (start or end, little or big
endian, optional CRC32C; shardkv's default: end, little, crc32c)::

    +---------+---------+-----+-----------------------------+-----------+
    | chunk a | chunk b | ... | index: n x (offset, nbytes) | crc32c    |
    | bytes   | bytes   |     | uint64 pairs, C order       | uint32 LE |
    +---------+---------+-----+-----------------------------+-----------+
                                  16 * n bytes                 4 bytes (optional)

With the index at the start, offsets still count from the shard's first byte.
Chunks may come in any order, with unused bytes between them.
"""

from __future__ import annotations

import functools
import itertools
import operator
import os
import sys
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from math import prod
from typing import TYPE_CHECKING, Literal

import google_crc32c

from shardkv._types import BytesLike
from shardkv.errors import ChecksumError, ConfigurationError, CorruptShardError
from shardkv.format.ranges import ByteRange

if TYPE_CHECKING:
    import numpy as np

EMPTY = 2**64 - 1
"""The value of both ``offset`` and ``nbytes`` for an empty inner chunk."""

MAX_SHARD_NBYTES = 2**43
"""Largest ``offset + nbytes`` (bytes) of an entry: 8 TiB, above S3's 5 TiB objects, below ext4's 16 TiB files."""

DEFAULT_MAX_CHUNK_NBYTES = 2**31
"""Default bound (bytes) on an entry's ``nbytes`` when the shard's size is unknown."""


def _max_chunks_from_environment(default: int) -> int:
    text = os.environ.get("SHARDKV_MAX_CHUNKS_PER_SHARD", "")
    try:
        return int(text) if text.strip() else default
    except ValueError:
        raise ConfigurationError(f"SHARDKV_MAX_CHUNKS_PER_SHARD must be an integer, got {text!r}") from None


MAX_CHUNKS_PER_SHARD: int = _max_chunks_from_environment(2**24)
"""Most inner chunks a shard layout may have (its index is allocated whole, 16 bytes per chunk).

Default ``2**24`` (a 256 MiB index); set per process by the environment
variable ``SHARDKV_MAX_CHUNKS_PER_SHARD`` (read on import).
"""

_ENTRY = "Q"  # the array type code of an index entry field: unsigned 64 bits on every platform CPython runs on
if array(_ENTRY).itemsize != 8:
    raise ImportError(f"array type code {_ENTRY!r} is not 64 bits on this platform: shard indexes cannot be held")

_POSITIONS_MAX_CHUNKS = 4096  # shards of at most this many chunks have their index positions memoised


@functools.lru_cache(maxsize=16)
def _positions(chunks_per_shard: tuple[int, ...]) -> dict[tuple[int, ...], int] | None:
    """Local coords -> row-major position in the index, for shards of few chunks (else ``None``)."""
    if prod(chunks_per_shard) > _POSITIONS_MAX_CHUNKS:
        return None
    return {coords: i for i, coords in enumerate(itertools.product(*map(range, chunks_per_shard)))}


def _ravel(local_coords: Sequence[int], chunks_per_shard: tuple[int, ...]) -> int:
    """Row-major position of local coords in an index; ValueError outside the shard, TypeError for a non-integer."""
    if len(local_coords) != len(chunks_per_shard):
        raise ValueError(f"{len(local_coords)} local coords for a {len(chunks_per_shard)}-d shard")
    position = 0
    for c, n in zip(map(operator.index, local_coords), chunks_per_shard, strict=True):
        if not 0 <= c < n:
            raise ValueError(f"local coord {c} outside [0, {n})")
        position = position * n + c
    return position


class ShardIndex:
    """Offsets and sizes of the inner chunks of one shard (spec "Binary shard format").

    The entries are held as one flat ``array('Q')`` (native byte order, C
    order: offset then nbytes per inner chunk), so that building and encoding
    an index needs no numpy; :attr:`entries` is a numpy view of them for the
    operations on whole indexes (numpy imported on their first use).

    Parameters
    ----------
    entries : array_like
        ``uint64``, shape ``(*chunks_per_shard, 2)``: ``[..., 0]`` the offset
        (bytes from the shard's start), ``[..., 1]`` the nbytes. Copied.

    Raises
    ------
    ValueError
        If ``entries`` is not of shape ``(..., 2)``.
    """

    __slots__ = ("chunks_per_shard", "_flat", "_positions")

    chunks_per_shard: tuple[int, ...]
    """Number of inner chunks along each dimension."""

    def __init__(self, entries: np.ndarray) -> None:
        import numpy as np  # whoever holds entries as an array has numpy loaded

        entries = np.asarray(entries, dtype=np.uint64)
        if entries.ndim < 1 or entries.shape[-1] != 2:
            raise ValueError(f"a shard index has shape (*chunks_per_shard, 2), got {entries.shape}")
        flat = array(_ENTRY)
        flat.frombytes(np.ascontiguousarray(entries, dtype="=u8").tobytes())
        self._hold(flat, tuple(entries.shape[:-1]))

    def _hold(self, flat: array[int], chunks_per_shard: tuple[int, ...]) -> None:
        self._flat, self.chunks_per_shard = flat, chunks_per_shard
        self._positions: dict[tuple[int, ...], int] | None | Literal[False] = False  # looked up on the first get

    @classmethod
    def _of(cls, flat: array[int], chunks_per_shard: tuple[int, ...]) -> ShardIndex:
        """An index holding ``flat`` (``2 * prod(chunks_per_shard)`` fields, not copied)."""
        index = cls.__new__(cls)
        index._hold(flat, chunks_per_shard)
        return index

    @classmethod
    def empty(cls, chunks_per_shard: Sequence[int]) -> ShardIndex:
        """An index with every inner chunk empty."""
        cps = tuple(chunks_per_shard)
        return cls._of(array(_ENTRY, (EMPTY,)) * (2 * prod(cps)), cps)

    @property
    def entries(self) -> np.ndarray:
        """A writable numpy view of the entries: ``uint64``, shape ``(*chunks_per_shard, 2)``."""
        import numpy as np  # loaded by the operations on whole indexes only

        return np.frombuffer(self._flat, dtype=np.uint64).reshape(*self.chunks_per_shard, 2)

    @property
    def nbytes(self) -> int:
        """Bytes the entries take in memory (16 per inner chunk)."""
        return len(self._flat) * self._flat.itemsize

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, ShardIndex)
            and self.chunks_per_shard == other.chunks_per_shard
            and self._flat == other._flat
        )

    def copy(self) -> ShardIndex:
        """An independent copy."""
        return ShardIndex._of(self._flat[:], self.chunks_per_shard)

    def _field(self, local_coords: Sequence[int]) -> int:
        """Position of an inner chunk's offset in the flat entries; IndexError for coords outside the shard."""
        positions = self._positions
        if positions is False:  # decoded indexes that are never read pay nothing (the memo is 16 layouts)
            positions = self._positions = _positions(self.chunks_per_shard)
        try:
            if positions is not None:
                return 2 * positions[tuple(local_coords)]
            return 2 * _ravel(local_coords, self.chunks_per_shard)
        except (KeyError, TypeError, ValueError):
            raise IndexError(
                f"local coords {tuple(local_coords)} lie outside chunks_per_shard {self.chunks_per_shard}"
            ) from None

    def get(self, local_coords: Sequence[int]) -> tuple[int, int] | None:
        """``(offset, nbytes)`` of an inner chunk, or ``None`` when it is empty (IndexError outside the shard)."""
        i = self._field(local_coords)
        offset, nbytes = self._flat[i], self._flat[i + 1]
        if offset == EMPTY and nbytes == EMPTY:
            return None
        return offset, nbytes

    def set(self, local_coords: Sequence[int], offset: int, nbytes: int) -> None:
        """Point an inner chunk at ``nbytes`` bytes starting at byte ``offset``."""
        i = self._field(local_coords)
        self._flat[i], self._flat[i + 1] = offset, nbytes

    def clear(self, local_coords: Sequence[int]) -> None:
        """Mark an inner chunk empty."""
        self.set(local_coords, EMPTY, EMPTY)

    def present_mask(self) -> np.ndarray:
        """Boolean array of shape ``chunks_per_shard``: True where a chunk is stored."""
        import numpy as np

        entries, empty = self.entries, np.uint64(EMPTY)
        return ~((entries[..., 0] == empty) & (entries[..., 1] == empty))

    def present(self) -> list[tuple[int, ...]]:
        """Local coords of the stored inner chunks, in row-major order."""
        import numpy as np

        return [tuple(c) for c in np.argwhere(self.present_mask()).tolist()]

    def stored_entries(self) -> list[tuple[tuple[int, ...], int, int]]:
        """``(local_coords, offset, nbytes)`` of the stored inner chunks, in row-major order (bytes)."""
        import numpy as np

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
            Half-open byte range where chunk data may lie; ``data_stop=None``
            when the shard's size is not known.
        max_chunk_nbytes : int, optional
            Largest plausible encoded inner chunk (bytes), checked when
            ``data_stop`` is None (default :data:`DEFAULT_MAX_CHUNK_NBYTES`).

        Raises
        ------
        CorruptShardError
            If an entry has one field only at ``2**64 - 1``, ``offset + nbytes``
            overflows or passes :data:`MAX_SHARD_NBYTES`, it points outside
            ``[data_start, data_stop)``, or (size unknown) ``nbytes`` exceeds
            ``max_chunk_nbytes``.
        """
        import numpy as np

        off, nb = self.entries[..., 0], self.entries[..., 1]
        empty, most = np.uint64(EMPTY), np.uint64(MAX_SHARD_NBYTES)
        half = (off == empty) ^ (nb == empty)
        if half.any():
            where = tuple(int(c) for c in np.argwhere(half)[0])
            raise CorruptShardError(shard_key, f"index entry {where} has only one of offset/nbytes set to 2**64-1")
        present = off != empty
        offs, nbs = off[present], nb[present]
        # compared before adding, so nothing wraps: offset + nbytes <= MAX_SHARD_NBYTES
        bad = (offs < np.uint64(data_start)) | (offs > most) | (nbs > most - np.minimum(offs, most))
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
        """Local coords of two stored chunks whose byte ranges overlap (zero-length ones never do), or ``None``."""
        spans = sorted((offset, nbytes, local) for local, offset, nbytes in self.stored_entries() if nbytes > 0)
        for (o1, n1, c1), (o2, _, c2) in itertools.pairwise(spans):
            if o2 < o1 + n1:
                return c1, c2
        return None


def _as_endian(flat: array[int], endian: str) -> array[int]:
    """``flat`` (native byte order) in byte order ``endian``: itself, or a byte-swapped copy."""
    if endian == sys.byteorder:
        return flat
    swapped = flat[:]
    swapped.byteswap()
    return swapped


IndexLocation = Literal["start", "end"]
Endian = Literal["little", "big"]


def crc32c_of(data: BytesLike, value: int = 0) -> int:
    """CRC32C (Castagnoli) of ``data`` continuing ``value``, an unsigned 32-bit int (google-crc32c reads bytes only)."""
    return google_crc32c.extend(value, data if type(data) is bytes else bytes(data))


def chunk_nbytes_bound(chunk_shape: Sequence[int], itemsize: int | None) -> int | None:
    """Largest plausible encoded size (bytes) of one inner chunk, or ``None`` if unknown.

    Parameters
    ----------
    chunk_shape : sequence of int
        Inner chunk shape (elements).
    itemsize : int or None
        Bytes per element; ``None`` (or < 1) when unknown (opaque types).

    Returns
    -------
    int or None
        ``prod(chunk_shape) * itemsize * 2 + 65536``: twice the decoded chunk
        (a compressor may grow incompressible data a little) plus 64 KiB of
        codec headers; ``None`` keeps :data:`DEFAULT_MAX_CHUNK_NBYTES`.
    """
    if itemsize is None or itemsize < 1:
        return None
    return prod(int(c) for c in chunk_shape) * int(itemsize) * 2 + 65536


@dataclass(frozen=True, slots=True)
class ShardLayout:
    """Where the index goes and how it is encoded, for shards of one array.

    Parameters
    ----------
    chunks_per_shard : tuple of int
        Inner chunks per shard along each dimension (each >= 1).
    index_location : {"start", "end"}
        Where the index is stored (v1.0 codec ``index_location``).
    index_endian : {"little", "big"}
        Byte order of the ``uint64`` entries (the ``bytes`` index codec).
    index_checksum : bool
        Whether a little-endian ``uint32`` CRC32C follows the index (the ``crc32c`` index codec).
    max_chunk_nbytes : int, optional
        Largest plausible encoded inner chunk (bytes), checked when the shard's
        size is unknown; default :data:`DEFAULT_MAX_CHUNK_NBYTES` (2 GiB),
        :func:`chunk_nbytes_bound` for layouts built from array metadata. Not
        part of equality.

    Attributes
    ----------
    n_chunks : int
        Inner chunks per shard.
    index_nbytes : int
        Bytes of the encoded index, including the 4-byte CRC32C if any.

    Raises
    ------
    ConfigurationError
        If a ``chunks_per_shard`` value is < 1, their product exceeds
        :data:`MAX_CHUNKS_PER_SHARD`, or an option is unknown.
    """

    chunks_per_shard: tuple[int, ...]
    index_location: IndexLocation = "end"
    index_endian: Endian = "little"
    index_checksum: bool = True
    max_chunk_nbytes: int | None = field(default=None, compare=False)  # a reader's limit, not the format
    n_chunks: int = field(init=False, repr=False, compare=False)
    index_nbytes: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        cps = tuple(int(c) for c in self.chunks_per_shard)
        if any(c < 1 for c in cps):
            raise ConfigurationError(f"chunks_per_shard values must be >= 1, got {cps}")
        n = prod(cps)
        if n > MAX_CHUNKS_PER_SHARD:  # refused before any index is allocated
            raise ConfigurationError(
                f"chunks_per_shard {cps} means {n} chunks per shard (an index of {16 * n} bytes), beyond the limit "
                f"of {MAX_CHUNKS_PER_SHARD} (shardkv.format.layout.MAX_CHUNKS_PER_SHARD, environment "
                "SHARDKV_MAX_CHUNKS_PER_SHARD)"
            )
        object.__setattr__(self, "chunks_per_shard", cps)
        object.__setattr__(self, "n_chunks", n)
        object.__setattr__(self, "index_nbytes", 16 * n + (4 if self.index_checksum else 0))
        if self.index_location not in ("start", "end"):
            raise ConfigurationError(f"index_location must be 'start' or 'end', got {self.index_location!r}")
        if self.index_endian not in ("little", "big"):
            raise ConfigurationError(f"index endian must be 'little' or 'big', got {self.index_endian!r}")
        if self.max_chunk_nbytes is not None and self.max_chunk_nbytes < 0:
            raise ConfigurationError(f"max_chunk_nbytes must be >= 0, got {self.max_chunk_nbytes}")

    @classmethod
    def draft_2022(cls, chunks_per_shard: Sequence[int], max_chunk_nbytes: int | None = None) -> ShardLayout:
        """The 2022 draft ``indexed`` format: end, little endian, no checksum."""
        return cls(tuple(chunks_per_shard), "end", "little", False, max_chunk_nbytes)

    @classmethod
    def v3(
        cls,
        chunks_per_shard: Sequence[int],
        index_location: IndexLocation = "end",
        index_endian: Endian = "little",
        index_checksum: bool = True,
    ) -> ShardLayout:
        """A v1.0 ``sharding_indexed`` layout (default: end, little endian, crc32c)."""
        return cls(tuple(chunks_per_shard), index_location, index_endian, index_checksum)

    def index_range(self) -> ByteRange:
        """The byte range of the encoded index: a prefix, or a suffix read."""
        if self.index_location == "start":
            return ByteRange(0, self.index_nbytes)
        return ByteRange.suffix(self.index_nbytes)

    def data_region(self, shard_nbytes: int | None) -> tuple[int, int | None]:
        """Half-open byte range where chunk data may lie in a shard of ``shard_nbytes`` bytes."""
        if self.index_location == "start":
            return self.index_nbytes, shard_nbytes
        return 0, None if shard_nbytes is None else shard_nbytes - self.index_nbytes

    def encode_index(self, index: ShardIndex) -> bytes:
        """Encode an index (and its checksum) to ``index_nbytes`` bytes; ConfigurationError if its shape differs."""
        if index.chunks_per_shard != self.chunks_per_shard:
            raise ConfigurationError(
                f"index of shape {index.chunks_per_shard} does not match chunks_per_shard {self.chunks_per_shard}"
            )
        raw = _as_endian(index._flat, self.index_endian).tobytes()
        if self.index_checksum:
            raw += crc32c_of(raw).to_bytes(4, "little")
        return raw

    def decode_index(self, data: BytesLike, shard_key: str, shard_nbytes: int | None = None) -> ShardIndex:
        """Decode and validate an encoded index.

        Parameters
        ----------
        data : bytes-like
            Exactly ``index_nbytes`` bytes, as stored.
        shard_key : str
            Named in errors.
        shard_nbytes : int, optional
            Size of the whole shard (bytes), when known.

        Returns
        -------
        ShardIndex
            A writable index of shape ``(*chunks_per_shard, 2)``.

        Raises
        ------
        CorruptShardError
            If ``data`` has the wrong length (a truncated shard) or an entry
            fails :meth:`ShardIndex.validate`.
        ChecksumError
            If the stored CRC32C differs from the one computed.
        """
        data = memoryview(data).cast("B")
        if len(data) != self.index_nbytes:
            raise CorruptShardError(
                shard_key,
                f"expected an index of {self.index_nbytes} bytes at the {self.index_location}, "
                f"got {len(data)} bytes (truncated shard?)",
            )
        body = data[: 16 * self.n_chunks]
        if self.index_checksum:
            stored = int.from_bytes(data[16 * self.n_chunks :], "little")
            computed = crc32c_of(body)
            if stored != computed:
                raise ChecksumError(shard_key, stored, computed)
        flat = array(_ENTRY)
        flat.frombytes(body)
        index = ShardIndex._of(_as_endian(flat, self.index_endian), self.chunks_per_shard)
        index.validate(shard_key, *self.data_region(shard_nbytes), self.max_chunk_nbytes)
        return index

    def index_of_shard(self, shard: BytesLike, shard_key: str) -> ShardIndex:
        """Decode and validate the index of a whole stored shard (errors as :meth:`decode_index`)."""
        shard = memoryview(shard).cast("B")
        n = self.index_nbytes
        if len(shard) < n:
            raise CorruptShardError(shard_key, f"shard of {len(shard)} bytes is shorter than its {n}-byte index")
        raw = shard[:n] if self.index_location == "start" else shard[len(shard) - n :]
        return self.decode_index(raw, shard_key, len(shard))

    def encode_shard(self, chunks: Mapping[tuple[int, ...], BytesLike]) -> bytes:
        """A shard as one ``bytes`` object (:meth:`encode_shard_with_index`, joined)."""
        return b"".join(self.encode_shard_with_index(chunks)[0])

    def encode_shard_with_index(
        self, chunks: Mapping[tuple[int, ...], BytesLike]
    ) -> tuple[list[BytesLike], ShardIndex]:
        """The parts of a shard built from encoded inner chunks, in order, and its index (no copy).

        Parameters
        ----------
        chunks : mapping of local coords to bytes-like
            The encoded inner chunks, written back to back in row-major order;
            absent coords are empty.

        Returns
        -------
        list of bytes-like
            The parts whose concatenation is the shard: the chunk values (not
            copied) and the encoded index at ``index_location``.
        ShardIndex
            Its index.

        Raises
        ------
        ConfigurationError
            If a local coord lies outside ``chunks_per_shard``.
        """
        order = sorted(chunks)
        index = ShardIndex.empty(self.chunks_per_shard)
        values: list[BytesLike] = list(map(chunks.__getitem__, order))
        offset = self.index_nbytes if self.index_location == "start" else 0
        try:
            for local, value in zip(order, values, strict=True):
                nbytes = len(value) if type(value) is bytes else memoryview(value).nbytes
                index.set(local, offset, nbytes)
                offset += nbytes
        except IndexError:  # a coord outside the shard, or not an integer: named here
            cps = self.chunks_per_shard
            for local in order:
                if len(local) != len(cps) or any(not 0 <= c < n for c, n in zip(local, cps, strict=True)):
                    raise ConfigurationError(f"local coords {local} lie outside chunks_per_shard {cps}") from None
            raise ConfigurationError(f"local coords {list(order)} are not integers") from None
        encoded_index = self.encode_index(index)
        return ([encoded_index, *values] if self.index_location == "start" else [*values, encoded_index]), index

    def chunks_of_shard(
        self, shard: BytesLike, shard_key: str, index: ShardIndex | None = None
    ) -> dict[tuple[int, ...], memoryview]:
        """All stored inner chunks of a whole shard, as zero-copy views (errors as :meth:`decode_index`)."""
        view = memoryview(shard).cast("B")
        if index is None:
            index = self.index_of_shard(view, shard_key)
        return {local: view[offset : offset + nbytes] for local, offset, nbytes in index.stored_entries()}
