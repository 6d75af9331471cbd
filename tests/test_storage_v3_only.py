"""The proxy's metadata behaviour when storage never lies (v3 only), and its metadata checks.

zarr-python 2.18 writes through :class:`ShardedStore`; the stored documents are
read back as JSON (what any reader without shardkv sees) and through the proxy
(what zarr 2 sees). Readers without shardkv (zarr 3, xarray, tensorstore) are in
tests/latest.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, MutableMapping

import numpy as np
import pytest
import zarr

from shardkv import ConfigurationError, ShardedStore
from shardkv.errors import MetadataError


class CountingDict(MutableMapping):
    """A dict that records every request made to it: ("get" | "set" | "del" | "contains" | "list", key)."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.requests: list[tuple[str, str]] = []

    def __getitem__(self, key: str) -> bytes:
        self.requests.append(("get", key))
        return self.data[key]

    def __setitem__(self, key: str, value: bytes) -> None:
        self.requests.append(("set", key))
        self.data[key] = bytes(value)

    def __delitem__(self, key: str) -> None:
        self.requests.append(("del", key))
        del self.data[key]

    def __contains__(self, key: object) -> bool:
        self.requests.append(("contains", str(key)))
        return key in self.data

    def __iter__(self) -> Iterator[str]:
        self.requests.append(("list", ""))
        return iter(list(self.data))

    def __len__(self) -> int:
        return len(self.data)


def _write(base: MutableMapping, cps: int = 2) -> np.ndarray:
    store = ShardedStore(base, chunks_per_shard=cps, concurrency="process")
    root = zarr.open_group(store, mode="w")
    root.attrs["title"] = "t"
    arr = root.create_dataset("g/a", shape=(8, 6), chunks=(2, 3), dtype="<i4", fill_value=-1)
    data = np.arange(48, dtype="<i4").reshape(8, 6)
    arr[...] = data
    arr.attrs["units"] = "m"
    return data


def test_opening_an_array_reads_each_zarr_json_once_and_probes_nothing_else() -> None:
    base = CountingDict()
    data = _write(base)
    base.requests.clear()
    arr = zarr.open_array(ShardedStore(base, concurrency="process"), path="g/a", mode="r")
    assert arr.attrs["units"] == "m"
    opened = list(base.requests)
    # the array's zarr.json: no .zarray/.zattrs probe (they cannot exist), no listing, and no
    # layout detection (ShardedStore is always the v2 proxy; open_store is the one that detects)
    assert opened == [("get", "g/a/zarr.json")], opened
    np.testing.assert_array_equal(arr[...], data)
    # the chunk reads learn which array owns the keys from the array's own zarr.json, read once
    # (no second read, and no group above it, as tensorstore), nothing else
    meta = [r for r in base.requests if r[1].rpartition("/")[2] in (".zarray", ".zattrs", ".zgroup", "zarr.json")]
    assert meta == [("get", "g/a/zarr.json")]
    assert not any(op in ("list", "contains") for op, _ in base.requests)


def test_stored_documents_are_v3_only_and_presented_documents_are_zarr2s() -> None:
    base: dict[str, bytes] = {}
    _write(base)
    assert {k for k in base if not k.split("/")[-1][0].isdigit()} == {"zarr.json", "g/zarr.json", "g/a/zarr.json"}
    doc = json.loads(base["g/a/zarr.json"])
    assert doc["attributes"] == {"units": "m"} and doc["shape"] == [8, 6]
    assert doc["chunk_key_encoding"] == {"name": "v2"}  # zarr 2 named no separator: the default "."
    proxy = ShardedStore(base)
    zarray = json.loads(proxy["g/a/.zarray"])
    assert zarray["shape"] == [8, 6] and zarray["chunks"] == [2, 3] and "dimension_separator" not in zarray
    assert json.loads(proxy[".zattrs"]) == {"title": "t"} and json.loads(proxy["g/.zgroup"]) == {"zarr_format": 2}
    assert "g/a/zarr.json" not in proxy and "g/a/zarr.json" not in set(proxy)


def test_deleting_a_sharded_array_deletes_its_zarr_json() -> None:
    base: dict[str, bytes] = {}
    _write(base)
    group = zarr.open_group(ShardedStore(base), mode="r+")
    del group["g/a"]
    assert not any(k.startswith("g/a/") for k in base)
    assert "g/a" not in zarr.open_group(ShardedStore(base), mode="r")["g"]


def test_attributes_written_before_the_array_are_taken_into_its_zarr_json() -> None:
    base: dict[str, bytes] = {}
    store = ShardedStore(base, chunks_per_shard=2)
    store["a/.zattrs"] = json.dumps({"k": 1}).encode()
    zarr.create(shape=(4,), chunks=(1,), dtype="<u1", store=store, path="a")
    assert "a/.zattrs" not in base and json.loads(base["a/zarr.json"])["attributes"] == {"k": 1}
    assert zarr.open_array(ShardedStore(base), path="a", mode="r").attrs.asdict() == {"k": 1}


@pytest.mark.parametrize(
    "change, words",
    [({"dimension_separator": "/"}, "dimension_separator"), ({"chunks": [4, 3]}, "chunks")],
    ids=["separator", "chunks"],
)
def test_a_zarray_rewrite_that_reshards_is_refused_before_anything_is_written(change: dict, words: str) -> None:
    base: dict[str, bytes] = {}
    data = _write(base)
    before = dict(base)
    store = ShardedStore(base)
    zarray = {**json.loads(store["g/a/.zarray"]), **change}
    with pytest.raises(ConfigurationError, match=words) as info:
        store["g/a/.zarray"] = json.dumps(zarray).encode()
    assert "g/a/.zarray" in str(info.value)
    assert base == before
    np.testing.assert_array_equal(zarr.open_array(ShardedStore(base), path="g/a", mode="r")[...], data)


@pytest.mark.parametrize(
    "raw, field",
    [
        (b"{not json", "valid JSON"),
        (b'{"shape": "8", "chunks": [2], "dtype": "<i4"}', "'shape'"),
        (b'{"shape": [8], "chunks": [0], "dtype": "<i4"}', "'chunks'"),
        (b'{"shape": [8], "chunks": [2, 2], "dtype": "<i4"}', "same length"),
        (b'{"shape": [8], "chunks": [2], "dtype": 4}', "'dtype'"),
        (b"[1, 2]", "JSON object"),
    ],
    ids=["not-json", "shape", "chunks", "lengths", "dtype", "not-object"],
)
def test_invalid_zarray_is_one_metadata_error_naming_key_and_field(raw: bytes, field: str) -> None:
    base: dict[str, bytes] = {}
    store = ShardedStore(base, chunks_per_shard=2)
    with pytest.raises(MetadataError, match=field) as info:
        store["x/.zarray"] = raw
    assert info.value.key == "x/.zarray" and base == {}


def test_recreating_an_array_over_left_shards_never_reinterprets_them() -> None:
    base: dict[str, bytes] = {}
    _write(base, cps=2)
    shards = {k for k in base if k.startswith("g/a/") and not k.endswith("zarr.json")}
    assert shards
    del base["g/a/zarr.json"]  # the array's metadata deleted by hand: its shards remain
    store = ShardedStore(base, chunks_per_shard=4)
    arr = zarr.create(shape=(8, 6), chunks=(2, 3), dtype="<i4", fill_value=-1, store=store, path="g/a")
    assert not shards & set(base)  # the old shards are gone, not read as shards of the new layout
    np.testing.assert_array_equal(arr[...], np.full((8, 6), -1, dtype="<i4"))
    np.testing.assert_array_equal(zarr.open_array(ShardedStore(base), path="g/a", mode="r")[...], np.full((8, 6), -1))


def test_new_groups_under_a_v3_root_are_v3_groups_and_attributes_stay_in_step() -> None:
    base: dict[str, bytes] = {}
    _write(base)
    group = zarr.open_group(ShardedStore(base), mode="r+")
    group.create_group("h/i").attrs["k"] = 1
    assert json.loads(base["h/i/zarr.json"]) == {"zarr_format": 3, "node_type": "group", "attributes": {"k": 1}}
    assert "h/i/.zgroup" not in base and "h/.zgroup" not in base
    group.attrs["title"] = "u"
    assert json.loads(base["zarr.json"])["attributes"] == {"title": "u"}
    del group["g/a"].attrs["units"]
    assert json.loads(base["g/a/zarr.json"])["attributes"] == {}
    assert zarr.open_group(ShardedStore(base), mode="r")["h/i"].attrs["k"] == 1
