"""shardkv.metadata.hierarchy: what a sharded hierarchy stores (v3 only), and the v2 documents presented from it.

Pure plans checked against the documents zarr-python 2.18 writes (the .zarray /
.zattrs / .zgroup / .zmetadata it produces are the inputs) and against zarr 2.18
reading the stored .zmetadata without shardkv. The newest zarr-python 3 and
xarray reading these documents are in tests/latest.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import zarr

from shardkv import ConfigurationError, ShardLayout
from shardkv.metadata.hierarchy import (
    REFUSED_ZARRAY,
    MetadataPlan,
    array_document,
    group_document,
    group_paths,
    plan_attributes,
    plan_group,
    plan_sharded_array,
    plan_zarray_update,
    present,
    presented_zmetadata,
    stored_zmetadata,
    with_consolidated_metadata,
)
from shardkv.metadata.v3_view import sharding_spec_from_v3


def _v2_hierarchy(sep: str = ".") -> dict[str, bytes]:
    """What zarr-python 2.18 writes: root and group attributes, an array with attributes, consolidated."""
    store: dict[str, bytes] = {}
    root = zarr.open_group(store, mode="w")
    root.attrs["title"] = "demo"
    grp = root.create_group("g")
    grp.attrs["level"] = 1
    arr = grp.create_dataset("a", shape=(6, 4), chunks=(2, 2), dtype="<f4", fill_value=np.nan, dimension_separator=sep)
    arr.attrs.update({"units": "m", "_ARRAY_DIMENSIONS": ["y", "x"]})
    root.create_dataset("plain", shape=(3,), chunks=(3,), dtype="<i2")
    zarr.consolidate_metadata(store)
    return store


def _doc(store: dict[str, bytes], key: str) -> dict:
    return json.loads(store[key])


LAYOUT = ShardLayout.v3((2, 1))


def test_group_paths() -> None:
    assert group_paths("a") == [""]
    assert group_paths("a/b/c") == ["", "a", "a/b"]


@pytest.mark.parametrize("sep", [".", "/"])
def test_sharded_array_plan_and_presented_documents_round_trip(sep: str) -> None:
    store = _v2_hierarchy(sep)
    zarray, zattrs = _doc(store, "g/a/.zarray"), _doc(store, "g/a/.zattrs")
    plan = plan_sharded_array(
        "g/a", zarray, zattrs, LAYOUT, {"": _doc(store, ".zattrs"), "g": _doc(store, "g/.zattrs")}
    )
    assert set(plan.writes) == {"zarr.json", "g/zarr.json", "g/a/zarr.json"}
    assert plan.deletes == {"g/a/.zarray", "g/a/.zattrs", ".zgroup", ".zattrs", "g/.zgroup", "g/.zattrs"}
    assert plan.writes["zarr.json"] == {"zarr_format": 3, "node_type": "group", "attributes": {"title": "demo"}}
    assert plan.writes["g/zarr.json"] == group_document({"level": 1})
    doc = plan.writes["g/a/zarr.json"]
    assert doc["attributes"] == {"units": "m"} and doc["dimension_names"] == ["y", "x"]
    assert doc["chunk_key_encoding"] == {"name": "v2", "configuration": {"separator": sep}}
    assert sharding_spec_from_v3(doc).layout == LAYOUT  # type: ignore[union-attr]
    # presented: exactly what zarr 2 wrote (the .zarray zarr 2.18 wrote has the same keys)
    presented = present(doc, "g/a")
    assert presented[".zarray"] == zarray
    assert presented[".zattrs"] == zattrs
    assert present(plan.writes["g/zarr.json"]) == {".zgroup": {"zarr_format": 2}, ".zattrs": {"level": 1}}
    assert present(group_document()) == {".zgroup": {"zarr_format": 2}}


def test_root_cannot_be_a_sharded_array() -> None:
    store = _v2_hierarchy()
    with pytest.raises(ConfigurationError, match="root"):
        plan_sharded_array("", _doc(store, "g/a/.zarray"), None, LAYOUT, {})


def test_array_dimensions_must_fit() -> None:
    store = _v2_hierarchy()
    with pytest.raises(ConfigurationError, match="_ARRAY_DIMENSIONS"):
        array_document(_doc(store, "g/a/.zarray"), {"_ARRAY_DIMENSIONS": ["y"]}, LAYOUT)


def test_attribute_updates_keep_documents_in_step() -> None:
    store = _v2_hierarchy()
    doc = array_document(_doc(store, "g/a/.zarray"), _doc(store, "g/a/.zattrs"), LAYOUT)
    plan = plan_attributes("g/a", doc, {"units": "km"})
    new = plan.writes["g/a/zarr.json"]
    assert new["attributes"] == {"units": "km"} and "dimension_names" not in new
    assert plan.deletes == {"g/a/.zattrs"}
    assert present(new)[".zattrs"] == {"units": "km"}
    new = plan_attributes("g/a", new, {"_ARRAY_DIMENSIONS": ["t", "x"]}).writes["g/a/zarr.json"]
    assert new["dimension_names"] == ["t", "x"] and present(new)[".zattrs"] == {"_ARRAY_DIMENSIONS": ["t", "x"]}
    group = plan_attributes("g", group_document(), {"k": [1, 2]}).writes["g/zarr.json"]
    assert group == group_document({"k": [1, 2]})
    with pytest.raises(ConfigurationError):
        plan_attributes("g/a", _doc(store, "g/a/.zarray"), {})


def test_plans_merge_writes_over_deletes() -> None:
    a = MetadataPlan({"x/zarr.json": {"n": 1}}, frozenset({"y/.zattrs"}))
    b = MetadataPlan({"y/.zattrs": {"n": 2}}, frozenset({"x/.zarray"}))
    merged = a.merged(b)
    assert merged.writes == {"x/zarr.json": {"n": 1}, "y/.zattrs": {"n": 2}}
    assert merged.deletes == {"x/.zarray"}


def _write(root: Path, docs: dict) -> None:
    for key, doc in docs.items():
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        (root / key).write_text(json.dumps(doc))


def test_stored_zmetadata_makes_zarr2_refuse_sharded_arrays_and_read_the_rest(tmp_path: Path) -> None:
    store = _v2_hierarchy()
    full = _doc(store, ".zmetadata")
    stored = stored_zmetadata(full, ["g/a"])
    assert stored["metadata"]["g/a/.zarray"] == REFUSED_ZARRAY
    assert stored["metadata"]["g/a/.zattrs"] == full["metadata"]["g/a/.zattrs"]  # the snapshot consolidated
    assert stored["metadata"]["plain/.zarray"] == full["metadata"]["plain/.zarray"]
    # oracle: zarr 2.18 without shardkv over the stored documents
    root = tmp_path / "s"
    _write(root, {".zmetadata": stored, ".zgroup": {"zarr_format": 2}, "plain/.zarray": _doc(store, "plain/.zarray")})
    group = zarr.open_consolidated(zarr.DirectoryStore(str(root)), mode="r")
    assert group.attrs["title"] == "demo" and group["plain"].shape == (3,)
    with pytest.raises(zarr.errors.MetadataError, match="zarr format"):
        group["g/a"]
    with pytest.raises(zarr.errors.MetadataError):
        group["g"]["a"]
    # and the proxy presents the full one again from the stored zarr.json documents
    plan = plan_sharded_array(
        "g/a",
        _doc(store, "g/a/.zarray"),
        _doc(store, "g/a/.zattrs"),
        LAYOUT,
        {"": _doc(store, ".zattrs"), "g": _doc(store, "g/.zattrs")},
    )
    nodes = {k.rpartition("/")[0]: v for k, v in plan.writes.items()}
    assert presented_zmetadata(stored, nodes) == full


def test_stored_zmetadata_rejects_other_formats() -> None:
    with pytest.raises(ConfigurationError, match="zarr_consolidated_format"):
        stored_zmetadata({"zarr_consolidated_format": 2, "metadata": {}}, [])


def test_consolidated_block_has_zarr3s_shape() -> None:
    """The shape zarr-python 3.4's consolidate_metadata writes (read by it: tests/latest)."""
    store = _v2_hierarchy()
    plan = plan_sharded_array(
        "g/a", _doc(store, "g/a/.zarray"), _doc(store, "g/a/.zattrs"), LAYOUT, {"": _doc(store, ".zattrs")}
    )
    nodes = {k.rpartition("/")[0]: v for k, v in plan.writes.items() if k != "zarr.json"}
    root = with_consolidated_metadata(plan.writes["zarr.json"], nodes)
    block = root["consolidated_metadata"]
    assert block["kind"] == "inline" and block["must_understand"] is False
    assert sorted(block["metadata"]) == ["g", "g/a"]
    assert block["metadata"]["g"]["consolidated_metadata"] == {
        "kind": "inline",
        "must_understand": False,
        "metadata": {},
    }
    assert block["metadata"]["g/a"] == plan.writes["g/a/zarr.json"]
    assert root["attributes"] == {"title": "demo"}
    assert with_consolidated_metadata(root, {}) == {
        **root,
        "consolidated_metadata": {"kind": "inline", "must_understand": False, "metadata": {}},
    }
    with pytest.raises(ConfigurationError):
        with_consolidated_metadata(plan.writes["g/a/zarr.json"], {})


def test_resize_keeps_layout_attributes_and_dimension_names() -> None:
    store = _v2_hierarchy()
    zarray = _doc(store, "g/a/.zarray")
    doc = array_document(zarray, _doc(store, "g/a/.zattrs"), LAYOUT)
    plan = plan_zarray_update("g/a", doc, {**zarray, "shape": [9, 4]})
    new = plan.writes["g/a/zarr.json"]
    assert new == {**doc, "shape": [9, 4]}
    assert plan.deletes == {"g/a/.zarray"}
    assert present(new)[".zarray"] == {**zarray, "shape": [9, 4]}
    with pytest.raises(ConfigurationError, match="chunks"):
        plan_zarray_update("g/a", doc, {**zarray, "chunks": [3, 2]})
    with pytest.raises(ConfigurationError, match="sharded"):
        plan_zarray_update("g", group_document(), zarray)


def test_new_group_in_a_v3_hierarchy_is_a_v3_group() -> None:
    plan = plan_group("h/i", {"k": 1}, {"": {"title": "demo"}})
    assert plan.writes == {
        "h/i/zarr.json": group_document({"k": 1}),
        "h/zarr.json": group_document(),
        "zarr.json": group_document({"title": "demo"}),
    }
    assert plan.deletes == {"h/i/.zgroup", "h/i/.zattrs", "h/.zgroup", "h/.zattrs", ".zgroup", ".zattrs"}
