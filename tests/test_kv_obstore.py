"""The store contract on obstore stores (:class:`ObstoreStore`).

MemoryStore, and S3Store on moto; an obstore LocalStore opens as shardkv's own local store.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import moto_strict
import pytest
from kv_contract import KVContract, put_ok

obstore = pytest.importorskip("obstore")
boto3 = pytest.importorskip("boto3")
from obstore.store import LocalStore as ObLocalStore  # noqa: E402
from obstore.store import MemoryStore, S3Store  # noqa: E402

from shardkv.format.ranges import ByteRange  # noqa: E402
from shardkv.storage.kv import ANY, NO_VALUE, KVStore  # noqa: E402
from shardkv.storage.local import LocalStore  # noqa: E402
from shardkv.storage.obstore import ObstoreStore, conditional_put_disabled, is_obstore_store  # noqa: E402
from shardkv.storage.open import open_kv  # noqa: E402

pytestmark = pytest.mark.zarr2
KEY, SECRET, REGION = "shardkv-test", "shardkv-test-secret", "us-east-1"


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    server, endpoint = moto_strict.start_server()  # conditional writes decided as S3 decides them
    try:
        yield endpoint
    finally:
        server.stop()


@pytest.fixture(scope="module")
def bucket(endpoint: str) -> str:
    name = f"shardkv-{uuid.uuid4().hex[:12]}"
    boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id=KEY, aws_secret_access_key=SECRET, region_name=REGION
    ).create_bucket(Bucket=name)
    return name


def s3_store(endpoint: str, bucket: str, prefix: str, **options: Any) -> Any:
    return S3Store(
        bucket,
        prefix=prefix,
        endpoint=endpoint,
        region=REGION,
        access_key_id=KEY,
        secret_access_key=SECRET,
        client_options={"allow_http": True},
        **options,
    )


class TestMemoryContract(KVContract):
    @pytest.fixture
    def kv(self) -> Iterator[KVStore]:
        store = ObstoreStore(MemoryStore())
        yield store
        store.close()


class TestS3Contract(KVContract):
    @pytest.fixture
    def kv(self, endpoint: str, bucket: str) -> Iterator[KVStore]:
        store = ObstoreStore(s3_store(endpoint, bucket, uuid.uuid4().hex[:12]))
        yield store
        store.close()


def test_caps_per_store(endpoint: str, bucket: str, tmp_path: Path) -> None:
    memory = ObstoreStore(MemoryStore())
    assert memory.caps.in_process and memory.caps.conditional_put and not memory.caps.round_trips
    s3 = ObstoreStore(s3_store(endpoint, bucket, "p"))
    assert s3.caps.round_trips and s3.caps.conditional_put and not s3.caps.conditional_delete
    assert s3.location.namespace == ("s3", endpoint) and s3.location.root == f"{bucket}/p"
    disabled = s3_store(endpoint, bucket, "p", conditional_put="disabled")
    assert conditional_put_disabled(disabled) and not ObstoreStore(disabled).caps.conditional_put
    assert is_obstore_store(MemoryStore()) and not is_obstore_store({})


def test_obstore_written_files_read_by_local_store(tmp_path: Path) -> None:
    ob = ObLocalStore(str(tmp_path))
    obstore.put(ob, "a/c/0", b"0123456789")
    obstore.put(ob, "zarr.json", b"{}")
    kv = open_kv(ob)  # an obstore LocalStore is opened as shardkv's LocalStore: lock files, os calls
    assert isinstance(kv, LocalStore) and kv.location == LocalStore(tmp_path).location
    r = kv.get("a/c/0", [ByteRange.suffix(3), ByteRange(0, 2)])
    assert [bytes(b) for b in r.values or []] == [b"789", b"01"]
    assert sorted(kv.list_prefix("")) == ["a/c/0", "zarr.json"]
    g = put_ok(kv, "a/c/0", b"new")
    assert g is not None and bytes(obstore.get(ob, "a/c/0").bytes()) == b"new"


def test_warm_ranged_read_is_one_conditional_get(endpoint: str, bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    kv = ObstoreStore(s3_store(endpoint, bucket, uuid.uuid4().hex[:12]))
    g = put_ok(kv, "k", bytes(1000))
    calls: list[tuple[str, Any]] = []
    real_get = kv._obs.get

    def get(store: Any, key: str, options: Any = None) -> Any:
        calls.append((key, options))
        return real_get(store, key, options=options)

    monkeypatch.setattr(kv, "_obs", type("O", (), {"get": staticmethod(get)})())
    r = kv.get("k", [ByteRange(100, 200)], if_generation=g)
    assert r.found and len(r.values[0]) == 100  # type: ignore[index]
    assert calls == [("k", {"if_match": g.token[0], "range": (100, 200)})]  # type: ignore[index]


def test_conditional_create_and_update(endpoint: str, bucket: str) -> None:
    kv = ObstoreStore(s3_store(endpoint, bucket, uuid.uuid4().hex[:12]))
    g = put_ok(kv, "k", b"1", if_generation=NO_VALUE)
    assert g is not None and kv.put("k", b"2", if_generation=NO_VALUE) is None
    assert kv.put("k", b"3", if_generation=g) is not None and kv.put("k", b"4", if_generation=g) is None
    assert bytes(kv.get("k").whole()) == b"3" and kv.delete("k", if_generation=ANY)


def test_many_multi_range_reads_on_a_small_pool() -> None:
    """More multi-range reads than pool threads: requests are never nested on the pool (no deadlock)."""
    kv = ObstoreStore(MemoryStore(), max_concurrency=2)
    for i in range(6):
        kv.put(f"k{i}", bytes(range(50)))
    results = kv.get_many([(f"k{i}", [ByteRange(j, j + 2) for j in range(4)], ANY) for i in range(6)])
    assert [[bytes(b) for b in r.values or []] for r in results] == [[bytes([j, j + 1]) for j in range(4)]] * 6
    kv.close()


def test_pickled_s3_store_reaches_the_same_objects(endpoint: str, bucket: str) -> None:
    import pickle

    kv = ObstoreStore(s3_store(endpoint, bucket, uuid.uuid4().hex[:12]))
    g = put_ok(kv, "k", b"v")
    copy = pickle.loads(pickle.dumps(kv))
    assert isinstance(copy, ObstoreStore) and copy.location == kv.location
    assert copy.get("k", if_generation=g).found


def test_zarr2_through_sharded_store(endpoint: str, bucket: str) -> None:
    import numpy as np
    import zarr

    from shardkv import ShardedStore
    from shardkv.storage.open import open_kv

    data = np.arange(64 * 48, dtype="float32").reshape(64, 48)
    prefix = f"data-{uuid.uuid4().hex[:8]}.zarr"
    store = ShardedStore(s3_store(endpoint, bucket, prefix), chunks_per_shard=2)
    assert store.concurrency_mode == "conditional"  # compare-and-swap: tests/test_concurrency_obstore.py
    z = zarr.create(shape=data.shape, chunks=(16, 16), dtype="float32", store=store, path="arr")
    z[...] = data
    keys = sorted(open_kv(s3_store(endpoint, bucket, prefix)).list_prefix("arr/"))
    assert [k for k in keys if not k.rsplit("/", 1)[-1].startswith((".z", "zarr"))] == [
        "arr/0.0",
        "arr/0.1",
        "arr/1.0",
        "arr/1.1",
    ]  # 4 x 3 chunks in 2 x 2 shards
    reread = zarr.open_array(
        store=ShardedStore(s3_store(endpoint, bucket, prefix), concurrency="process"), path="arr", mode="r"
    )
    np.testing.assert_array_equal(reread[...], data)
    np.testing.assert_array_equal(reread[20:40, 5:30], data[20:40, 5:30])
