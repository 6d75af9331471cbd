"""``convert --all-v3``: unsharded arrays and groups also described in v3.

Oracles here: zarr-python 2.18 over a plain DirectoryStore reads the unsharded
arrays unchanged; the proxy reads every array. tests/latest/test_all_v3.py has
the newest zarr 3 open the converted shared fixture at its root.
"""

from __future__ import annotations

import json
from pathlib import Path

import numcodecs
import numpy as np
import pytest
import zarr

from shardkv import ShardedStore
from shardkv.cli.convert import convert
from shardkv.cli.main import main
from shardkv.metadata.all_v3 import plan_all_v3, zarr3_unreachable
from shardkv.metadata.v3_view import V2_FILL_FIELD, v3_view_of_v2


def _source(root: Path) -> dict[str, np.ndarray]:
    store = zarr.DirectoryStore(str(root))
    g = zarr.group(store)
    g.attrs["title"] = "t"
    sub = g.create_group("sub")
    sub.attrs["k"] = 1
    data = {
        "sub/plain": np.arange(30, dtype=">i4").reshape(5, 6),  # 2-d: unsharded under --chunks-per-shard 2
        "flat": np.arange(10, dtype="<f8"),  # 1-d: sharded
        "sub/nested": np.arange(24, dtype="<u2").reshape(4, 6),
    }
    zarr.array(
        data["sub/plain"], chunks=(2, 4), store=store, path="sub/plain", compressor=zarr.Zlib(level=3), order="F"
    ).attrs["_ARRAY_DIMENSIONS"] = ["y", "x"]
    zarr.array(data["flat"], chunks=(3,), store=store, path="flat")
    nested = zarr.NestedDirectoryStore(str(root))
    zarr.array(data["sub/nested"], chunks=(3, 3), store=nested, path="sub/nested", fill_value=None)
    zarr.consolidate_metadata(store)
    return data


def test_all_v3_documents_and_zarr2_reads(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    data = _source(src)
    convert(str(src), str(dst), (2,), skip_mismatched=True, all_v3=True)
    plain = zarr.DirectoryStore(str(dst))
    for path in ("sub/plain", "sub/nested"):  # unsharded: v2 documents kept, zarr 2 reads them
        assert (dst / path / ".zarray").is_file()
        np.testing.assert_array_equal(zarr.open_array(plain, path=path, mode="r")[...], data[path])
    np.testing.assert_array_equal(zarr.open_consolidated(plain, mode="r")["sub/plain"][...], data["sub/plain"])
    doc = json.loads((dst / "sub/plain/zarr.json").read_text())
    assert doc["chunk_grid"]["configuration"]["chunk_shape"] == [2, 4]
    assert doc["chunk_key_encoding"] == {"name": "v2", "configuration": {"separator": "."}}
    assert [c["name"] for c in doc["codecs"]] == ["transpose", "bytes", "numcodecs.zlib"]
    assert doc["codecs"][1]["configuration"] == {"endian": "big"}
    assert doc["dimension_names"] == ["y", "x"] and doc["attributes"] == {}
    nested = json.loads((dst / "sub/nested/zarr.json").read_text())
    assert nested["chunk_key_encoding"]["configuration"]["separator"] == "/"
    assert nested[V2_FILL_FIELD] == {"must_understand": False, "fill_value": None}
    assert json.loads((dst / "sub/zarr.json").read_text()) == {
        "zarr_format": 3,
        "node_type": "group",
        "attributes": {"k": 1},
    }
    root = json.loads((dst / "zarr.json").read_text())
    assert root["attributes"] == {"title": "t"}
    assert sorted(root["consolidated_metadata"]["metadata"]) == ["flat", "sub", "sub/nested", "sub/plain"]
    through = zarr.open_group(ShardedStore(str(dst)), mode="r")
    for path, values in data.items():
        np.testing.assert_array_equal(through[path][...], values)


def test_default_convert_stores_the_hierarchy_the_proxy_would(tmp_path: Path) -> None:
    """Once an array is sharded, every group is a v3 group and every unsharded array has a zarr.json mirror."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    data = _source(src)
    report = convert(str(src), str(dst), (2,), skip_mismatched=True)
    for path in ("sub/plain", "sub/nested"):
        assert (dst / path / ".zarray").is_file() and (dst / path / "zarr.json").is_file(), path
    assert not (dst / "sub/.zgroup").exists() and not (dst / "sub/.zattrs").exists()
    assert json.loads((dst / "sub/zarr.json").read_text())["attributes"] == {"k": 1}
    root = json.loads((dst / "zarr.json").read_text())
    assert sorted(root["consolidated_metadata"]["metadata"]) == ["flat", "sub", "sub/nested", "sub/plain"]
    assert report.v3_root and report.zarr2_only == {}
    assert "zarr 3 opens it at the root as Zarr v3 and reaches 3 arrays" in report.summary()
    # what the proxy writes for the same arrays: the same documents
    proxied = tmp_path / "proxied"
    with ShardedStore(str(proxied), chunks_per_shard={"flat": 2}) as store:
        g = zarr.group(store)
        g.attrs["title"] = "t"
        g.create_group("sub").attrs["k"] = 1
        zarr.array(data["flat"], chunks=(3,), store=store, path="flat")
        zarr.array(
            data["sub/plain"], chunks=(2, 4), store=store, path="sub/plain", compressor=zarr.Zlib(level=3), order="F"
        ).attrs["_ARRAY_DIMENSIONS"] = ["y", "x"]
    for key in ("zarr.json", "sub/zarr.json", "flat/zarr.json", "sub/plain/zarr.json"):
        stored = json.loads((proxied / key).read_text())
        converted = json.loads((dst / key).read_text())
        stored.pop("consolidated_metadata", None), converted.pop("consolidated_metadata", None)
        assert converted == stored, key
    through = zarr.open_group(ShardedStore(str(dst)), mode="r")
    for path, values in data.items():
        np.testing.assert_array_equal(through[path][...], values)


def test_nothing_sharded_stays_v2_unless_all_v3(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _source(src)
    plain = convert(str(src), str(tmp_path / "plain"), (7, 7, 7), skip_mismatched=True)
    assert not list((tmp_path / "plain").rglob("zarr.json")) and not plain.v3_root
    assert "as the Zarr v2 hierarchy it is" in plain.summary()
    described = convert(str(src), str(tmp_path / "v3"), (7, 7, 7), skip_mismatched=True, all_v3=True)
    assert (tmp_path / "v3/zarr.json").is_file() and (tmp_path / "v3/.zgroup").is_file() and described.v3_root
    assert (tmp_path / "v3/sub/plain/zarr.json").is_file() and (tmp_path / "v3/sub/.zgroup").is_file()


def test_an_array_no_v3_reader_decodes_is_named_zarr2_only(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    g = zarr.open_group(str(src), mode="w")
    g.create_dataset("a", data=np.arange(8.0), chunks=2)
    g.create_dataset("o", data=np.array([{"k": 1}, [2]], dtype=object), chunks=1, object_codec=numcodecs.MsgPack())
    report = convert(str(src), str(dst), 2)
    assert list(report.zarr2_only) == ["o"] and "no Zarr v3 reader decodes it" in report.zarr2_only["o"]
    assert "zarr 2 only (zarr 3 does not read them): o (" in report.summary()


def test_zarr3_unreachable() -> None:
    group = {"zarr_format": 3, "node_type": "group", "attributes": {}}
    array = {"zarr_format": 3, "node_type": "array"}
    zarray = {
        "zarr_format": 2,
        "shape": [2],
        "chunks": [2],
        "dtype": "<f8",
        "compressor": None,
        "fill_value": 0.0,
        "filters": None,
        "order": "C",
    }
    docs = {
        "zarr.json": group,
        "g/zarr.json": group,
        "g/a/zarr.json": array,
        "b/.zarray": zarray,
        "h/.zgroup": {},
        "h/c/zarr.json": array,
    }
    out = zarr3_unreachable(docs, ["g/a", "b", "h/c"], ["g", "h"])
    assert sorted(out) == ["b", "h", "h/c"] and not any(u.opaque for u in out.values())
    assert "not a Zarr v3 group" in out["h/c"].reason
    block = {**group, "consolidated_metadata": {"kind": "inline", "must_understand": False, "metadata": {"g": group}}}
    assert zarr3_unreachable(docs, ["b"], [])["b"].reason == "no zarr.json under a Zarr v3 root"
    out = zarr3_unreachable({**docs, "zarr.json": block}, ["g/a"], ["g"])
    assert list(out) == ["g/a"] and "consolidated metadata of / does not list it" in out["g/a"].reason
    assert zarr3_unreachable({".zgroup": {}, "b/.zarray": zarray}, ["b"], []) == {}


def test_cli_all_v3(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    _source(src)
    assert main(["convert", str(src), str(dst), "--chunks-per-shard", "2", "--skip-mismatched", "--all-v3"]) == 0
    assert (dst / "sub/plain/zarr.json").is_file()


def test_no_v3_data_type_no_document() -> None:
    zarray = {
        "zarr_format": 2,
        "shape": [2],
        "chunks": [2],
        "dtype": "|O",
        "compressor": None,
        "fill_value": None,
        "filters": [{"id": "msgpack2"}],
        "order": "C",
    }
    assert v3_view_of_v2(zarray, None).metadata == {}
    plan = plan_all_v3({"s/.zarray": zarray, ".zgroup": {"zarr_format": 2}})
    assert "s/zarr.json" not in plan.writes
    assert plan.writes["zarr.json"] == {"zarr_format": 3, "node_type": "group", "attributes": {}}


@pytest.mark.parametrize("dtype", ["<U3", "|S2", "<M8[s]"])
def test_extension_types_are_described(dtype: str) -> None:
    zarray = {
        "zarr_format": 2,
        "shape": [2],
        "chunks": [2],
        "dtype": dtype,
        "compressor": None,
        "fill_value": None,
        "filters": None,
        "order": "C",
    }
    view = v3_view_of_v2(zarray, {"a": 1})
    assert view.metadata["attributes"] == {"a": 1} and view.problems


@pytest.mark.parametrize("all_v3", [False, True], ids=["sharded-only", "all-v3"])
def test_non_finite_attributes_convert(tmp_path: Path, all_v3: bool) -> None:
    """NaN/+-inf attributes (zarr 2 writes them bare) stay bare in the v3 documents, as zarr-python 3 writes them."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    g = zarr.open_group(str(src), mode="w")
    g.attrs["lo"] = float("-inf")
    g.create_dataset("a", data=np.arange(16.0), chunks=2).attrs["missing"] = float("nan")
    g.create_dataset("b", data=np.arange(4.0), chunks=(2,)).attrs["hi"] = float("inf")
    args = ["convert", str(src), str(dst), "--chunks-per-shard", "4"] + (["--all-v3"] if all_v3 else [])
    assert main(args) == 0
    assert '"missing": NaN' in (dst / "a" / "zarr.json").read_text()
    assert '"lo": -Infinity' in (dst / "zarr.json").read_text()
    with ShardedStore(str(dst)) as store:
        assert np.isnan(zarr.open_array(store, path="a", mode="r").attrs["missing"])
        assert zarr.open_array(store, path="b", mode="r").attrs["hi"] == float("inf")
        np.testing.assert_array_equal(zarr.open_array(store, path="a", mode="r")[...], np.arange(16.0))
