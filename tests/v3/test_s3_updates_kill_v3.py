"""A writer killed (``kill -9``) between the parts of an O(chunk) update on S3 loses nothing acknowledged.

A child process writes a 6 MiB shard through ``shardkv.zarr3.ShardedStore``
on moto's S3 server (``tests/moto_strict.py``), says so, then starts an
update of one chunk: a multipart upload whose copied part is made; its last
part waits on the test's pipe (its standard input), and the test kills it
there. zarr 3 alone (no shardkv) then reads the old shard whole, every
acknowledged chunk as written; the incomplete upload the child left is
listed under the store's prefix and reclaimed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from typing import Any

import numpy as np
import pytest

pytest.importorskip("zarr.abc.store")
pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

import zarr  # noqa: E402
from concurrency_harness import moto_s3  # noqa: E402,F401  (the module-scoped server fixture)
from zarr.storage import FsspecStore  # noqa: E402

from shardkv.storage.s3 import S3Store  # noqa: E402

CHUNK, N_CHUNKS = 65536, 48  # uint16: 128 KiB chunks, one 6 MiB shard

_CHILD = """
import sys
import numpy as np, s3fs, zarr
from zarr.storage import FsspecStore
from shardkv.zarr3 import ShardedStore
from shardkv.storage.s3 import S3Store

endpoint, root, chunk, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
fs = s3fs.S3FileSystem(key="testing", secret="testing", asynchronous=True, skip_instance_cache=True,
                       client_kwargs={"endpoint_url": endpoint, "region_name": "us-east-1"})
store = ShardedStore(FsspecStore(fs, path=root), chunks_per_shard=n)
z = zarr.create_array(store, shape=(n * chunk,), chunks=(chunk,), dtype="u2", compressors=None, fill_value=0)
z[:] = np.arange(n * chunk, dtype="u2")
print("acknowledged", flush=True)
real = S3Store._api

async def held(self, method, **kwargs):
    if method == "upload_part":  # the copied part is made; the last part waits for the test
        print("held", flush=True)
        sys.stdin.read()
    return await real(self, method, **kwargs)

S3Store._api = held
z[0:chunk] = 7
print("not killed", flush=True)
"""


def test_a_kill_between_the_parts_leaves_the_old_shard_and_an_upload_compact_reclaims(moto_s3: Any) -> None:  # noqa: F811
    root = f"{moto_s3.bucket}/killed-{uuid.uuid4().hex[:8]}"
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, moto_s3.endpoint_url, root, str(CHUNK), str(N_CHUNKS)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        lines = [child.stdout.readline().strip(), child.stdout.readline().strip()]
        assert lines == ["acknowledged", "held"]
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(timeout=60) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=60)
    fs = moto_s3.filesystem()
    async_fs = type(fs)(
        key="testing",
        secret="testing",
        asynchronous=True,
        skip_instance_cache=True,
        client_kwargs={"endpoint_url": moto_s3.endpoint_url, "region_name": "us-east-1"},
    )
    alone = zarr.open_array(FsspecStore(async_fs, path=root, read_only=True), mode="r")  # zarr 3, no shardkv
    np.testing.assert_array_equal(alone[:], np.arange(N_CHUNKS * CHUNK, dtype="u2"))
    kv = S3Store(fs, root, upload_age=0)  # moto dates every upload 2010: no live writer's to tell apart
    aborted = kv.abort_incomplete_writes("")
    assert [name.split("?uploadId=")[0] for name in aborted] == ["c/0"]
    assert kv.abort_incomplete_writes("") == []
    np.testing.assert_array_equal(alone[:], np.arange(N_CHUNKS * CHUNK, dtype="u2"))
