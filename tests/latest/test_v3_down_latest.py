"""A hierarchy is v3 all the way down once any array is sharded, read without shardkv.

Written through ``ShardedStore`` by xarray <= 2026.2.0 and zarr-python 2.18
(this environment): the user guide's kind of dataset, a sharded data variable
with small unsharded 1-D ``time``/``lat``/``lon`` coordinates and group
attributes. Oracles: the newest xarray + zarr 3 in .venv-latest (no shardkv)
open the stored hierarchy at its root and show every variable and coordinate
with the values written, after later zarr 2 writes too; zarr 2 through the
proxy reopens it identical. An array no v3 reader decodes makes only itself
fail, never its siblings or the consolidated metadata.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pytest
import zarr
from latest_helpers import Reader

from shardkv import ShardedStore

xr = pytest.importorskip("xarray")

pytestmark = pytest.mark.filterwarnings("ignore")


def _dataset(n_time: int, start: int = 0) -> xr.Dataset:
    rng = np.random.default_rng(start)
    time = np.datetime64("2026-01-01", "ns") + np.arange(start, start + n_time) * np.timedelta64(1, "D")
    return xr.Dataset(
        {
            "temp": (("time", "lat", "lon"), rng.normal(280, 5, (n_time, 12, 16)).astype("f4"), {"units": "K"}),
            "precip": (("time", "lat", "lon"), rng.random((n_time, 12, 16)), {"units": "mm"}),
        },
        coords={"time": time, "lat": np.linspace(-55.0, 55.0, 12), "lon": np.arange(16, dtype="i4") * 22.5},
        attrs={"title": "weather", "institution": "shardkv"},
    )


def _to_zarr(path: Path, ds: xr.Dataset, **kwargs: Any) -> None:
    with ShardedStore(str(path), chunks_per_shard=(2, 2, 2), buffer_bytes=2**24) as store:  # 3-d sharded, 1-d not
        ds.chunk({"time": 2, "lat": 6, "lon": 4}).to_zarr(store, **kwargs)


def _assert_reads(result: dict[str, Any], expected: xr.Dataset) -> None:
    """The newest xarray shows every variable and coordinate of ``expected``, equal, and its attributes."""
    names = sorted(str(n) for n in expected.variables)
    assert sorted(k for k in result if k != "__attrs__") == names
    for name in names:
        assert result[name]["ok"], (name, result[name])
        np.testing.assert_array_equal(result[name]["data"], expected[name].values, err_msg=name)
        assert result[name]["dims"] == list(expected[name].dims), name
        for key, value in expected[name].attrs.items():
            assert result[name]["attrs"][key] == value, (name, key)
    assert result["__attrs__"] == expected.attrs


def test_user_guide_dataset_reads_whole_at_the_root(tmp_path: Path, reader: Reader) -> None:
    path = tmp_path / "weather.zarr"
    first = _dataset(6)
    _to_zarr(path, first, mode="w")
    with ShardedStore(str(path)) as store:
        xr.testing.assert_identical(xr.open_zarr(store).load(), first)
    _assert_reads(reader.run("xarray", path), first)
    # zarr 3 and tensorstore at the root, array by array: the stored values as zarr 2 reads them
    # (time: its int encoding)
    plain = zarr.DirectoryStore(str(path))
    for command in ("zarr3", "tensorstore"):
        read = reader.run(command, path, "time", "lat", "lon")
        for name in ("time", "lat", "lon"):
            assert read[name]["ok"], (command, read[name])
            np.testing.assert_array_equal(read[name]["data"], zarr.open_array(plain, path=name, mode="r")[...])

    # later zarr 2 writes: append along time (xarray consolidates), then attributes and a new
    # unsharded array without consolidating again
    more = _dataset(4, start=6)
    _to_zarr(path, more, append_dim="time")
    with ShardedStore(str(path), chunks_per_shard=(2, 2, 2)) as store:
        group = zarr.open_group(store, mode="a")
        group.attrs["history"] = "appended 4 days"
        group["lat"].attrs["units"] = "degrees_north"
        elevation = group.create_dataset("elevation", shape=(12,), chunks=(6,), dtype="f8", fill_value=np.nan)
        elevation[...] = np.arange(12.0) * 100
        elevation.attrs.update({"_ARRAY_DIMENSIONS": ["lat"], "units": "m"})
        scratch = group.create_dataset("scratch", shape=(16,), chunks=(8,), dtype="i2")
        scratch.attrs["_ARRAY_DIMENSIONS"] = ["lon"]
        del group["scratch"]  # a zarr 2 delete: gone for v3 readers too
    expected = xr.concat([first, more], dim="time", data_vars="minimal")
    expected.attrs["history"] = "appended 4 days"
    expected["lat"].attrs["units"] = "degrees_north"
    expected["elevation"] = ("lat", np.arange(12.0) * 100, {"units": "m"})
    with ShardedStore(str(path)) as store:
        xr.testing.assert_identical(xr.open_zarr(store, consolidated=False).load(), expected)
    _assert_reads(reader.run("xarray", path), expected)
    members = reader.run("zarr3-consolidated", path)["members"]
    assert sorted(members) == ["elevation", "lat", "lon", "precip", "temp", "time"]
    assert members["time"]["shape"] == [10] and members["temp"]["shape"] == [10, 12, 16]


@pytest.mark.parametrize("consolidated", [True, False], ids=["consolidated", "listed"])
def test_an_opaque_array_fails_alone(tmp_path: Path, reader: Reader, consolidated: bool) -> None:
    path = tmp_path / "mixed.zarr"
    grid = np.arange(32.0).reshape(4, 8)
    x = np.arange(8, dtype="i8") * 10
    packed = np.array([{"a": 1}, [1, 2], "three"], dtype=object)
    packed2d = np.array([[1, "a"], [{"b": 2}, None]], dtype=object)
    with ShardedStore(str(path), chunks_per_shard=(2, 2)) as store:
        group = zarr.group(store=store)
        group.attrs["title"] = "one opaque array"
        group.create_dataset("x", data=x, chunks=(4,)).attrs["_ARRAY_DIMENSIONS"] = ["x"]
        group.create_dataset("packed", data=packed, chunks=(2,), object_codec=numcodecs.MsgPack()).attrs[
            "_ARRAY_DIMENSIONS"
        ] = ["k"]
        group.create_dataset("grid", data=grid, chunks=(2, 4)).attrs["_ARRAY_DIMENSIONS"] = ["y", "x"]
        group.create_dataset("packed2d", data=packed2d, chunks=(1, 2), object_codec=numcodecs.JSON()).attrs[
            "_ARRAY_DIMENSIONS"
        ] = ["k", "j"]  # 2-d: sharded, with an opaque data type
        sub = group.create_group("sub")
        sub.create_dataset("line", data=np.arange(5, dtype="u1"), chunks=(2,))
        if consolidated:
            zarr.consolidate_metadata(store)
    with ShardedStore(str(path)) as store:  # zarr 2 through the proxy reads all of it
        back = zarr.open_group(store, mode="r")
        np.testing.assert_array_equal(back["packed"][...], packed)
        np.testing.assert_array_equal(back["grid"][...], grid)
        assert store.sharded_array("packed2d") is not None and store.sharded_array("packed") is None
        assert back["packed2d"][...].tolist() == packed2d.tolist()
    read = reader.run("zarr3", path, "x", "grid", "sub/line", "packed", "packed2d")
    np.testing.assert_array_equal(read["x"]["data"], x)
    np.testing.assert_array_equal(read["grid"]["data"], grid)
    np.testing.assert_array_equal(read["sub/line"]["data"], np.arange(5, dtype="u1"))
    assert not read["packed"]["ok"] and "packed" in read["packed"]["error"], read["packed"]
    assert not read["packed2d"]["ok"], read["packed2d"]
    if consolidated:
        listed = reader.run("zarr3-consolidated", path)
        assert listed["consolidated"] and listed["attributes"] == {"title": "one opaque array"}
        assert sorted(listed["members"]) == ["grid", "sub", "sub/line", "x"]
        ds = reader.run("xarray", path)
        assert sorted(k for k in ds if k != "__attrs__") == ["grid", "x"]
        np.testing.assert_array_equal(ds["grid"]["data"], grid)


def test_unsharded_arrays_of_many_kinds_read_equal_at_the_root(tmp_path: Path, reader: Reader) -> None:
    """F order, a filter, strings, a '/' separator, a NaN fill: the mirrors read the chunk files zarr 2 wrote."""
    path = tmp_path / "kinds.zarr"
    arrays = {
        "f_order": (np.arange(24.0).reshape(4, 6), {"chunks": (3, 4), "order": "F", "fill_value": np.nan}),
        "delta": (np.arange(10, dtype="i4"), {"chunks": (4,), "filters": [numcodecs.Delta(dtype="i4")]}),
        "words": (np.array(["a", "bc", "déf"], dtype=object), {"chunks": (2,), "object_codec": numcodecs.VLenUTF8()}),
        "g/nested": (np.arange(12, dtype="u2").reshape(3, 4), {"chunks": (2, 2), "dimension_separator": "/"}),
        "g/sparse": (np.full(6, np.nan), {"chunks": (2,), "fill_value": np.nan}),
    }
    with ShardedStore(str(path), chunks_per_shard={"cube": (2, 2, 2)}) as store:
        group = zarr.group(store=store)
        for name, (data, kwargs) in arrays.items():
            group.create_dataset(name, data=data, **kwargs)
        group["g/sparse"][2:4] = [1.0, 2.0]
        group.create_dataset("cube", data=np.ones((4, 4, 4)), chunks=(2, 2, 2))  # the one sharded array
    read = reader.run("zarr3", path, *arrays)
    with ShardedStore(str(path)) as store:
        for name in arrays:
            expected = zarr.open_array(store, path=name, mode="r")[...]
            assert read[name]["ok"], (name, read[name])
            if expected.dtype == object:
                assert read[name]["data"].tolist() == expected.tolist(), name
            else:
                np.testing.assert_array_equal(read[name]["data"], expected, err_msg=name)


NON_FINITE = {"missing": float("nan"), "hi": float("inf"), "lo": float("-inf")}


@pytest.mark.parametrize("consolidated", [False, True], ids=["listed", "consolidated"])
def test_non_finite_attributes_read_at_the_root(tmp_path: Path, reader: Reader, consolidated: bool) -> None:
    """NaN/inf attributes (zarr 2 writes them bare): the newest zarr 3 lists every node with them, equal,
    and reads the arrays; tensorstore, whose JSON parser refuses them, fails on such an array alone."""
    path = tmp_path / "nan.zarr"
    with ShardedStore(str(path), chunks_per_shard=(2, 2)) as store:
        group = zarr.group(store=store)
        group.create_group("odd").attrs.update(NON_FINITE)
        group.create_dataset("line", data=np.arange(3.0), chunks=2).attrs.update(NON_FINITE)
        group.create_dataset("plain", data=np.arange(4.0), chunks=2)
        group.create_dataset("grid", data=np.arange(16.0).reshape(4, 4), chunks=(2, 2)).attrs.update(NON_FINITE)
        group.create_group("late").attrs.update(NON_FINITE)
        if consolidated:
            zarr.consolidate_metadata(store)
    listed = reader.run("zarr3-members", path, "")[""]
    assert listed["ok"], listed
    assert listed["consolidated"] is consolidated
    assert sorted(listed["members"]) == ["grid", "late", "line", "odd", "plain"]
    expected = json.dumps(NON_FINITE, sort_keys=True)
    for name in ("grid", "late", "line", "odd"):
        assert json.dumps(listed["members"][name]["attributes"], sort_keys=True) == expected, name
    read = reader.run("zarr3", path, "grid", "line", "plain")
    np.testing.assert_array_equal(read["grid"]["data"], np.arange(16.0).reshape(4, 4))
    np.testing.assert_array_equal(read["line"]["data"], np.arange(3.0))
    ts_read = reader.run("tensorstore", path, "grid", "line", "plain")
    assert not ts_read["grid"]["ok"] and "JSON" in ts_read["grid"]["error"]
    assert not ts_read["line"]["ok"] and "JSON" in ts_read["line"]["error"]
    np.testing.assert_array_equal(ts_read["plain"]["data"], np.arange(4.0))
