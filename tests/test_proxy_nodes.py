"""The node table of the v2 proxy and the owner of a key (shardkv.proxy.nodes)."""

from __future__ import annotations

import json

import pytest

from shardkv import ConfigurationError, ShardedStore
from shardkv.proxy.nodes import NodeTable
from shardkv.storage.open import open_kv


def table(base: dict) -> NodeTable:
    return NodeTable(open_kv(base).values)


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


def test_nodes_say_what_each_path_is(base: dict) -> None:
    nodes = table(base)
    assert not nodes.node("g").is_array and not nodes.node("nothing/here").is_array
    assert nodes.node("g").documents[".zgroup"]  # a v3 group, presented as a v2 group
    plain = nodes.node("g/plain")
    assert plain.unsharded and plain.array is None and not plain.documents
    node = nodes.node("g/sharded")
    assert node.array is not None and node.doc is not None
    assert node.array.chunks_per_shard == (2, 2) and node.doc["codecs"][0]["name"] == "sharding_indexed"
    # the presented documents are the dicts the key mapping was built from, served as JSON once dumped
    assert json.loads(node.documents[".zarray"]) == node.presented[".zarray"]
    assert node.presented[".zarray"]["chunks"] == list(node.array.chunks)


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
    arr = table(base).owner(key)
    assert (arr.path if arr is not None else None) == owner


def test_nodes_are_read_once_and_forgotten_on_request(base: dict) -> None:
    reads: list[list[str]] = []
    kv = open_kv(base)

    def read(keys):
        reads.append(list(keys))
        return kv.values(keys)

    nodes = NodeTable(read)
    assert nodes.sharded("g/sharded") is not None
    assert reads == [["g/sharded/zarr.json"]]  # a presented v3 node needs no .zarray probe
    del base["g/sharded/zarr.json"]  # issue 11: the array is its zarr.json alone
    assert nodes.sharded("g/sharded") is not None  # kept
    nodes.forget_under("g")
    assert nodes.sharded("g/sharded") is None and not nodes.node("g/sharded").is_array
    assert reads[1:] == [["g/sharded/zarr.json"], ["g/sharded/.zarray"]]  # missing: then the v2 probe


def test_a_stale_zarray_beside_a_v3_array_is_not_what_zarr_2_sees(base: dict) -> None:
    # the v3 zarr.json is the array (issue 11); a .zarray left beside it by hand never overrides it
    base["g/sharded/.zarray"] = zarray(chunks=(4, 4))
    node = table(base).node("g/sharded")
    assert node.array is not None and node.array.chunks == (2, 2)
    assert json.loads(ShardedStore(base)["g/sharded/.zarray"])["chunks"] == [2, 2]


def test_a_zarr_json_that_is_not_json_is_refused(base: dict) -> None:
    base["g/sharded/zarr.json"] = b"{not json"
    with pytest.raises(ConfigurationError, match="g/sharded"):
        table(base).node("g/sharded")
