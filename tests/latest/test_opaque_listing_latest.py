"""An array no v3 reader decodes never hides its siblings, even when nobody consolidated.

Written through ``ShardedStore`` by zarr-python 2.18 (this environment), never
consolidated by the user: sharded numeric arrays, unsharded coordinates, and
sharded arrays stored with the opaque ``shardkv.v2_dtype`` (``|O`` with
``MsgPack``/``JSON``, a structured dtype with a subarray field). Oracles: the
newest zarr 3 and xarray in .venv-latest (no shardkv), with their defaults
(``use_consolidated=None``, ``consolidated=None``): every group on the path of
an opaque array lists all its decodable members, xarray opens the root with
the values written, and opening an opaque array by its path raises an error
naming its data type; after attribute changes, a second opaque array and
deletions too. zarr-python 2.18 through the proxy sees what it wrote: no
``.zmetadata`` appears. ``convert --all-v3`` of the same hierarchy lists alike.
"""

from __future__ import annotations

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

# the arrays named are sharded; x, y and sub/line stay unsharded
CPS = {"grid": (2, 2), "packed": (2,), "sub/rec": (2,), "sub/deep/vals": (2,), "sub/deep/more": (2, 2)}
GRID = np.arange(48.0).reshape(6, 8)
X = np.arange(8, dtype="i8") * 10
Y = np.linspace(-5.0, 5.0, 6)
LINE = np.arange(5, dtype="u1")
VALS = np.arange(12, dtype="i4") * 3
PACKED = np.array([{"a": 1}, [1, 2], "three", None, 4.5, {"b": [1]}], dtype=object)
REC_DTYPE = np.dtype([("a", "<f4", (2,)), ("b", "<i2")])  # a subarray field: no v3 data type
REC = np.array([((1.0, 2.0), 3), ((4.0, 5.0), 6), ((7.0, 8.0), 9), ((0.5, 0.25), -1)], dtype=REC_DTYPE)
MORE = np.array([[1, "a", None], [{"b": 2}, [3], "c"]], dtype=object)


def _write_hierarchy(store: Any) -> None:
    group = zarr.group(store=store)
    group.attrs["title"] = "opaque arrays, never consolidated"
    group.create_dataset("x", data=X, chunks=(4,)).attrs["_ARRAY_DIMENSIONS"] = ["x"]
    group.create_dataset("y", data=Y, chunks=(3,)).attrs["_ARRAY_DIMENSIONS"] = ["y"]
    grid = group.create_dataset("grid", data=GRID, chunks=(3, 4))
    grid.attrs.update({"_ARRAY_DIMENSIONS": ["y", "x"], "units": "K"})
    packed = group.create_dataset("packed", data=PACKED, chunks=(2,), object_codec=numcodecs.MsgPack())
    packed.attrs["_ARRAY_DIMENSIONS"] = ["k"]
    sub = group.create_group("sub")
    sub.attrs["level"] = 1
    sub.create_dataset("line", data=LINE, chunks=(2,))
    sub.create_dataset("rec", data=REC, chunks=(1,))
    sub.create_group("deep").create_dataset("vals", data=VALS, chunks=(3,))


def _members(reader: Reader, root: Path, *groups: str) -> dict[str, Any]:
    listed = reader.run("zarr3-members", root, *groups)
    for group in groups:
        assert listed[group]["ok"], (group, listed[group])
    return listed


def _assert_v3_readers_list(reader: Reader, root: Path, opaque: list[str], extra: dict[str, str] | None = None) -> None:
    """zarr 3 lists every decodable node under each group, xarray reads the root, opaque arrays raise alone."""
    decodable = {
        "x": "array",
        "y": "array",
        "grid": "array",
        "sub": "group",
        "sub/line": "array",
        "sub/deep": "group",
        "sub/deep/vals": "array",
        **(extra or {}),
    }
    listed = _members(reader, root, "", "sub", "sub/deep")
    for group in {g for p in opaque for g in ("", "sub", "sub/deep")[: p.count("/") + 1]}:
        assert listed[group]["consolidated"], group  # listed from the block that leaves the opaque arrays out
    assert listed[""]["members"].keys() == decodable.keys()
    assert {p: m["node_type"] for p, m in listed[""]["members"].items()} == decodable
    assert listed[""]["members"]["grid"]["shape"] == [6, 8]
    assert listed[""]["arrays"] == sorted(p for p, t in decodable.items() if "/" not in p and t == "array")
    assert listed[""]["attributes"] == {"title": "opaque arrays, never consolidated"}
    assert sorted(listed["sub"]["members"]) == sorted(p[4:] for p in decodable if p.startswith("sub/"))
    assert listed["sub"]["attributes"] == {"level": 1}
    assert sorted(listed["sub/deep"]["members"]) == sorted(p[9:] for p in decodable if p.startswith("sub/deep/"))
    ds = reader.run("xarray", root)
    assert sorted(k for k in ds if k != "__attrs__") == ["grid", "x", "y"]
    for name, expected in (("grid", GRID), ("x", X), ("y", Y)):
        np.testing.assert_array_equal(ds[name]["data"], expected, err_msg=name)
    assert ds["grid"]["dims"] == ["y", "x"] and ds["grid"]["attrs"]["units"] == "K"
    read = reader.run("zarr3-path", root, "sub/line", "sub/deep/vals", *opaque)
    np.testing.assert_array_equal(read["sub/line"]["data"], LINE)
    np.testing.assert_array_equal(read["sub/deep/vals"]["data"], VALS)
    for path in opaque:
        assert not read[path]["ok"] and "shardkv.v2_dtype" in read[path]["error"], (path, read[path])


def _assert_zarr2_view(root: Path, opaque: dict[str, np.ndarray]) -> None:
    """zarr 2 through the proxy reads what it wrote; the user never consolidated, so no .zmetadata is shown."""
    with ShardedStore(str(root)) as store:
        assert not [k for k in store.keys() if k.endswith(".zmetadata") or k.endswith("zarr.json")]
        group = zarr.open_group(store, mode="r")
        np.testing.assert_array_equal(group["grid"][...], GRID)
        np.testing.assert_array_equal(group["sub/deep/vals"][...], VALS)
        for path, expected in opaque.items():
            back = group[path][...]
            assert back.dtype == expected.dtype, path
            if expected.dtype == object:
                assert back.tolist() == expected.tolist(), path
            else:
                np.testing.assert_array_equal(back, expected, err_msg=path)
        with pytest.raises(KeyError):
            zarr.open_consolidated(store)


def test_opaque_arrays_never_hide_their_siblings(tmp_path: Path, reader: Reader) -> None:
    root = tmp_path / "mixed.zarr"
    with ShardedStore(str(root), chunks_per_shard=CPS) as store:
        _write_hierarchy(store)
        assert store.sharded_array("packed") is not None and store.sharded_array("sub/rec") is not None
    assert not list(root.rglob(".zmetadata"))
    _assert_zarr2_view(root, {"packed": PACKED, "sub/rec": REC})
    _assert_v3_readers_list(reader, root, ["packed", "sub/rec"])

    # attribute changes, and a second opaque array one group deeper
    with ShardedStore(str(root), chunks_per_shard=CPS) as store:
        group = zarr.open_group(store, mode="a")
        group.attrs["title"] = "opaque arrays, never consolidated"
        group["grid"].attrs["units"] = "K"
        group["sub"].attrs["level"] = 1
        group["packed"].attrs["note"] = "msgpack"
        more = group["sub/deep"].create_dataset("more", data=MORE, chunks=(1, 2), object_codec=numcodecs.JSON())
        more.attrs["kind"] = "json"
        group["sub"].create_dataset("z", data=np.arange(3.0), chunks=(2,))  # unsharded: its mirror enters the blocks
    _assert_zarr2_view(root, {"packed": PACKED, "sub/rec": REC, "sub/deep/more": MORE})
    _assert_v3_readers_list(reader, root, ["packed", "sub/rec", "sub/deep/more"], {"sub/z": "array"})

    # deleting opaque arrays: the others still fail alone, and the siblings list
    with ShardedStore(str(root), chunks_per_shard=CPS) as store:
        group = zarr.open_group(store, mode="a")
        del group["packed"]
        del group["sub/deep/more"]
    _assert_zarr2_view(root, {"sub/rec": REC})
    _assert_v3_readers_list(reader, root, ["sub/rec"], {"sub/z": "array"})

    # the last one: no block is needed any more, zarr 3 lists the store itself
    with ShardedStore(str(root)) as store:
        del zarr.open_group(store, mode="a")["sub/rec"]
    _assert_zarr2_view(root, {})
    _assert_v3_readers_list(reader, root, [], {"sub/z": "array"})
    listed = _members(reader, root, "", "sub")
    assert not listed[""]["consolidated"] and not listed["sub"]["consolidated"]


def test_convert_all_v3_lists_alike(tmp_path: Path, reader: Reader) -> None:
    from shardkv.cli.convert import convert

    src, dst = tmp_path / "src.zarr", tmp_path / "dst.zarr"
    _write_hierarchy(zarr.DirectoryStore(str(src)))
    convert(str(src), str(dst), (2,), all_v3=True)  # 1-d arrays sharded (packed, sub/rec among them)
    assert not list(dst.rglob(".zmetadata"))
    _assert_v3_readers_list(reader, dst, ["packed", "sub/rec"])
