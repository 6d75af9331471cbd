"""Chunk key encodings and one sharded array's key space: chunk keys <-> (shard key, local coords). Pure.

Encodings (the part of a key after the array's path; decoders accept only
the canonical form their encoder writes, so one chunk has exactly one key)::

    encoding (separator)     chunk (1, 2)   0-d chunk   where specified
    v2 ("." or "/")          1.2 or 1/2     0           Zarr v2; v3 core "v2"
    default ("/" or ".")     c/1/2, c.1.2   c           v3 core "default"
    draft2022 ("/")          c1/2           c           2022 draft, under data/root/<path>/

A :class:`ShardedArray` maps an array's chunk keys (``chunk_key_encoding``)
to its shard keys (``shard_key_encoding``) under its ``key_prefix``: with
``chunks_per_shard=(4, 2)``, chunk ``(5, 3)`` lives in shard ``(1, 1)`` at
local coords ``(1, 1)`` (v2 proxy: ``path/5.3`` -> ``path/1.1``; draft:
``data/root/path/c5/3`` -> ``data/root/path/c1/1``). An unknown grid (a draft
transformer without the array's shape) puts every chunk key in the grid.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from math import ceil, prod
from operator import floordiv, ge, mod, sub
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from shardkv.errors import ChunkOutOfGridError, ConfigurationError, InvalidKeyError
from shardkv.format.layout import ShardLayout

if TYPE_CHECKING:
    import numpy as np

Separator = Literal[".", "/"]


def _decode_ints(text: str, separator: str, ndim: int) -> tuple[int, ...]:
    parts = text.split(separator)
    if len(parts) != ndim:
        raise ValueError(f"expected {ndim} coordinate(s) separated by {separator!r}, got {len(parts)}")
    for p in parts:
        if not (p.isascii() and p.isdigit()) or (p[0] == "0" and len(p) > 1):
            raise ValueError(f"coordinate {p!r} is not a canonical non-negative decimal integer")
    return tuple(map(int, parts))


@dataclass(frozen=True, slots=True)
class ChunkKeyEncoding:
    """Base of the chunk key encodings: chunk coords <-> key suffix ``head + separator.join(coords)``."""

    separator: Separator = "/"
    head: str = field(init=False, repr=False, compare=False)  # what precedes the coordinates in a key suffix

    name = "abstract"
    head_template = "c{}"  # the head, ``{}`` standing for the separator
    zero_key = "c"  # the key suffix of the one chunk of a 0-d array

    def __post_init__(self) -> None:
        if self.separator not in (".", "/"):
            raise ConfigurationError(f"chunk key separator must be '.' or '/', got {self.separator!r}")
        object.__setattr__(self, "head", self.head_template.format(self.separator))

    def encode(self, chunk_coords: Sequence[int]) -> str:
        """The key suffix (relative to the array path) of a chunk."""
        if len(chunk_coords) == 0:
            return self.zero_key
        return self.head + self.separator.join(str(int(c)) for c in chunk_coords)

    def decode(self, suffix: str, ndim: int) -> tuple[int, ...]:
        """Chunk coords from a key suffix; ValueError (saying which rule) unless it is a canonical ``ndim``-d key."""
        if ndim == 0:
            if suffix != self.zero_key:
                raise ValueError(f"the only chunk of a 0-d array has the key {self.zero_key!r}")
            return ()
        if not suffix.startswith(self.head):
            raise ValueError(f"a {self.name!r} chunk key starts with {self.head!r}")
        return _decode_ints(suffix[len(self.head) :], self.separator, ndim)

    def to_metadata(self) -> dict[str, Any]:
        """The v3 ``chunk_key_encoding`` metadata object."""
        return {"name": self.name, "configuration": {"separator": self.separator}}


@dataclass(frozen=True, slots=True)
class V2ChunkKeyEncoding(ChunkKeyEncoding):
    """Zarr v2 keys (``1.2`` or ``1/2``, ``0`` for 0-d); also the v3 core ``v2`` encoding."""

    separator: Separator = "."
    name = "v2"
    head_template = ""
    zero_key = "0"


@dataclass(frozen=True, slots=True)
class DefaultChunkKeyEncoding(ChunkKeyEncoding):
    """v3 core ``default`` keys: ``c/1/2`` (or ``c.1.2``), ``c`` for 0-d."""

    name = "default"


@dataclass(frozen=True, slots=True)
class Draft2022ChunkKeyEncoding(ChunkKeyEncoding):
    """2022 draft keys under ``data/root/<path>/``: ``c1/2`` (or ``c1.2``), ``c`` for 0-d."""

    name = "draft2022"
    head_template = "c"

    def to_metadata(self) -> dict[str, Any]:
        return {"type": "regular", "separator": self.separator}


def chunk_key_encoding_from_metadata(meta: dict[str, Any]) -> ChunkKeyEncoding:
    """The encoding a v3 ``chunk_key_encoding`` object describes; ConfigurationError for an unknown one."""
    name = meta.get("name")
    separator = (meta.get("configuration") or {}).get("separator")
    if name not in ("default", "v2"):
        raise ConfigurationError(f"unknown chunk_key_encoding {meta!r}; expected name 'default' or 'v2'")
    return DefaultChunkKeyEncoding(separator or "/") if name == "default" else V2ChunkKeyEncoding(separator or ".")


def grid_shape(shape: Sequence[int], chunks: Sequence[int]) -> tuple[int, ...]:
    """Number of chunks along each dimension: ``ceil(shape / chunks)`` (elements)."""
    return tuple(ceil(s / c) for s, c in zip(shape, chunks, strict=True))


def chunk_to_shard(
    chunk_coords: Sequence[int], chunks_per_shard: Sequence[int]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(chunk_coords // chunks_per_shard, chunk_coords % chunks_per_shard)`` (draft "Key & value transformation")."""
    shard = tuple(map(floordiv, chunk_coords, chunks_per_shard))  # map of operators: no Python frame per dimension
    local = tuple(map(mod, chunk_coords, chunks_per_shard))
    return shard, local


def shard_extent(
    shard_coords: Sequence[int], chunks_per_shard: Sequence[int], chunk_grid_shape: Sequence[int] | None = None
) -> list[range]:
    """The chunk coords a shard spans along each dimension, clipped to ``chunk_grid_shape`` if given.

    Leading shard coords (fewer than the dimensions) give the leading dimensions' ranges.
    """
    out = []
    for d, (s, n) in enumerate(zip(shard_coords, chunks_per_shard, strict=False)):
        stop = (s + 1) * n if chunk_grid_shape is None else min((s + 1) * n, chunk_grid_shape[d])
        out.append(range(s * n, max(s * n, stop)))
    return out


def shard_to_chunks(
    shard_coords: Sequence[int],
    chunks_per_shard: Sequence[int],
    chunk_grid_shape: Sequence[int] | None = None,
) -> Iterator[tuple[tuple[int, ...], tuple[int, ...]]]:
    """``(chunk_coords, local_coords)`` of a shard's chunks (inside ``chunk_grid_shape`` if given), row-major."""
    extent = shard_extent(shard_coords, chunks_per_shard, chunk_grid_shape)
    starts = [r.start for r in extent]
    for chunk_coords in itertools.product(*extent):
        yield chunk_coords, tuple(map(sub, chunk_coords, starts))


# a canonical coordinate below 10**18 (parsed as int64 without overflow); longer ones take the slow path
_COORD = r"(?:0|[1-9][0-9]{0,17})"


class ChunkRef(NamedTuple):
    """Where one inner chunk lives: its shard's key and its place in the shard (a tuple: cheap to make)."""

    chunk_key: str
    shard_key: str
    shard_coords: tuple[int, ...]
    local_coords: tuple[int, ...]
    array: ShardedArray

    @property
    def chunk_coords(self) -> tuple[int, ...]:
        """The chunk's coords in the array's chunk grid."""
        return self.array.chunk_coords(self.shard_coords, self.local_coords)


@dataclass(frozen=True)
class ShardedArray:
    """The key mapping of one sharded array.

    Parameters
    ----------
    path : str
        The array's path in the hierarchy (``""`` for a root array).
    key_prefix : str
        What precedes the key suffix: ``"path/"`` (v2), ``"data/root/path/"`` (draft).
    shape, chunks : tuple of int or None
        Array shape and inner chunk shape (elements); ``None`` when unknown (no grid checks).
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

    @cached_property
    def ndim(self) -> int:
        return len(self.layout.chunks_per_shard)

    @cached_property
    def chunks_per_shard(self) -> tuple[int, ...]:
        return self.layout.chunks_per_shard

    @property
    def shard_shape(self) -> tuple[int, ...] | None:
        """Shard shape (elements), ``None`` when the chunk shape is unknown."""
        if self.chunks is None:
            return None
        return tuple(c * n for c, n in zip(self.chunks, self.chunks_per_shard, strict=True))

    @cached_property
    def chunk_grid_shape(self) -> tuple[int, ...] | None:
        """Number of inner chunks along each dimension, ``None`` when the grid is unknown."""
        return None if self.shape is None or self.chunks is None else grid_shape(self.shape, self.chunks)

    @property
    def shard_grid_shape(self) -> tuple[int, ...] | None:
        """Number of shards along each dimension, ``None`` when the grid is unknown."""
        grid = self.chunk_grid_shape
        return None if grid is None else grid_shape(grid, self.chunks_per_shard)

    def with_shape(self, shape: Sequence[int]) -> ShardedArray:
        """The same array after a resize."""
        return replace(self, shape=tuple(int(s) for s in shape))

    def chunk_key(self, chunk_coords: Sequence[int]) -> str:
        return self.key_prefix + self.chunk_key_encoding.encode(chunk_coords)

    def shard_key(self, shard_coords: Sequence[int]) -> str:
        return self.key_prefix + self.shard_key_encoding.encode(shard_coords)

    def owns(self, key: str) -> bool:
        """True when ``key`` lies under the array's key prefix."""
        return key.startswith(self.key_prefix)

    def chunk_coords_of(self, chunk_key: str) -> tuple[int, ...]:
        """Chunk coords of a chunk key of this array (no grid check); InvalidKeyError for another key."""
        if not chunk_key.startswith(self.key_prefix):
            raise InvalidKeyError(chunk_key, f"not under the array prefix {self.key_prefix!r}")
        try:
            return self.chunk_key_encoding.decode(chunk_key[len(self.key_prefix) :], self.ndim)
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
        if check_grid and grid is not None and any(map(ge, coords, grid)):
            raise ChunkOutOfGridError(chunk_key, coords, grid)
        shard_coords, local = chunk_to_shard(coords, self.chunks_per_shard)
        shard_key = self._shard_keys.get(shard_coords) or self._remember_shard_key(shard_coords)
        return ChunkRef(chunk_key, shard_key, shard_coords, local, self)

    @cached_property
    def _shard_keys(self) -> dict[tuple[int, ...], str]:
        """Memo of shard keys by shard coords (one entry per shard touched)."""
        return {}

    def _remember_shard_key(self, shard_coords: tuple[int, ...]) -> str:
        shard_key = self._shard_keys[shard_coords] = self.shard_key(shard_coords)
        return shard_key

    def locate_batch(self, chunk_keys: Sequence[str], *, check_grid: bool = True) -> list[ChunkRef] | None:
        """:meth:`locate` of every key at once, or ``None`` when one key needs :meth:`locate` to say why not.

        One regular expression checks the joined keys and numpy parses their
        coordinates in one call; ``None`` (nothing raised) for a key that is
        not canonical, outside the grid (with ``check_grid``) or of a 19-digit
        coordinate, and for a 0-d array. Chunks of one shard share its coords tuple.
        """
        import numpy as np

        pattern, form = self._batch_pattern, self.chunk_key_form
        if pattern is None or form is None or not chunk_keys:
            return None
        try:
            text = "\n".join(chunk_keys)
        except TypeError:  # a key that is not a str
            return None
        if pattern.fullmatch(text) is None:
            return None
        head, sep = form
        flat = np.fromstring(text.replace("\n" + head, " ")[len(head) :].replace(sep, " "), dtype=np.int64, sep=" ")
        if flat.size != len(chunk_keys) * self.ndim:  # a key holding a line break that mimics several keys
            return None
        coords = flat.reshape(len(chunk_keys), self.ndim)
        grid = self.chunk_grid_shape
        if check_grid and grid is not None and (coords >= np.array(grid, dtype=np.int64)).any():
            return None
        shards, local = np.divmod(coords, np.array(self.chunks_per_shard, dtype=np.int64))
        by_shard, by_local = _distinct_rows(shards), _distinct_rows(local)
        if by_shard is None or by_local is None:
            return None
        (shard_ids, shard_of_id), (local_ids, local_of_id) = by_shard, by_local
        memo = self._shard_keys
        key_of_id = {i: memo.get(sc) or self._remember_shard_key(sc) for i, sc in shard_of_id.items()}
        return list(
            map(
                ChunkRef,
                chunk_keys,
                map(key_of_id.__getitem__, shard_ids),
                map(shard_of_id.__getitem__, shard_ids),
                map(local_of_id.__getitem__, local_ids),
                itertools.repeat(self),
            )
        )

    @cached_property
    def chunk_key_form(self) -> tuple[str, str] | None:
        """``(head, separator)`` when every chunk key is ``head + separator.join(coords)`` (head: prefix included)."""
        if self.ndim == 0:
            return None
        return self.key_prefix + self.chunk_key_encoding.head, self.chunk_key_encoding.separator

    @cached_property
    def _batch_pattern(self) -> re.Pattern[str] | None:
        """The expression every key of a :meth:`locate_batch` text matches, or ``None`` (no batch path)."""
        if self.chunk_key_form is None:
            return None
        head, sep = map(re.escape, self.chunk_key_form)
        row = head + _COORD + (sep + _COORD) * (self.ndim - 1)
        return re.compile(f"{row}(?:\n{row})*")

    def shard_coords_of(self, shard_key: str) -> tuple[int, ...] | None:
        """Shard coords of a stored key, or ``None`` if it is not a shard key of this array."""
        if not shard_key.startswith(self.key_prefix):
            return None
        try:
            return self.shard_key_encoding.decode(shard_key[len(self.key_prefix) :], self.ndim)
        except ValueError:
            return None

    def chunk_coords(self, shard_coords: Sequence[int], local_coords: Sequence[int]) -> tuple[int, ...]:
        """Chunk coords of the inner chunk at ``local_coords`` of a shard (the inverse of :func:`chunk_to_shard`)."""
        return tuple(s * n + i for s, n, i in zip(shard_coords, self.chunks_per_shard, local_coords, strict=True))

    def in_grid(self, chunk_coords: Sequence[int]) -> bool:
        """True when the chunk lies inside the chunk grid (always, when the grid is unknown)."""
        grid = self.chunk_grid_shape
        return grid is None or all(c < g for c, g in zip(chunk_coords, grid, strict=True))

    def shard_in_grid(self, shard_coords: Sequence[int]) -> bool:
        """True when every inner chunk of the shard lies inside the chunk grid (always, when the grid is unknown)."""
        return self.n_chunks_in_shard(shard_coords) == self.layout.n_chunks

    def chunks_in_shard(self, shard_coords: Sequence[int]) -> Iterator[tuple[tuple[int, ...], tuple[int, ...]]]:
        """``(chunk_coords, local_coords)`` of the shard's available chunks (inside the grid when known)."""
        return shard_to_chunks(shard_coords, self.chunks_per_shard, self.chunk_grid_shape)

    def extent(self, shard_coords: Sequence[int], in_grid_only: bool = True) -> list[range]:
        """The chunk coords a shard spans along each dimension (clipped to the grid when known and ``in_grid_only``)."""
        return shard_extent(shard_coords, self.chunks_per_shard, self.chunk_grid_shape if in_grid_only else None)

    def n_chunks_in_shard(self, shard_coords: Sequence[int]) -> int:
        """How many of the shard's inner chunks are available (inside the grid when known)."""
        grid = self.chunk_grid_shape
        if grid is None:
            return self.layout.n_chunks
        return prod(map(len, shard_extent(shard_coords, self.chunks_per_shard, grid)))

    def shard_keys(self) -> Iterator[tuple[str, tuple[int, ...]]]:
        """Every possible shard key of the array with its shard coords, row-major; ValueError if the grid is unknown."""
        grid = self.shard_grid_shape
        if grid is None:
            raise ValueError(f"the shard grid of array {self.path!r} is unknown (no shape or chunk shape)")
        for coords in itertools.product(*(range(n) for n in grid)):
            yield self.shard_key(coords), coords


def _distinct_rows(rows: np.ndarray) -> tuple[list[int], dict[int, tuple[int, ...]]] | None:
    """Each row's id and one tuple per distinct id, of a 2-d ``int64`` array (``None``: rows too far apart)."""
    import numpy as np

    low = rows.min(axis=0)
    try:
        ids = np.ravel_multi_index((rows - low).T, tuple((rows.max(axis=0) - low + 1).tolist())).tolist()
    except ValueError:  # more row positions between the extremes than intp numbers
        return None
    first = dict(zip(reversed(ids), range(len(ids) - 1, -1, -1), strict=True))  # id -> its first row
    return ids, dict(zip(first, map(tuple, rows[list(first.values())].tolist()), strict=True))
