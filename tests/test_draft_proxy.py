"""The proxy in 2022 draft mode, without zarr: dispatch, metadata, keys, counts, refusals.

(zarr-python 2.18 through the proxy is tested in test_draft_zarr_interop.py.)
"""

from __future__ import annotations

import json
import struct
from collections import Counter

import pytest
from transformer_mapping import CountingAbstractStore

from shardkv import ShardedStore, open_store
from shardkv.errors import ConfigurationError, UnsupportedError
from shardkv.metadata.documents import DRAFT_ZARR_FORMAT
from shardkv.proxy.draft import DraftShardedStore

SHARDING = "https://purl.org/zarr/spec/storage_transformers/sharding/1.0"
ENTRY_POINT = json.dumps(
    {
        "zarr_format": DRAFT_ZARR_FORMAT,
        "metadata_encoding": DRAFT_ZARR_FORMAT,
        "metadata_key_suffix": ".json",
        "extensions": [],
    }
).encode()
EMPTY = 2**64 - 1


def array_meta(shape, chunks, separator="/", **extra) -> bytes:
    doc = {
        "shape": list(shape),
        "data_type": "<i2",
        "chunk_grid": {"type": "regular", "chunk_shape": list(chunks), "separator": separator},
        "chunk_memory_layout": "C",
        "fill_value": 0,
        "extensions": [],
        "attributes": {},
        **extra,
    }
    return json.dumps(doc).encode()


@pytest.fixture
def base() -> dict:
    return {"zarr.json": ENTRY_POINT}


def make_array(proxy, path="a/b", shape=(10, 11), chunks=(2, 2), separator="/"):
    proxy[f"meta/root/{path}.array.json"] = array_meta(shape, chunks, separator)


# -- dispatch -------------------------------------------------------------------------------------


def test_open_store_dispatches_on_a_draft_hierarchy(base):
    assert isinstance(open_store(base), DraftShardedStore)
    assert isinstance(open_store({}, chunks_per_shard=2, layout="draft2022"), DraftShardedStore)
    v2 = open_store({}, chunks_per_shard=2)
    assert type(v2) is ShardedStore and v2._store_version == 2
    assert type(ShardedStore(base)) is ShardedStore  # a constructor never returns another class


def test_a_v2_root_zarr_json_is_not_a_draft_hierarchy():
    assert type(open_store({"zarr.json": b'{"zarr_format": 3, "node_type": "array"}'})) is ShardedStore


def test_dispatch_refuses_options_the_draft_format_cannot_honour(base):
    with pytest.raises(ConfigurationError, match="layout"):
        open_store(base, layout="draft2023")
    with pytest.raises(ConfigurationError, match="do not apply"):
        open_store(base, buffer_bytes=1024)
    with pytest.raises(ConfigurationError, match="checksum"):
        open_store(base, index_checksum=True)


def test_zarr_2_takes_the_proxy_as_a_v3_store(base):
    zarr_store = pytest.importorskip("zarr._storage.store")
    proxy = open_store(base)
    assert isinstance(proxy, zarr_store.StoreV3) and proxy._store_version == 3


# -- metadata --------------------------------------------------------------------------------------


def test_new_array_gets_the_transformer_entry_and_code_above_does_not_see_it(base):
    proxy = DraftShardedStore(base, chunks_per_shard=(2, 3))
    make_array(proxy)
    stored = json.loads(base["meta/root/a/b.array.json"])
    assert stored["storage_transformers"] == [
        {"extension": SHARDING, "type": "indexed", "configuration": {"chunks_per_shard": [2, 3]}}
    ]
    visible = json.loads(proxy["meta/root/a/b.array.json"])
    assert "storage_transformers" not in visible and visible["shape"] == [10, 11]
    # a resize (metadata rewritten from above without the entry) keeps it
    proxy["meta/root/a/b.array.json"] = array_meta((4, 11), (2, 2))
    assert json.loads(base["meta/root/a/b.array.json"])["storage_transformers"][0]["configuration"] == {
        "chunks_per_shard": [2, 3]
    }
    assert DraftShardedStore(base).storage_transformers("a/b") == stored["storage_transformers"]


def test_chunks_per_shard_rules(base):
    proxy = DraftShardedStore(base, chunks_per_shard={"x": [4]})
    make_array(proxy, "x", (10,), (2,))
    make_array(proxy, "y", (10,), (2,))
    assert proxy.storage_transformers("x")[0]["configuration"] == {"chunks_per_shard": [4]}
    assert proxy.storage_transformers("y") == []
    proxy = DraftShardedStore(base, chunks_per_shard=(2, 2))
    make_array(proxy, "one_d", (10,), (2,))  # a tuple of another length: unsharded
    assert proxy.storage_transformers("one_d") == []


def test_metadata_with_its_own_transformers_is_refused(base):
    proxy = DraftShardedStore(base, chunks_per_shard=2)
    doc = array_meta((4,), (2,), storage_transformers=[{"extension": SHARDING, "type": "indexed"}])
    with pytest.raises(ConfigurationError, match="applies the array's transformers itself"):
        proxy["meta/root/z.array.json"] = doc


def test_changing_the_chunk_grid_of_a_sharded_array_is_refused(base):
    proxy = DraftShardedStore(base, chunks_per_shard=2)
    make_array(proxy, "a", (8, 8), (2, 2))
    with pytest.raises(ConfigurationError, match="chunk grid"):
        proxy["meta/root/a.array.json"] = array_meta((8, 8), (4, 4))
    del proxy["meta/root/a.array.json"]  # deleting the array first is fine
    proxy["meta/root/a.array.json"] = array_meta((8, 8), (4, 4))


def test_unknown_transformer_is_refused_never_ignored(base):
    base["meta/root/u.array.json"] = array_meta(
        (4,), (2,), storage_transformers=[{"extension": "https://example.org/x/1.0", "type": "t", "configuration": {}}]
    )
    base["data/root/u/c0"] = b"whatever these bytes are"
    base["meta/root/ok.array.json"] = array_meta((4,), (2,))
    base["data/root/ok/c0"] = b"plain"
    proxy = open_store(base)
    for access in (
        lambda: proxy["meta/root/u.array.json"],
        lambda: proxy["data/root/u/c0"],
        lambda: proxy.__setitem__("data/root/u/c1", b"x"),
        lambda: proxy.list_prefix("data/root/u/"),
    ):
        with pytest.raises(UnsupportedError, match="example.org"):
            access()
    assert proxy["data/root/ok/c0"] == b"plain"  # other arrays are unaffected


def test_an_array_with_stacked_sharding_transformers_is_refused_when_opened(base):
    """Two sharding transformers of one array take their shard locks in opposite orders (a deadlock of two
    writers): the array is refused on every access, naming the stack and why; other arrays are unaffected."""
    stack = [
        {"extension": SHARDING, "type": "indexed", "configuration": {"chunks_per_shard": [1, 2]}},
        {"extension": SHARDING, "type": "indexed", "configuration": {"chunks_per_shard": [2, 1]}},
    ]
    base["meta/root/s.array.json"] = array_meta((8, 8), (2, 2), storage_transformers=stack)
    base["meta/root/ok.array.json"] = array_meta((4,), (2,))
    base["data/root/ok/c0"] = b"plain"
    proxy = open_store(base)
    for access in (
        lambda: proxy["meta/root/s.array.json"],
        lambda: proxy["data/root/s/c0/0"],
        lambda: proxy.__setitem__("data/root/s/c0/1", b"x"),
        lambda: proxy.list_prefix("data/root/s/"),
    ):
        with pytest.raises(UnsupportedError, match=r"array 's': 2 sharding storage transformers are stacked"):
            access()
    assert proxy["data/root/ok/c0"] == b"plain"
    assert "data/root/s/c0/1" not in base


# -- chunks, shards, listings ------------------------------------------------------------------------------


def parse(blob: bytes, n: int) -> list[tuple[int, int]]:
    return [struct.unpack_from("<QQ", blob, len(blob) - 16 * n + 16 * i) for i in range(n)]


@pytest.mark.parametrize("separator", ["/", "."], ids=["slash", "dot"])
def test_chunks_are_packed_in_the_draft_indexed_layout(base, separator):
    proxy = DraftShardedStore(base, chunks_per_shard=(2, 3))
    make_array(proxy, separator=separator)
    chunks = {(i, j): bytes([i * 16 + j]) * (1 + i + j) for i in range(2) for j in range(3) if (i, j) != (1, 1)}
    proxy.setitems({f"data/root/a/b/c{i}{separator}{j}": v for (i, j), v in chunks.items()})
    shard_key = f"data/root/a/b/c0{separator}0"
    assert [k for k in base if k.startswith("data/")] == [shard_key]
    blob = base[shard_key]
    entries = parse(blob, 6)
    assert entries[4] == (EMPTY, EMPTY)  # (1, 1) in row-major order
    offset = 0
    for local, (off, nbytes) in zip([(0, 0), (0, 1), (0, 2), (1, 0), None, (1, 2)], entries, strict=True):
        if local is None:
            continue
        assert (off, nbytes) == (offset, len(chunks[local]))  # back to back, row-major
        assert blob[off : off + nbytes] == chunks[local]
        offset += nbytes
    assert len(blob) == offset + 16 * 6  # index at the end, nothing else


def test_getitems_two_requests_per_sharded_array():
    under = CountingAbstractStore()
    under.data["zarr.json"] = ENTRY_POINT
    proxy = DraftShardedStore(under, chunks_per_shard=(2, 3))
    make_array(proxy)
    keys = [f"data/root/a/b/c{i}/{j}" for i in range(5) for j in range(6)]
    proxy.setitems({k: k.encode() for k in keys})
    reader = DraftShardedStore(under)  # nothing cached
    reader.getitems(["zarr.json"])  # reads the hierarchy's metadata
    under.reset()
    got = reader.getitems(keys + ["zarr.json"])
    assert got == {**{k: k.encode() for k in keys}, "zarr.json": ENTRY_POINT}
    # the array's document (read once), then 30 chunks in 6 shards: one index round and one chunk round;
    # the plain key its own request
    assert under.calls == Counter({"get_partial_values": 4})
    assert [len(arg) for _, arg in under.requests] == [1, 6, 6, 1]  # type: ignore[arg-type]
    under.reset()
    assert reader.getitems(keys) == {k: k.encode() for k in keys}
    assert under.calls == Counter({"get_partial_values": 1})  # indexes cached: the chunk round only


def test_listing_through_the_proxy(base):
    proxy = DraftShardedStore(base, chunks_per_shard=(2, 3))
    make_array(proxy)
    proxy["meta/root/a.group.json"] = b'{"attributes": {}}'
    proxy.setitems({"data/root/a/b/c0/0": b"1", "data/root/a/b/c3/5": b"2"})
    assert sorted(proxy) == sorted(
        ["zarr.json", "meta/root/a.group.json", "meta/root/a/b.array.json", "data/root/a/b/c0/0", "data/root/a/b/c3/5"]
    )
    assert sorted(proxy.list_prefix("data/root/a/b")) == ["data/root/a/b/c0/0", "data/root/a/b/c3/5"]
    assert proxy.list_dir("data/root/a/b/c3/") == (["data/root/a/b/c3/5"], [])
    assert proxy.list_dir("data/root/a/b/")[1] == [f"data/root/a/b/c{i}/" for i in range(4)]
    assert proxy.list_dir("meta/root/a/") == (["meta/root/a/b.array.json"], [])
    assert proxy.listdir("data/root/a/b/c3") == ["5"]
    assert "data/root/a/b/c3/5" in proxy and "data/root/a/b/c3/4" not in proxy
    assert len(proxy) == 5


def test_delete_erase_rmdir_rename(base):
    proxy = DraftShardedStore(base, chunks_per_shard=(2, 3))
    make_array(proxy)
    proxy.setitems({f"data/root/a/b/c{i}/{j}": b"v" for i in range(5) for j in range(6)})
    del proxy["data/root/a/b/c0/0"]
    with pytest.raises(KeyError):
        del proxy["data/root/a/b/c0/0"]
    proxy.delitems(["data/root/a/b/c0/1", "data/root/a/b/c0/1", "data/root/a/b/c4/5"])
    proxy.erase_prefix("data/root/a/b/c2/")
    assert len(proxy.list_prefix("data/root/")) == 30 - 3 - 6
    proxy.rename("a/b", "moved")
    assert json.loads(proxy["meta/root/moved.array.json"])["shape"] == [10, 11]
    assert proxy["data/root/moved/c3/3"] == b"v"
    assert proxy.getsize("moved") == sum(len(v) for k, v in base.items() if "moved" in k)
    proxy.rmdir("moved")
    assert sorted(base) == ["zarr.json"]


def test_values_must_be_bytes_like(base):
    proxy = DraftShardedStore(base, chunks_per_shard=2)
    make_array(proxy, "a", (4,), (2,))
    with pytest.raises(TypeError, match="data/root/a/c0"):
        proxy["data/root/a/c0"] = 12
