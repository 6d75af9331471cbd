"""storage_transformers metadata entries -> the array's one sharding transformer; unknown ones refused."""

from __future__ import annotations

import pytest

from shardkv.errors import ConfigurationError, UnsupportedError
from shardkv.transformers import (
    SHARDING_EXTENSION,
    AdapterStore,
    ShardingStorageTransformer,
    build_stack,
    storage_transformer_entries,
)

META = {"shape": [8, 8], "chunk_grid": {"type": "regular", "chunk_shape": [2, 2], "separator": "/"}}


def entry(cps, type="indexed", extension=SHARDING_EXTENSION):
    return {"extension": extension, "type": type, "configuration": {"chunks_per_shard": cps}}


def test_the_sharding_entry_builds_the_sharding_transformer():
    assert isinstance(build_stack([entry([2, 2])], META, "a", AdapterStore({})), ShardingStorageTransformer)


@pytest.mark.parametrize(
    "bad",
    [entry([2, 2], extension="https://example.org/unknown/1.0"), entry([2, 2], type="hashed")],
    ids=["unknown-extension", "unknown-type"],
)
def test_unknown_transformers_are_refused_with_their_name(bad):
    with pytest.raises(UnsupportedError) as info:
        build_stack([bad], META, "arr", AdapterStore({}))
    message = str(info.value)
    assert f"storage transformer {bad['extension']!r} of type {bad['type']!r}" in message  # names the entry
    assert message.startswith("array 'arr': ")
    assert isinstance(info.value, UnsupportedError) and isinstance(info.value, NotImplementedError)
    assert bad["extension"] in str(info.value) and "indexed" in str(info.value)


def test_a_stack_with_one_unknown_entry_is_refused_whole():
    with pytest.raises(UnsupportedError):
        build_stack([entry([2, 2]), entry([1, 1], type="other")], META, "a", AdapterStore({}))


def test_malformed_entries():
    with pytest.raises(ConfigurationError, match="extension"):
        build_stack([{"type": "indexed"}], META, "a", AdapterStore({}))
    with pytest.raises(ConfigurationError, match="must be a list"):
        storage_transformer_entries({"storage_transformers": {"extension": SHARDING_EXTENSION}})
    assert storage_transformer_entries({}) == []


@pytest.mark.parametrize("cps", [[2], [2, 2, 2], [0, 2], [2, "2"], None, [True, 2]])
def test_chunks_per_shard_must_have_one_positive_int_per_dimension(cps):
    with pytest.raises(ConfigurationError, match="chunks_per_shard"):
        build_stack([entry(cps)], META, "a", AdapterStore({}))


def test_a_stack_of_sharding_transformers_is_refused_naming_them_and_why():
    """Two stacked sharding transformers take their shard locks in opposite orders: refused, never built."""
    base = AdapterStore({})
    with pytest.raises(UnsupportedError) as info:
        build_stack([entry([1, 2]), entry([2, 1])], META, "a", base)
    message = str(info.value)
    assert message.startswith("array 'a': 2 sharding storage transformers are stacked")
    assert "[1, 2]" in message and "[2, 1]" in message and "opposite orders" in message
    one = build_stack([entry([2, 1])], META, "a", base)
    with pytest.raises(UnsupportedError, match="stacked"):  # nor by hand
        ShardingStorageTransformer(one, (1, 2), array_path="a")
    assert base.list() == []


def test_no_entries_is_the_store_itself():
    base = AdapterStore({})
    assert build_stack([], META, "a", base) is base


def test_metadata_round_trip():
    t = ShardingStorageTransformer.from_metadata(entry([4, 1]), META, "x/y", AdapterStore({}))
    assert t.to_metadata() == entry([4, 1])
    assert t.key_prefix == "data/root/x/y/" and t.encoding.separator == "/"
    root = ShardingStorageTransformer(AdapterStore({}), (2,))
    assert root.key_prefix == "data/root/" and root.chunk_key((3,)) == "data/root/c3"
