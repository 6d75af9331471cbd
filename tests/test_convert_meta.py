"""shardkv.cli.convert.meta: ``convert`` builds the stored documents of a sharded hierarchy directly.

Inputs are the documents zarr-python 2.18 writes; the expected documents are the
proxy's own plans (shardkv.metadata.hierarchy), which ``convert`` must match.
"""

from __future__ import annotations

import json

import numpy as np
import zarr

from shardkv import ShardLayout
from shardkv.cli.convert.listing import ArrayListing
from shardkv.cli.convert.meta import array_metadata, store_as_v3
from shardkv.metadata.documents import dump_json
from shardkv.metadata.hierarchy import REFUSED_ZARRAY, array_document, present

LAYOUT = ShardLayout.v3((2, 1))


def _v2_hierarchy() -> dict[str, bytes]:
    store: dict[str, bytes] = {}
    root = zarr.open_group(store, mode="w")
    root.attrs["title"] = "demo"
    grp = root.create_group("g")
    grp.attrs["level"] = 1
    arr = grp.create_dataset("a", shape=(6, 4), chunks=(2, 2), dtype="<f4", fill_value=np.nan)
    arr.attrs.update({"units": "m", "_ARRAY_DIMENSIONS": ["y", "x"]})
    root.create_dataset("plain", shape=(3,), chunks=(3,), dtype="<i2")
    zarr.consolidate_metadata(store)
    return store


def _listing(store: dict[str, bytes], path: str, detected: bool = False) -> ArrayListing:
    zarray = json.loads(store[f"{path}/.zarray"])
    return ArrayListing(path, zarray, "/" if detected else ".", detected, None)  # type: ignore[arg-type]


def _meta(store: dict[str, bytes], path: str) -> dict[str, bytes]:
    return {k: v for k, v in store.items() if k.rpartition("/")[0] == path}


def test_a_sharded_array_gets_its_stored_zarr_json_directly() -> None:
    store = _v2_hierarchy()
    amended: dict[str, dict] = {}
    out = array_metadata(_listing(store, "g/a"), _meta(store, "g/a"), LAYOUT, amended)
    zarray, zattrs = json.loads(store["g/a/.zarray"]), json.loads(store["g/a/.zattrs"])
    assert out == {"g/a/zarr.json": dump_json(array_document(zarray, zattrs, LAYOUT))}
    assert amended == {}
    out = array_metadata(_listing(store, "g/a", detected=True), _meta(store, "g/a"), LAYOUT, amended)
    doc = json.loads(out["g/a/zarr.json"])
    assert doc["chunk_key_encoding"] == {"name": "v2", "configuration": {"separator": "/"}}
    assert amended == {"g/a": {**zarray, "dimension_separator": "/"}}


def test_store_as_v3_stores_groups_and_copies_as_the_proxy_does() -> None:
    store = _v2_hierarchy()
    meta_out = {k: v for k, v in store.items() if not k.startswith("g/a/")}
    meta_out.update(array_metadata(_listing(store, "g/a"), _meta(store, "g/a"), LAYOUT, {}))
    sharded = json.loads(meta_out["g/a/zarr.json"])
    # an already sharded array copied from the source, with the documents its view presents
    meta_out["c/zarr.json"] = dump_json(sharded)
    meta_out.update({f"c/{name}": dump_json(doc) for name, doc in present(sharded, "c").items()})
    plain = meta_out["plain/.zarray"]
    store_as_v3(meta_out)
    assert not any(k.startswith(("g/a/.", "c/.")) for k in meta_out)  # sharded arrays are stored v3 only
    assert json.loads(meta_out["c/zarr.json"]) == sharded == json.loads(meta_out["g/a/zarr.json"])
    assert json.loads(meta_out["g/zarr.json"]) == {"zarr_format": 3, "node_type": "group", "attributes": {"level": 1}}
    assert ".zgroup" not in meta_out and "g/.zgroup" not in meta_out
    assert meta_out["plain/.zarray"] == plain  # unsharded arrays keep their v2 documents (and gain a mirror)
    zmetadata = json.loads(meta_out[".zmetadata"])["metadata"]
    assert zmetadata["g/a/.zarray"] == REFUSED_ZARRAY == zmetadata["c/.zarray"]
    root = json.loads(meta_out["zarr.json"])
    assert sorted(root["consolidated_metadata"]["metadata"]) == ["c", "g", "g/a", "plain"]
