"""Requests a full read of a sharded array makes on S3 (moto's server on loopback, every request logged).

Issue 13 item 2: a batch that wants every chunk of a shard whose index is not
cached reads the shard once (index from its tail), and opening the array
through zarr 2 costs a few metadata requests.
"""

from __future__ import annotations

import logging
import re
import socket
import uuid
from typing import Any, Iterator

import numpy as np
import pytest
import zarr

pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")

from shardkv import ShardedStore  # noqa: E402
from shardkv.errors import CorruptShardError  # noqa: E402

BUCKET = "shardkv-requests"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # werkzeug colours its request lines
SHAPE, CHUNKS, CPS = (64, 64), (8, 8), (4, 4)  # 2 x 2 shards of 4 x 4 chunks
SHARDS = ["arr/0.0", "arr/0.1", "arr/1.0", "arr/1.1"]


class _Requests(logging.Handler):
    """``(method, path)`` of every request werkzeug logs (moto's server runs in this process)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, str]] = []

    def reset(self) -> None:
        """Forget the requests seen; log requests again (other modules' fixtures quiet werkzeug)."""
        logging.getLogger("werkzeug").setLevel(logging.INFO)
        self.seen.clear()

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args
        if isinstance(args, tuple) and args:
            parts = _ANSI.sub("", str(args[0])).split(" ")
            if len(parts) >= 2:
                self.seen.append((parts[0], parts[1]))


@pytest.fixture(scope="module")
def s3() -> Iterator[tuple[dict[str, Any], _Requests]]:
    """Storage options for a moto S3 server with one bucket, and the log of its requests."""
    boto3 = pytest.importorskip("boto3")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = _Requests()
    werkzeug = logging.getLogger("werkzeug")
    werkzeug.addHandler(log)
    level, werkzeug.level = werkzeug.level, logging.INFO
    propagate, werkzeug.propagate = werkzeug.propagate, False
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1"
    ).create_bucket(Bucket=BUCKET)
    options = {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}}
    try:
        yield options, log
    finally:
        server.stop()
        werkzeug.removeHandler(log)
        werkzeug.setLevel(level)
        werkzeug.propagate = propagate


def _store(options: dict[str, Any], root: str, **kwargs: Any) -> ShardedStore:
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
    return ShardedStore(fs.get_mapper(f"{BUCKET}/{root}"), **kwargs)


def _written(options: dict[str, Any]) -> tuple[str, np.ndarray]:
    root = f"full-{uuid.uuid4().hex[:8]}"
    data = np.arange(np.prod(SHAPE), dtype="<f4").reshape(SHAPE)
    z = zarr.open_array(
        _store(options, root, chunks_per_shard=CPS), path="arr", mode="w", shape=SHAPE, chunks=CHUNKS, dtype="<f4"
    )
    z[:] = data
    return root, data


def test_full_read_is_one_get_per_shard_and_open_costs_three_requests_at_most(s3: Any) -> None:
    options, log = s3
    root, data = _written(options)
    reader = _store(options, root)  # fresh: nothing cached

    log.reset()
    z = zarr.open_array(reader, path="arr", mode="r")
    np.testing.assert_array_equal(z[:], data)
    shard_paths = {f"/{BUCKET}/{root}/{k}" for k in SHARDS}
    reads = sorted(r for r in log.seen if r[1] in shard_paths)
    assert reads == sorted(("GET", p) for p in shard_paths), reads  # one request per shard
    metadata = [r for r in log.seen if r[1] not in shard_paths]
    # arr/zarr.json on open, the root's zarr.json when the proxy finds the owner of the chunk keys
    assert len(metadata) <= 3, metadata
    assert all(method == "GET" and path.endswith("/zarr.json") for method, path in metadata), metadata

    log.reset()  # the indexes are cached now: a second read costs chunk ranges, no index read
    np.testing.assert_array_equal(z[:], data)
    assert len(log.seen) == len(SHARDS), log.seen


def test_a_few_chunks_of_a_shard_still_read_index_then_ranges(s3: Any) -> None:
    options, log = s3
    root, data = _written(options)
    reader = _store(options, root)
    z = zarr.open_array(reader, path="arr", mode="r")
    log.reset()
    np.testing.assert_array_equal(z[0:8, 0:16], data[0:8, 0:16])  # 2 of the 16 chunks of shard 0.0
    shard_reads = [p for _, p in log.seen if not p.endswith("/zarr.json")]
    assert shard_reads == [f"/{BUCKET}/{root}/arr/0.0"] * 2  # the index, then one merged range


def test_whole_shard_read_catches_a_truncated_shard(s3: Any) -> None:
    import s3fs

    options, log = s3
    root, _ = _written(options)
    reader = _store(options, root)
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
    path = f"{BUCKET}/{root}/arr/0.0"
    stored = fs.cat_file(path)
    fs.pipe_file(path, stored[:100] + stored[164:])  # 64 bytes of chunk data gone, the index intact
    z = zarr.open_array(reader, path="arr", mode="r")
    log.reset()
    with pytest.raises(CorruptShardError, match="arr/0.0"):
        z[:]
    assert [p for _, p in log.seen].count(f"/{BUCKET}/{root}/arr/0.0") == 1  # caught by the whole read itself


def test_a_chunk_of_a_cached_shard_is_one_conditional_get(s3: Any) -> None:
    options, log = s3
    root, data = _written(options)
    reader = _store(options, root, concurrency="none")  # reads are pinned whatever the writers' mode
    z = zarr.open_array(reader, path="arr", mode="r")
    np.testing.assert_array_equal(z[0:8, 0:8], data[0:8, 0:8])  # the index (with its ETag), then the chunk
    log.reset()
    np.testing.assert_array_equal(z[0:8, 8:16], data[0:8, 8:16])  # another chunk of the cached shard
    assert log.seen == [("GET", f"/{BUCKET}/{root}/arr/0.0")]  # one GET (If-Match the cached index's ETag)
    assert reader.engine.stats.read_stale == 0


def test_a_writer_caches_the_etag_it_wrote_so_its_next_chunk_read_is_one_get(s3: Any) -> None:
    options, log = s3
    root, data = _written(options)
    store = _store(options, root)  # "auto": compare-and-swap writes, whose answers carry the new ETag
    z = zarr.open_array(store, path="arr", mode="r+")
    z[0:8, 0:8] = -1  # a partly covered shard: read with its ETag, merged, written If-Match
    log.reset()
    np.testing.assert_array_equal(z[0:8, 8:16], data[0:8, 8:16])  # another chunk of the shard just written
    assert log.seen == [("GET", f"/{BUCKET}/{root}/arr/0.0")]  # no index GET: the written ETag pins the read
    np.testing.assert_array_equal(z[0:8, 0:8], -1)
    assert store.engine.stats.read_stale == 0


# -- listings: the ETags of ListObjectsV2 confirm the cached indexes ---------------------------------------


def _listing_requests(log: _Requests) -> list[tuple[str, str]]:
    return [r for r in log.seen if "list-type=2" in r[1]]


def test_a_warm_listing_is_the_listing_request_alone(s3: Any) -> None:
    options, log = s3
    root, _ = _written(options)
    store = _store(options, root)
    z = zarr.open_array(store, path="arr", mode="r")
    cold = list(store)
    assert z.nchunks_initialized == z.nchunks
    shard_paths = {f"/{BUCKET}/{root}/{k}" for k in SHARDS}
    log.reset()
    assert list(store) == cold
    assert len(store) == len(cold)
    assert sorted(store.keys()) == sorted(cold)
    assert z.nchunks_initialized == z.nchunks  # zarr 2: listdir of the array
    assert not [r for r in log.seen if r[1] in shard_paths], log.seen  # no HEAD or GET per cached shard
    assert log.seen == _listing_requests(log), log.seen  # nothing but ListObjectsV2
    assert len(log.seen) == 4  # one listing each (list(store) once, not twice)


def test_a_shard_rewritten_by_another_store_is_read_again_by_the_next_listing(s3: Any) -> None:
    options, log = s3
    root, _ = _written(options)
    store = _store(options, root)
    before = set(store)  # warm: every index cached with its ETag
    other = _store(options, root)
    del other["arr/0.1"]  # a chunk of shard arr/0.0: the shard is rewritten (a new ETag)
    log.reset()
    assert set(store) == before - {"arr/0.1"}
    shard_reads = [r for r in log.seen if r not in _listing_requests(log)]
    assert shard_reads == [("GET", f"/{BUCKET}/{root}/arr/0.0")], log.seen  # its index, the others confirmed
