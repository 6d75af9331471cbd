"""O(chunk) updates on S3: a multipart upload whose first part is a server-side copy, counted on the wire.

One shard of 48 chunks of 128 KiB (6 MiB, uncompressed, index at the end):
an update of one chunk of the stored shard sends the chunk and the new
index, copies the rest on the server (``UploadPartCopy`` pinned to the ETag
whose index was read) and completes with ``If-Match`` on that ETag; only the
index comes down. A writer that loses its race (another commits between its
copy and its complete) is refused by the complete (412), aborts its upload,
and sends only its chunk again. Every exchange is recorded at the moto server
(``tests/moto_strict.py``), which refuses stale completes and copies as S3 does.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Iterator
from typing import Any

import moto_strict
import numpy as np
import pytest
import zarr

boto3 = pytest.importorskip("boto3")
s3fs = pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

from shardkv import ShardedStore  # noqa: E402
from shardkv.storage.s3 import S3Store  # noqa: E402
from shardkv.storage.s3_updates import MIN_PART_NBYTES  # noqa: E402

pytestmark = pytest.mark.zarr2
BUCKET = "shardkv-updates"
CHUNK = 65536  # uint16 items: 128 KiB a chunk
N_CHUNKS = 48  # one shard of 6 MiB
CHUNK_NBYTES = CHUNK * 2
INDEX_NBYTES = N_CHUNKS * 16 + 4  # offset/nbytes pairs and the CRC32C
XML_NBYTES = 2048  # bound of the XML bodies of one upload's requests and answers


@pytest.fixture(scope="module")
def moto() -> Iterator[tuple[str, moto_strict.Wire]]:
    server, endpoint = moto_strict.start_server()
    wire = moto_strict.Wire(server)
    _client(endpoint).create_bucket(Bucket=BUCKET)
    try:
        yield endpoint, wire
    finally:
        server.stop()


def _client(endpoint: str) -> Any:
    return boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id="t", aws_secret_access_key="t", region_name="us-east-1"
    )


def _fs(endpoint: str) -> Any:
    options = {"endpoint_url": endpoint, "region_name": "us-east-1"}
    return s3fs.S3FileSystem(key="t", secret="t", client_kwargs=options, skip_instance_cache=True)


def _array(endpoint: str, root: str, n_chunks: int = N_CHUNKS, **options: Any) -> Any:
    options.setdefault("chunks_per_shard", N_CHUNKS)
    store = ShardedStore(_fs(endpoint).get_mapper(f"{BUCKET}/{root}"), **options)
    return zarr.open_array(
        store, mode="a", shape=(n_chunks * CHUNK,), chunks=(CHUNK,), dtype="u2", compressor=None, fill_value=0
    )


def _chunk(c: int, seed: int) -> np.ndarray:
    return np.random.default_rng([c, seed]).integers(0, 2**16, CHUNK, dtype="u2")


def _stored_array(endpoint: str, root: str, n_chunks: int = N_CHUNKS) -> np.ndarray:
    data = np.concatenate([_chunk(c, 0) for c in range(n_chunks)])
    _array(endpoint, root, n_chunks)[:] = data
    return data


def _by_operation(exchanges: list[moto_strict.Exchange]) -> dict[str, list[moto_strict.Exchange]]:
    out: dict[str, list[moto_strict.Exchange]] = {}
    for e in exchanges:
        out.setdefault(e.operation, []).append(e)
    return out


def test_one_chunk_update_sends_the_chunk_and_the_index_and_reads_only_the_index(moto) -> None:
    endpoint, wire = moto
    root = f"one-{uuid.uuid4().hex[:8]}"
    data = _stored_array(endpoint, root)
    arr = _array(endpoint, root)  # a fresh store: no index cached
    wire.take()
    data[5 * CHUNK : 6 * CHUNK] = new = _chunk(5, 1)
    arr[5 * CHUNK : 6 * CHUNK] = new
    seen = wire.take()
    ops = _by_operation(seen)
    assert "PutObject" not in ops and len(ops["UploadPartCopy"]) == 1 and len(ops["CompleteMultipartUpload"]) == 1
    assert [e.up for e in ops["UploadPart"]] == [CHUNK_NBYTES + INDEX_NBYTES]  # the chunk and the new index
    assert [e.down for e in ops["GetObject"]] == [INDEX_NBYTES]  # the index, read by its range
    assert ops["UploadPartCopy"][0].headers["x-amz-copy-source-range"] == f"bytes=0-{N_CHUNKS * CHUNK_NBYTES - 1}"
    assert sum(e.up for e in seen) <= CHUNK_NBYTES + INDEX_NBYTES + XML_NBYTES
    assert sum(e.down for e in seen) <= INDEX_NBYTES + XML_NBYTES
    np.testing.assert_array_equal(_array(endpoint, root)[:], data)
    assert _client(endpoint).list_multipart_uploads(Bucket=BUCKET, Prefix=root).get("Uploads", []) == []


def test_a_writer_refused_at_its_complete_sends_only_its_chunk_again(moto) -> None:
    endpoint, wire = moto
    root = f"race-{uuid.uuid4().hex[:8]}"
    data = _stored_array(endpoint, root)
    a, b = _array(endpoint, root), _array(endpoint, root, concurrency="none")  # b: not this process's stripes
    kv = a.store._kv
    assert isinstance(kv, S3Store)
    real_api = kv._api
    raced: list[str] = []

    async def api(method: str, **kwargs: Any) -> Any:
        if method == "upload_part" and not raced:  # after the copy, before the complete: the other commits
            raced.append(method)
            await asyncio.to_thread(b.__setitem__, slice(7 * CHUNK, 8 * CHUNK), _chunk(7, 2))  # s3fs's loop runs on
        return await real_api(method, **kwargs)

    kv._api = api  # type: ignore[method-assign]
    wire.take()
    a[3 * CHUNK : 4 * CHUNK] = _chunk(3, 1)
    seen = wire.take()
    ops = _by_operation(seen)
    assert raced and "PutObject" not in ops
    assert [e.status for e in ops["CompleteMultipartUpload"]] == [200, 412, 200]  # b's, a's stale one, a's retry
    assert len(ops["AbortMultipartUpload"]) == 1
    assert [e.up for e in ops["UploadPart"]] == [CHUNK_NBYTES + INDEX_NBYTES] * 3  # a's chunk twice, b's once
    assert all(e.down <= INDEX_NBYTES for e in ops["GetObject"])  # indexes only, never a shard
    data[3 * CHUNK : 4 * CHUNK], data[7 * CHUNK : 8 * CHUNK] = _chunk(3, 1), _chunk(7, 2)
    np.testing.assert_array_equal(_array(endpoint, root)[:], data)  # both changes landed
    assert _client(endpoint).list_multipart_uploads(Bucket=BUCKET, Prefix=root).get("Uploads", []) == []


def test_a_copy_pinned_to_a_replaced_shard_is_refused_and_planned_again(moto) -> None:
    endpoint, wire = moto
    root = f"copy-{uuid.uuid4().hex[:8]}"
    data = _stored_array(endpoint, root)
    a, b = _array(endpoint, root), _array(endpoint, root)
    a[0:CHUNK] = data[0:CHUNK]  # a caches the index
    b[9 * CHUNK : 10 * CHUNK] = _chunk(9, 3)  # the shard a's index came from is gone
    wire.take()
    a[1 * CHUNK : 2 * CHUNK] = _chunk(1, 4)
    ops = _by_operation(wire.take())
    assert [e.operation for e in ops["HeadObject"]] and ops["HeadObject"][0].status == 412  # cached index: stale
    assert [e.up for e in ops["UploadPart"]] == [CHUNK_NBYTES + INDEX_NBYTES]
    data[9 * CHUNK : 10 * CHUNK], data[CHUNK : 2 * CHUNK] = _chunk(9, 3), _chunk(1, 4)
    np.testing.assert_array_equal(_array(endpoint, root)[:], data)


def test_a_shard_below_five_mib_is_written_whole(moto) -> None:
    endpoint, wire = moto
    root = f"small-{uuid.uuid4().hex[:8]}"
    data = _stored_array(endpoint, root, n_chunks=N_CHUNKS)
    small = _array(endpoint, f"{root}-small", n_chunks=8)
    small[:] = data[: 8 * CHUNK]  # 1 MiB: S3 copies no part that small
    wire.take()
    small[0:CHUNK] = _chunk(0, 5)
    ops = _by_operation(wire.take())
    assert "CreateMultipartUpload" not in ops and len(ops["PutObject"]) == 1


def test_a_shard_begun_in_part_is_led_by_a_reserve_so_each_later_chunk_costs_the_chunk(moto) -> None:
    endpoint, wire = moto
    root = f"reserve-{uuid.uuid4().hex[:8]}"
    n = 2 * N_CHUNKS  # a 12 MiB shard: expected to outgrow S3's 5 MiB part minimum twice over
    client = _client(endpoint)

    def size() -> int:
        return int(client.head_object(Bucket=BUCKET, Key=f"{root}/0")["ContentLength"])

    data = np.zeros(n * CHUNK, dtype="u2")
    wire.take()
    _array(endpoint, root, n, chunks_per_shard=n)[0:CHUNK] = data[0:CHUNK] = _chunk(0, 0)
    first = wire.take()
    assert size() == MIN_PART_NBYTES + n * 16 + 4  # the chunk led by the zero bytes that make 5 MiB
    assert sum(e.up for e in first) <= MIN_PART_NBYTES + n * 16 + 4 + XML_NBYTES
    for c in range(1, 41):  # each chunk from a fresh store, as a dask task writes it
        arr = _array(endpoint, root, n, chunks_per_shard=n)
        wire.take()
        arr[c * CHUNK : (c + 1) * CHUNK] = data[c * CHUNK : (c + 1) * CHUNK] = _chunk(c, 0)
        seen = wire.take()
        assert "PutObject" not in _by_operation(seen)
        assert sum(e.up for e in seen) <= CHUNK_NBYTES + n * 16 + 4 + XML_NBYTES, c  # the chunk and the index
        assert sum(e.down for e in seen) <= n * 16 + 4 + XML_NBYTES, c  # the index
    assert size() == 41 * CHUNK_NBYTES + n * 16 + 4  # the reserve went once 5 MiB of chunks followed it
    np.testing.assert_array_equal(_array(endpoint, root, n, chunks_per_shard=n)[:], data)


def test_a_writer_that_loses_the_race_to_begin_a_shard_sends_only_its_chunk_again(moto) -> None:
    endpoint, wire = moto
    root = f"begin-{uuid.uuid4().hex[:8]}"
    n = 2 * N_CHUNKS
    a = _array(endpoint, root, n, chunks_per_shard=n)
    b = _array(endpoint, root, n, chunks_per_shard=n, concurrency="none")  # b: not this process's stripes
    kv = a.store._kv
    real_s3 = kv._s3
    raced: list[str] = []

    async def s3(method: str, key: str, **kwargs: Any) -> Any:
        if method == "put_object" and key.rsplit("/", 1)[-1] == "0" and not raced:  # a found no shard: b begins it
            raced.append(key)
            await asyncio.to_thread(b.__setitem__, slice(7 * CHUNK, 8 * CHUNK), _chunk(7, 2))
        return await real_s3(method, key, **kwargs)

    kv._s3 = s3  # type: ignore[method-assign]
    wire.take()
    a[3 * CHUNK : 4 * CHUNK] = _chunk(3, 1)
    ops = _by_operation(wire.take())
    assert raced and [e.status for e in ops["PutObject"]] == [200, 412]  # b's shard with its reserve, a's refused
    assert [e.up for e in ops["UploadPart"]] == [CHUNK_NBYTES + n * 16 + 4]  # a again: its chunk and the index
    data = np.zeros(n * CHUNK, dtype="u2")
    data[3 * CHUNK : 4 * CHUNK], data[7 * CHUNK : 8 * CHUNK] = _chunk(3, 1), _chunk(7, 2)
    np.testing.assert_array_equal(_array(endpoint, root, n, chunks_per_shard=n)[:], data)  # both landed


def test_compact_aborts_the_incomplete_uploads_killed_writers_left(moto) -> None:
    endpoint, _ = moto
    root = f"orphans-{uuid.uuid4().hex[:8]}"
    _stored_array(endpoint, root)
    client = _client(endpoint)
    orphan = client.create_multipart_upload(Bucket=BUCKET, Key=f"{root}/0")["UploadId"]
    elsewhere = client.create_multipart_upload(Bucket=BUCKET, Key=f"other-{root}/0")["UploadId"]

    def uploads() -> set[str]:
        return {u["UploadId"] for u in client.list_multipart_uploads(Bucket=BUCKET).get("Uploads", [])}

    assert {orphan, elsewhere} <= uploads()
    # upload_age=0: moto dates every upload 2010-11-10, so its age cannot tell a live writer's here
    ShardedStore(S3Store(_fs(endpoint), f"{BUCKET}/{root}", upload_age=0)).compact()
    assert orphan not in uploads() and elsewhere in uploads()
    client.abort_multipart_upload(Bucket=BUCKET, Key=f"other-{root}/0", UploadId=elsewhere)


def test_the_kept_bytes_are_copied_in_parts_s3_accepts() -> None:
    from shardkv.storage.s3_updates import MAX_PART_NBYTES, MIN_PART_NBYTES, copy_ranges

    assert copy_ranges(MIN_PART_NBYTES) == [(0, MIN_PART_NBYTES)]
    for keep in (MAX_PART_NBYTES, MAX_PART_NBYTES + 1, 3 * MAX_PART_NBYTES - 7, 10**13):
        ranges = copy_ranges(keep)
        assert ranges[0][0] == 0 and ranges[-1][1] == keep
        assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))  # back to back
        assert all(MIN_PART_NBYTES <= stop - start <= MAX_PART_NBYTES for start, stop in ranges)
    with pytest.raises(ValueError, match="cannot be copied as a part"):
        copy_ranges(MIN_PART_NBYTES - 1)


def test_an_update_carries_the_file_systems_extra_arguments(moto) -> None:
    endpoint, wire = moto
    root = f"sse-{uuid.uuid4().hex[:8]}"
    options = {"endpoint_url": endpoint, "region_name": "us-east-1"}
    fs = s3fs.S3FileSystem(
        key="t",
        secret="t",
        client_kwargs=options,
        skip_instance_cache=True,
        s3_additional_kwargs={"ServerSideEncryption": "AES256"},  # a bucket policy may demand it of every write
    )
    store = ShardedStore(fs.get_mapper(f"{BUCKET}/{root}"), chunks_per_shard=N_CHUNKS)
    arr = zarr.open_array(
        store, mode="a", shape=(N_CHUNKS * CHUNK,), chunks=(CHUNK,), dtype="u2", compressor=None, fill_value=0
    )
    arr[:] = data = np.concatenate([_chunk(c, 0) for c in range(N_CHUNKS)])
    wire.take()
    arr[2 * CHUNK : 3 * CHUNK] = data[2 * CHUNK : 3 * CHUNK] = _chunk(2, 6)
    assert "CreateMultipartUpload" in _by_operation(wire.take())  # an O(chunk) update, not a whole PUT
    head = _client(endpoint).head_object(Bucket=BUCKET, Key=f"{root}/0")
    assert head.get("ServerSideEncryption") == "AES256"
    np.testing.assert_array_equal(_array(endpoint, root)[:], data)
