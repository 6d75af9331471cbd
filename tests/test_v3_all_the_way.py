"""A hierarchy is v3 all the way down once any array in it is sharded.

Written through ``ShardedStore`` by zarr-python 2.18 and xarray (this
environment). Oracles: zarr-python 2.18 over its own ``DirectoryStore``
(no shardkv) reads every unsharded array as written; the same writes on a
plain store give the same documents through the proxy; each ``zarr.json``
mirror has the shape, chunks, separator and attributes of the ``.zarray`` and
``.zattrs`` stored beside it. The newest zarr 3 and xarray reading the stored
hierarchy at its root without shardkv: ``tests/latest/test_v3_down_latest.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pytest
import zarr

from shardkv import ShardedStore
from shardkv.errors import ReservedKeyError

pytestmark = pytest.mark.filterwarnings("ignore::shardkv.PartialShardWriteWarning")

xr = pytest.importorskip("xarray")


def _doc(root: Path, key: str) -> dict[str, Any]:
    return json.loads((root / key).read_text())  # type: ignore[no-any-return]


def _block(root: Path, group: str = "") -> dict[str, Any]:
    """The consolidated block of the group at ``group``: path -> entry."""
    doc = _doc(root, f"{group}/zarr.json" if group else "zarr.json")
    return doc["consolidated_metadata"]["metadata"]  # type: ignore[no-any-return]


def _arrays(root: Path) -> list[str]:
    return sorted(p.parent.relative_to(root).as_posix() for p in root.rglob(".zarray"))


def _assert_mirror(root: Path, path: str) -> dict[str, Any]:
    """The mirror of the unsharded array at ``path`` describes its stored ``.zarray`` and ``.zattrs``."""
    mirror = _doc(root, f"{path}/zarr.json")
    zarray = _doc(root, f"{path}/.zarray")
    zattrs = _doc(root, f"{path}/.zattrs") if (root / path / ".zattrs").is_file() else {}
    assert mirror["node_type"] == "array" and mirror["zarr_format"] == 3
    assert mirror["shape"] == zarray["shape"]
    assert mirror["chunk_grid"] == {"name": "regular", "configuration": {"chunk_shape": zarray["chunks"]}}
    assert mirror["chunk_key_encoding"] == {
        "name": "v2",
        "configuration": {"separator": zarray.get("dimension_separator") or "."},
    }
    assert not any(c["name"] == "sharding_indexed" for c in mirror["codecs"])
    names = zattrs.pop("_ARRAY_DIMENSIONS", None)
    assert mirror.get("dimension_names") == names
    assert mirror["attributes"] == zattrs
    return mirror


def _dataset(n_time: int = 8, start: int = 0) -> xr.Dataset:
    rng = np.random.default_rng(start)
    return xr.Dataset(
        {"temp": (("time", "lat", "lon"), rng.random((n_time, 12, 10), dtype="f4"), {"units": "K"})},
        coords={
            "time": np.arange(start, start + n_time, dtype="i8"),
            "lat": np.linspace(-55.0, 55.0, 12),
            "lon": np.linspace(0.0, 90.0, 10),
        },
        attrs={"title": "v3 all the way down", "source": "shardkv"},
    )


def _write(path: Path, ds: xr.Dataset, **kwargs: Any) -> None:
    with ShardedStore(str(path), chunks_per_shard=(2, 2, 2)) as store:  # 3-d arrays sharded, 1-d ones not
        ds.chunk({"time": 2, "lat": 6, "lon": 5}).to_zarr(store, **kwargs)


def test_xarray_dataset_is_v3_all_the_way_down(tmp_path: Path) -> None:
    root = tmp_path / "ds.zarr"
    ds = _dataset()
    _write(root, ds, mode="w")
    # the data variable is sharded (v3 only); the 1-d coordinates keep their v2 documents and gain a mirror
    assert not (root / "temp" / ".zarray").exists()
    assert any(c["name"] == "sharding_indexed" for c in _doc(root, "temp/zarr.json")["codecs"])
    assert _arrays(root) == ["lat", "lon", "time"]
    for path in _arrays(root):
        _assert_mirror(root, path)
    top = _doc(root, "zarr.json")
    assert top["node_type"] == "group" and top["attributes"] == ds.attrs
    assert not (root / ".zgroup").exists() and not (root / ".zattrs").exists()
    assert sorted(_block(root)) == ["lat", "lon", "temp", "time"]  # xarray consolidated: every node listed
    for path in ("lat", "lon", "time"):
        assert _block(root)[path] == _doc(root, f"{path}/zarr.json")
    # zarr 2 without shardkv reads the unsharded arrays as written
    plain = zarr.DirectoryStore(str(root))
    consolidated = zarr.open_consolidated(plain, mode="r")
    for name in ("lat", "lon", "time"):
        np.testing.assert_array_equal(zarr.open_array(plain, path=name, mode="r")[...], ds[name].values)
        np.testing.assert_array_equal(consolidated[name][...], ds[name].values)
    # zarr 2 through the proxy: the same dataset, and no mirror in sight
    with ShardedStore(str(root)) as store:
        xr.testing.assert_identical(xr.open_zarr(store).load(), ds)
        assert "time/zarr.json" not in store and "time/zarr.json" not in set(store)
        assert store.listdir("time") == sorted(["0", ".zarray", ".zattrs"])
        with pytest.raises(KeyError):
            store["time/zarr.json"]
        with pytest.raises(ReservedKeyError):
            store["time/zarr.json"] = b"{}"


def test_later_zarr2_writes_keep_the_v3_documents_in_step(tmp_path: Path) -> None:
    root = tmp_path / "ds.zarr"
    first, more = _dataset(), _dataset(4, start=8)
    _write(root, first, mode="w")
    _write(root, more, append_dim="time")  # resizes time (unsharded) and temp (sharded)
    assert _assert_mirror(root, "time")["shape"] == [12]
    assert _block(root)["time"]["shape"] == [12] and _block(root)["temp"]["shape"] == [12, 12, 10]
    with ShardedStore(str(root), chunks_per_shard=(2, 2, 2)) as store:
        group = zarr.open_group(store, mode="a")
        group.attrs["history"] = "appended"  # no consolidate_metadata afterwards
        group["lat"].attrs["units"] = "degrees_north"
        new = group.create_dataset("station", shape=(5,), chunks=(5,), dtype="i2", fill_value=-1)
        new[...] = np.arange(5)
        new.attrs["_ARRAY_DIMENSIONS"] = ["station"]
        sub = group.create_group("sub")
        sub.attrs["level"] = 1
        sub.create_dataset("flag", shape=(3,), chunks=(2,), dtype="u1")[...] = [1, 2, 3]
    top = _doc(root, "zarr.json")
    assert top["attributes"]["history"] == "appended"
    block = _block(root)
    assert block["lat"]["attributes"] == {"units": "degrees_north"}
    assert _assert_mirror(root, "lat")["attributes"] == {"units": "degrees_north"}
    assert block["station"] == _assert_mirror(root, "station") and block["station"]["dimension_names"] == ["station"]
    assert block["sub"]["attributes"] == {"level": 1} and block["sub/flag"] == _assert_mirror(root, "sub/flag")
    assert _doc(root, "sub/zarr.json")["node_type"] == "group" and not (root / "sub" / ".zgroup").exists()
    # deletes: a zarr 2 del (rmdir), a .zattrs, a .zarray
    with ShardedStore(str(root), chunks_per_shard=(2, 2, 2)) as store:
        group = zarr.open_group(store, mode="a")
        del group["sub"]
        del store["station/.zattrs"]
        assert "_ARRAY_DIMENSIONS" not in group["station"].attrs
    block = _block(root)
    assert not any(p == "sub" or p.startswith("sub/") for p in block) and not (root / "sub").exists()
    assert "dimension_names" not in _assert_mirror(root, "station") and block["station"]["attributes"] == {}
    with ShardedStore(str(root)) as store:
        del store["station/.zarray"]
        assert "station" not in zarr.open_group(store, mode="r").array_keys()
    assert not (root / "station" / "zarr.json").exists() and "station" not in _block(root)
    # zarr 2 reopens what it wrote
    with ShardedStore(str(root)) as store:
        back = xr.open_zarr(store, consolidated=False).load()
    expected = xr.concat([first, more], dim="time", data_vars="minimal")
    expected.attrs["history"] = "appended"
    expected["lat"].attrs["units"] = "degrees_north"
    xr.testing.assert_identical(back, expected)


def _build_zarr2(store: Any) -> zarr.hierarchy.Group:
    """The same zarr 2 writes on any store: unsharded arrays of many kinds before and after a sharded one."""
    root = zarr.group(store=store)
    root.attrs["title"] = "mixed"
    g = root.create_group("g")
    g.attrs["level"] = 1
    root.create_dataset("f_order", data=np.arange(12.0).reshape(12), chunks=5, order="F", fill_value=np.nan)
    root.create_dataset("delta", data=np.arange(10, dtype="i4"), chunks=4, filters=[numcodecs.Delta(dtype="i4")])
    root.create_dataset(
        "words", data=np.array(["a", "bc", "déf"], dtype=object), chunks=2, object_codec=numcodecs.VLenUTF8()
    )
    g.create_dataset("nested", data=np.arange(7, dtype="u2"), chunks=3, dimension_separator="/")
    sharded = g.create_dataset("grid", shape=(4, 6), chunks=(2, 2), dtype="f8", fill_value=-1.0)  # 2-d: sharded
    sharded[...] = np.arange(24.0).reshape(4, 6)
    root.create_dataset("after", data=np.arange(5, dtype="i8"), chunks=2)
    return root


def test_zarr2_reopen_identical_and_mirrors_of_every_kind(tmp_path: Path) -> None:
    oracle = zarr.MemoryStore()
    _build_zarr2(oracle)
    root = tmp_path / "mixed.zarr"
    _build_zarr2(ShardedStore(str(root), chunks_per_shard=(2, 2)))
    store = ShardedStore(str(root))
    unsharded = ["after", "delta", "f_order", "g/nested", "words"]
    for path in unsharded + ["g/grid"]:
        for name in (".zarray", ".zattrs"):
            key = f"{path}/{name}"
            if key in oracle:
                assert json.loads(store[key]) == json.loads(oracle[key]), key
        want = zarr.open_array(oracle, path=path, mode="r")
        got = zarr.open_array(store, path=path, mode="r")
        assert (got.dtype, got.order, got.filters, got.compressor) == (
            want.dtype,
            want.order,
            want.filters,
            want.compressor,
        )
        np.testing.assert_array_equal(got[...], want[...])
    for path in ("", "g"):
        assert json.loads(store[f"{path}/.zattrs".lstrip("/")]) == json.loads(oracle[f"{path}/.zattrs".lstrip("/")])
    # on storage: v2 groups are v3 groups now, unsharded arrays (made before the sharded one too) have a mirror
    assert sorted(_arrays(root)) == unsharded
    for path in unsharded:
        _assert_mirror(root, path)
    assert _doc(root, "g/zarr.json") == {"zarr_format": 3, "node_type": "group", "attributes": {"level": 1}}
    assert _doc(root, "zarr.json")["attributes"] == {"title": "mixed"}
    assert "consolidated_metadata" not in _doc(root, "zarr.json")  # nobody consolidated: v3 readers list
    assert sorted(store) == sorted(oracle)


def test_an_opaque_unsharded_array_gets_no_mirror_and_stays_out_of_the_block(tmp_path: Path) -> None:
    root = tmp_path / "opaque.zarr"
    with ShardedStore(str(root), chunks_per_shard=(2, 2)) as store:
        group = zarr.group(store=store)
        group.create_dataset("grid", data=np.arange(16.0).reshape(4, 4), chunks=(2, 2))
        group.create_dataset(
            "packed", data=np.array([{"a": 1}, [1, 2], "x"], dtype=object), chunks=2, object_codec=numcodecs.MsgPack()
        )
        group.create_dataset("plain", data=np.arange(3), chunks=2)
        zarr.consolidate_metadata(store)
        np.testing.assert_array_equal(
            zarr.open_group(store, mode="r")["packed"][...], np.array([{"a": 1}, [1, 2], "x"], dtype=object)
        )
    assert not (root / "packed" / "zarr.json").exists()
    assert sorted(_block(root)) == ["grid", "plain"]
    _assert_mirror(root, "plain")
    np.testing.assert_array_equal(
        zarr.open_array(zarr.DirectoryStore(str(root)), path="packed", mode="r")[...],
        np.array([{"a": 1}, [1, 2], "x"], dtype=object),
    )


NON_FINITE = {"missing": float("nan"), "hi": float("inf"), "lo": float("-inf")}


def _text(attrs: Any) -> str:
    """Attributes as JSON text (``NaN``, ``Infinity`` spelled out): non-finite floats compare equal."""
    return json.dumps(dict(attrs), sort_keys=True)


def non_finite_hierarchy(store: Any) -> None:
    """Groups and arrays, sharded and not, whose attributes hold ``NaN`` and +-inf (zarr 2 writes them bare)."""
    group = zarr.group(store=store)
    group.create_group("odd").attrs.update(NON_FINITE)  # a v2 group before the first sharded array
    group.create_dataset("line", data=np.arange(3.0), chunks=2).attrs.update(NON_FINITE)
    group.create_dataset("grid", data=np.arange(16.0).reshape(4, 4), chunks=(2, 2)).attrs.update(NON_FINITE)
    group.create_group("late").attrs.update(NON_FINITE)  # a v3 group from the start


def test_non_finite_attributes_are_kept_as_zarr_python_3_writes_them(tmp_path: Path) -> None:
    """NaN/inf attributes: the zarr 2 writes succeed and reopen as on a MemoryStore; every node gets its
    ``zarr.json`` with them bare, as zarr-python 3 writes attributes (no node left v2 or unmirrored)."""
    root = tmp_path / "nan.zarr"
    oracle = zarr.MemoryStore()
    non_finite_hierarchy(oracle)
    with ShardedStore(str(root), chunks_per_shard=(2, 2)) as store:
        non_finite_hierarchy(store)
        zarr.consolidate_metadata(store)
    paths = ("odd", "line", "grid", "late")
    with ShardedStore(str(root)) as store:
        for path in paths:
            assert _text(zarr.open(store, path=path, mode="r").attrs) == _text(
                zarr.open(oracle, path=path, mode="r").attrs
            )
        np.testing.assert_array_equal(zarr.open_array(store, path="grid", mode="r")[...], np.arange(16.0).reshape(4, 4))
    for path in paths:
        doc = _doc(root, f"{path}/zarr.json")
        assert doc["zarr_format"] == 3 and _text(doc["attributes"]) == _text(NON_FINITE), path
        assert _text(_block(root)[path]["attributes"]) == _text(NON_FINITE), path
    assert not (root / "odd" / ".zgroup").exists()
    text = (root / "grid" / "zarr.json").read_text()
    assert '"missing": NaN' in text and '"hi": Infinity' in text and '"lo": -Infinity' in text


def test_a_hierarchy_made_before_is_described_when_consolidated(tmp_path: Path) -> None:
    """A v3 root whose plain arrays and groups lack v3 documents (an earlier shardkv) gains them on consolidation."""
    root = tmp_path / "old.zarr"
    with ShardedStore(str(root), chunks_per_shard=(2, 2)) as store:
        group = zarr.group(store=store)
        group.create_dataset("grid", data=np.arange(16.0).reshape(4, 4), chunks=(2, 2))
        group.create_dataset("line", data=np.arange(3.0), chunks=2)
    (root / "line" / "zarr.json").unlink()
    (root / "old").mkdir()
    (root / "old" / ".zgroup").write_text(json.dumps({"zarr_format": 2}))
    (root / "old" / ".zattrs").write_text(json.dumps({"kept": True}))
    with ShardedStore(str(root)) as store:
        zarr.consolidate_metadata(store)
        assert zarr.open_group(store, mode="r")["old"].attrs["kept"] is True
    _assert_mirror(root, "line")
    assert _doc(root, "old/zarr.json")["attributes"] == {"kept": True}
    assert sorted(_block(root)) == ["grid", "line", "old"]


def test_a_v2_hierarchy_without_sharded_arrays_stays_v2(tmp_path: Path) -> None:
    root = tmp_path / "v2.zarr"
    with ShardedStore(str(root), chunks_per_shard=None) as store:
        group = zarr.group(store=store)
        group.create_group("g").create_dataset("a", data=np.arange(4), chunks=2)
        zarr.consolidate_metadata(store)
    assert not list(root.rglob("zarr.json"))


def test_over_a_dict_the_same_documents(tmp_path: Path) -> None:
    base: dict[str, bytes] = {}
    store = ShardedStore(base, chunks_per_shard=(2, 2))
    group = zarr.group(store=store)
    group.create_dataset("line", data=np.arange(6), chunks=(3,)).attrs["_ARRAY_DIMENSIONS"] = ["k"]
    group.create_group("g").attrs["a"] = 1
    group.create_dataset("g/grid", data=np.ones((4, 4)), chunks=(2, 2))
    assert sorted(k for k in base if not k[0].isdigit() and "/0" not in k and "/1" not in k) == [
        "g/grid/zarr.json",
        "g/zarr.json",
        "line/.zarray",
        "line/.zattrs",
        "line/zarr.json",
        "zarr.json",
    ]
    mirror = json.loads(base["line/zarr.json"])
    assert mirror["dimension_names"] == ["k"] and mirror["shape"] == [6] and mirror["attributes"] == {}
    assert json.loads(base["g/zarr.json"])["attributes"] == {"a": 1}
    assert "line/zarr.json" not in store and sorted(store.listdir("line")) == [".zarray", ".zattrs", "0", "1"]
    group["line"].resize(9)
    assert json.loads(base["line/zarr.json"])["shape"] == [9]


# -- the pure plans ------------------------------------------------------------------------------


def test_plan_v3_down_groups_arrays_and_refusals() -> None:
    from shardkv.metadata.all_v3 import may_mirror, plan_v3_down

    zarray = {
        "zarr_format": 2,
        "shape": [4],
        "chunks": [2],
        "dtype": "<i4",
        "compressor": None,
        "fill_value": 0,
        "filters": None,
        "order": "C",
    }
    packed = {**zarray, "dtype": "|O", "filters": [{"id": "msgpack2"}]}
    documents = {
        "zarr.json": {"zarr_format": 3, "node_type": "group", "attributes": {}},
        "g/.zgroup": {"zarr_format": 2},
        "g/.zattrs": {"a": 1},
        "g/x/.zarray": zarray,
        "g/x/.zattrs": {"_ARRAY_DIMENSIONS": ["t"], "units": "m"},
        "h/i/y/.zarray": zarray,  # under implicit groups h and h/i
        "p/.zarray": packed,
        "done/.zarray": zarray,
    }
    plan, refused = plan_v3_down(documents, ["done"])
    assert sorted(plan.writes) == ["g/x/zarr.json", "g/zarr.json", "h/i/y/zarr.json", "h/i/zarr.json", "h/zarr.json"]
    assert plan.writes["g/zarr.json"] == {"zarr_format": 3, "node_type": "group", "attributes": {"a": 1}}
    assert plan.deletes == {"g/.zgroup", "g/.zattrs", "h/.zgroup", "h/.zattrs", "h/i/.zgroup", "h/i/.zattrs"}
    x = plan.writes["g/x/zarr.json"]
    assert x["dimension_names"] == ["t"] and x["attributes"] == {"units": "m"} and may_mirror(x)
    assert list(refused) == ["p"]
    assert not may_mirror(documents["zarr.json"]) and not may_mirror(None)


def test_consolidated_in_step_adds_replaces_and_removes_entries() -> None:
    from shardkv.errors import ConfigurationError
    from shardkv.metadata.hierarchy import consolidated_in_step, has_consolidated, with_consolidated_metadata

    array = {"zarr_format": 3, "node_type": "array", "shape": [2], "attributes": {}}
    group = {"zarr_format": 3, "node_type": "group", "attributes": {"a": 1}}
    root = with_consolidated_metadata(
        {"zarr_format": 3, "node_type": "group", "attributes": {}}, {"a": array, "g": group, "g/b": array}
    )
    assert has_consolidated(root) and not has_consolidated(group)
    opaque = {**array, "data_type": {"name": "shardkv.v2_dtype"}}
    bigger = {**array, "shape": [3]}
    out = consolidated_in_step(
        {**root, "attributes": {"new": True}}, root, {"g": None, "a": bigger, "c": array, "d": opaque}
    )
    assert out["attributes"] == {"new": True}
    assert out["consolidated_metadata"]["metadata"] == {"a": bigger, "c": array}
    assert out["consolidated_metadata"]["kind"] == "inline"
    out = consolidated_in_step(root, root, {"g/e": group})
    assert out["consolidated_metadata"]["metadata"]["g/e"]["consolidated_metadata"]["metadata"] == {}
    with pytest.raises(ConfigurationError):
        consolidated_in_step(root, group, {})
    with pytest.raises(ConfigurationError):
        consolidated_in_step(array, root, {})


# -- opaque arrays: blocks that keep their siblings listable ----------------------

_PACKED = np.array([{"a": 1}, [1, 2], "x", None], dtype=object)


def _opaque_hierarchy(store: Any) -> Any:
    """A sharded opaque array two groups down (a/b/packed), its siblings, and a group c without one."""
    group = zarr.group(store=store)
    group.attrs["title"] = "t"
    group.create_dataset("grid", data=np.arange(16.0).reshape(4, 4), chunks=(2, 2))
    b = group.create_group("a").create_group("b")
    b.create_dataset("packed", data=_PACKED, chunks=(2,), object_codec=numcodecs.MsgPack())
    b.create_dataset("v", data=np.arange(3), chunks=(2,))
    group.create_group("c").create_dataset("w", data=np.arange(4.0), chunks=(2,))
    return group


def test_groups_above_an_opaque_array_hold_a_block_while_it_is_there(tmp_path: Path) -> None:
    root = tmp_path / "opaque.zarr"
    cps = {"grid": (2, 2), "a/b/packed": (2,)}
    with ShardedStore(str(root), chunks_per_shard=cps) as store:
        group = _opaque_hierarchy(store)
        assert store.sharded_array("a/b/packed") is not None
        assert _doc(root, "a/b/packed/zarr.json")["data_type"]["name"] == "shardkv.v2_dtype"
        # the zarr 2 view: nothing consolidated, nothing new
        assert ".zmetadata" not in store and not [k for k in store if k.endswith((".zmetadata", "zarr.json"))]
        assert sorted(store.listdir("")) == [".zattrs", ".zgroup", "a", "c", "grid"]
        assert sorted(store.listdir("a/b")) == [".zgroup", "packed", "v"]
        np.testing.assert_array_equal(group["a/b/packed"][...], _PACKED)
        with pytest.raises(KeyError):
            zarr.open_consolidated(store)
    assert not list(root.rglob(".zmetadata"))
    assert sorted(_block(root)) == ["a", "a/b", "a/b/v", "c", "c/w", "grid"]
    assert sorted(_block(root, "a")) == ["b", "b/v"]
    assert sorted(_block(root, "a/b")) == ["v"]
    assert "consolidated_metadata" not in _doc(root, "c/zarr.json")
    assert _block(root)["a"]["consolidated_metadata"] == {"kind": "inline", "must_understand": False, "metadata": {}}
    assert _doc(root, "zarr.json")["attributes"] == {"title": "t"}

    with ShardedStore(str(root), chunks_per_shard=cps) as store:  # later writes keep the blocks in step
        group = zarr.open_group(store, mode="a")
        group["a"].attrs["level"] = 1
        group["a/b"].create_dataset("u", data=np.arange(2), chunks=(2,))
        group["grid"].resize(6, 4)
        assert ".zmetadata" not in store
    assert sorted(_block(root, "a")) == ["b", "b/u", "b/v"] and _doc(root, "a/zarr.json")["attributes"] == {"level": 1}
    assert _block(root)["grid"]["shape"] == [6, 4] and _block(root)["a"]["attributes"] == {"level": 1}
    assert sorted(_block(root, "a/b")) == ["u", "v"]

    with ShardedStore(str(root)) as store:  # the last opaque array goes: so do the blocks
        del zarr.open_group(store, mode="a")["a/b/packed"]
    for group_path in ("", "a", "a/b", "c"):
        doc = _doc(root, f"{group_path}/zarr.json" if group_path else "zarr.json")
        assert "consolidated_metadata" not in doc, group_path
    assert _doc(root, "zarr.json")["attributes"] == {"title": "t"}
    assert _doc(root, "a/zarr.json")["attributes"] == {"level": 1}


def test_a_users_block_stays_when_the_last_opaque_array_goes(tmp_path: Path) -> None:
    root = tmp_path / "consolidated.zarr"
    with ShardedStore(str(root), chunks_per_shard={"grid": (2, 2), "a/b/packed": (2,)}) as store:
        _opaque_hierarchy(store)
        zarr.consolidate_metadata(store)
        del zarr.open_group(store, mode="a")["a/b/packed"]
        consolidated = zarr.open_consolidated(store, mode="r")
        assert sorted(consolidated["a/b"]) == ["v"]
    assert sorted(_block(root)) == ["a", "a/b", "a/b/v", "c", "c/w", "grid"]  # the user's, in step
    assert "consolidated_metadata" not in _doc(root, "a/zarr.json")
    assert "consolidated_metadata" not in _doc(root, "a/b/zarr.json")


def test_over_a_dict_deleting_the_opaque_array_takes_the_blocks_along() -> None:
    base: dict[str, bytes] = {}
    store = ShardedStore(base, chunks_per_shard={"grid": (2, 2), "a/b/packed": (2,)})
    _opaque_hierarchy(store)
    assert [k for k in sorted(base) if k.endswith("zarr.json") and "consolidated_metadata" in json.loads(base[k])] == [
        "a/b/zarr.json",
        "a/zarr.json",
        "zarr.json",
    ]
    assert sorted(json.loads(base["a/b/zarr.json"])["consolidated_metadata"]["metadata"]) == ["v"]
    chunks = sorted(k for k in store if k.startswith("a/b/packed/") and k[-1].isdigit())
    del store["a/b/packed/.zarray"]  # that key alone: the chunks stay chunks, so the array's zarr.json stays
    assert "a/b/packed/.zarray" not in store
    assert sorted(k for k in store if k.startswith("a/b/packed/")) == chunks
    assert json.loads(base["a/b/packed/zarr.json"])["shardkv.v2_deleted"]["documents"] == [".zarray"]
    assert sorted(json.loads(base["a/b/zarr.json"])["consolidated_metadata"]["metadata"]) == ["v"]
    store.rmdir("a/b/packed")
    assert "a/b/packed/zarr.json" not in base
    assert not [k for k in base if k.endswith("zarr.json") and "consolidated_metadata" in json.loads(base[k])]
    assert ".zmetadata" not in store and not [k for k in base if k.endswith(".zmetadata")]


def test_plan_opaque_blocks_adds_keeps_and_releases() -> None:
    from shardkv.metadata.hierarchy import plan_opaque_blocks, with_consolidated_metadata

    group = {"zarr_format": 3, "node_type": "group", "attributes": {}}
    array = {"zarr_format": 3, "node_type": "array", "shape": [2], "attributes": {}}
    opaque = {**array, "data_type": {"name": "shardkv.v2_dtype", "configuration": {"dtype": "|O"}}}
    documents: dict[str, Any] = {
        "zarr.json": group,
        "g/zarr.json": group,
        "g/o/zarr.json": opaque,
        "g/x/zarr.json": array,
        "h/zarr.json": group,
        "h/y/zarr.json": array,
    }
    plan = plan_opaque_blocks(documents)
    assert sorted(plan.writes) == ["g/zarr.json", "zarr.json"] and not plan.deletes
    assert sorted(plan.writes["zarr.json"]["consolidated_metadata"]["metadata"]) == ["g", "g/x", "h", "h/y"]
    assert list(plan.writes["g/zarr.json"]["consolidated_metadata"]["metadata"]) == ["x"]
    assert not plan_opaque_blocks({**documents, **plan.writes}).writes  # in step: nothing to write
    # no opaque array left: a released block goes unless a .zmetadata stands beside it; others stay
    blocked = with_consolidated_metadata(group, {"y": array})
    left = {"zarr.json": blocked, "g/zarr.json": blocked, "h/zarr.json": blocked, "g/.zmetadata": {}}
    plan = plan_opaque_blocks(left, released=["", "g"])
    assert list(plan.writes) == ["zarr.json"] and plan.writes["zarr.json"] == group
    assert not plan_opaque_blocks(left).writes
