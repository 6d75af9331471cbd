"""shardkv.zarr3.ShardedStore over zarr 3's FsspecStore on S3 (s3fs against moto's server on 127.0.0.1).

The engine reaches the same bucket through shardkv's S3 store: ETag
compare-and-swap writes (``concurrency="conditional"``), so threads writing
chunks of the same shards through separate store objects lose nothing, and
zarr 3 reads the sharded array at the root without shardkv.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

pytest.importorskip("zarr.abc.store")
pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

import zarr  # noqa: E402
from concurrency_harness import moto_s3  # noqa: E402,F401  (the module-scoped server fixture)
from zarr.storage import FsspecStore  # noqa: E402

from shardkv.zarr3 import ShardedStore  # noqa: E402

pytestmark = [pytest.mark.zarr3, pytest.mark.filterwarnings("ignore::UserWarning")]


def _url_store(moto_s3: Any, name: str, **kwargs: Any) -> ShardedStore:  # noqa: F811
    options = {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": moto_s3.endpoint_url, "region_name": "us-east-1"},
    }
    return ShardedStore(f"s3://{moto_s3.bucket}/{name}", storage_options=options, **kwargs)


def test_s3_array_is_sharded_and_read_at_the_root(moto_s3: Any) -> None:  # noqa: F811
    store = _url_store(moto_s3, "one.zarr", chunks_per_shard=4)
    assert isinstance(store.base, FsspecStore)
    assert store.concurrency_mode == "conditional"
    data = np.arange(64 * 48, dtype="i4").reshape(64, 48)
    z = zarr.create_array(store, name="a", shape=data.shape, chunks=(8, 8), dtype="i4")
    z[:] = data
    fs = moto_s3.filesystem()
    shards = sorted(p.rsplit("/a/", 1)[1] for p in fs.find(f"{moto_s3.bucket}/one.zarr/a"))
    assert shards == ["c/0/0", "c/0/1", "c/1/0", "c/1/1", "zarr.json"]
    np.testing.assert_array_equal(zarr.open_array(store.base, path="a")[:], data)  # without shardkv
    np.testing.assert_array_equal(zarr.open_array(store, path="a")[:], data)


def test_threads_with_their_own_stores_lose_no_chunk_on_s3(moto_s3: Any) -> None:  # noqa: F811
    writer = _url_store(moto_s3, "race.zarr", chunks_per_shard=4)
    zarr.create_array(writer, name="a", shape=(32, 32), chunks=(4, 4), dtype="u2", fill_value=0)
    errors: list[BaseException] = []

    def write_rows(first: int) -> None:
        try:
            z = zarr.open_array(_url_store(moto_s3, "race.zarr", chunks_per_shard=4), path="a")
            for i in range(first, 8, 2):  # chunk rows of the same shards, interleaved between the two threads
                z[i * 4 : (i + 1) * 4] = i + 1
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=write_rows, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and not any(t.is_alive() for t in threads)
    expected = np.repeat(np.arange(1, 9, dtype="u2"), 4)[:, None] * np.ones((1, 32), dtype="u2")
    np.testing.assert_array_equal(zarr.open_array(writer.base, path="a")[:], expected)
