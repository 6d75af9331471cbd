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

from worker_writes import CHUNK, CPS, ROWS, SHAPE, bytes_bounds, counting_client, data, worker_writes  # noqa: E402

from shardkv import ShardedStore  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::shardkv.PartialShardWriteWarning")


@pytest.fixture(scope="module")
def client() -> Any:
    with counting_client() as client:
        yield client


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
    z[...] = data(0)
    shards = [str(root / "0.0"), str(root / "0.1")]
    assert all(os.path.isfile(p) for p in shards), os.listdir(root)

    worker_writes(client)  # counted from here
    target = zarr.open_array(ShardedStore(str(root), **options), mode="r+")
    blocks = da.from_array(data(1)[ROWS], chunks=CHUNK)  # 8 tasks of one chunk each
    da.store(blocks, target, regions=(ROWS, slice(None)), lock=False, compute=False).compute(scheduler=client)
    nbytes, whole = worker_writes(client)

    least, most = bytes_bounds(shards[0], in_place=not on_reflinks)
    assert not set(whole) & set(shards), whole  # no shard rewritten whole
    assert least <= nbytes <= most, (nbytes, least, most)
    expected = data(0)
    expected[ROWS] = data(1)[ROWS]
    np.testing.assert_array_equal(zarr.open_array(ShardedStore(str(root)), mode="r")[...], expected)
