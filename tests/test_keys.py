"""Chunk key encodings, the chunk grid -> shard grid mapping, and key hygiene."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardkv import ConfigurationError, InvalidKeyError
from shardkv.keys.paths import join_path, validate_key
from shardkv.keys.space import (
    DefaultChunkKeyEncoding,
    Draft2022ChunkKeyEncoding,
    V2ChunkKeyEncoding,
    chunk_key_encoding_from_metadata,
    chunk_to_shard,
    grid_shape,
    shard_to_chunks,
)

ENCODINGS = [
    pytest.param(V2ChunkKeyEncoding("."), id="v2-dot"),
    pytest.param(V2ChunkKeyEncoding("/"), id="v2-slash"),
    pytest.param(DefaultChunkKeyEncoding("/"), id="default-slash"),
    pytest.param(DefaultChunkKeyEncoding("."), id="default-dot"),
    pytest.param(Draft2022ChunkKeyEncoding("/"), id="draft2022-slash"),
    pytest.param(Draft2022ChunkKeyEncoding("."), id="draft2022-dot"),
]


@pytest.mark.parametrize(
    "encoding, key_1_2, key_0d",
    [
        pytest.param(V2ChunkKeyEncoding("."), "1.2", "0", id="v2-dot"),
        pytest.param(V2ChunkKeyEncoding("/"), "1/2", "0", id="v2-slash"),
        pytest.param(DefaultChunkKeyEncoding("/"), "c/1/2", "c", id="default-slash"),
        pytest.param(DefaultChunkKeyEncoding("."), "c.1.2", "c", id="default-dot"),
        pytest.param(Draft2022ChunkKeyEncoding("/"), "c1/2", "c", id="draft2022-slash"),
    ],
)
def test_encoding_table(encoding, key_1_2: str, key_0d: str) -> None:
    assert encoding.encode((1, 2)) == key_1_2
    assert encoding.decode(key_1_2, 2) == (1, 2)
    assert encoding.encode(()) == key_0d
    assert encoding.decode(key_0d, 0) == ()


def test_default_separators() -> None:
    assert V2ChunkKeyEncoding().separator == "."
    assert DefaultChunkKeyEncoding().separator == "/"


@pytest.mark.parametrize("encoding", ENCODINGS)
@given(coords=st.lists(st.integers(0, 10**12), max_size=5).map(tuple))
def test_round_trip(encoding, coords: tuple[int, ...]) -> None:
    key = encoding.encode(coords)
    assert encoding.decode(key, len(coords)) == coords
    assert validate_key(key) == key  # every chunk key is a valid store key


@pytest.mark.parametrize("encoding", ENCODINGS)
@given(
    a=st.lists(st.integers(0, 999), min_size=1, max_size=4).map(tuple),
    b=st.lists(st.integers(0, 999), min_size=1, max_size=4).map(tuple),
)
def test_distinct_chunks_get_distinct_keys(encoding, a: tuple[int, ...], b: tuple[int, ...]) -> None:
    if len(a) == len(b) and a != b:
        assert encoding.encode(a) != encoding.encode(b)


def _prefix(encoding) -> str:
    return {"v2": "", "default": "c" + encoding.separator, "draft2022": "c"}[encoding.name]


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize(
    "coord",
    [
        pytest.param("01", id="leading-zero"),
        pytest.param("00", id="double-zero"),
        pytest.param("-1", id="negative"),
        pytest.param("+1", id="plus-sign"),
        pytest.param("1.", id="trailing-dot"),
        pytest.param("", id="empty"),
        pytest.param(" 1", id="space"),
        pytest.param("1_0", id="underscore"),
        pytest.param("\u0661", id="arabic-indic-digit"),
        pytest.param("0x1", id="hex"),
    ],
)
def test_non_canonical_coordinates_rejected(encoding, coord: str) -> None:
    key = _prefix(encoding) + coord
    with pytest.raises(ValueError):
        encoding.decode(key, 1)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_wrong_number_of_coordinates_rejected(encoding) -> None:
    key = encoding.encode((1, 2, 3))
    with pytest.raises(ValueError, match="coordinate"):
        encoding.decode(key, 2)
    with pytest.raises(ValueError):
        encoding.decode(key, 4)


@pytest.mark.parametrize(
    "encoding, key",
    [
        pytest.param(DefaultChunkKeyEncoding("/"), "1/2", id="default-without-c"),
        pytest.param(DefaultChunkKeyEncoding("/"), "c.1.2", id="default-wrong-separator"),
        pytest.param(Draft2022ChunkKeyEncoding("/"), "1/2", id="draft-without-c"),
        pytest.param(V2ChunkKeyEncoding("."), "1/2", id="v2-dot-given-slash"),
        pytest.param(V2ChunkKeyEncoding("."), "c1.2", id="v2-with-c"),
    ],
)
def test_foreign_forms_rejected(encoding, key: str) -> None:
    with pytest.raises(ValueError):
        encoding.decode(key, 2)


@pytest.mark.parametrize(
    "encoding, key",
    [
        pytest.param(V2ChunkKeyEncoding("."), "1", id="v2"),
        pytest.param(DefaultChunkKeyEncoding("/"), "c/0", id="default"),
        pytest.param(Draft2022ChunkKeyEncoding("/"), "c0", id="draft2022"),
    ],
)
def test_0d_accepts_only_its_one_key(encoding, key: str) -> None:
    with pytest.raises(ValueError, match="0-d"):
        encoding.decode(key, 0)


@pytest.mark.parametrize("cls", [V2ChunkKeyEncoding, DefaultChunkKeyEncoding, Draft2022ChunkKeyEncoding])
def test_bad_separator(cls) -> None:
    with pytest.raises(ConfigurationError, match="'-'"):
        cls("-")


def test_metadata_round_trip() -> None:
    for enc in (
        V2ChunkKeyEncoding("."),
        V2ChunkKeyEncoding("/"),
        DefaultChunkKeyEncoding("/"),
        DefaultChunkKeyEncoding("."),
    ):
        assert chunk_key_encoding_from_metadata(enc.to_metadata()) == enc
    assert V2ChunkKeyEncoding("/").to_metadata() == {"name": "v2", "configuration": {"separator": "/"}}
    assert chunk_key_encoding_from_metadata({"name": "default"}) == DefaultChunkKeyEncoding("/")
    assert chunk_key_encoding_from_metadata({"name": "v2"}) == V2ChunkKeyEncoding(".")
    assert Draft2022ChunkKeyEncoding("/").to_metadata() == {"type": "regular", "separator": "/"}


def test_unknown_metadata_encoding() -> None:
    with pytest.raises(ConfigurationError, match="unknown chunk_key_encoding"):
        chunk_key_encoding_from_metadata({"name": "fancy"})


# -- grids ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape, chunks, grid",
    [
        pytest.param((10,), (5,), (2,), id="exact"),
        pytest.param((11,), (5,), (3,), id="edge"),
        pytest.param((0, 4), (3, 3), (0, 2), id="zero-length"),
        pytest.param((), (), (), id="0d"),
    ],
)
def test_grid_shape(shape, chunks, grid) -> None:
    assert grid_shape(shape, chunks) == grid


def test_chunk_to_shard_example() -> None:
    # the module docstring's example: chunk (5, 3), chunks_per_shard (4, 2) -> shard (1, 1), local (1, 1)
    assert chunk_to_shard((5, 3), (4, 2)) == ((1, 1), (1, 1))


@st.composite
def grids(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...]]:
    ndim = draw(st.integers(1, 3))
    cps = tuple(draw(st.integers(1, 4)) for _ in range(ndim))
    grid = tuple(draw(st.integers(0, 9)) for _ in range(ndim))
    return cps, grid


@settings(deadline=None)  # up to 729 chunks, each looked up in its shard: timing varies on a loaded 2-core CI
@given(g=grids())
def test_chunk_to_shard_and_shard_to_chunks_are_inverse(g) -> None:
    cps, grid = g
    all_chunks = list(itertools.product(*(range(n) for n in grid)))
    shard_grid = grid_shape(grid, cps)
    seen: list[tuple[int, ...]] = []
    for shard in itertools.product(*(range(n) for n in shard_grid)):
        for chunk, local in shard_to_chunks(shard, cps, grid):
            assert chunk_to_shard(chunk, cps) == (shard, local)
            assert all(0 <= i < n for i, n in zip(local, cps, strict=True))
            seen.append(chunk)
    # every chunk of the grid belongs to exactly one shard
    assert sorted(seen) == sorted(all_chunks)
    for chunk in all_chunks:
        shard, local = chunk_to_shard(chunk, cps)
        assert (chunk, local) in list(shard_to_chunks(shard, cps, grid))


def test_shard_to_chunks_without_grid_yields_the_full_shard_row_major() -> None:
    assert list(shard_to_chunks((1, 0), (2, 2))) == [
        ((2, 0), (0, 0)),
        ((2, 1), (0, 1)),
        ((3, 0), (1, 0)),
        ((3, 1), (1, 1)),
    ]
    assert list(shard_to_chunks((1, 0), (2, 2), (3, 1))) == [((2, 0), (0, 0))]  # edge shard


# -- key hygiene ------------------------------------------------------------------


@pytest.mark.parametrize("key", ["a", "a/b/c", ".zarray", "g/a/0.0", "c/0/1", "a..b", "..a", "a."])
def test_valid_keys(key: str) -> None:
    assert validate_key(key) == key


@pytest.mark.parametrize(
    "key, rule",
    [
        pytest.param("", "empty key", id="empty"),
        pytest.param("/a", "empty path segment", id="leading-slash"),
        pytest.param("a/", "empty path segment", id="trailing-slash"),
        pytest.param("a//b", "empty path segment", id="double-slash"),
        pytest.param("/", "empty path segment", id="only-slash"),
        pytest.param("..", "'..'", id="dotdot"),
        pytest.param("a/../b", "'..'", id="dotdot-inside"),
        pytest.param("a/./b", "'.'", id="dot-inside"),
        pytest.param(".", "'.'", id="dot"),
    ],
)
def test_invalid_keys(key: str, rule: str) -> None:
    with pytest.raises(InvalidKeyError, match=rule) as info:
        validate_key(key)
    assert info.value.key == key


@pytest.mark.parametrize(
    "key",
    [
        pytest.param(b"a", id="bytes"),
        pytest.param(1, id="int"),
        pytest.param(None, id="None"),
        pytest.param(("a",), id="tuple"),
    ],
)
def test_non_str_keys(key: object) -> None:
    with pytest.raises(TypeError, match="str"):
        validate_key(key)


def test_join_path() -> None:
    assert join_path("", "0.0") == "0.0"
    assert join_path("g/a", "0.0") == "g/a/0.0"
