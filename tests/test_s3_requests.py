"""Requests a full read of a sharded array makes on S3 (moto's server on loopback, every request logged).

A batch that wants every chunk of a shard whose index is not
cached reads the shard once (index from its tail), and opening the array
through zarr 2 costs a few metadata requests.

The request budget, proved on the wire for the s3fs and obstore clients: every
HTTP exchange the server answers is recorded (:class:`moto_strict.Wire`, a WSGI
wrapper around moto's application: method, path, ``Range``, ``If-Match``,
status and the bytes of the response body), so the tests assert what was sent
and how many bytes came back. Expected ranges come from the shard's own index,
decoded here from the stored bytes (:func:`_chunk_entry`), ETags from a
``HeadObject``.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import moto_strict
import numpy as np
import pytest
import zarr

pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")

from shardkv import ShardedStore  # noqa: E402
from shardkv.errors import CorruptShardError  # noqa: E402
from shardkv.keys.paths import join_path  # noqa: E402

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


@dataclass(frozen=True)
class _Exchange:
    """One HTTP exchange as moto's server saw it (``nbytes``: bytes of the response body; 0 for HEAD)."""

    method: str
    path: str
    range: str | None
    if_match: str | None
    status: int
    nbytes: int


def _seen(wire: moto_strict.Wire) -> list[_Exchange]:
    """The exchanges the server answered since the last call, as the tests below compare them."""
    return [
        _Exchange(e.method, e.path, e.headers.get("range"), e.headers.get("if-match"), e.status, e.down)
        for e in wire.take()
    ]


@dataclass(frozen=True)
class _Moto:
    """The module's moto server: s3fs options, its endpoint, the werkzeug log and the exchange recorder."""

    options: dict[str, Any]
    endpoint: str
    log: _Requests
    exchanges: moto_strict.Wire
    client: Any  # a boto3 S3 client, to look at what is stored outside the recorded windows


@pytest.fixture(scope="module")
def s3(moto: _Moto) -> tuple[dict[str, Any], _Requests]:
    """Storage options for a moto S3 server with one bucket, and the log of its requests."""
    return moto.options, moto.log


@pytest.fixture(scope="module")
def moto() -> Iterator[_Moto]:
    """A moto S3 server with one bucket, its requests logged (werkzeug) and its exchanges recorded (WSGI)."""
    boto3 = pytest.importorskip("boto3")
    log = _Requests()
    werkzeug = logging.getLogger("werkzeug")
    werkzeug.addHandler(log)
    level, werkzeug.level = werkzeug.level, logging.INFO
    propagate, werkzeug.propagate = werkzeug.propagate, False
    server, endpoint = moto_strict.start_server()  # conditional writes decided as S3 decides them
    try:
        exchanges = moto_strict.Wire(server)  # every exchange the server answers, in order
    except RuntimeError as exc:
        server.stop()
        pytest.fail(str(exc))
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )
    client.create_bucket(Bucket=BUCKET)
    options = {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
    }
    try:
        yield _Moto(options, endpoint, log, exchanges, client)
    finally:
        server.stop()
        werkzeug.removeHandler(log)
        werkzeug.setLevel(level)
        werkzeug.propagate = propagate


def _store(options: dict[str, Any], root: str, **kwargs: Any) -> ShardedStore:
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
    return ShardedStore(fs.get_mapper(f"{BUCKET}/{root}"), **kwargs)


def _reader(moto: _Moto, root: str, client: str, **kwargs: Any) -> ShardedStore:
    """A fresh store on ``root`` through the s3fs or the obstore client (as tests/test_concurrency_readers.py)."""
    if client == "s3fs":
        return _store(moto.options, root, **kwargs)
    pytest.importorskip("obstore")
    options = {
        "client": "obstore",
        "endpoint": moto.endpoint,
        "region": "us-east-1",
        "access_key_id": "testing",
        "secret_access_key": "testing",
        "client_options": {"allow_http": True},
    }
    return ShardedStore(f"s3://{BUCKET}/{root}", storage_options=options, **kwargs)


def _stored(moto: _Moto, root: str, key: str) -> tuple[bytes, str]:
    """The stored bytes of ``key`` under ``root`` and its ETag (quoted, as S3 sends it)."""
    answer = moto.client.get_object(Bucket=BUCKET, Key=f"{root}/{key}")
    return answer["Body"].read(), answer["ETag"]


INDEX_NBYTES = 16 * int(np.prod(CPS)) + 4  # one (offset, nbytes) uint64 pair per chunk, then the CRC32C


def _chunk_entry(shard: bytes, local_coords: tuple[int, ...]) -> tuple[int, int]:
    """``(offset, nbytes)`` of a chunk of ``shard``, decoded from its stored index.

    The v1.0 ``sharding_indexed`` layout shardkv writes by default: the index at
    the end (``index_location`` "end"), little-endian uint64 pairs in C order of
    the local coordinates, then a 4-byte CRC32C (``index_codecs`` bytes + crc32c).
    """
    index = np.frombuffer(shard[-INDEX_NBYTES:-4], dtype="<u8").reshape(*CPS, 2)
    offset, nbytes = (int(v) for v in index[local_coords])
    return offset, nbytes


def _range(offset: int, nbytes: int) -> str:
    """The ``Range`` header of ``nbytes`` bytes from ``offset`` (HTTP ranges are inclusive)."""
    return f"bytes={offset}-{offset + nbytes - 1}"


def _written(options: dict[str, Any], path: str = "arr") -> tuple[str, np.ndarray]:
    """A new root holding the array at ``path`` (zarr 2 makes the groups above it), every chunk written."""
    root = f"full-{uuid.uuid4().hex[:8]}"
    data = np.arange(np.prod(SHAPE), dtype="<f4").reshape(SHAPE)
    z = zarr.open_array(
        _store(options, root, chunks_per_shard=CPS), path=path, mode="w", shape=SHAPE, chunks=CHUNKS, dtype="<f4"
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
    # arr/zarr.json on open; the owner of the chunk keys is found without the root's zarr.json
    assert len(metadata) <= 3, metadata
    assert all(method == "GET" and path.endswith("/zarr.json") for method, path in metadata), metadata
    assert metadata == [("GET", f"/{BUCKET}/{root}/arr/zarr.json")], metadata

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


CLIENTS = ["s3fs", "obstore"]


@pytest.mark.parametrize("client", CLIENTS)
def test_a_warm_chunk_read_is_one_get_of_exactly_the_chunks_bytes_if_match_the_shards_etag(
    moto: _Moto, client: str
) -> None:
    root, data = _written(moto.options)
    reader = _reader(moto, root, client)
    z = zarr.open_array(reader, path="arr", mode="r")
    np.testing.assert_array_equal(z[0:8, 0:8], data[0:8, 0:8])  # caches the index of shard arr/0.0 and its ETag
    shard, etag = _stored(moto, root, "arr/0.0")
    offset, nbytes = _chunk_entry(shard, (0, 1))  # chunk 0.1 of the array: local (0, 1) of shard 0.0
    assert reader.getsize("arr/0.1") == nbytes  # the proxy's cached index says the same
    assert 0 < nbytes < len(shard) // 8
    moto.exchanges.take()
    np.testing.assert_array_equal(z[0:8, 8:16], data[0:8, 8:16])
    # one request, conditional on the cached ETag; the bytes moved are the chunk's, not one more
    seen = _seen(moto.exchanges)
    assert seen == [_Exchange("GET", f"/{BUCKET}/{root}/arr/0.0", _range(offset, nbytes), etag, 206, nbytes)], seen


@pytest.mark.parametrize("client", CLIENTS)
def test_a_shard_replaced_elsewhere_costs_one_refused_get_one_index_get_and_one_chunk_get(
    moto: _Moto, client: str
) -> None:
    root, data = _written(moto.options)
    reader = _reader(moto, root, client)
    z = zarr.open_array(reader, path="arr", mode="r")
    np.testing.assert_array_equal(z[0:8, 8:16], data[0:8, 8:16])  # the index of arr/0.0 cached, with its ETag
    old_shard, old_etag = _stored(moto, root, "arr/0.0")
    old_offset, old_nbytes = _chunk_entry(old_shard, (0, 1))

    new = np.random.default_rng(21).random((8, 16), dtype="<f4")  # incompressible: chunk 0.1 grows and moves
    zarr.open_array(_store(moto.options, root), path="arr", mode="r+")[0:8, 0:16] = new  # another writer
    shard, etag = _stored(moto, root, "arr/0.0")
    offset, nbytes = _chunk_entry(shard, (0, 1))
    assert etag != old_etag and (offset, nbytes) != (old_offset, old_nbytes)
    stale = reader.engine.stats.read_stale

    moto.exchanges.take()
    np.testing.assert_array_equal(z[0:8, 8:16], new[:, 8:16])  # the new bytes, never the old offsets' bytes
    path = f"/{BUCKET}/{root}/arr/0.0"
    seen = _seen(moto.exchanges)
    assert [(e.method, e.path, e.range, e.if_match, e.status) for e in seen] == [
        ("GET", path, _range(old_offset, old_nbytes), old_etag, 412),  # refused: the shard is not the one cached
        ("GET", path, f"bytes=-{INDEX_NBYTES}", None, 206),  # the index, read again once
        ("GET", path, _range(offset, nbytes), etag, 206),  # the chunk, pinned to the new ETag
    ], seen
    assert [e.nbytes for e in seen[1:]] == [INDEX_NBYTES, nbytes]
    assert reader.engine.stats.read_stale == stale + 1


@pytest.mark.parametrize("path", ["", "arr", "g/arr"], ids=["root-array", "array-in-root-group", "nested-array"])
@pytest.mark.parametrize("client", CLIENTS)
def test_a_cold_chunk_read_is_the_arrays_zarr_json_then_the_index_then_the_chunk(
    moto: _Moto, client: str, path: str
) -> None:
    root, data = _written(moto.options, path)  # zarr 2 made the groups above the array: zarr.json at each level
    shard_key = join_path(path, "0.0")
    shard, etag = _stored(moto, root, shard_key)
    document, _ = _stored(moto, root, join_path(path, "zarr.json"))
    offset, nbytes = _chunk_entry(shard, (0, 0))

    moto.exchanges.take()
    reader = _reader(moto, root, client)  # opened cold: nothing read, nothing cached
    z = zarr.open_array(reader, path=path, mode="r")
    np.testing.assert_array_equal(z[0:8, 0:8], data[0:8, 0:8])
    seen = _seen(moto.exchanges)
    documents = Counter(e.path for e in seen if e.path.endswith("/zarr.json"))
    assert all(e.method == "GET" for e in seen) and set(documents.values()) == {1}, seen  # each zarr.json once
    prefix = f"/{BUCKET}/{root}/"
    # what tensorstore reads for the chunk too: the array's zarr.json (not its parents'), the index, the chunk
    assert seen == [
        _Exchange("GET", prefix + join_path(path, "zarr.json"), None, None, 200, len(document)),
        _Exchange("GET", prefix + shard_key, f"bytes=-{INDEX_NBYTES}", None, 206, INDEX_NBYTES),
        _Exchange("GET", prefix + shard_key, _range(offset, nbytes), etag, 206, nbytes),
    ], seen


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
    per_call = []
    for listing in (
        lambda: list(store) == cold,
        lambda: list(store.keys()) == cold,
        lambda: len(store) == len(cold),
        lambda: sorted(store.keys()) == sorted(cold),
        lambda: z.nchunks_initialized == z.nchunks,  # zarr 2: listdir of the array
    ):
        before = len(log.seen)
        assert listing()
        per_call.append(len(log.seen) - before)
    assert not [r for r in log.seen if r[1] in shard_paths], log.seen  # no HEAD or GET per cached shard
    assert log.seen == _listing_requests(log), log.seen  # nothing but ListObjectsV2
    # one listing each; list(store) may list twice (Python asks len() as a length hint)
    assert per_call[0] in (1, 2) and per_call[1:] == [1, 1, 1, 1], per_call


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
