"""Chunk key encodings and the chunk grid -> shard grid mapping. Pure logic.

Encodings (the part of a key after the array's path):

======================  ==============  ==================  ===================
encoding                chunk (1, 2)    0-d chunk           where specified
======================  ==============  ==================  ===================
``v2`` ``"."``          ``1.2``         ``0``               Zarr v2; v3 core "v2"
``v2`` ``"/"``          ``1/2``         ``0``               Zarr v2; v3 core "v2"
``default`` ``"/"``     ``c/1/2``       ``c``               v3 core "default"
``default`` ``"."``     ``c.1.2``       ``c``               v3 core "default"
``draft2022`` ``"/"``   ``c1/2``        ``c``               2022 draft, under ``data/root/<path>/``
======================  ==============  ==================  ===================

Every decoder accepts only the canonical form its encoder writes (decimal
digits, no sign, no leading zeros), so one chunk has exactly one key.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from math import ceil
from operator import floordiv, mod
from typing import Any, Literal

from shardkv.errors import ConfigurationError, InvalidKeyError

Separator = Literal[".", "/"]


def _check_separator(separator: str) -> None:
    if separator not in (".", "/"):
        raise ConfigurationError(f"chunk key separator must be '.' or '/', got {separator!r}")


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
    """Base of the chunk key encodings: maps chunk coords to a key suffix and back.

    Parameters
    ----------
    separator : {".", "/"}
        The character between coordinates.
    """

    separator: Separator = "/"

    name = "abstract"

    def __post_init__(self) -> None:
        _check_separator(self.separator)

    def encode(self, chunk_coords: Sequence[int]) -> str:
        """The key suffix (relative to the array path) of a chunk."""
        raise NotImplementedError

    def decode(self, suffix: str, ndim: int) -> tuple[int, ...]:
        """Chunk coords from a key suffix.

        Raises
        ------
        ValueError
            If ``suffix`` is not the canonical key of an ``ndim``-dimensional chunk
            in this encoding (the message says which rule it breaks).
        """
        raise NotImplementedError

    def to_metadata(self) -> dict[str, Any]:
        """The v3 ``chunk_key_encoding`` metadata object."""
        return {"name": self.name, "configuration": {"separator": self.separator}}


@dataclass(frozen=True, slots=True)
class V2ChunkKeyEncoding(ChunkKeyEncoding):
    """Zarr v2 keys (``1.2`` or ``1/2``); also the v3 core ``v2`` encoding."""

    separator: Separator = "."
    name = "v2"

    def encode(self, chunk_coords: Sequence[int]) -> str:
        if len(chunk_coords) == 0:
            return "0"
        return self.separator.join(str(int(c)) for c in chunk_coords)

    def decode(self, suffix: str, ndim: int) -> tuple[int, ...]:
        if ndim == 0:
            if suffix != "0":
                raise ValueError("the only chunk of a 0-d array has the key '0'")
            return ()
        return _decode_ints(suffix, self.separator, ndim)


@dataclass(frozen=True, slots=True)
class DefaultChunkKeyEncoding(ChunkKeyEncoding):
    """v3 core ``default`` keys: ``c/1/2`` (or ``c.1.2``), ``c`` for 0-d."""

    separator: Separator = "/"
    name = "default"

    def encode(self, chunk_coords: Sequence[int]) -> str:
        if len(chunk_coords) == 0:
            return "c"
        return "c" + self.separator + self.separator.join(str(int(c)) for c in chunk_coords)

    def decode(self, suffix: str, ndim: int) -> tuple[int, ...]:
        if ndim == 0:
            if suffix != "c":
                raise ValueError("the only chunk of a 0-d array has the key 'c'")
            return ()
        head = "c" + self.separator
        if not suffix.startswith(head):
            raise ValueError(f"a 'default' chunk key starts with {head!r}")
        return _decode_ints(suffix[len(head) :], self.separator, ndim)


@dataclass(frozen=True, slots=True)
class Draft2022ChunkKeyEncoding(ChunkKeyEncoding):
    """2022 draft keys under ``data/root/<path>/``: ``c1/2`` (or ``c1.2``)."""

    separator: Separator = "/"
    name = "draft2022"

    def encode(self, chunk_coords: Sequence[int]) -> str:
        return "c" + self.separator.join(str(int(c)) for c in chunk_coords)

    def decode(self, suffix: str, ndim: int) -> tuple[int, ...]:
        if not suffix.startswith("c"):
            raise ValueError("a draft chunk key starts with 'c'")
        if ndim == 0:
            if suffix != "c":
                raise ValueError("the only chunk of a 0-d array has the key 'c'")
            return ()
        return _decode_ints(suffix[1:], self.separator, ndim)

    def to_metadata(self) -> dict[str, Any]:
        return {"type": "regular", "separator": self.separator}


def chunk_key_encoding_from_metadata(meta: dict[str, Any]) -> ChunkKeyEncoding:
    """The encoding described by a v3 ``chunk_key_encoding`` object.

    Raises
    ------
    ConfigurationError
        If the name is unknown or the separator invalid.
    """
    name = meta.get("name")
    separator = (meta.get("configuration") or {}).get("separator")
    if name == "default":
        return DefaultChunkKeyEncoding(separator or "/")
    if name == "v2":
        return V2ChunkKeyEncoding(separator or ".")
    raise ConfigurationError(f"unknown chunk_key_encoding {meta!r}; expected name 'default' or 'v2'")


# -- grids ---------------------------------------------------------------


def grid_shape(shape: Sequence[int], chunks: Sequence[int]) -> tuple[int, ...]:
    """Number of chunks along each dimension: ``ceil(shape / chunks)`` (elements)."""
    return tuple(ceil(s / c) for s, c in zip(shape, chunks, strict=True))


def chunk_to_shard(
    chunk_coords: Sequence[int], chunks_per_shard: Sequence[int]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Split chunk coords into ``(shard_coords, local_coords)``.

    ``shard_coords = chunk_coords // chunks_per_shard`` and
    ``local_coords = chunk_coords % chunks_per_shard``, per dimension (draft
    2022 "Key & value transformation").
    """
    shard = tuple(map(floordiv, chunk_coords, chunks_per_shard))  # map of operators: no Python frame per dimension
    local = tuple(map(mod, chunk_coords, chunks_per_shard))
    return shard, local


def shard_to_chunks(
    shard_coords: Sequence[int],
    chunks_per_shard: Sequence[int],
    chunk_grid_shape: Sequence[int] | None = None,
) -> Iterator[tuple[tuple[int, ...], tuple[int, ...]]]:
    """``(chunk_coords, local_coords)`` of the chunks of a shard, in row-major order.

    With ``chunk_grid_shape``, only chunks inside the array's chunk grid are
    yielded (edge shards hold fewer).
    """
    import itertools

    ranges = []
    for d, (s, n) in enumerate(zip(shard_coords, chunks_per_shard, strict=True)):
        stop = n if chunk_grid_shape is None else max(0, min(n, chunk_grid_shape[d] - s * n))
        ranges.append(range(stop))
    for local in itertools.product(*ranges):
        yield shard_to_chunk(shard_coords, chunks_per_shard, local), local


def shard_to_chunk(
    shard_coords: Sequence[int], chunks_per_shard: Sequence[int], local_coords: Sequence[int]
) -> tuple[int, ...]:
    """Chunk coords of the inner chunk at ``local_coords`` of a shard (the inverse of :func:`chunk_to_shard`)."""
    return tuple(s * n + i for s, n, i in zip(shard_coords, chunks_per_shard, local_coords, strict=True))


# -- key hygiene ---------------------------------------------------------


def validate_key(key: object) -> str:
    """Check the rules every key obeys and return it.

    A key is a ``str`` of ``/``-separated segments, none empty, none made of
    periods only (``.``, ``..``), with no leading or trailing ``/`` (v3 core
    "Node names").

    Raises
    ------
    TypeError
        If ``key`` is not a ``str``.
    InvalidKeyError
        If a rule is broken (the error names the key and the rule).
    """
    if not isinstance(key, str):
        raise TypeError(f"store keys are str, got {type(key).__name__}: {key!r}")
    if key == "":
        raise InvalidKeyError(key, "the empty key names no entry")
    for segment in key.split("/"):
        if segment == "":
            raise InvalidKeyError(key, "empty path segment (leading, trailing or doubled '/')")
        if set(segment) == {"."}:
            raise InvalidKeyError(key, f"path segment {segment!r} (only periods) is not allowed")
    return key
