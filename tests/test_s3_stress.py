"""Concurrent conditional writers to one shard on S3 (s3fs, one client per process) lose no chunk.

Four processes, each with its own ``ShardedStore`` (its own s3fs client),
write disjoint chunks of one shard, one chunk per call, so every write is a
read-modify-write of the same object conditioned on its ETag: a server or a
client that lets two writers win on one ETag loses a chunk, which the
read-back finds. The server's store step is slowed (``moto_strict.widened_races``)
so that such races happen nearly every time: against plain moto (no
``moto_strict.install``) this test lost 4, 7 and 11 of 48 chunks in three
runs; against the server the suite starts, none. (Threads of one process do
not race at the server: they take the shard's in-process stripe.) The
bounds are in counts, the joins in time.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import moto_strict
import pytest

pytest.importorskip("s3fs")
from concurrency_harness import moto_s3, run_sharded_writers  # noqa: E402,F401  (fixture)

pytestmark = [pytest.mark.zarr2, pytest.mark.usefixtures("widened_races")]
N_CHUNKS, CHUNK_LEN = 48, 1024  # one shard of 48 chunks of 4 KiB


@pytest.fixture
def widened_races() -> Iterator[None]:
    with moto_strict.widened_races():
        yield


def _options(moto_s3) -> dict:  # noqa: F811
    return {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": moto_s3.endpoint_url, "region_name": "us-east-1"},
        "skip_instance_cache": True,
    }


def test_processes_writing_one_shard_lose_no_chunk(moto_s3) -> None:  # noqa: F811
    url = f"s3://{moto_s3.bucket}/stress-procs-{uuid.uuid4().hex[:8]}"
    result = run_sharded_writers(
        url,
        n_procs=4,
        n_chunks=N_CHUNKS,
        chunk_len=CHUNK_LEN,
        chunks_per_shard=N_CHUNKS,
        storage_options=_options(moto_s3),
    )
    assert result.child_errors == ()
    assert result.lost == 0, f"{result.lost} of {result.total} chunk updates lost"
