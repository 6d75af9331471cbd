"""The node table of the v2 proxy and the owner of a key (shardkv.proxy.nodes)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from shardkv import ConfigurationError, ShardedStore
from shardkv.proxy.nodes import NodeTable
from shardkv.storage.open import open_kv


def table(base: dict) -> NodeTable:
    return NodeTable(open_kv(base).values)


def zarray(shape=(8, 8), chunks=(2, 2), sep=".") -> bytes:
    return json.dumps(
        {
            "zarr_format": 2,
            "shape": list(shape),
            "chunks": list(chunks),
            "dtype": "|u1",
            "compressor": None,
            "fill_value": 0,
            "filters": None,
            "order": "C",
            "dimension_separator": sep,
        }
    ).encode()


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
    del base["g/sharded/zarr.json"]  # the array is its zarr.json alone
    assert nodes.sharded("g/sharded") is not None  # kept
    nodes.forget_under("g")
    assert nodes.sharded("g/sharded") is None and not nodes.node("g/sharded").is_array
    assert reads[1:] == [["g/sharded/zarr.json"], ["g/sharded/.zarray"]]  # missing: then the v2 probe


def test_a_stale_zarray_beside_a_v3_array_is_not_what_zarr_2_sees(base: dict) -> None:
    # the v3 zarr.json is the array; a .zarray left beside it by hand never overrides it
    base["g/sharded/.zarray"] = zarray(chunks=(4, 4))
    node = table(base).node("g/sharded")
    assert node.array is not None and node.array.chunks == (2, 2)
    assert json.loads(ShardedStore(base)["g/sharded/.zarray"])["chunks"] == [2, 2]


def test_a_zarray_beside_a_zarr_json_zarr_2_is_not_shown_is_that_array_and_its_chunks_stay() -> None:
    # a v3 array with default chunk keys cannot be shown in v2; the plain v2 array beside it is what zarr 2 sees
    v3 = {"zarr_format": 3, "node_type": "array", "shape": [4], "data_type": "uint8", "fill_value": 0}
    v3 |= {"chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4]}}, "attributes": {}}
    v3 |= {"chunk_key_encoding": {"name": "default"}, "codecs": [{"name": "bytes"}]}
    base = {"a/.zarray": zarray(shape=(4,), chunks=(4,)), "a/0": b"\1" * 4, "a/zarr.json": json.dumps(v3).encode()}
    assert table(base).node("a").unsharded
    ShardedStore(base, chunks_per_shard=2)["a/.zarray"] = zarray(shape=(8,), chunks=(4,))  # a resize
    assert base["a/0"] == b"\1" * 4 and json.loads(base["a/.zarray"])["shape"] == [8]


def test_a_zarr_json_that_is_not_json_is_refused(base: dict) -> None:
    base["g/sharded/zarr.json"] = b"{not json"
    with pytest.raises(ConfigurationError, match="g/sharded"):
        table(base).node("g/sharded")


@pytest.mark.parametrize(
    "key, owner, read",
    [
        ("g/sharded/3.1", "g/sharded", [["g/sharded/zarr.json"]]),  # not "" nor "g": "sharded" is not chunk-like
        ("g/nested/3/1", "g/nested", [["g/nested/zarr.json"]]),  # "3" could be an array below g/nested: not read
        ("g/sharded/notes/0", None, [["g/sharded/notes/zarr.json"], ["g/sharded/notes/.zarray"]]),
        ("0.0", None, [["zarr.json"]]),  # a root array could own it: the root is read
    ],
)
def test_the_owner_of_a_key_is_found_reading_only_the_paths_that_could_own_it(
    base: dict, key: str, owner: str | None, read: list[list[str]]
) -> None:
    # a cold read of a chunk of g/sharded reads g/sharded/zarr.json, not the zarr.json of every parent
    reads: list[list[str]] = []
    kv = open_kv(base)

    def recording_read(keys):
        reads.append(list(keys))
        return kv.values(keys)

    arr = NodeTable(recording_read).owner(key)
    assert (arr.path if arr is not None else None) == owner
    assert reads == read


def test_an_array_below_an_array_is_read_as_its_own_document_says(base: dict) -> None:
    # a hierarchy zarr refuses to make, made by another tool: the root turned into an array above g/sharded.
    # zarr 2 opens g/sharded from the .zarray presented from g/sharded/zarr.json; its chunks come from its
    # shards (as tensorstore and zarr-python 3 read them), never the shard bytes served as one chunk
    zarr = pytest.importorskip("zarr")
    if not zarr.__version__.startswith("2."):
        pytest.skip("zarr-python 2 reads through the v2 proxy")
    proxy = ShardedStore(base)
    z = zarr.open_array(proxy, path="g/sharded", mode="r+")
    z[:] = 7
    root = json.loads(base["g/sharded/zarr.json"])
    base["zarr.json"] = json.dumps({**root, "shape": [2, 2]}).encode()
    fresh = ShardedStore(base)
    np.testing.assert_array_equal(zarr.open_array(fresh, path="g/sharded", mode="r")[:], 7)
    assert zarr.open_array(fresh, path="", mode="r").shape == (2, 2)
