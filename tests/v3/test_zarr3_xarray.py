"""The newest xarray through shardkv.zarr3.ShardedStore: to_zarr / open_zarr round trips.

A dataset with float, datetime and string variables round-trips
(``assert_identical``) through the store, with ``append_dim`` and ``region=``
writes, dask on threads and on a ``LocalCluster`` of worker processes
(127.0.0.1 only, 2 workers, bounded). xarray opens the stored data without
shardkv too (its consolidated metadata holds the sharded documents).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

xr = pytest.importorskip("xarray")
pytest.importorskip("dask")
pytest.importorskip("zarr.abc.store")

import pandas as pd  # noqa: E402
from zarr.storage import LocalStore, MemoryStore  # noqa: E402

from shardkv.zarr3 import ShardedStore  # noqa: E402

pytestmark = [pytest.mark.zarr3, pytest.mark.filterwarnings("ignore::UserWarning")]

ENCODING = {"temp": {"chunks": (2, 3)}, "label": {"chunks": (3,)}}


def dataset(n_time: int = 8, start: str = "2021-03-01") -> Any:
    rng = np.random.default_rng(n_time)
    return xr.Dataset(
        {
            "temp": (("time", "x"), rng.random((n_time, 9))),
            "when": (("time",), pd.date_range("1999-12-31", periods=n_time, freq="7h").values),
            "label": (("x",), np.array(["a", "bb", "ccc", "", "é", "ff", "g", "hh", "iii"])),
        },
        coords={"time": pd.date_range(start, periods=n_time, freq="D"), "x": np.arange(9)},
        attrs={"title": "shardkv zarr3"},
    )


def _stored_objects(root: Path, var: str) -> list[str]:
    return sorted(
        str(p.relative_to(root / var)) for p in (root / var).rglob("*") if p.is_file() and ".shardkv-" not in str(p)
    )


@pytest.mark.parametrize("kind", ["memory", "local"])
def test_dataset_round_trips_and_is_stored_sharded(kind: str, tmp_path: Path) -> None:
    base = MemoryStore() if kind == "memory" else LocalStore(str(tmp_path / "ds.zarr"))
    store = ShardedStore(base, chunks_per_shard=2)
    ds = dataset()
    ds.to_zarr(store, mode="w", encoding=ENCODING)
    xr.testing.assert_identical(xr.open_zarr(store).load(), ds)
    xr.testing.assert_identical(xr.open_zarr(base).load(), ds)  # without shardkv (consolidated metadata)
    xr.testing.assert_identical(xr.open_zarr(base, consolidated=False).load(), ds)
    if kind == "local":  # temp: 4 x 3 chunks of (2, 3) -> 2 x 2 shards
        assert _stored_objects(tmp_path / "ds.zarr", "temp") == ["c/0/0", "c/0/1", "c/1/0", "c/1/1", "zarr.json"]


def test_append_dim_and_region_writes(tmp_path: Path) -> None:
    store = ShardedStore(LocalStore(str(tmp_path / "ds.zarr")), chunks_per_shard=2)
    first, more = dataset(8), dataset(6, start="2021-03-09")
    first.to_zarr(store, mode="w", encoding=ENCODING)
    more.to_zarr(store, append_dim="time")
    expected = xr.concat([first, more], dim="time", data_vars="minimal")
    expected["label"] = first["label"]
    xr.testing.assert_identical(xr.open_zarr(store).load(), expected)

    temp = expected["temp"].values.copy()
    temp[4:10] *= -1
    when = expected["when"].values.astype("datetime64[ns]")
    when[4:10] += np.timedelta64(3, "h")  # representable in the stored units (hours)
    expected["temp"] = (("time", "x"), temp)
    expected["when"] = (("time",), when)
    patch = expected.isel(time=slice(4, 10)).drop_vars(["label", "x"])
    patch.to_zarr(store, region={"time": slice(4, 10)})
    xr.testing.assert_identical(xr.open_zarr(store).load(), expected)
    xr.testing.assert_identical(xr.open_zarr(str(tmp_path / "ds.zarr")).load(), expected)  # without shardkv


def test_dask_threads_write_partial_shards_without_losing_chunks(tmp_path: Path) -> None:
    import dask

    store = ShardedStore(LocalStore(str(tmp_path / "ds.zarr")), chunks_per_shard=4)
    ds = dataset(16).chunk({"time": 2, "x": 3})  # every task writes one chunk of a shard of 4 x 4 chunks
    with dask.config.set(scheduler="threads", num_workers=4):
        ds.to_zarr(store, mode="w", encoding={"label": {"chunks": (3,)}})
    xr.testing.assert_identical(xr.open_zarr(store).load(), ds.load())
    xr.testing.assert_identical(xr.open_zarr(str(tmp_path / "ds.zarr")).load(), ds.load())


def test_dask_local_cluster_of_processes(tmp_path: Path) -> None:
    distributed = pytest.importorskip("distributed")

    store = ShardedStore(LocalStore(str(tmp_path / "ds.zarr")), chunks_per_shard=4)
    ds = dataset(16).chunk({"time": 2, "x": 3})
    with (
        distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=2,
            host="127.0.0.1",
            dashboard_address=":0",  # a free port: None still serves the scheduler's HTTP routes on 8787
            processes=True,
            worker_dashboard_address=None,  # a dashboard per worker would warn that port 8787 is taken
            death_timeout=60,
        ) as cluster,
        distributed.Client(cluster, timeout=60) as client,
    ):
        ds.to_zarr(store, mode="w", encoding={"label": {"chunks": (3,)}}, compute=False).compute(scheduler=client)
        back = xr.open_zarr(store).load(scheduler=client)
    xr.testing.assert_identical(back, ds.load())
    xr.testing.assert_identical(xr.open_zarr(str(tmp_path / "ds.zarr")).load(), ds.load())
