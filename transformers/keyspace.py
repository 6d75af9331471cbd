"""One sharded array's key space under the 2022 draft transformer. Pure logic.

:class:`ShardKeySpace` maps the chunk keys of one array
(``data/root/<path>/c<i><sep><j>...``) to shard keys and local coords, the
shard keys back to chunks, and a key *prefix* that reaches into the
chunk-grid part of the keys to the shard prefix covering it (draft "API
implementation": "If the prefix contains a part of the chunk-grid key, this
part is translated to the referenced shard and contained chunks").
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Sequence

from shardkv.errors import InvalidKeyError
from shardkv.keys.encodings import Draft2022ChunkKeyEncoding, chunk_to_shard

__all__ = ["ShardKeySpace", "Local"]

Local = tuple[int, ...]


def _canonical_int(text: str) -> int | None:
    if text.isdigit() and text.isascii() and (len(text) == 1 or text[0] != "0"):
        return int(text)
    return None


@dataclass(frozen=True)
class ShardKeySpace:
    """Chunk keys <-> shard keys of one array.

    Parameters
    ----------
    key_prefix : str
        ``data/root/<path>/`` (``data/root/`` for a root array).
    encoding : Draft2022ChunkKeyEncoding
        The chunk (and shard) key encoding with the array's separator.
    chunks_per_shard : tuple of int
        Chunks per shard along each dimension.
    chunk_grid_shape : tuple of int or None
        Chunks along each dimension, when the array shape is known.
    """

    key_prefix: str
    encoding: Draft2022ChunkKeyEncoding
    chunks_per_shard: tuple[int, ...]
    chunk_grid_shape: tuple[int, ...] | None = None

    @property
    def ndim(self) -> int:
        return len(self.chunks_per_shard)

    def locate(self, key: str) -> tuple[str, Local] | None:
        """``(shard_key, local_coords)`` of a chunk key of this array, ``None`` for other keys.

        Raises
        ------
        InvalidKeyError
            If ``key`` lies under the array's data prefix but is not one of
            its chunk keys.
        """
        if not isinstance(key, str):
            raise TypeError(f"store keys are str, got {type(key).__name__}: {key!r}")
        if not key.startswith(self.key_prefix):
            return None
        try:
            coords = self.encoding.decode(key[len(self.key_prefix) :], self.ndim)
        except ValueError as exc:
            raise InvalidKeyError(
                key,
                f"under the data prefix {self.key_prefix!r} of a sharded {self.ndim}-d array but not one of "
                f"its chunk keys ('c' and {self.ndim} coordinate(s) separated by "
                f"{self.encoding.separator!r}): {exc}",
            ) from None
        shard_coords, local = chunk_to_shard(coords, self.chunks_per_shard)
        return self.shard_key(shard_coords), local

    def shard_key(self, shard_coords: Sequence[int]) -> str:
        """The key of a shard in the underlying store."""
        return self.key_prefix + self.encoding.encode(shard_coords)

    def chunk_key(self, chunk_coords: Sequence[int]) -> str:
        """The key of a chunk as code above the transformer uses it."""
        return self.key_prefix + self.encoding.encode(chunk_coords)

    def shard_coords_of(self, key: str) -> tuple[int, ...] | None:
        """Shard coords of an underlying key, or ``None`` if it is not a shard key of this array."""
        if not key.startswith(self.key_prefix):
            return None
        try:
            return self.encoding.decode(key[len(self.key_prefix) :], self.ndim)
        except ValueError:
            return None

    def chunk_coords(self, shard_coords: Sequence[int], local: Sequence[int]) -> tuple[int, ...]:
        return tuple(s * n + l for s, n, l in zip(shard_coords, self.chunks_per_shard, local))

    def available(self, shard_coords: Sequence[int]) -> set[Local]:
        """Local coords of the shard's available chunks (inside the chunk grid when known)."""
        ranges = []
        for d, (s, n) in enumerate(zip(shard_coords, self.chunks_per_shard)):
            stop = n if self.chunk_grid_shape is None else max(0, min(n, self.chunk_grid_shape[d] - s * n))
            ranges.append(range(stop))
        return set(itertools.product(*ranges))

    def split_prefix(self, prefix: str) -> tuple[list[int], bool] | None:
        """Complete chunk coords named by a prefix inside the chunk-grid part of the keys.

        Returns ``None`` when ``prefix`` does not reach into the chunk-grid
        part, else ``(coords, ok)`` where ``ok`` is False when no chunk key of
        the array can start with ``prefix``.
        """
        if not prefix.startswith(self.key_prefix) or len(prefix) == len(self.key_prefix):
            return None
        part = prefix[len(self.key_prefix) :]
        if not part.startswith("c"):
            return [], False
        pieces = part[1:].split(self.encoding.separator)
        coords = []
        for piece in pieces[:-1]:
            value = _canonical_int(piece)
            if value is None:
                return [], False
            coords.append(value)
        if len(coords) >= max(self.ndim, 1):
            return [], False
        return coords, True

    def shard_prefix(self, coords: Sequence[int]) -> str:
        """The underlying prefix covering the shards of the chunks whose keys start with ``coords``."""
        if not coords:
            return self.key_prefix + "c"
        shard = [c // n for c, n in zip(coords, self.chunks_per_shard)]
        sep = self.encoding.separator
        return self.key_prefix + "c" + sep.join(str(s) for s in shard) + sep

    def expand_shard_prefix(self, shard_prefix: str, fixed: Sequence[int]) -> list[str] | None:
        """Chunk-key prefixes covering a retrieved partial shard key (``None`` if it is not one)."""
        part = shard_prefix[len(self.key_prefix) :].rstrip("/")
        if self.encoding.separator != "/" or not part.startswith("c"):
            return None
        coords = [_canonical_int(p) for p in part[1:].split("/")]
        if any(c is None for c in coords) or not 0 < len(coords) < self.ndim:
            return None
        choices = []
        for d, s in enumerate(coords):
            n = self.chunks_per_shard[d]
            stop = (s + 1) * n
            if self.chunk_grid_shape is not None:
                stop = min(stop, self.chunk_grid_shape[d])
            if d < len(fixed):
                choices.append([fixed[d]] if s * n <= fixed[d] < (s + 1) * n else [])
            else:
                choices.append(range(s * n, stop))
        return [self.key_prefix + "c" + "/".join(map(str, c)) + "/" for c in itertools.product(*choices)]
