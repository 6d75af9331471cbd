"""The helpers every layer shares: range resolution, JSON documents, key owners, chunks_per_shard rules."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardkv.codecs.inner import BLOSC_SHUFFLE_IDS, codec_from_config
from shardkv.codecs.sharding import ShardingCodec
from shardkv.errors import ConfigurationError, MetadataError
from shardkv.format.layout import ShardLayout
from shardkv.format.ranges import ByteRange
from shardkv.keys.paths import join_path, owner_candidates, owning_array, split_key
from shardkv.metadata.chunks_per_shard import ChunksPerShardRule, check_chunks_per_shard
from shardkv.metadata.documents import dump_json, load_json
from shardkv.metadata.v3_view import v3_view_of_v2

# -- ByteRange.resolve ------------------------------------------------------------------


@pytest.mark.parametrize(
    "byte_range, size, clamped, as_stated",
    [
        (ByteRange(2, 5), 10, (2, 5), (2, 5)),
        (ByteRange(2), 10, (2, 10), (2, 10)),
        (ByteRange.suffix(4), 10, (6, 10), (6, 10)),
        (ByteRange.suffix(20), 10, (0, 10), (-10, 10)),
        (ByteRange(12, 15), 10, (10, 10), (12, 15)),
        (ByteRange(2, 15), 10, (2, 10), (2, 15)),
    ],
    ids=["inside", "open-end", "suffix", "suffix-longer-than-object", "past-the-end", "stop-past-the-end"],
)
def test_resolve(byte_range: ByteRange, size: int, clamped: tuple, as_stated: tuple) -> None:
    assert byte_range.resolve(size) == clamped
    assert byte_range.resolve(size, clamp=False) == as_stated


@given(data=st.binary(max_size=40), start=st.integers(-50, 50), length=st.none() | st.integers(0, 50))
def test_resolve_slices_like_python(data: bytes, start: int, length: int | None) -> None:
    if start < 0:
        r, expected = ByteRange(start), data[start:]
    else:
        stop = None if length is None else start + length
        r, expected = ByteRange(start, stop), data[start:stop]
    a, b = r.resolve(len(data))
    assert data[a:b] == expected
    assert 0 <= a <= b <= len(data)


# -- JSON documents ---------------------------------------------------------------------


def test_dump_json_writes_as_zarr_python_2() -> None:
    assert dump_json({"b": [1, 2], "a": "é"}) == b'{\n    "a": "\\u00e9",\n    "b": [\n        1,\n        2\n    ]\n}'


def test_dump_json_strict_refuses_nan_naming_the_key() -> None:
    assert dump_json({"x": math.nan}) == b'{\n    "x": NaN\n}'  # zarr-python 2 writes .zattrs so
    with pytest.raises(MetadataError, match="g/zarr.json") as info:
        dump_json({"x": math.nan}, key="g/zarr.json", strict=True)
    assert isinstance(info.value, ValueError) and info.value.key == "g/zarr.json"


@pytest.mark.parametrize("raw", [b"{", b"\xff\xfe", b""], ids=["truncated", "not-utf8", "empty"])
def test_load_json_names_the_document(raw: bytes) -> None:
    with pytest.raises(MetadataError, match="a/.zarray") as info:
        load_json("a/.zarray", raw)
    assert isinstance(info.value, ConfigurationError)
    assert load_json("k", b'{"a": 1}') == {"a": 1}


# -- which array owns a key ----------------------------------------------------------------


@pytest.mark.parametrize(
    "key, arrays, owner",
    [
        ("a/b/0.0", {"a/b"}, "a/b"),
        ("a/b/0/0", {"a/b"}, "a/b"),
        ("a/b/.zarray", {"a/b"}, "a/b"),
        ("a/.zgroup", {"a/b"}, None),
        ("0.0", {""}, ""),
        ("x/0.0", {"", "x"}, ""),  # the first array met from the root
        ("a/bc/0", {"a/b"}, None),  # a path, not a string prefix
    ],
)
def test_owning_array(key: str, arrays: set, owner: str | None) -> None:
    assert owning_array(key, arrays) == owner


def test_owner_candidates_filter_by_next_segment() -> None:
    chunk = lambda s: s.startswith("c")  # noqa: E731
    assert list(owner_candidates("a/b/c0/1", chunk)) == ["a/b"]
    assert list(owner_candidates("a/b/c0/1")) == ["", "a", "a/b", "a/b/c0"]
    assert owning_array("a/x/c0/1", {"a", "a/x"}, chunk) == "a/x"  # "a" is followed by "x": not its chunk
    assert owning_array("a/x/1", {"a"}, chunk) is None


def test_split_and_join() -> None:
    assert split_key("g/a/.zarray") == ("g/a", ".zarray") and split_key("0.0") == ("", "0.0")
    assert join_path("", "x") == "x" and join_path("g", "x") == "g/x"


# -- chunks_per_shard ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "option, path, ndim, expected",
    [
        (4, "a", 2, (4, 4)),
        ((2, 3), "a", 2, (2, 3)),
        ([2, 3], "a", 3, None),  # for 2-d arrays only
        (4, "a", 0, None),  # 0-d arrays are never sharded
        (None, "a", 2, None),
        ({"/a/": 2, "b": [1, 2]}, "a", 2, (2, 2)),
        ({"b": [1, 2]}, "a", 2, None),
    ],
)
def test_rule_for_array(option, path: str, ndim: int, expected) -> None:
    assert ChunksPerShardRule.parse(option).for_array(path, ndim) == expected


def test_rule_names_what_does_not_fit() -> None:
    rule = ChunksPerShardRule.parse({"a": (2, 0), "b": (2, 2, 2)})
    with pytest.raises(ConfigurationError, match="'a'"):
        rule.for_array("a", 2)
    with pytest.raises(ConfigurationError, match="3 value"):
        rule.for_array("b", 2)
    assert ChunksPerShardRule.parse((2, 3)).why_unsharded("x", 3) == "3-d; chunks_per_shard 2,3 is for 2-d arrays"


@pytest.mark.parametrize("value", [0, -1, True, (), (2, 0), "a", 1.5, None, {"a": 2}])
def test_check_chunks_per_shard_refuses(value) -> None:
    with pytest.raises(ConfigurationError):
        check_chunks_per_shard(value)


# -- codecs ----------------------------------------------------------------------------------


def test_the_registry_knows_the_sharding_codec() -> None:
    config = {
        "name": "sharding_indexed",
        "configuration": {
            "chunk_shape": [2],
            "codecs": [{"name": "bytes"}],
            "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
            "index_location": "end",
        },
    }
    assert isinstance(codec_from_config(config), ShardingCodec)


@pytest.mark.parametrize("shuffle", sorted(BLOSC_SHUFFLE_IDS))
def test_one_blosc_shuffle_table(shuffle: str) -> None:
    zarray = {
        "shape": [4],
        "chunks": [2],
        "dtype": "<i2",
        "fill_value": 0,
        "order": "C",
        "filters": None,
        "compressor": {"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": BLOSC_SHUFFLE_IDS[shuffle]},
    }
    view = v3_view_of_v2(zarray, {}, ShardLayout.v3((2,), "end", "little", True)).metadata
    blosc = view["codecs"][0]["configuration"]["codecs"][-1]
    assert blosc["configuration"]["shuffle"] == shuffle
    assert codec_from_config(blosc).shuffle == shuffle
