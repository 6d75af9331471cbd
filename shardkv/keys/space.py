"""One sharded array's key space: chunk keys <-> (shard key, local coords). Pure.

A :class:`ShardedArray` knows where an array lives (``key_prefix``), its
shape and inner chunk shape, its shard layout and two chunk key encodings:
the one code above uses for chunks (``chunk_key_encoding``) and the one the
underlying store uses for shards (``shard_key_encoding``). Every path of
shardkv uses this one type; the paths differ only in the encodings:

==========================  ======================  =============  ===========
path                        key_prefix              chunk (5, 3)   its shard
==========================  ======================  =============  ===========
v2 proxy (``ShardedStore``)  ``path/``               ``5.3``        ``1.1``
v3 view of a v2 array       ``path/``               ``5.3``        ``c/1/1``
2022 draft transformer      ``data/root/path/``     ``c5/3``       ``c1/1``
==========================  ======================  =============  ===========

(with ``chunks_per_shard=(4, 2)``: chunk ``(5, 3)`` lives in shard ``(1, 1)``
at local coords ``(1, 1)``). Prefix translation for listings lives beside it
in :mod:`shardkv.keys.prefixes`.

The array's grid may be unknown (a draft transformer configured without the
array's shape): then every chunk key is in the grid and every shard has all
``chunks_per_shard`` chunks available.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cached_property
from math import prod
from typing import Iterator, Sequence

from shardkv.errors import ChunkOutOfGridError, InvalidKeyError
from shardkv.format.layout import ShardLayout
from shardkv.keys.encodings import ChunkKeyEncoding, chunk_to_shard, grid_shape, shard_to_chunk, shard_to_chunks

__all__ = ["ShardedArray", "ChunkRef"]


@dataclass(frozen=True, slots=True)
class ChunkRef:
    """Where one inner chunk lives: its shard's key and its place in the shard."""

    chunk_key: str
    chunk_coords: tuple[int, ...]
    shard_key: str
    shard_coords: tuple[int, ...]
    local_coords: tuple[int, ...]
    array: ShardedArray


@dataclass(frozen=True)
class ShardedArray:
    """The key mapping of one sharded array.

    Parameters
    ----------
    path : str
        The array's path in the hierarchy (``""`` for a root array).
    key_prefix : str
        What precedes the chunk key suffix in chunk and shard keys: ``"path/"``
        for v2, ``"data/root/path/"`` for the 2022 draft, ``""`` for a root v2 array.
    shape : tuple of int or None
        Array shape (elements); ``None`` when unknown (no grid checks).
    chunks : tuple of int or None
        Inner chunk shape (elements); ``None`` when unknown.
    layout : ShardLayout
        ``chunks_per_shard`` and index layout.
    chunk_key_encoding, shard_key_encoding : ChunkKeyEncoding
        Encodings of chunk keys (seen above the proxy) and shard keys (stored).
    """

    path: str
    key_prefix: str
    shape: tuple[int, ...] | None
    chunks: tuple[int, ...] | None
    layout: ShardLayout
    chunk_key_encoding: ChunkKeyEncoding
    shard_key_encoding: ChunkKeyEncoding

    @property
    def ndim(self) -> int:
        return len(self.layout.chunks_per_shard)

    @property
    def chunks_per_shard(self) -> tuple[int, ...]:
        return self.layout.chunks_per_shard

    @property
    def shard_shape(self) -> tuple[int, ...] | None:
        """Shard shape (elements), ``None`` when the chunk shape is unknown."""
        if self.chunks is None:
            return None
        return tuple(c * n for c, n in zip(self.chunks, self.chunks_per_shard))

    @cached_property
    def chunk_grid_shape(self) -> tuple[int, ...] | None:
        """Number of inner chunks along each dimension, ``None`` when the grid is unknown."""
        if self.shape is None or self.chunks is None:
            return None
        return grid_shape(self.shape, self.chunks)

    @property
    def shard_grid_shape(self) -> tuple[int, ...] | None:
        """Number of shards along each dimension, ``None`` when the grid is unknown."""
        grid = self.chunk_grid_shape
        if grid is None:
            return None
        return grid_shape(grid, self.chunks_per_shard)

    def with_shape(self, shape: Sequence[int]) -> ShardedArray:
        """The same array after a resize."""
        return ShardedArray(
            self.path, self.key_prefix, tuple(int(s) for s in shape), self.chunks, self.layout,
            self.chunk_key_encoding, self.shard_key_encoding,
        )  # fmt: skip

    # -- keys -------------------------------------------------------------

    def chunk_key(self, chunk_coords: Sequence[int]) -> str:
        return self.key_prefix + self.chunk_key_encoding.encode(chunk_coords)

    def shard_key(self, shard_coords: Sequence[int]) -> str:
        return self.key_prefix + self.shard_key_encoding.encode(shard_coords)

    def owns(self, key: str) -> bool:
        """True when ``key`` lies under the array's key prefix."""
        return key.startswith(self.key_prefix)

    def _suffix(self, key: str) -> str:
        if not key.startswith(self.key_prefix):
            raise InvalidKeyError(key, f"not under the array prefix {self.key_prefix!r}")
        return key[len(self.key_prefix) :]

    def chunk_coords_of(self, chunk_key: str) -> tuple[int, ...]:
        """Chunk coords of a chunk key of this array (no grid check).

        Raises
        ------
        InvalidKeyError
            If the key is not a well-formed chunk key of this array.
        """
        try:
            return self.chunk_key_encoding.decode(self._suffix(chunk_key), self.ndim)
        except InvalidKeyError:
            raise
        except ValueError as exc:
            enc = self.chunk_key_encoding
            raise InvalidKeyError(
                chunk_key,
                f"under the prefix {self.key_prefix!r} of a sharded {self.ndim}-d array but not one of its "
                f"chunk keys ({enc.name} encoding, separator {enc.separator!r}): {exc}",
            ) from None

    def locate(self, chunk_key: str, *, check_grid: bool = True) -> ChunkRef:
        """Resolve a chunk key to its shard.

        Parameters
        ----------
        chunk_key : str
            A chunk key of this array.
        check_grid : bool
            Refuse chunk coords outside the chunk grid (when the grid is known).

        Raises
        ------
        InvalidKeyError
            If the key is not a well-formed chunk key of this array.
        ChunkOutOfGridError
            If ``check_grid`` and its chunk coords lie outside the chunk grid.
        """
        coords = self.chunk_coords_of(chunk_key)
        grid = self.chunk_grid_shape
        if check_grid and grid is not None and any(c >= g for c, g in zip(coords, grid)):
            raise ChunkOutOfGridError(chunk_key, coords, grid)
        shard_coords, local = chunk_to_shard(coords, self.chunks_per_shard)
        shard_key = self._shard_keys.get(shard_coords)
        if shard_key is None:
            shard_key = self._shard_keys[shard_coords] = self.shard_key(shard_coords)
        return ChunkRef(chunk_key, coords, shard_key, shard_coords, local, self)

    @cached_property
    def _shard_keys(self) -> dict[tuple[int, ...], str]:
        """Memo of shard keys by shard coords (one entry per shard touched)."""
        return {}

    def shard_coords_of(self, shard_key: str) -> tuple[int, ...] | None:
        """Shard coords of a stored key, or ``None`` if it is not a shard key of this array."""
        if not shard_key.startswith(self.key_prefix):
            return None
        try:
            return self.shard_key_encoding.decode(shard_key[len(self.key_prefix) :], self.ndim)
        except ValueError:
            return None

    # -- chunks of a shard --------------------------------------------------

    def chunk_coords(self, shard_coords: Sequence[int], local_coords: Sequence[int]) -> tuple[int, ...]:
        """Chunk coords of the inner chunk at ``local_coords`` of a shard."""
        return shard_to_chunk(shard_coords, self.chunks_per_shard, local_coords)

    def in_grid(self, chunk_coords: Sequence[int]) -> bool:
        """True when the chunk lies inside the chunk grid (always, when the grid is unknown)."""
        grid = self.chunk_grid_shape
        return grid is None or all(c < g for c, g in zip(chunk_coords, grid))

    def chunks_in_shard(self, shard_coords: Sequence[int]) -> Iterator[tuple[tuple[int, ...], tuple[int, ...]]]:
        """``(chunk_coords, local_coords)`` of the shard's available chunks (inside the grid when known)."""
        return shard_to_chunks(shard_coords, self.chunks_per_shard, self.chunk_grid_shape)

    def n_chunks_in_shard(self, shard_coords: Sequence[int]) -> int:
        """How many of the shard's inner chunks are available (inside the grid when known)."""
        grid = self.chunk_grid_shape
        if grid is None:
            return prod(self.chunks_per_shard)
        n = 1
        for s, cps, g in zip(shard_coords, self.chunks_per_shard, grid):
            n *= max(0, min(cps, g - s * cps))
        return n

    def shard_keys(self) -> Iterator[tuple[str, tuple[int, ...]]]:
        """Every possible shard key of the array with its shard coords, row-major.

        Raises
        ------
        ValueError
            If the grid is unknown (list the stored shards instead).
        """
        grid = self.shard_grid_shape
        if grid is None:
            raise ValueError(f"the shard grid of array {self.path!r} is unknown (no shape or chunk shape)")
        for coords in itertools.product(*(range(n) for n in grid)):
            yield self.shard_key(coords), coords
