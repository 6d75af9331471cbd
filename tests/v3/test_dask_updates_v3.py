"""Unaligned dask writes from worker processes update stored shards at the cost of their chunks (zarr 3).

xarray ``to_zarr(region=...)`` through ``shardkv.zarr3.ShardedStore`` from a
``LocalCluster`` of 2 worker processes, one dask chunk per inner chunk (a
quarter of each shard's chunks): every task's chunk reaches its stored shard
as one O(chunk) update (a clone with the new chunk and index, on a reflink
file system with default options; an in-place append with its intent, with
``shard_updates="append"`` on ext4), so the bytes the workers write (counted
in the workers, :mod:`worker_writes`) stay within, per task, the chunk, the
shard index and an append intent; a whole-shard rewrite per task writes 16
chunks per task. No chunk is lost, as zarr 3 reads the array without shardkv.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

xr = pytest.importorskip("xarray")
pytest.importorskip("dask")
distributed = pytest.importorskip("distributed")
zarr = pytest.importorskip("zarr", minversion="3")

from shardkv.format.tail import INTENT_MAGIC, AppendIntent  # noqa: E402
from shardkv.zarr3 import ShardedStore  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the worker plugin (workers import it too)
from worker_writes import counting_client, worker_writes  # noqa: E402

pytestmark = [pytest.mark.zarr3, pytest.mark.filterwarnings("ignore::UserWarning")]

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


def _dataset(version: int, rows: slice = slice(0, SHAPE[0])) -> Any:
    full = (np.arange(SHAPE[0] * SHAPE[1], dtype="uint32").reshape(SHAPE) * 7 + version * 100_003).astype("uint32")
    return xr.Dataset({"v": (("y", "x"), full[rows])})


@pytest.mark.parametrize("place", ["default on reflinks", "append on ext4"])
def test_unaligned_region_write_costs_each_task_its_chunk(
    place: str, client: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    on_reflinks = place.startswith("default")
    root = (request.getfixturevalue("reflink_dir") if on_reflinks else tmp_path) / "ds.zarr"
    options = {} if on_reflinks else {"shard_updates": "append"}
    encoding = {"v": {"chunks": CHUNK, "compressors": None}}
    _dataset(0).to_zarr(ShardedStore(str(root), chunks_per_shard=CPS, **options), mode="w", encoding=encoding)
    shards = sorted(str(p) for p in (root / "v" / "c").rglob("*") if p.is_file())
    assert len(shards) == 2

    worker_writes(client)  # counted from here
    patch = _dataset(1, ROWS).chunk({"y": CHUNK[0], "x": CHUNK[1]})  # 8 tasks of one chunk each
    store = ShardedStore(str(root), chunks_per_shard=CPS, **options)
    patch.to_zarr(store, region={"y": ROWS, "x": slice(None)}, compute=False).compute(scheduler=client)
    nbytes, whole = worker_writes(client)

    tasks = (ROWS.stop - ROWS.start) // CHUNK[0] * SHAPE[1] // CHUNK[1]
    # an append also records its intent, and clears it (zeros over the record's magic)
    intent = 0 if on_reflinks else len(AppendIntent(os.path.realpath(shards[0]), 0, 0, 0, 0, 0).encode() + INTENT_MAGIC)
    bound = tasks * (CHUNK_NBYTES + INDEX_NBYTES + intent)
    assert not set(whole) & set(shards), whole  # no shard rewritten whole
    assert tasks * CHUNK_NBYTES <= nbytes <= bound, (nbytes, bound)
    expected = _dataset(0)["v"].values.copy()
    expected[ROWS] = _dataset(1, ROWS)["v"].values
    np.testing.assert_array_equal(zarr.open_array(str(root), path="v", mode="r")[...], expected)  # without shardkv
