"""The proxies' metadata side: reserved names refused on write, each metadata document read once, drafts in rechunk."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from counting_fs import CountingDict

from shardkv import ReservedKeyError, ShardedStore, open_store, rechunk_to_shards
from shardkv.metadata.documents import DRAFT_ZARR_FORMAT
from shardkv.proxy.draft import DraftShardedStore

zarr = pytest.importorskip("zarr")
if not zarr.__version__.startswith("2."):
    pytest.skip("zarr-python 2 only", allow_module_level=True)

ZARRAY = json.dumps(
    {
        "zarr_format": 2,
        "shape": [8, 8],
        "chunks": [2, 2],
        "dtype": "<i4",
        "compressor": None,
        "fill_value": 0,
        "filters": None,
        "order": "C",
    }
).encode()


# -- shardkv's internal names are refused on write --------------------------

RESERVED = [".shardkv-locks", "a.shardkv-tmp-123", "g/.shardkv-locks", "g/x.shardkv-tmp-9/arr"]


@pytest.mark.parametrize("name", RESERVED)
@pytest.mark.parametrize("document", [".zarray", ".zgroup", ".zattrs"])
def test_an_array_or_group_named_like_shardkv_files_is_refused(name: str, document: str) -> None:
    base: dict = {}
    store = ShardedStore(base, chunks_per_shard=2)
    value = ZARRAY if document == ".zarray" else b'{"zarr_format": 2}' if document == ".zgroup" else b"{}"
    with pytest.raises(ReservedKeyError, match="shardkv") as info:
        store[f"{name}/{document}"] = value
    assert isinstance(info.value, ValueError) and name.rsplit("/", 1)[-1] in str(info.value)
    assert base == {}  # nothing written


def test_zarr_2_creating_a_reserved_array_gets_the_error() -> None:
    store = ShardedStore({}, chunks_per_shard=2)
    root = zarr.group(store=store)
    with pytest.raises(ReservedKeyError):
        root.create_dataset(".shardkv-locks", shape=(4,), chunks=(2,), dtype="i4")
    root.create_dataset("ok.shardkv-tmp", shape=(4,), chunks=(2,), dtype="i4")  # the marker is ".shardkv-tmp-"


@pytest.mark.parametrize("kind", ["array", "group"])
def test_the_draft_proxy_refuses_reserved_names_too(kind: str) -> None:
    base = {"zarr.json": json.dumps({"zarr_format": DRAFT_ZARR_FORMAT, "metadata_key_suffix": ".json"}).encode()}
    proxy = open_store(base, 2)
    assert isinstance(proxy, DraftShardedStore)
    with pytest.raises(ReservedKeyError):
        proxy[f"meta/root/g/x.shardkv-tmp-1.{kind}.json"] = b"{}"


# -- a freshly opened store reads each metadata document once ----------------


def _written(base: dict) -> np.ndarray:
    store = ShardedStore(base, chunks_per_shard=2)
    root = zarr.open_group(store, mode="w")
    arr = root.create_dataset("g/a", shape=(8, 8), chunks=(2, 2), dtype="<i4", fill_value=0)
    data = np.arange(64, dtype="<i4").reshape(8, 8)
    arr[...] = data
    return data


@pytest.mark.parametrize(
    "opener, documents",
    [
        (ShardedStore, {"g/a/zarr.json": 1}),  # the array's own document: its parents cannot own its chunks
        (open_store, {"zarr.json": 1, "g/a/zarr.json": 1}),  # the root's tells open_store the layout
    ],
    ids=["ShardedStore", "open_store"],
)
def test_a_cold_chunk_read_reads_each_zarr_json_once(opener: Any, documents: dict[str, int]) -> None:
    base = CountingDict()
    data = _written(base)
    base.reads.clear()
    arr = zarr.open_array(opener(base), path="g/a", mode="r")
    np.testing.assert_array_equal(arr[0:2, 0:2], data[0:2, 0:2])  # one chunk, cold
    meta = {
        k: n for k, n in base.reads.items() if k.rpartition("/")[2] in (".zarray", ".zattrs", ".zgroup", "zarr.json")
    }
    # once each, no v2 probes; was {"zarr.json", "g/zarr.json", "g/a/zarr.json"} before the owner lookup
    assert meta == documents


# -- rechunk_to_shards takes the draft proxy ----------------------------------------------------


def test_rechunk_to_shards_accepts_a_draft_array() -> None:
    da = pytest.importorskip("dask.array")
    proxy = open_store({}, chunks_per_shard=(2, 3), layout="draft2022")
    proxy["meta/root/a.array.json"] = json.dumps(
        {
            "shape": [10, 12],
            "data_type": "<i4",
            "chunk_grid": {"type": "regular", "chunk_shape": [2, 2], "separator": "/"},
            "chunk_memory_layout": "C",
            "fill_value": 0,
            "extensions": [],
            "attributes": {},
        }
    ).encode()
    assert proxy.sharded_array("a").shard_shape == (4, 6)
    blocks = rechunk_to_shards(da.zeros((10, 12), chunks=(5, 5), dtype="i4"), proxy, "a")
    assert blocks.chunks == ((4, 4, 2), (6, 6))
    assert proxy.sharded_array("nothing") is None
