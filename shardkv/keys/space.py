"""One sharded array's key space: chunk keys <-> (shard key, local coords). Pure.

A :class:`ShardedArray` knows where an array lives (``key_prefix``), its
shape and inner chunk shape, its shard layout and two chunk key encodings:
the one code above the proxy uses for chunks (``chunk_key_encoding``) and the
one the underlying store uses for shards (``shard_key_encoding``). For a Zarr
v2 array both are the v2 encoding with the array's separator, so chunk
``(5, 3)`` with ``chunks_per_shard=(4, 2)`` lives in shard ``1.1`` at local
coords ``(1, 1)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Iterator, Sequence

from shardkv.errors import ChunkOutOfGridError, InvalidKeyError
from shardkv.format.layout import ShardLayout
from shardkv.keys.encodings import ChunkKeyEncoding, chunk_to_shard, grid_shape, shard_to_chunks

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
    shape : tuple of int
        Array shape (elements).
    chunks : tuple of int
        Inner chunk shape (elements).
    layout : ShardLayout
        ``chunks_per_shard`` and index layout.
    chunk_key_encoding, shard_key_encoding : ChunkKeyEncoding
        Encodings of chunk keys (seen above the proxy) and shard keys (stored).
    """

    path: str
    key_prefix: str
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    layout: ShardLayout
    chunk_key_encoding: ChunkKeyEncoding
    shard_key_encoding: ChunkKeyEncoding

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def chunks_per_shard(self) -> tuple[int, ...]:
        return self.layout.chunks_per_shard

    @property
    def shard_shape(self) -> tuple[int, ...]:
        """Shard shape (elements)."""
        return tuple(c * n for c, n in zip(self.chunks, self.chunks_per_shard))

    @cached_property
    def chunk_grid_shape(self) -> tuple[int, ...]:
        """Number of inner chunks along each dimension."""
        return grid_shape(self.shape, self.chunks)

    @property
    def shard_grid_shape(self) -> tuple[int, ...]:
        """Number of shards along each dimension."""
        return grid_shape(self.shape, self.shard_shape)

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

    def _suffix(self, key: str) -> str:
        if not key.startswith(self.key_prefix):
            raise InvalidKeyError(key, f"not under the array prefix {self.key_prefix!r}")
        return key[len(self.key_prefix) :]

    def locate(self, chunk_key: str) -> ChunkRef:
        """Resolve a chunk key to its shard.

        Raises
        ------
        InvalidKeyError
            If the key is not a well-formed chunk key of this array.
        ChunkOutOfGridError
            If its chunk coords lie outside the chunk grid.
        """
        try:
            coords = self.chunk_key_encoding.decode(self._suffix(chunk_key), self.ndim)
        except ValueError as exc:
            if isinstance(exc, InvalidKeyError):
                raise
            raise InvalidKeyError(
                chunk_key, f"not a {self.chunk_key_encoding.name} chunk key of a {self.ndim}-d array: {exc}"
            ) from None
        grid = self.chunk_grid_shape
        if any(c >= g for c, g in zip(coords, grid)):
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
        try:
            return self.shard_key_encoding.decode(self._suffix(shard_key), self.ndim)
        except ValueError:
            return None

    def chunks_in_shard(self, shard_coords: Sequence[int]) -> Iterator[tuple[tuple[int, ...], tuple[int, ...]]]:
        """``(chunk_coords, local_coords)`` of the shard's chunks inside the chunk grid."""
        return shard_to_chunks(shard_coords, self.chunks_per_shard, self.chunk_grid_shape)

    def n_chunks_in_shard(self, shard_coords: Sequence[int]) -> int:
        """How many of the shard's inner chunks lie inside the chunk grid."""
        n = 1
        for s, cps, g in zip(shard_coords, self.chunks_per_shard, self.chunk_grid_shape):
            n *= max(0, min(cps, g - s * cps))
        return n

    def shard_keys(self) -> Iterator[tuple[str, tuple[int, ...]]]:
        """Every possible shard key of the array with its shard coords, row-major."""
        import itertools

        for coords in itertools.product(*(range(n) for n in self.shard_grid_shape)):
            yield self.shard_key(coords), coords
