"""A default ``shardkv convert`` keeps every node visible to zarr 3, read without shardkv.

Sources written by xarray <= 2026.2.0 / zarr-python 2.18 without shardkv (this
environment): the user guide's weather dataset (a sharded 3-d ``temp``, 1-d
``time``/``y``/``x`` coordinates left unsharded by ``--chunks-per-shard 4,2,3``)
and the README's hierarchy for ``--chunks-per-shard 2,2,1`` (3-d ``precip`` and
``temp``, a group ``obs`` holding a 1-d ``stations``). Oracles: the newest
zarr 3 and xarray in .venv-latest open the converted root, list every node of
the source and read every array equal to the source.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr
from latest_helpers import Reader

from shardkv.cli.main import main

xr = pytest.importorskip("xarray")

pytestmark = pytest.mark.filterwarnings("ignore")


def _nodes(root: Path) -> tuple[list[str], list[str]]:
    """(arrays, groups below the root) of a zarr 2 directory hierarchy."""

    def paths(name: str) -> list[str]:
        return sorted(p.parent.relative_to(root).as_posix() for p in root.rglob(name))

    return paths(".zarray"), [g for g in paths(".zgroup") if g != "."]


def _check_every_node(reader: Reader, src: Path, dst: Path) -> None:
    arrays, groups = _nodes(src)
    listed = reader.run("zarr3-consolidated", dst)
    members = listed["members"]
    assert sorted(members) == sorted(arrays + groups), members
    assert all(members[g]["node_type"] == "group" for g in groups)
    plain = zarr.open_group(zarr.DirectoryStore(str(src)), mode="r")
    read = reader.run("zarr3", dst, *arrays)
    for path in arrays:
        assert read[path]["ok"], (path, read[path])
        np.testing.assert_array_equal(read[path]["data"], plain[path][...], err_msg=path)
    # the root opened as zarr 3 opens it by default (no use_consolidated): every group lists its members
    default = reader.run("zarr3-members", dst, ".", *groups)
    for group in [".", *groups]:
        assert default[group]["ok"], (group, default[group])
    assert sorted(default["."]["members"]) == sorted(arrays + groups)


def test_the_user_guide_weather_dataset_converted_with_default_options(reader: Reader, tmp_path: Path) -> None:
    src, dst = tmp_path / "weather.zarr", tmp_path / "sharded.zarr"
    ds = xr.Dataset(
        {"temp": (("time", "y", "x"), np.random.default_rng(0).random((8, 40, 60), dtype="f4"), {"units": "K"})},
        coords={"time": np.arange(8), "y": np.arange(40), "x": np.arange(60)},
        attrs={"title": "weather"},
    )
    ds.chunk({"time": 1, "y": 20, "x": 20}).to_zarr(str(src), mode="w")  # zarr 2.18, no shardkv
    assert main(["convert", str(src), str(dst), "--chunks-per-shard", "4,2,3", "--no-progress"]) == 0
    assert (dst / "temp" / "zarr.json").is_file() and not (dst / "temp" / ".zarray").exists()
    _check_every_node(reader, src, dst)
    opened = reader.run("xarray", dst)
    assert sorted(k for k in opened if k != "__attrs__") == ["temp", "time", "x", "y"]
    for name in ("temp", "time", "x", "y"):
        assert opened[name]["ok"], (name, opened[name])
        np.testing.assert_array_equal(opened[name]["data"], ds[name].values, err_msg=name)
        assert opened[name]["dims"] == list(ds[name].dims), name
    assert opened["temp"]["attrs"]["units"] == "K" and opened["__attrs__"] == {"title": "weather"}


def test_the_readme_hierarchy_with_a_1d_group_member(reader: Reader, tmp_path: Path) -> None:
    src, dst = tmp_path / "in.zarr", tmp_path / "out.zarr"
    root = zarr.open_group(str(src), mode="w")
    rng = np.random.default_rng(1)
    root.create_dataset("precip", data=rng.random((4, 6, 6)), chunks=(1, 3, 3))
    root.create_dataset("temp", data=rng.random((4, 6, 6)).astype("f4"), chunks=(1, 3, 3))
    obs = root.create_group("obs")
    obs.attrs["network"] = "synop"
    obs.create_dataset("stations", data=np.arange(10, dtype="i4"), chunks=(3,))
    zarr.consolidate_metadata(str(src))
    assert main(["convert", str(src), str(dst), "--chunks-per-shard", "2,2,1", "--no-progress"]) == 0
    _check_every_node(reader, src, dst)
    listed = reader.run("zarr3-consolidated", dst)
    assert listed["members"]["obs"]["attributes"] == {"network": "synop"}
