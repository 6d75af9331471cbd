"""Unaligned dask writes from worker processes update stored shards at the cost of their chunks (zarr 2 proxy).

``da.store`` into a zarr 2 array through ``shardkv.ShardedStore`` from a
``LocalCluster`` of 2 worker processes, one dask block per chunk over a
quarter of each shard's chunks: every task's chunk reaches its stored shard
as one O(chunk) update (a clone on a reflink file system with default
options, an in-place append with ``shard_updates="append"`` on ext4), so the
bytes the workers write (counted in the workers, :mod:`worker_writes`) stay
within, per task, the chunk, the shard index and an append intent (and its clearing), where a
whole-shard rewrite per task writes 16 chunks. No chunk is lost.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

zarr = pytest.importorskip("zarr")
if not zarr.__version__.startswith("2."):
    pytest.skip("zarr-python 2 only", allow_module_level=True)
da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")

from worker_writes import counting_client, worker_writes  # noqa: E402

from shardkv import ShardedStore  # noqa: E402
from shardkv.format.tail import INTENT_MAGIC, AppendIntent  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::shardkv.PartialShardWriteWarning")

CHUNK = (32, 32)  # uint32, no compressor: 4096 bytes per chunk
CHUNK_NBYTES = 32 * 32 * 4
CPS = 4  # 4 x 4 chunks per shard
INDEX_NBYTES = 16 * CPS * CPS + 4  # offset/nbytes pairs and the CRC32C
SHAPE = (128, 256)  # two shards of 128 x 128
ROWS = slice(32, 64)  # one row of chunks: 8 tasks, 4 chunks of each shard


@pytest.fixture(scope="module")
def client() -> Any:
    with counting_client() as client:
        yield client


def _data(version: int) -> np.ndarray:
    return (np.arange(SHAPE[0] * SHAPE[1], dtype="uint32").reshape(SHAPE) * 7 + version * 100_003).astype("uint32")


@pytest.mark.parametrize("place", ["default on reflinks", "append on ext4"])
def test_unaligned_dask_store_costs_each_task_its_chunk(
    place: str, client: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    on_reflinks = place.startswith("default")
    root = (request.getfixturevalue("reflink_dir") if on_reflinks else tmp_path) / "a.zarr"
    options = {} if on_reflinks else {"shard_updates": "append"}
    z = zarr.open_array(
        ShardedStore(str(root), chunks_per_shard=CPS, **options), mode="w", shape=SHAPE, chunks=CHUNK,
        dtype="uint32", compressor=None,
    )  # fmt: skip
    z[...] = _data(0)
    shards = [str(root / "0.0"), str(root / "0.1")]
    assert all(os.path.isfile(p) for p in shards), os.listdir(root)

    worker_writes(client)  # counted from here
    target = zarr.open_array(ShardedStore(str(root), **options), mode="r+")
    blocks = da.from_array(_data(1)[ROWS], chunks=CHUNK)  # 8 tasks of one chunk each
    da.store(blocks, target, regions=(ROWS, slice(None)), lock=False, compute=False).compute(scheduler=client)
    nbytes, whole = worker_writes(client)

    tasks = (ROWS.stop - ROWS.start) // CHUNK[0] * SHAPE[1] // CHUNK[1]
    # an append also records its intent, and clears it (zeros over the record's magic)
    intent = 0 if on_reflinks else len(AppendIntent(os.path.realpath(shards[0]), 0, 0, 0, 0, 0).encode() + INTENT_MAGIC)
    bound = tasks * (CHUNK_NBYTES + INDEX_NBYTES + intent)
    assert not set(whole) & set(shards), whole  # no shard rewritten whole
    assert tasks * CHUNK_NBYTES <= nbytes <= bound, (nbytes, bound)
    expected = _data(0)
    expected[ROWS] = _data(1)[ROWS]
    np.testing.assert_array_equal(zarr.open_array(ShardedStore(str(root)), mode="r")[...], expected)
