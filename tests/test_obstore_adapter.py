"""The obstore adapter against an S3-protocol server on loopback (moto on 127.0.0.1).

The same contract as the other adapters (tests/test_stores.py), plus what is
obstore's own: dispatch from ``adapt`` (a store object, or a URL with
``client="obstore"``), values written from parts, and compare-and-swap with
``put_if``. The server runs in this process for the module's tests; each test
gets a new bucket.
"""

from __future__ import annotations

import socket
import uuid
from typing import Iterator

import boto3
import numpy as np
import pytest
import zarr
from moto.server import ThreadedMotoServer
from obstore.store import MemoryStore, S3Store
from range_cases import GET_RANGE_CASES, STORED

from shardkv import ShardedStore
from shardkv.errors import PreconditionFailedError
from shardkv.format.ranges import ByteRange
from shardkv.storage.adapters import adapt
from shardkv.storage.obstore_adapter import ObstoreAdapter, Version, is_obstore_store

pytestmark = pytest.mark.zarr2

KEY, SECRET, REGION = "shardkv-test", "shardkv-test-secret", "us-east-1"


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def bucket(endpoint: str) -> str:
    name = f"shardkv-{uuid.uuid4().hex[:12]}"
    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=KEY,
                          aws_secret_access_key=SECRET, region_name=REGION)
    client.create_bucket(Bucket=name)
    return name


def s3_store(endpoint: str, bucket: str, prefix: str | None = None) -> S3Store:
    return S3Store(bucket, prefix=prefix, endpoint=endpoint, region=REGION, access_key_id=KEY,
                   secret_access_key=SECRET, client_options={"allow_http": True})


@pytest.fixture
def adapter(endpoint: str, bucket: str) -> Iterator[ObstoreAdapter]:
    a = adapt(s3_store(endpoint, bucket, "root"))
    assert isinstance(a, ObstoreAdapter)
    yield a
    a.close()


def test_dispatch(endpoint: str, bucket: str) -> None:
    assert is_obstore_store(MemoryStore()) and not is_obstore_store({})
    assert isinstance(adapt(MemoryStore()), ObstoreAdapter)
    options = {"client": "obstore", "endpoint": endpoint, "region": REGION, "access_key_id": KEY,
               "secret_access_key": SECRET, "client_options": {"allow_http": True}}
    by_url = adapt(f"s3://{bucket}/root", options)
    assert isinstance(by_url, ObstoreAdapter) and by_url.supports_ranges
    by_url.set("k", b"v")
    assert bytes(adapt(s3_store(endpoint, bucket, "root")).get("k")) == b"v"  # the URL's path is the prefix


def test_get_set_contains_size(adapter: ObstoreAdapter) -> None:
    adapter.set("a/b/0.0", b"hello")
    assert bytes(adapter.get("a/b/0.0")) == b"hello"
    assert adapter.contains("a/b/0.0") and not adapter.contains("a/b/0.1")
    assert adapter.size("a/b/0.0") == 5


def test_missing_is_key_error(adapter: ObstoreAdapter) -> None:
    for call in (adapter.get, adapter.size, adapter.delete, adapter.get_versioned):
        with pytest.raises(KeyError):
            call("nope")


def test_parts_are_stored_as_their_concatenation(adapter: ObstoreAdapter) -> None:
    parts = [b"head-", memoryview(b"xxbodyxx")[2:6], np.arange(2, dtype="<u2"), b""]
    adapter.set_many({"p": parts, "q": (b"only",)})
    assert bytes(adapter.get("p")) == b"head-body\x00\x00\x01\x00"
    assert bytes(adapter.get("q")) == b"only"


def test_get_many_concurrent_and_leaves_out_missing(adapter: ObstoreAdapter) -> None:
    values = {f"k/{i}": bytes([i]) * (i + 1) for i in range(20)}
    adapter.set_many(values)
    got = adapter.get_many([*values, "missing"])
    assert {k: bytes(v) for k, v in got.items()} == values
    assert adapter.get_many([]) == {}


@pytest.mark.parametrize("byte_range, expected", GET_RANGE_CASES)
def test_get_ranges(adapter: ObstoreAdapter, byte_range: ByteRange, expected: bytes) -> None:
    adapter.set("s/0", STORED)
    out = adapter.get_ranges([("s/0", byte_range), ("s/missing", ByteRange(0, 1))])
    assert [None if v is None else bytes(v) for v in out] == [expected, None]


def test_ranges_come_back_in_request_order(adapter: ObstoreAdapter) -> None:
    adapter.set("big", bytes(range(256)) * 4)
    requests = [("big", ByteRange(i, i + 3)) for i in range(0, 1000, 37)]
    out = adapter.get_ranges(requests)
    assert [bytes(v) for v in out] == [(bytes(range(256)) * 4)[r.start : r.stop] for _, r in requests]


def test_delete_listing_rmdir(adapter: ObstoreAdapter) -> None:
    adapter.set_many({"g/.zgroup": b"{}", "g/a/0.0": b"x", "g/a/0.1": b"y", "top": b"z"})
    assert sorted(adapter.iter_keys()) == ["g/.zgroup", "g/a/0.0", "g/a/0.1", "top"]
    assert sorted(adapter.iter_keys("g/a/")) == ["g/a/0.0", "g/a/0.1"]
    assert list(adapter.iter_keys("nothing/")) == []
    assert adapter.list_dir("") == ["g", "top"]
    assert adapter.list_dir("g") == [".zgroup", "a"]
    assert adapter.list_dir("missing") == []
    adapter.delete_many(["top", "never-there"])
    adapter.rmdir("g/a")
    assert sorted(adapter.iter_keys()) == ["g/.zgroup"]


def test_put_if_create_only(adapter: ObstoreAdapter) -> None:
    version = adapter.put_if("lock", b"mine", None)
    assert isinstance(version, Version) and version.e_tag
    with pytest.raises(PreconditionFailedError) as info:
        adapter.put_if("lock", b"theirs", None)
    assert info.value.key == "lock" and info.value.reason == "exists"
    assert bytes(adapter.get("lock")) == b"mine"


def test_put_if_compare_and_swap(adapter: ObstoreAdapter) -> None:
    adapter.set("counter", b"0")
    value, seen = adapter.get_versioned("counter")
    assert bytes(value) == b"0"
    newer = adapter.put_if("counter", [b"1"], seen)
    assert newer != seen
    with pytest.raises(PreconditionFailedError) as info:  # a writer holding the old version loses
        adapter.put_if("counter", b"2", seen)
    assert info.value.reason == "changed"
    assert bytes(adapter.get("counter")) == b"1"
    adapter.put_if("counter", b"2", newer)
    assert bytes(adapter.get("counter")) == b"2"


def test_zarr2_through_sharded_store(endpoint: str, bucket: str) -> None:
    data = np.arange(64 * 48, dtype="float32").reshape(64, 48)
    store = ShardedStore(s3_store(endpoint, bucket, "data.zarr"), chunks_per_shard=2)
    assert store.concurrency_mode == "conditional"  # compare-and-swap: tests/test_concurrency_obstore.py
    z = zarr.create(shape=data.shape, chunks=(16, 16), dtype="float32", store=store, path="arr")
    z[...] = data
    keys = sorted(ObstoreAdapter(s3_store(endpoint, bucket, "data.zarr")).iter_keys("arr/"))
    assert [k for k in keys if not k.rsplit("/", 1)[-1].startswith((".z", "zarr"))] == [
        "arr/0.0", "arr/0.1", "arr/1.0", "arr/1.1"]  # 4 x 3 chunks in 2 x 2 shards
    reread = zarr.open_array(
        store=ShardedStore(s3_store(endpoint, bucket, "data.zarr"), concurrency="process"), path="arr", mode="r"
    )
    np.testing.assert_array_equal(reread[...], data)
    np.testing.assert_array_equal(reread[20:40, 5:30], data[20:40, 5:30])
