"""The node states of the v2 proxy and the owner of a key (shardkv.proxy.nodes)."""

from __future__ import annotations

import json

import pytest

from shardkv import ConfigurationError, ShardedStore
from shardkv.proxy.nodes import NOT_ARRAY, UNSHARDED, NodeCache, ShardedNode
from shardkv.storage.adapters import adapt


def zarray(shape=(8, 8), chunks=(2, 2), sep=".") -> bytes:
    return json.dumps(
        {"zarr_format": 2, "shape": list(shape), "chunks": list(chunks), "dtype": "|u1", "compressor": None,
         "fill_value": 0, "filters": None, "order": "C", "dimension_separator": sep}
    ).encode()  # fmt: skip


@pytest.fixture
def base() -> dict:
    base: dict = {}
    proxy = ShardedStore(base, chunks_per_shard={"g/sharded": 2, "g/nested": 2})
    proxy[".zgroup"] = proxy["g/.zgroup"] = b'{"zarr_format": 2}'
    proxy["g/sharded/.zarray"] = zarray()
    proxy["g/nested/.zarray"] = zarray(sep="/")
    proxy["g/plain/.zarray"] = zarray()
    return base


def test_states_are_typed(base: dict) -> None:
    nodes = NodeCache(adapt(base))
    assert nodes.state("g") is NOT_ARRAY and nodes.state("nothing/here") is NOT_ARRAY
    assert nodes.state("g/plain") is UNSHARDED
    node = nodes.state("g/sharded")
    assert isinstance(node, ShardedNode)
    assert node.array.chunks_per_shard == (2, 2) and node.view["codecs"][0]["name"] == "sharding_indexed"


@pytest.mark.parametrize(
    "key, owner",
    [
        ("g/sharded/3.1", "g/sharded"),
        ("g/nested/3/1", "g/nested"),
        ("g/plain/3.1", None),  # unsharded arrays pass through
        ("g/sharded/.zattrs", None),
        ("g/sharded/notes/0", None),  # a name that is not chunk-like between the array and the key
        ("g/0.0", None),
    ],
)
def test_owner(base: dict, key: str, owner: str | None) -> None:
    arr = NodeCache(adapt(base)).owner(key)
    assert (arr.path if arr is not None else None) == owner


def test_states_are_read_once_and_forgotten_on_request(base: dict) -> None:
    nodes = NodeCache(adapt(base))
    assert isinstance(nodes.state("g/sharded"), ShardedNode)
    del base["g/sharded/zarr.json"]  # issue 11: the array is its zarr.json alone
    assert isinstance(nodes.state("g/sharded"), ShardedNode)  # cached
    nodes.forget_under("g")
    assert nodes.state("g/sharded") is NOT_ARRAY


def test_a_view_that_contradicts_the_zarray_is_refused(base: dict) -> None:
    base["g/sharded/.zarray"] = zarray(chunks=(4, 4))
    with pytest.raises(ConfigurationError, match="g/sharded"):
        NodeCache(adapt(base)).state("g/sharded")
