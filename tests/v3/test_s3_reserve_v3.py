"""A whole-array zarr 3 write on S3 sends each shard's bytes about once, and readers without shardkv read it.

zarr 3 hands ``shardkv.zarr3.ShardedStore`` a few chunks of a shard at a
time. A shard expected to outgrow S3's 5 MiB part minimum is begun led by a
reserve of zero bytes, so every later round is an O(chunk) update (a
server-side copy of what stays, the new chunks and index sent); the first
update that keeps 5 MiB after the reserve drops it. Counted on the wire at
moto's S3 server (``tests/moto_strict.py``); zarr 3 alone and tensorstore read
the shard exactly while its reserve is there, and after.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("zarr.abc.store")
s3fs = pytest.importorskip("s3fs")
boto3 = pytest.importorskip("boto3")
pytest.importorskip("moto.server")

import zarr  # noqa: E402
from zarr.storage import FsspecStore  # noqa: E402

from shardkv.storage.s3_updates import MIN_PART_NBYTES  # noqa: E402
from shardkv.zarr3 import ShardedStore  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: moto_strict
import moto_strict  # noqa: E402
from v3_helpers import read_tensorstore, read_zarr3  # noqa: E402

pytestmark = pytest.mark.zarr3
BUCKET = "shardkv-reserve"
CHUNK, N = 65536, 96  # uint16: 128 KiB chunks, one 12 MiB shard (uncompressed)
INDEX_NBYTES = N * 16 + 4


@pytest.fixture(scope="module")
def moto() -> Iterator[tuple[str, moto_strict.Wire]]:
    server, endpoint = moto_strict.start_server()
    _client(endpoint).create_bucket(Bucket=BUCKET)
    try:
        yield endpoint, moto_strict.Wire(server)
    finally:
        server.stop()


def _client(endpoint: str) -> Any:
    return boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id="t", aws_secret_access_key="t", region_name="us-east-1"
    )


def _base(endpoint: str, root: str, read_only: bool = False) -> FsspecStore:
    options = {"endpoint_url": endpoint, "region_name": "us-east-1"}
    fs = s3fs.S3FileSystem(key="t", secret="t", client_kwargs=options, asynchronous=True, skip_instance_cache=True)
    return FsspecStore(fs, path=f"{BUCKET}/{root}", read_only=read_only)


def _create(endpoint: str, root: str) -> Any:
    store = ShardedStore(_base(endpoint, root), chunks_per_shard=N)
    return zarr.create_array(store, shape=(N * CHUNK,), chunks=(CHUNK,), dtype="u2", compressors=None, fill_value=0)


def _download(endpoint: str, root: str, to: Path) -> Path:
    client = _client(endpoint)
    for o in client.list_objects_v2(Bucket=BUCKET, Prefix=f"{root}/")["Contents"]:
        path = to / o["Key"][len(root) + 1 :]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(client.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read())
    return to


def test_a_whole_array_write_sends_each_shard_about_once_and_reads_only_indexes(moto: Any) -> None:
    endpoint, wire = moto
    root = f"whole-{uuid.uuid4().hex[:8]}"
    data = np.random.default_rng(0).integers(0, 2**16, N * CHUNK, dtype="u2")
    z = _create(endpoint, root)
    wire.take()
    z[...] = data
    seen = wire.take()
    live = data.nbytes + INDEX_NBYTES
    assert _client(endpoint).head_object(Bucket=BUCKET, Key=f"{root}/c/0")["ContentLength"] == live  # no reserve left
    assert sum(e.up for e in seen) <= 1.5 * live  # the chunks, the reserve once, the indexes of the rounds
    assert sum(e.down for e in seen) <= 64 * 1024  # indexes and XML, never a shard
    np.testing.assert_array_equal(zarr.open_array(_base(endpoint, root, read_only=True), mode="r")[...], data)


def test_readers_without_shardkv_read_a_shard_led_by_its_reserve(moto: Any, tmp_path: Path) -> None:
    endpoint, _ = moto
    root = f"begun-{uuid.uuid4().hex[:8]}"
    want = np.zeros(N * CHUNK, dtype="u2")
    want[: 8 * CHUNK] = np.arange(8 * CHUNK, dtype="u2")
    _create(endpoint, root)[: 8 * CHUNK] = want[: 8 * CHUNK]
    size = _client(endpoint).head_object(Bucket=BUCKET, Key=f"{root}/c/0")["ContentLength"]
    assert size == MIN_PART_NBYTES + INDEX_NBYTES  # 1 MiB of chunks after 4 MiB of reserve
    np.testing.assert_array_equal(zarr.open_array(_base(endpoint, root, read_only=True), mode="r")[...], want)
    local = _download(endpoint, root, tmp_path / "a")
    np.testing.assert_array_equal(read_zarr3(local), want)
    np.testing.assert_array_equal(read_tensorstore(local), want)


def test_writes_of_chunk_runs_over_a_reserve_read_as_a_model_says(moto: Any) -> None:
    endpoint, _ = moto
    root = f"model-{uuid.uuid4().hex[:8]}"
    rng = np.random.default_rng(7)
    model = np.zeros(N * CHUNK, dtype="u2")
    z = _create(endpoint, root)
    sizes = []
    for step in range(20):  # runs of 1 to 5 chunks, zeros (chunks deleted) or values, from fresh stores or not
        start = int(rng.integers(0, N * CHUNK))
        stop = min(N * CHUNK, start + int(rng.integers(1, 5 * CHUNK)))
        values = np.zeros(stop - start, "u2") if rng.integers(0, 4) == 0 else rng.integers(0, 2**16, stop - start)
        if rng.integers(0, 2):
            z = zarr.open_array(ShardedStore(_base(endpoint, root), chunks_per_shard=N), mode="r+")
        z[start:stop] = model[start:stop] = values
        got = zarr.open_array(_base(endpoint, root, read_only=True), mode="r")[...]
        np.testing.assert_array_equal(got, model, err_msg=f"step {step}")
        sizes.append(_client(endpoint).head_object(Bucket=BUCKET, Key=f"{root}/c/0")["ContentLength"])
    assert sizes[0] >= MIN_PART_NBYTES and min(sizes[1:]) < max(sizes)  # begun with a reserve, dropped later
