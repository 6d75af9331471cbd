"""An xarray dataset of strings, datetimes, attributes and encodings through ShardedStore.

Written with ``to_zarr(ShardedStore(...))`` (xarray <= 2026.2.0 with zarr-python
2.18), appended along time and patched with ``region=``, read back with
``open_zarr`` (``assert_identical``), then opened at the root by the newest
xarray + zarr 3 without shardkv.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from latest_helpers import Reader

from shardkv import ShardedStore

xr = pytest.importorskip("xarray")


def _dataset(n_time: int, start: int = 0) -> xr.Dataset:
    rng = np.random.default_rng(start)
    time = np.datetime64("2026-01-01T00:00", "ns") + np.arange(start, start + n_time) * np.timedelta64(6, "h")
    stations = np.array(["Zürich", "Genève", "Lugano", "Chur"], dtype=object)
    ds = xr.Dataset(
        {
            "temp": (
                ("time", "station"),
                rng.normal(10, 5, (n_time, 4)).astype("f4"),
                {"units": "degC", "long_name": "air temperature"},
            ),
            "flag": (
                ("time", "station"),
                np.array([["ok", "bad", "", "ok"][i % 4] for i in range(n_time * 4)], dtype=object).reshape(n_time, 4),
            ),
            "lead": (("time",), (np.arange(start, start + n_time) * np.timedelta64(30, "m")).astype("m8[ns]")),
        },
        coords={
            "time": time,
            "station": stations,
            "code": (("station",), np.array(["ZRH", "GVA", "LUG", "CHU"], dtype="<U3")),
        },
        attrs={"title": "strings through shards", "history": "written through shards"},
    )
    ds["temp"].encoding = {"dtype": "f4", "_FillValue": np.float32(np.nan)}
    ds["time"].encoding = {"units": "hours since 2026-01-01", "calendar": "proleptic_gregorian", "dtype": "i8"}
    return ds


def _chunked(ds: xr.Dataset) -> xr.Dataset:
    return ds.chunk({"time": 1, "station": 2})


@pytest.mark.filterwarnings("ignore")
def test_strings_datetimes_round_trip_and_read_at_the_root(tmp_path: Path, reader: Reader) -> None:
    path = tmp_path / "ds.zarr"
    first = _dataset(4)
    with ShardedStore(str(path), chunks_per_shard=2) as store:
        _chunked(first).to_zarr(store, mode="w")
    with ShardedStore(str(path)) as store:
        back = xr.open_zarr(store).load()
    xr.testing.assert_identical(back, first)
    assert back["temp"].encoding["_FillValue"] is not None and np.isnan(back["temp"].encoding["_FillValue"])
    assert back["time"].encoding["units"] == "hours since 2026-01-01"

    more = _dataset(3, start=4)
    with ShardedStore(str(path), chunks_per_shard=2) as store:
        _chunked(more).to_zarr(store, append_dim="time")
    whole = xr.concat([first, more], dim="time", data_vars="minimal")
    with ShardedStore(str(path)) as store:
        xr.testing.assert_identical(xr.open_zarr(store).load(), whole)

    patch = whole.isel(time=slice(2, 4)).copy(deep=True)
    patch["flag"][:] = "patched"
    with ShardedStore(str(path)) as store:
        patch.drop_vars(["station", "code"]).drop_vars("time").to_zarr(store, region={"time": slice(2, 4)})
    expected = whole.copy(deep=True)
    expected["flag"][2:4] = "patched"
    with ShardedStore(str(path)) as store:
        final = xr.open_zarr(store).load()
    xr.testing.assert_identical(final, expected)

    # the newest xarray + zarr 3, without shardkv, at the root
    result = reader.run("xarray", path)
    for name in ("temp", "flag", "lead", "time", "station", "code"):
        assert name in result, (name, sorted(result))
        assert result[name]["ok"], result[name]
    assert result["__attrs__"]["title"] == "strings through shards"
    np.testing.assert_array_equal(result["temp"]["data"], expected["temp"].values)
    assert result["flag"]["data"].tolist() == expected["flag"].values.tolist()
    assert result["station"]["data"].tolist() == expected["station"].values.tolist()
    assert result["code"]["data"].tolist() == expected["code"].values.tolist()
    np.testing.assert_array_equal(result["time"]["data"], expected["time"].values)
    np.testing.assert_array_equal(result["lead"]["data"], expected["lead"].values)
