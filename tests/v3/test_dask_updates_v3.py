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

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

xr = pytest.importorskip("xarray")
pytest.importorskip("dask")
distributed = pytest.importorskip("distributed")
zarr = pytest.importorskip("zarr", minversion="3")

from shardkv.zarr3 import ShardedStore  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the worker plugin (workers import it too)
from worker_writes import CHUNK, CPS, ROWS, SHAPE, bytes_bounds, counting_client, data, worker_writes  # noqa: E402

pytestmark = [pytest.mark.zarr3, pytest.mark.filterwarnings("ignore::UserWarning")]


@pytest.fixture(scope="module")
def client() -> Any:
    with counting_client() as client:
        yield client


def _dataset(version: int, rows: slice = slice(0, SHAPE[0])) -> Any:
    return xr.Dataset({"v": (("y", "x"), data(version)[rows])})


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

    least, most = bytes_bounds(shards[0], in_place=not on_reflinks)
    assert not set(whole) & set(shards), whole  # no shard rewritten whole
    assert least <= nbytes <= most, (nbytes, least, most)
    expected = _dataset(0)["v"].values.copy()
    expected[ROWS] = _dataset(1, ROWS)["v"].values
    np.testing.assert_array_equal(zarr.open_array(str(root), path="v", mode="r")[...], expected)  # without shardkv
