"""Zero lost updates on obstore stores: compare-and-swap shard writes against moto's S3 server.

* :class:`~shardkv.storage.obstore.ObstoreStore` reads a value and its version
  in one GET, reads only if unchanged (``If-Match``), and puts conditionally
  with ``PutMode``;
* ``concurrency="auto"`` gives ``"conditional"`` for an obstore ``S3Store``,
  lock files for a ``LocalStore``, and refuses an ``S3Store`` whose
  conditional puts are disabled;
* a forced race is refused by the server and retried; spawned processes and
  threads, each with its own store, writing disjoint chunks of shared shards
  lose nothing;
* a shard emptied by erasing stays as an empty shard object (obstore has no
  conditional delete), so a concurrent writer's chunk is never deleted.

Every loop is bounded in count and time; threads and processes are joined with a timeout.
"""

from __future__ import annotations

import pickle
import uuid

import numpy as np
import pytest
from concurrency_harness import MotoS3, moto_s3, run_sharded_writers, run_threads  # noqa: F401  (fixture)

from shardkv import ShardedStore
from shardkv.engine.locks import ShardLocks
from shardkv.errors import ConfigurationError
from shardkv.format.layout import EMPTY
from shardkv.format.ranges import ByteRange
from shardkv.storage.kv import ANY, NO_VALUE
from shardkv.storage.obstore import ObstoreStore
from shardkv.storage.open import kv_of_fs, open_kv

zarr = pytest.importorskip("zarr")
obstore_store = pytest.importorskip("obstore.store")
if not zarr.__version__.startswith("2."):
    pytest.skip("zarr-python 2 only", allow_module_level=True)

REGION = "us-east-1"
N_THREADS = 8
JOIN_S = 60.0


def _s3(moto_s3: MotoS3, prefix: str, **config) -> object:  # noqa: F811
    return obstore_store.S3Store(
        moto_s3.bucket,
        prefix=prefix,
        endpoint=moto_s3.endpoint_url,
        region=REGION,
        access_key_id="testing",
        secret_access_key="testing",
        client_options={"allow_http": True},
        **config,
    )


def _url_options(moto_s3: MotoS3) -> dict:  # noqa: F811
    return {
        "client": "obstore",
        "endpoint": moto_s3.endpoint_url,
        "region": REGION,
        "access_key_id": "testing",
        "secret_access_key": "testing",
        "client_options": {"allow_http": True},
    }


def _prefix(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


# -- the conditional store ------------------------------------------------------------------


def test_reads_return_bytes_and_version_of_one_get(moto_s3) -> None:  # noqa: F811
    kv = open_kv(_s3(moto_s3, _prefix("reads")))
    assert isinstance(kv, ObstoreStore) and kv.caps.round_trips and not kv.caps.conditional_delete
    assert kv.get("k").state == "missing"
    version = kv.put("k", b"hello world", if_generation=NO_VALUE)
    assert version is not None and isinstance(version.token, tuple) and version.token[0]  # (e_tag, version)
    cases = {
        None: b"hello world",
        ByteRange(1, 3): b"el",
        ByteRange(-5, None): b"world",
        ByteRange(6, None): b"world",
        ByteRange(4, 4): b"",
        ByteRange(11, 20): b"",
        ByteRange(8, 20): b"rld",
    }
    for byte_range, expected in cases.items():
        result = kv.get("k", None if byte_range is None else [byte_range])
        assert [bytes(d) for d in result.values or []] == [expected] and result.generation == version, byte_range
    many = kv.get_many([("k", [ByteRange(0, 5)], ANY), ("k", None, ANY)])
    assert [bytes(r.values[0]) for r in many if r.values] == [b"hello", b"hello world"]
    assert [r.state for r in kv.get_many([("missing", None, ANY)])] == ["missing"]


def test_conditional_reads_and_puts_refuse_a_changed_value(moto_s3) -> None:  # noqa: F811
    kv = open_kv(_s3(moto_s3, _prefix("swap")))
    first = kv.put("k", b"one", if_generation=NO_VALUE)
    assert first is not None
    assert kv.put("k", b"again", if_generation=NO_VALUE) is None  # create-only: it exists
    second = kv.put("k", b"two", if_generation=first)
    assert second is not None and second != first
    assert kv.put("k", b"stale", if_generation=first) is None  # If-Match on the old ETag: 412
    read = kv.get("k", [ByteRange(0, 2)], if_generation=second)
    assert read.found and [bytes(d) for d in read.values or []] == [b"tw"]
    for empty in (ByteRange(1, 1), ByteRange(5, 9)):  # a HEAD-like GET; a range past the end
        read = kv.get("k", [empty], if_generation=second)
        assert read.found and [bytes(d) for d in read.values or []] == [b""], empty
    assert kv.get("k", None, if_generation=first).state == "stale"
    assert kv.get("gone", None, if_generation=first).state in ("missing", "stale")
    assert kv.get("k", None, if_generation=NO_VALUE).state == "stale"  # "only if nothing is stored"
    results = kv.get_many([("k", None, second), ("k", None, first)])
    assert [(r.found, None if r.values is None else bytes(r.values[0])) for r in results] == [
        (True, b"two"),
        (False, None),
    ]
    assert kv.delete("k", if_generation=first) is False  # no conditional delete in obstore: checked first
    assert bytes(kv.get("k").whole()) == b"two"


# -- choosing the guarantee -----------------------------------------------------------------


def test_auto_is_conditional_for_an_obstore_s3_store(moto_s3, tmp_path) -> None:  # noqa: F811
    prefix = _prefix("auto")
    kv = open_kv(_s3(moto_s3, prefix))
    assert ShardLocks.of_store(kv).mode == "conditional" and isinstance(kv, ObstoreStore) and kv.caps.conditional_put
    assert ShardedStore(_s3(moto_s3, prefix)).concurrency_mode == "conditional"
    by_url = ShardedStore(f"s3://{moto_s3.bucket}/{prefix}", storage_options=_url_options(moto_s3))
    assert by_url.concurrency_mode == "conditional"
    memory = open_kv(obstore_store.MemoryStore())  # real, atomic PutMode in the process
    assert (
        ShardLocks.of_store(memory).mode == "conditional"
        and memory.caps.conditional_put
        and not memory.caps.round_trips
    )
    local = open_kv(obstore_store.LocalStore(str(tmp_path)))  # no PutMode update: lock files
    assert ShardLocks.of_store(local).mode == "files" and not local.caps.conditional_put


def test_disabled_conditional_puts_are_refused_not_downgraded(moto_s3, monkeypatch) -> None:  # noqa: F811
    with pytest.raises(ConfigurationError, match="conditional_put='etag'"):
        ShardLocks.of_store(open_kv(_s3(moto_s3, _prefix("off"), conditional_put="disabled")))
    monkeypatch.setenv("AWS_CONDITIONAL_PUT", "disabled")
    with pytest.raises(ConfigurationError, match="AWS_CONDITIONAL_PUT"):
        ShardedStore(_s3(moto_s3, _prefix("off-env")))
    assert ShardLocks.of_store(open_kv(_s3(moto_s3, _prefix("off"))), "process").mode == "process"


@pytest.mark.parametrize("mode", ["none", "process"])
def test_a_store_with_disabled_conditional_puts_opens_writes_and_reads_with_an_explicit_mode(moto_s3, mode) -> None:  # noqa: F811
    store = _s3(moto_s3, _prefix(f"off-{mode}"), conditional_put="disabled")
    with pytest.raises(ConfigurationError, match="conditional_put='etag'"):
        ShardedStore(store)  # auto: refused, never downgraded
    sharded = ShardedStore(store, chunks_per_shard=4, concurrency=mode)
    assert sharded.concurrency_mode == mode
    assert sharded.engine.kv.caps.stamps == "native"  # reads are conditioned: GET If-Match only
    arr = zarr.open_array(store=sharded, mode="w", shape=(16,), chunks=(2,), dtype="i4", compressor=None)
    arr[:] = np.arange(16)
    np.testing.assert_array_equal(
        zarr.open_array(store=ShardedStore(store, concurrency=mode), mode="r")[:], np.arange(16)
    )


def test_a_missing_bucket_is_an_error_not_a_lost_race(moto_s3) -> None:  # noqa: F811
    boto3 = pytest.importorskip("boto3")
    bucket = f"gone-{uuid.uuid4().hex[:8]}"
    client = boto3.client(
        "s3",
        endpoint_url=moto_s3.endpoint_url,
        region_name=REGION,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    client.create_bucket(Bucket=bucket)
    s3 = obstore_store.S3Store(
        bucket,
        endpoint=moto_s3.endpoint_url,
        region=REGION,
        access_key_id="testing",
        secret_access_key="testing",
        client_options={"allow_http": True},
    )
    sharded = ShardedStore(s3, chunks_per_shard=4)
    arr = zarr.open_array(store=sharded, mode="w", shape=(8,), chunks=(2,), dtype="i4", compressor=None)
    for item in client.list_objects_v2(Bucket=bucket).get("Contents", []):
        client.delete_object(Bucket=bucket, Key=item["Key"])
    client.delete_bucket(Bucket=bucket)
    with pytest.raises(FileNotFoundError, match=bucket):
        open_kv(s3).put("k", b"x", if_generation=NO_VALUE)  # a create: not a lost race
    stats = sharded.engine.stats
    before = stats.write_attempts
    with pytest.raises(FileNotFoundError, match="does its bucket exist"):
        arr[0:2] = 1
    assert stats.write_attempts - before <= 1  # one attempt, not 16 retries of a "lost race"


def test_stores_of_one_bucket_and_prefix_share_a_location(moto_s3, tmp_path) -> None:  # noqa: F811
    prefix = _prefix("loc")
    a, b = ObstoreStore(_s3(moto_s3, prefix)), ObstoreStore(_s3(moto_s3, prefix + "/"))
    assert a.location == b.location and hash(a.location) == hash(b.location)
    assert a.location != ObstoreStore(_s3(moto_s3, _prefix("other"))).location
    by_url = open_kv(f"s3://{moto_s3.bucket}/{prefix}", _url_options(moto_s3))
    assert by_url.location == a.location
    s3fs_store = kv_of_fs(moto_s3.filesystem(), f"{moto_s3.bucket}/{prefix}")  # s3fs writers share locks too
    assert s3fs_store.location == a.location
    clone = pickle.loads(pickle.dumps(a))  # dask workers get the store's configuration
    assert isinstance(clone, ObstoreStore) and clone.location == a.location
    a.put("k", b"v")
    assert bytes(clone.get("k").whole()) == b"v" and clone.get("k").generation == a.get("k").generation
    store = pickle.loads(pickle.dumps(ShardedStore(_s3(moto_s3, prefix))))  # a dask task's copy
    assert store.concurrency_mode == "conditional" and store.engine.kv.location == a.location
    local = open_kv(obstore_store.LocalStore(str(tmp_path)))
    assert local.location == open_kv(str(tmp_path)).location  # the same lock files as fsspec writers


def test_lock_files_of_a_local_store_are_not_listed(tmp_path) -> None:
    store = ShardedStore(obstore_store.LocalStore(str(tmp_path)), chunks_per_shard=4)
    arr = zarr.open_array(store=store, mode="w", shape=(16,), chunks=(2,), dtype="i4", fill_value=0)
    arr[:] = 3
    assert (tmp_path / ".shardkv-locks").is_dir()
    assert not [k for k in store.keys() if "shardkv" in k]
    assert not [k for k in open_kv(obstore_store.LocalStore(str(tmp_path))).list_prefix("") if "shardkv" in k]


# -- races --------------------------------------------------------------------------------


def _race_once(store: ShardedStore, other_write) -> list[str]:
    """Make the next generation read of ``store`` run ``other_write`` right after it (once)."""
    kv = store.engine.kv
    read = kv.get_many
    raced: list[str] = []

    def read_then_lose_the_race(requests):
        found = read(requests)
        if not raced and requests and requests[0][1] is None:  # the shard read of the write
            raced.append(requests[0][0])  # the other writer stores the shard between our read and our write
            other_write()
        return found

    kv.get_many = read_then_lose_the_race
    return raced


def test_a_forced_race_is_refused_and_retried(moto_s3) -> None:  # noqa: F811
    prefix = _prefix("race")
    store = ShardedStore(_s3(moto_s3, prefix), chunks_per_shard=4)
    arr = zarr.open_array(store=store, mode="w", shape=(16,), chunks=(2,), dtype="i4", fill_value=0)
    arr[0:2] = 1
    other = zarr.open_array(store=ShardedStore(_s3(moto_s3, prefix), concurrency="none"), mode="r+")
    raced = _race_once(store, lambda: other.__setitem__(slice(2, 4), 2))
    arr[4:6] = 3
    stats = store.engine.stats
    assert raced == ["0"] and stats.write_lost >= 1, stats
    check = zarr.open_array(store=ShardedStore(_s3(moto_s3, prefix)), mode="r")
    np.testing.assert_array_equal(check[:8], [1, 1, 2, 2, 3, 3, 0, 0])  # both writers' chunks kept


def test_four_processes_writing_disjoint_chunks_lose_nothing(moto_s3) -> None:  # noqa: F811
    url = f"s3://{moto_s3.bucket}/{_prefix('procs')}"
    result = run_sharded_writers(
        url, n_procs=4, n_chunks=64, chunks_per_shard=16, storage_options=_url_options(moto_s3)
    )
    assert result.child_errors == ()
    assert result.lost == 0, f"{result.lost} of {result.total} chunk updates lost"


def test_eight_threads_with_their_own_stores_lose_nothing(moto_s3) -> None:  # noqa: F811
    prefix, chunk_len, n_chunks = _prefix("threads"), 4, 64  # 4 shards of 16 chunks
    setup = ShardedStore(_s3(moto_s3, prefix), chunks_per_shard=16)
    zarr.open_array(store=setup, mode="w", shape=(n_chunks * chunk_len,), chunks=(chunk_len,), dtype="i4", fill_value=0)
    stores = [ShardedStore(_s3(moto_s3, prefix), chunks_per_shard=16) for _ in range(N_THREADS)]

    def writer(w: int) -> None:
        arr = zarr.open_array(store=stores[w], mode="r+")
        for c in range(w, n_chunks, N_THREADS):
            arr[c * chunk_len : (c + 1) * chunk_len] = c + 1

    assert run_threads(writer, N_THREADS, JOIN_S) == []
    data = zarr.open_array(store=ShardedStore(_s3(moto_s3, prefix)), mode="r")[:]
    np.testing.assert_array_equal(data, np.repeat(np.arange(1, n_chunks + 1, dtype="i4"), chunk_len))


# -- empty shards instead of deletes ---------------------------------------------------------


def test_erasing_every_chunk_leaves_an_empty_shard(moto_s3) -> None:  # noqa: F811
    prefix = _prefix("erase")
    store = ShardedStore(_s3(moto_s3, prefix), chunks_per_shard=4)
    arr = zarr.open_array(store=store, mode="w", shape=(16,), chunks=(2,), dtype="i4", fill_value=7)
    arr[0:10] = 1  # shard 0 whole, shard 1 one chunk
    for key in ("0", "1", "2", "3"):
        del store[key]
    raw = ObstoreStore(_s3(moto_s3, prefix))
    assert raw.contains("0")  # kept: an unconditional delete could remove a concurrent writer's chunks
    entries = np.frombuffer(bytes(raw.get("0").whole())[: 4 * 2 * 8], dtype="<u8")
    assert raw.size("0") == 4 * 2 * 8 + 4 and (entries == EMPTY).all()  # the index (+ CRC32C) alone
    fresh = ShardedStore(_s3(moto_s3, prefix))
    np.testing.assert_array_equal(zarr.open_array(store=fresh, mode="r")[:], [7] * 8 + [1, 1] + [7] * 6)
    assert sorted(k for k in fresh.keys() if not k.startswith(".")) == ["4"]  # no chunk keys of shard 0
    assert zarr.open_array(store=fresh, mode="r").nchunks_initialized == 1
    arr[0:2] = 5  # an empty shard takes new chunks like any other
    np.testing.assert_array_equal(zarr.open_array(store=ShardedStore(_s3(moto_s3, prefix)), mode="r")[:4], [5, 5, 7, 7])


def test_a_writer_racing_an_erase_keeps_its_chunk(moto_s3) -> None:  # noqa: F811
    prefix = _prefix("erase-race")
    store = ShardedStore(_s3(moto_s3, prefix), chunks_per_shard=4)
    arr = zarr.open_array(store=store, mode="w", shape=(16,), chunks=(2,), dtype="i4", fill_value=0)
    arr[0:2] = 1  # shard 0 holds chunk 0 only: erasing it empties the shard
    other = zarr.open_array(store=ShardedStore(_s3(moto_s3, prefix), concurrency="none"), mode="r+")
    raced = _race_once(store, lambda: other.__setitem__(slice(2, 4), 2))
    del store["0"]
    check = zarr.open_array(store=ShardedStore(_s3(moto_s3, prefix)), mode="r")
    np.testing.assert_array_equal(check[:4], [0, 0, 2, 2])  # erased, and the racing chunk kept
    assert raced == ["0"] and store.engine.stats.write_lost >= 1
