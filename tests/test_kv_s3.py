"""The store contract on S3 through s3fs (:class:`S3Store`) against moto's server on 127.0.0.1.

Also the request budget of a warm chunk read (storage side): it
is one conditional ranged ``GetObject`` that moves exactly the chunk's bytes.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import moto_strict
import pytest
from kv_contract import KVContract, put_ok

pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")

from shardkv.format.ranges import ByteRange  # noqa: E402
from shardkv.storage.kv import ANY, NO_VALUE, KVStore  # noqa: E402
from shardkv.storage.s3 import S3Store  # noqa: E402

pytestmark = pytest.mark.zarr2
BUCKET = "shardkv-kv"


@pytest.fixture(scope="module")
def s3fs_fs() -> Iterator[Any]:
    import logging

    import boto3
    import s3fs

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server, endpoint = moto_strict.start_server()  # conditional writes decided as S3 decides them
    boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    ).create_bucket(Bucket=BUCKET)
    fs = s3fs.S3FileSystem(
        skip_instance_cache=True,
        key="testing",
        secret="testing",
        client_kwargs={"endpoint_url": endpoint, "region_name": "us-east-1"},
    )
    try:
        yield fs
    finally:
        server.stop()


@pytest.fixture
def s3kv(s3fs_fs: Any) -> S3Store:
    return S3Store(s3fs_fs, f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}")


class TestS3Contract(KVContract):
    @pytest.fixture
    def kv(self, s3kv: S3Store) -> KVStore:
        return s3kv


class Requests:
    """Records the S3 calls of a store (method and arguments) by wrapping its filesystem's ``_call_s3``."""

    def __init__(self, fs: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        real = fs._call_s3

        async def call(method: str, *args: Any, **kwargs: Any) -> Any:
            self.calls.append((method, dict(kwargs)))
            return await real(method, *args, **kwargs)

        monkeypatch.setattr(fs, "_call_s3", call)


def test_warm_chunk_read_is_one_conditional_ranged_get(s3kv: S3Store, monkeypatch: pytest.MonkeyPatch) -> None:
    shard = bytes(range(256)) * 64
    g = put_ok(s3kv, "a/c/0/0", shard)
    requests = Requests(s3kv.fs, monkeypatch)
    r = s3kv.get("a/c/0/0", [ByteRange(1000, 1100)], if_generation=g)
    assert r.found and bytes(r.values[0]) == shard[1000:1100] and r.size == len(shard)  # type: ignore[index]
    assert len(requests.calls) == 1
    method, kwargs = requests.calls[0]
    assert method == "get_object" and kwargs["Range"] == "bytes=1000-1099" and kwargs["IfMatch"] == g.token


def test_stale_read_is_one_request_and_reads_nothing(s3kv: S3Store, monkeypatch: pytest.MonkeyPatch) -> None:
    old = put_ok(s3kv, "k", b"0123456789")
    new = put_ok(s3kv, "k", b"9876543210")
    requests = Requests(s3kv.fs, monkeypatch)
    r = s3kv.get("k", [ByteRange(0, 4)], if_generation=old)
    assert r.state == "stale" and r.values is None and len(requests.calls) == 1
    check = s3kv.get("k", [], if_generation=new)
    assert check.found and check.values == [] and [m for m, _ in requests.calls[1:]] == ["head_object"]


def test_conditional_writes_send_their_headers(s3kv: S3Store, monkeypatch: pytest.MonkeyPatch) -> None:
    requests = Requests(s3kv.fs, monkeypatch)
    g = put_ok(s3kv, "k", [b"a", b"b"], if_generation=NO_VALUE)
    assert g is not None and s3kv.put("k", b"c", if_generation=g) is not None
    assert s3kv.delete("k", if_generation=g) is False
    puts = [kw for m, kw in requests.calls if m == "put_object"]
    assert puts[0]["IfNoneMatch"] == "*" and puts[1]["IfMatch"] == g.token
    deletes = [kw for m, kw in requests.calls if m == "delete_object"]
    assert deletes == [{"Bucket": BUCKET, "Key": deletes[0]["Key"], "IfMatch": g.token}]


def test_many_ranges_are_one_request_each_at_once(s3kv: S3Store, monkeypatch: pytest.MonkeyPatch) -> None:
    s3kv.put("k", bytes(100))
    requests = Requests(s3kv.fs, monkeypatch)
    r = s3kv.get("k", [ByteRange(i * 10, i * 10 + 5) for i in range(10)])
    assert r.found and all(len(b) == 5 for b in r.values or [])
    assert [m for m, _ in requests.calls] == ["get_object"] * 10


def test_listing_carries_etags(s3kv: S3Store) -> None:
    g = put_ok(s3kv, "a/b", b"v")
    assert dict(s3kv.list_generations("a/")) == {"a/b": g}


def test_unconditional_delete_of_missing_and_any(s3kv: S3Store) -> None:
    assert s3kv.delete("nothing", if_generation=ANY)
    assert s3kv.delete("nothing", if_generation=NO_VALUE)


def test_s3_caps(s3kv: S3Store) -> None:
    caps = s3kv.caps
    assert caps.ranged and caps.round_trips and caps.stamps == "native" and caps.conditional_put
    assert caps.conditional_delete and not caps.in_process and not caps.lock_dir
    assert s3kv.location.namespace[0] == "s3" and str(s3kv.location.namespace[1]).startswith("http://127.0.0.1:")


def test_open_kv_gives_s3_stores(s3fs_fs: Any) -> None:
    from shardkv.storage.open import open_kv

    options = {"key": "testing", "secret": "testing", "client_kwargs": s3fs_fs.client_kwargs}
    root = f"{BUCKET}/{uuid.uuid4().hex[:12]}"
    by_url = open_kv(f"s3://{root}", options)
    by_map = open_kv(s3fs_fs.get_mapper(root))
    assert type(by_url) is type(by_map) is S3Store
    assert by_url.location == by_map.location
    g = put_ok(by_url, "k", b"v")
    assert by_map.get("k").generation == g


def test_requests_of_one_call_share_the_in_flight_bound(s3kv: S3Store, monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    for i in range(4):
        s3kv.put(f"k{i}", bytes(100))
    monkeypatch.setattr("shardkv.storage.s3.IN_FLIGHT", 3)
    state = {"now": 0, "most": 0}
    real = s3kv.fs._call_s3

    async def call(method: str, *args: Any, **kwargs: Any) -> Any:
        state["now"] += 1
        state["most"] = max(state["most"], state["now"])
        try:
            await asyncio.sleep(0.01)  # let the others start, if they may
            return await real(method, *args, **kwargs)
        finally:
            state["now"] -= 1

    monkeypatch.setattr(s3kv.fs, "_call_s3", call)
    results = s3kv.get_many([(f"k{i}", [ByteRange(j, j + 1) for j in range(5)], ANY) for i in range(4)])
    assert all(r.found and len(r.values or []) == 5 for r in results)
    assert state["most"] == 3  # 20 requests, never more than 3 at once


def test_pickled_store_reaches_the_same_objects(s3kv: S3Store) -> None:
    import pickle

    g = put_ok(s3kv, "k", b"v")
    copy = pickle.loads(pickle.dumps(s3kv))
    assert isinstance(copy, S3Store) and copy.location == s3kv.location
    assert copy.get("k", if_generation=g).found
