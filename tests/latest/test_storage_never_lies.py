"""Readers without shardkv either read a sharded array right or refuse it.

Writers run here (zarr-python 2.18, xarray <= 2026.2.0, shardkv); the readers are
the newest zarr-python 3, tensorstore and xarray in .venv-latest, and zarr-python
2.18 over a plain DirectoryStore, none of which goes through shardkv.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from latest_helpers import Reader, stored_documents

from shardkv import ShardedStore
from shardkv.metadata.hierarchy import REFUSED_ZARRAY
from shardkv.metadata.v3_view import V2_FILL_FIELD, sharding_spec_from_v3

# what zarr-python 2.18 raises for a node it cannot read (MetadataError for zarr_format 3)
ZARR2_REFUSALS = (zarr.errors.MetadataError, KeyError, ValueError)


def _sharded_paths(root: Path) -> list[str]:
    paths = []
    for key, doc in stored_documents(root).items():
        path, _, name = key.rpartition("/")
        if name == "zarr.json" and doc.get("node_type") == "array" and sharding_spec_from_v3(doc, path) is not None:
            paths.append(path)
    return sorted(paths)


def _v2_arrays(root: Path) -> list[str]:
    """Arrays zarr 2 sees through the proxy: stored .zarray, or a v3 array zarr.json (presented)."""
    v3 = {
        p
        for p, d in ((k.rpartition("/")[0], d) for k, d in stored_documents(root).items() if k.endswith("zarr.json"))
        if d.get("node_type") == "array"
    }
    return sorted(v3 | {p.parent.relative_to(root).as_posix() for p in root.rglob(".zarray")})


def _assert_zarr2_refuses(root: Path, paths: list[str]) -> None:
    """zarr-python 2.18 over the plain directory: no sharded array opens, directly or consolidated."""
    plain = zarr.DirectoryStore(str(root))
    for path in paths:
        with pytest.raises(ZARR2_REFUSALS):
            zarr.open_array(plain, path=path, mode="r")
    if (root / ".zmetadata").is_file():
        group = zarr.open_consolidated(plain, mode="r")
        for path in paths:
            with pytest.raises(ZARR2_REFUSALS):
                group[path]


# -- converted shared data ---------------------------------------------------------------------


@pytest.mark.shared_data
@pytest.mark.parametrize("dataset,cps", [("zarr-python-fixture", 2), ("zarr_implementations/examples/zarr.zr", 3)])
def test_converted_shared_data(shared_data: Path, tmp_path: Path, reader: Reader, dataset: str, cps: int) -> None:
    """Every sharded array: zarr 2 without shardkv refuses it; the newest zarr 3 (at the root)
    reads it equal when it has a data type zarr 3 knows; tensorstore reads the core types."""
    from shardkv.cli.convert import convert

    dst = tmp_path / "dst"
    convert(str(shared_data / dataset), str(dst), cps)
    zarr.consolidate_metadata(ShardedStore(str(dst)))  # today's .zmetadata: the back door
    through_proxy = zarr.open_group(ShardedStore(str(dst)), mode="r")
    expected = {p: through_proxy[p][...] for p in _v2_arrays(dst)}  # equal to the source: test_convert_shared_data
    sharded = _sharded_paths(dst)
    assert sharded and set(sharded) <= set(expected)
    assert not any((dst / p / ".zarray").exists() or (dst / p / ".zattrs").exists() for p in sharded)
    assert json.loads((dst / "zarr.json").read_text())["node_type"] == "group"
    assert all(json.loads((dst / p / "zarr.json").read_text())["node_type"] == "array" for p in sharded)

    _assert_zarr2_refuses(dst, sharded)

    docs = {p: json.loads((dst / p / "zarr.json").read_text()) for p in sharded}
    opaque = {
        p for p, d in docs.items() if isinstance(d["data_type"], dict) and d["data_type"]["name"].startswith("shardkv.")
    }
    core = {p for p, d in docs.items() if isinstance(d["data_type"], str)}
    read = reader.run("zarr3", dst, *sharded)
    for path in sharded:
        if path in opaque:
            assert not read[path]["ok"], path
        else:
            assert read[path]["ok"], (path, read[path].get("error"))
            np.testing.assert_array_equal(read[path]["data"], expected[path], err_msg=path)
            assert read[path]["data"].dtype.kind == expected[path].dtype.kind, path
    assert not opaque, f"arrays no v3 reader can open: {sorted(opaque)}"
    # tensorstore: core data types with core codecs read equal (zarr.zr's zlib array is numcodecs.zlib)
    ts_read = reader.run("tensorstore", dst, *sorted(core))
    assert any(e["ok"] for e in ts_read.values())
    for path, entry in ts_read.items():
        if entry["ok"]:
            np.testing.assert_array_equal(entry["data"], expected[path], err_msg=path)
        else:
            assert "numcodecs" in entry["error"] or "not registered" in entry["error"], (path, entry["error"])
    extension = sorted(set(sharded) - core - opaque)
    if dataset == "zarr-python-fixture":
        assert extension, "the fixture's <U4 and |S1 arrays read through extension data types"
        ts_ext = reader.run("tensorstore", dst, *extension)
        assert not any(e["ok"] for e in ts_ext.values())


# -- data types without a core v3 type: the newest zarr 3 is the oracle ----------------------------


DTYPE_CASES = {
    # id: (dtype, fill_value, data)
    "U4": ("<U4", "", ["ab", "c", "déf", "", "ghij", "k", "l", "m", "n", "o"]),
    "U4-big": (">U4", "zz", ["ab", "c", "déf", "", "ghij", "k", "l", "m", "n", "o"]),
    "U2-null": ("<U2", None, ["ab", "c", "dé", "", "gh", "k", "l", "m", "n", "o"]),
    "S1": ("|S1", "", [b"a", b"b", b"", b"d", b"e", b"f", b"g", b"h", b"i", b"j"]),
    "S8": ("|S8", b"z", [b"ab", b"cdefgh", b"", b"12345678", b"x", b"y", b"z", b"q", b"r", b"s"]),
    "V2": ("|V2", b"\x01\x02", None),
    "datetime-ns": ("<M8[ns]", -9223372036854775808, None),
    "timedelta-10s": (">m8[10s]", 0, None),
    "bool-null": ("|b1", None, [True, False] * 5),
    "f8-null": ("<f8", None, list(np.linspace(-1, 1, 10))),
}


def _dtype_data(dtype: str, data: Any) -> np.ndarray:
    dt = np.dtype(dtype)
    if data is not None:
        return np.array(data, dtype=dt)
    if dt.kind == "V":
        return np.arange(10, dtype="<u2").view(dt)
    return np.arange(10).astype(dt.newbyteorder("=")).astype(dt)


@pytest.fixture(scope="module")
def dtype_store(tmp_path_factory: pytest.TempPathFactory, latest_python: str) -> dict[str, Any]:
    """One array per case, written by zarr 2 through the proxy and read by the newest zarr 3 in one subprocess."""
    root = tmp_path_factory.mktemp("dtypes") / "s"
    store = ShardedStore(str(root), chunks_per_shard=2)
    expected, written = {}, {}
    for case, (dtype, fill, values) in DTYPE_CASES.items():
        data = _dtype_data(dtype, values)
        arr = zarr.open_array(store, path=f"g/{case}", mode="w", shape=(12,), chunks=(3,), dtype=dtype, fill_value=fill)
        arr[:10] = data  # the last two elements: fill where there is one, never-written chunk data otherwise
        if fill is None:
            arr[10:] = data[:2]
        expected[case] = arr[...]
    store.close()
    written = {case: json.loads(ShardedStore(str(root))[f"g/{case}/.zarray"]) for case in DTYPE_CASES}  # presented
    read = Reader(latest_python, root.parent / "out").run("zarr3", root, *(f"g/{c}" for c in DTYPE_CASES))
    return {"root": root, "expected": expected, "written": written, "read": read}


@pytest.mark.parametrize("case", list(DTYPE_CASES), ids=list(DTYPE_CASES))
def test_v2_data_types_read_equal_in_newest_zarr3(dtype_store: dict[str, Any], case: str) -> None:
    dtype, fill, _ = DTYPE_CASES[case]
    root, path = dtype_store["root"], f"g/{case}"
    expected, written = dtype_store["expected"][case], dtype_store["written"][case]
    doc = json.loads((root / path / "zarr.json").read_text())
    assert (V2_FILL_FIELD in doc) == (fill is None)
    assert isinstance(doc["data_type"], str) == (np.dtype(dtype).kind in "bf")

    read = dtype_store["read"][path]
    assert read["ok"], read.get("error")
    np.testing.assert_array_equal(read["data"], expected)
    assert np.dtype(read["data"].dtype).kind == np.dtype(dtype).kind

    # through the proxy, zarr 2 sees the array as written: dtype, fill_value (null included), values
    presented = json.loads(ShardedStore(str(root))[f"{path}/.zarray"])
    assert presented["dtype"] == dtype and presented["fill_value"] == written["fill_value"]
    assert (written["fill_value"] is None) == (fill is None)
    np.testing.assert_array_equal(zarr.open_array(ShardedStore(str(root)), path=path, mode="r")[...], expected)
    _assert_zarr2_refuses(root, [path])


# -- xarray, consolidated metadata ---------------------------------------------------------------


def _dataset():
    import xarray as xr

    return xr.Dataset(
        {
            "t": (("y", "x"), np.arange(120, dtype="f4").reshape(10, 12), {"units": "K"}),
            "name": (("y",), np.array(["a", "bb", "ccc", "d", "e", "f", "g", "h", "i", "j"])),
        },
        coords={"y": np.arange(10), "x": np.arange(12.0)},
        attrs={"title": "demo"},
    )


def _write_dataset(root: Path) -> Any:
    ds = _dataset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        store = ShardedStore(str(root), chunks_per_shard=2)
        ds.to_zarr(store, consolidated=True, encoding={"t": {"chunks": (2, 3)}, "name": {"chunks": (2,)}})
        store.close()
    return ds


def _assert_dataset_equal(result: dict, ds: Any) -> None:
    assert result["__attrs__"] == ds.attrs
    for name, var in ds.variables.items():
        entry = result[name]
        assert entry["ok"] and entry["dims"] == list(var.dims), name
        np.testing.assert_array_equal(entry["data"], var.values, err_msg=name)
        assert entry["attrs"] == var.attrs, name


def test_proxy_dataset_opens_in_newest_xarray_and_zarr3_consolidated(tmp_path: Path, reader: Reader) -> None:
    root = tmp_path / "ds.zarr"
    ds = _write_dataset(root)
    _assert_dataset_equal(reader.run("xarray", root), ds)
    cons = reader.run("zarr3-consolidated", root)
    assert cons["consolidated"] and cons["attributes"] == ds.attrs
    assert set(cons["consolidated_paths"]) == set(ds.variables)
    assert cons["members"]["t"] == {"node_type": "array", "attributes": {"units": "K"}, "shape": [10, 12]}
    stored = json.loads((root / ".zmetadata").read_text())["metadata"]
    assert all(stored[f"{n}/.zarray"] == REFUSED_ZARRAY for n in ds.variables)
    _assert_zarr2_refuses(root, sorted(ds.variables))


# -- the proxy itself: these pass once ShardedStore stores the new layout -----------------


def test_proxy_stores_sharded_arrays_as_v3_only(tmp_path: Path) -> None:
    root = tmp_path / "s"
    store = ShardedStore(str(root), chunks_per_shard=2)
    group = zarr.open_group(store, mode="w")
    group.attrs["made_by"] = "zarr 2"
    arr = group.create_dataset("g/a", shape=(10, 10), chunks=(2, 2), dtype="<i4", fill_value=-1)
    arr[...] = np.arange(100).reshape(10, 10)
    arr.attrs["units"] = "m"
    store.close()
    assert not (root / "g/a/.zarray").exists() and not (root / "g/a/.zattrs").exists()
    for path in ("", "g"):
        doc = json.loads((root / path / "zarr.json").read_text())
        assert doc["node_type"] == "group" and not (root / path / ".zgroup").exists()
    assert json.loads((root / "zarr.json").read_text())["attributes"] == {"made_by": "zarr 2"}
    assert json.loads((root / "g/a/zarr.json").read_text())["attributes"] == {"units": "m"}
    _assert_zarr2_refuses(root, ["g/a"])


def test_dataset_written_through_the_proxy_opens_in_newest_xarray(tmp_path: Path, reader: Reader) -> None:
    root = tmp_path / "ds.zarr"
    ds = _write_dataset(root)
    _assert_dataset_equal(reader.run("xarray", root), ds)
    _assert_zarr2_refuses(root, sorted(ds.variables))


def test_consolidated_through_the_proxy_opens_no_back_door(tmp_path: Path, reader: Reader) -> None:
    root = tmp_path / "s"
    store = ShardedStore(str(root), chunks_per_shard=2)
    arr = zarr.open_group(store, mode="w").create_dataset("a", shape=(8,), chunks=(2,), dtype="<f8")
    arr[...] = np.arange(8.0)
    zarr.consolidate_metadata(store)
    store.close()
    # zarr 2 through the proxy: the consolidated group reads
    np.testing.assert_array_equal(zarr.open_consolidated(ShardedStore(str(root)), mode="r")["a"][...], np.arange(8.0))
    _assert_zarr2_refuses(root, ["a"])
    assert reader.run("zarr3-consolidated", root)["consolidated_paths"] == ["a"]


def _assert_in_step(root: Path, path: str) -> None:
    """The stored zarr.json and the .zarray/.zattrs the proxy presents say the same thing."""
    doc = json.loads((root / path / "zarr.json").read_text())
    store = ShardedStore(str(root))
    zarray = json.loads(store[f"{path}/.zarray"])
    assert not (root / path / ".zarray").exists()
    assert zarray["shape"] == doc["shape"]
    attrs = json.loads(store[f"{path}/.zattrs"]) if f"{path}/.zattrs" in store else {}
    assert {k: v for k, v in attrs.items() if k != "_ARRAY_DIMENSIONS"} == doc["attributes"]


def test_round_trips_keep_v3_and_presented_documents_in_step(tmp_path: Path, reader: Reader) -> None:
    root = tmp_path / "s"
    store = ShardedStore(str(root), chunks_per_shard=2)
    group = zarr.open_group(store, mode="w")
    arr = group.create_dataset("g/a", shape=(6, 4), chunks=(2, 2), dtype="<i2", fill_value=0)
    arr[...] = np.arange(24).reshape(6, 4)
    _assert_in_step(root, "g/a")
    arr.resize(4, 4)
    _assert_in_step(root, "g/a")
    arr.append(np.full((3, 4), 7, dtype="<i2"))
    _assert_in_step(root, "g/a")
    arr.attrs.update({"units": "m", "scale": 2})
    _assert_in_step(root, "g/a")
    group.create_group("h/i").attrs["k"] = 1
    assert json.loads((root / "h/i/zarr.json").read_text()) == {
        "zarr_format": 3,
        "node_type": "group",
        "attributes": {"k": 1},
    }
    del group["h"]
    assert not (root / "h").exists()
    store.close()
    expected = np.concatenate([np.arange(16).reshape(4, 4), np.full((3, 4), 7)]).astype("<i2")
    read = reader.run("zarr3", root, "g/a")["g/a"]
    assert read["ok"], read.get("error")
    np.testing.assert_array_equal(read["data"], expected)
