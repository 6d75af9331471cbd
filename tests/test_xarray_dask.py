"""xarray (<= 2026.2.0, the last that works with zarr-python 2.18) and dask through ShardedStore."""

from __future__ import annotations

import numpy as np
import pytest

xr = pytest.importorskip("xarray")
da = pytest.importorskip("dask.array")

from shardkv import ShardedStore  # noqa: E402


def _dataset(n_time: int, start: int = 0) -> xr.Dataset:
    rng = np.random.default_rng(start)
    temp = rng.random((n_time, 20, 30), dtype="f4")
    return xr.Dataset(
        {"temp": (("time", "y", "x"), temp)},
        coords={"time": np.arange(start, start + n_time), "y": np.arange(20), "x": np.arange(30)},
    )


def _shards(store_dir, name: str) -> list[str]:
    return sorted(p.name for p in (store_dir / name).iterdir() if p.name[0].isdigit())


def test_to_zarr_open_zarr_append_and_region(tmp_path):
    path = tmp_path / "ds.zarr"
    ds = _dataset(4).chunk({"time": 1, "y": 10, "x": 10})  # dask chunks = zarr chunks
    with ShardedStore(str(path), chunks_per_shard=(2, 2, 3)) as store:
        ds.to_zarr(store, mode="w")
    assert _shards(path, "temp") == ["0.0.0", "1.0.0"]  # 4 x 2 x 3 chunks in 2 shards
    with ShardedStore(str(path)) as store:
        back = xr.open_zarr(store).load()
    xr.testing.assert_identical(back, ds.load())

    more = _dataset(3, start=4).chunk({"time": 1, "y": 10, "x": 10})
    with ShardedStore(str(path), chunks_per_shard=(2, 2, 3)) as store:
        more.to_zarr(store, append_dim="time")
    with ShardedStore(str(path)) as store:
        back = xr.open_zarr(store).load()
    xr.testing.assert_identical(back, xr.concat([ds, more], dim="time").load())
    assert _shards(path, "temp") == ["0.0.0", "1.0.0", "2.0.0", "3.0.0"]

    patch = back.isel(time=slice(2, 4)).copy(deep=True)
    patch["temp"] = patch["temp"] * 0 - 1
    with ShardedStore(str(path)) as store:
        patch.drop_vars(["y", "x"]).to_zarr(store, region={"time": slice(2, 4)})
    with ShardedStore(str(path)) as store:
        final = xr.open_zarr(store).load()
    expected = back.copy(deep=True)
    expected["temp"][2:4] = -1
    xr.testing.assert_identical(final, expected)


def test_dask_to_zarr_through_the_proxy(tmp_path):
    path = tmp_path / "arr.zarr"
    data = np.arange(64 * 48, dtype="<i8").reshape(64, 48)
    darr = da.from_array(data, chunks=(16, 12))
    with ShardedStore(str(path), chunks_per_shard=2) as store:
        darr.to_zarr(store, component="a")
    assert _shards(path, "a") == [f"{i}.{j}" for i in range(2) for j in range(2)]  # 4 x 4 chunks, 2 x 2 shards
    with ShardedStore(str(path)) as store:
        np.testing.assert_array_equal(da.from_zarr(store, component="a").compute(), data)
