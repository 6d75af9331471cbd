"""shardkv.cli.convert on small hierarchies written by zarr-python 2.18 (the oracle).

The strongest check: converting a hierarchy gives exactly the store that
ShardedStore writes when zarr-python creates the same arrays through it.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr

from shardkv import ConfigurationError, ShardedStore
from shardkv.cli.convert import check_chunks_per_shard, convert, parse_chunks_per_shard
from shardkv.cli.convert import run as convert_module
from shardkv.cli.errors import DestinationNotEmptyError, NotAHierarchyError, SameLocationError
from shardkv.storage.mapping import MappingStore

ARRAYS = {
    # name: (shape, chunks, dtype, compressor)
    "a2": ((23, 17), (5, 4), "<f4", zarr.Zlib(level=1)),
    "g/a3": ((7, 9, 10), (2, 3, 4), "<i2", None),
    "g/a1": ((50,), (7,), "|u1", zarr.Blosc(cname="lz4")),
}


def _fill(store, arrays=ARRAYS, **kwargs) -> dict[str, np.ndarray]:
    """Create ``arrays`` in ``store`` with zarr-python 2; returns their values."""
    root = zarr.group(store=store, overwrite=True)
    root.attrs["title"] = "test hierarchy"
    rng = np.random.default_rng(1)
    values = {}
    for name, (shape, chunks, dtype, compressor) in arrays.items():
        z = root.create_dataset(name, shape=shape, chunks=chunks, dtype=dtype, compressor=compressor, **kwargs)
        data = (rng.random(shape) * 100).astype(dtype)
        z[...] = data
        z.attrs["units"] = f"units of {name}"
        values[name] = data
    return values


def _read(store, path: str) -> np.ndarray:
    return zarr.open_array(store, path=path, mode="r")[...]


@pytest.mark.parametrize("index_location", ["end", "start"])
@pytest.mark.parametrize("index_checksum", [True, False], ids=["crc32c", "nocrc"])
def test_result_equals_what_sharded_store_writes(index_location, index_checksum):
    src: dict = {}
    _fill(src)
    dst: dict = {}
    report = convert(src, dst, 2, index_location=index_location, index_checksum=index_checksum)

    via_proxy: dict = {}
    _fill(ShardedStore(via_proxy, 2, index_location=index_location, index_checksum=index_checksum))
    assert sorted(dst) == sorted(via_proxy)
    for key in via_proxy:
        assert bytes(dst[key]) == bytes(via_proxy[key]), key
    assert len(report.sharded) == 3 and not report.unsharded


def test_every_array_reads_back_equal():
    src: dict = {}
    values = _fill(src)
    dst: dict = {}
    convert(src, dst, 3)
    store = ShardedStore(dst)
    for name, data in values.items():
        np.testing.assert_array_equal(_read(store, name), data)
        assert store.sharded_array(name) is not None
    assert zarr.open_group(store, mode="r").attrs["title"] == "test hierarchy"
    assert zarr.open_array(store, path="g/a3", mode="r").attrs["units"] == "units of g/a3"


def test_tuple_applies_to_arrays_of_that_ndim_only():
    src: dict = {}
    values = _fill(src)
    dst: dict = {}
    report = convert(src, dst, (2, 2, 1))
    by_path = {a.path: a for a in report.arrays}
    assert by_path["g/a3"].sharded and by_path["g/a3"].chunks_per_shard == (2, 2, 1)
    for name in ("a2", "g/a1"):
        assert not by_path[name].sharded
        assert "3-d" in by_path[name].reason
        assert name in report.summary()
        # copied as they are, and described in v3 beside (the hierarchy is v3 all the way down)
        for key in [k for k in src if k.startswith(name + "/")]:
            assert bytes(dst[key]) == bytes(src[key])
        assert json.loads(dst[f"{name}/zarr.json"])["chunk_key_encoding"]["name"] == "v2"
    store = ShardedStore(dst)
    for name, data in values.items():
        np.testing.assert_array_equal(_read(store, name), data)


def test_zero_d_array_is_copied_unsharded():
    src: dict = {}
    root = zarr.group(store=src)
    z = root.create_dataset("scalar", shape=(), dtype="<f8")
    z[...] = 4.5
    dst: dict = {}
    report = convert(src, dst, 4)
    assert [(a.path, a.sharded, a.reason) for a in report.arrays] == [("scalar", False, "0-d")]
    assert {k: bytes(v) for k, v in dst.items()} == {k: bytes(v) for k, v in src.items()}
    assert _read(ShardedStore(dst), "scalar") == 4.5


def test_stale_chunks_are_skipped_and_counted():
    src: dict = {}
    values = _fill(src)
    src["a2/9.0"] = b"stale chunk left by an old resize"  # grid is (5, 5)
    src["a2/0.5"] = b"another"
    dst: dict = {}
    report = convert(src, dst, 2)
    assert report.stale_chunks == 2
    assert {a.path: a.stale_chunks for a in report.arrays}["a2"] == 2
    assert "stale" in report.summary()
    np.testing.assert_array_equal(_read(ShardedStore(dst), "a2"), values["a2"])
    assert report.objects_before == len(src)


def test_other_keys_inside_an_array_are_copied_as_they_are():
    src: dict = {}
    _fill(src)
    src["a2/README.txt"] = b"notes"
    src["a2/0.0.0"] = b"not a chunk key of a 2-d array"
    src["notes/readme"] = b"outside any array"
    dst: dict = {}
    convert(src, dst, 2)
    for key in ("a2/README.txt", "a2/0.0.0", "notes/readme"):
        assert bytes(dst[key]) == src[key]


def _nested_legacy(src: dict) -> np.ndarray:
    """An array with '/' chunk keys whose .zarray names no dimension_separator (NestedDirectoryStore)."""
    root = zarr.group(store=src)
    z = root.create_dataset("n", shape=(9, 10), chunks=(2, 3), dtype="<i4", dimension_separator="/")
    data = np.arange(90, dtype="<i4").reshape(9, 10)
    z[...] = data
    zarray = json.loads(src["n/.zarray"])
    del zarray["dimension_separator"]
    src["n/.zarray"] = json.dumps(zarray, indent=4).encode()
    assert any(k.startswith("n/") and k.count("/") == 2 for k in src)
    return data


def test_nested_keys_without_separator_are_detected():
    src: dict = {}
    data = _nested_legacy(src)
    zarr.consolidate_metadata(src)
    dst: dict = {}
    report = convert(src, dst, 2)
    (arr,) = report.arrays
    assert arr.separator == "/" and arr.separator_detected and arr.chunks == 20
    # stored as v3 only; zarr 2 reads the .zarray and .zmetadata presented through the proxy
    assert json.loads(dst["n/zarr.json"])["chunk_key_encoding"] == {"name": "v2", "configuration": {"separator": "/"}}
    assert json.loads(ShardedStore(dst)["n/.zarray"])["dimension_separator"] == "/"
    assert json.loads(ShardedStore(dst)[".zmetadata"])["metadata"]["n/.zarray"]["dimension_separator"] == "/"
    assert "n/0/0" in dst and "n/0.0" not in dst
    np.testing.assert_array_equal(_read(ShardedStore(dst), "n"), data)
    np.testing.assert_array_equal(zarr.open_consolidated(ShardedStore(dst), mode="r")["n"][...], data)


def test_mixed_separators_without_dimension_separator_are_refused():
    src: dict = {}
    _nested_legacy(src)
    src["n/1.1"] = b"x"
    with pytest.raises(ConfigurationError, match="both"):
        convert(src, {}, 2)


class _RecordingStore(dict):
    """A dict with zarr-style batch methods that records every batch."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.get_batches: list[list[str]] = []
        self.set_batches: list[list[str]] = []

    def getitems(self, keys, *, contexts=None):
        self.get_batches.append(list(keys))
        return {k: self[k] for k in keys if k in self}

    def setitems(self, values):
        self.set_batches.append(list(values))
        self.update(values)


def test_reads_one_shard_per_request_and_writes_in_batches(monkeypatch):
    monkeypatch.setattr(convert_module, "_WRITE_BATCH_OBJECTS", 2)
    plain: dict = {}
    _fill(plain)
    src = _RecordingStore(plain)
    dst = _RecordingStore()
    get_many = MappingStore.get_many

    def recorded(self, reads):  # the batches of values read through the store interface (not probes)
        wanted = [key for key, ranges, _ in reads if ranges is None]
        if self.mapping is src and wanted:
            src.get_batches.append(wanted)
        return get_many(self, reads)

    monkeypatch.setattr(MappingStore, "get_many", recorded)
    report = convert(src, dst, 2)
    chunk_batches = [b for b in src.get_batches if not any(k.rpartition("/")[2].startswith((".", "zarr")) for k in b)]
    # one batched read per shard, holding exactly that shard's chunks
    assert len(chunk_batches) == report.shards
    for batch in chunk_batches:
        array = batch[0].rpartition("/")[0]
        arr = ShardedStore(dst).sharded_array(array)
        assert len({arr.locate(k).shard_key for k in batch}) == 1
    assert all(len(b) <= 2 for b in dst.set_batches[:-1])  # shard batches are bounded
    shards_written = [k for b in dst.set_batches for k in b if not k.rpartition("/")[2].startswith((".", "zarr"))]
    assert len(shards_written) == len(set(shards_written)) == report.shards
    # metadata last: nothing is written after the first .zarray or zarr.json (sharded arrays have no .zarray)
    first_meta = next(i for i, b in enumerate(dst.set_batches) if any(k.endswith((".zarray", "zarr.json")) for k in b))
    assert all(
        k.rpartition("/")[2] in {".zarray", ".zattrs", ".zgroup", "zarr.json"}
        for b in dst.set_batches[first_meta:]
        for k in b
    )


def test_report_counts_objects_and_bytes():
    src: dict = {}
    _fill(src)
    dst: dict = {}
    report = convert(src, dst, 2)
    assert report.objects_before == len(src)
    assert report.bytes_before == sum(len(v) for v in src.values())
    assert report.objects_after == len(dst)
    assert report.bytes_after == sum(len(v) for v in dst.values())
    chunks = sum(1 for k in src if k.rpartition("/")[2][0].isdigit())
    assert report.chunks == chunks
    text = report.summary()
    assert f"{report.objects_before} -> {report.objects_after}" in text
    assert f"{report.bytes_before} -> {report.bytes_after}" in text
    assert json.loads(json.dumps(report.to_json()))["objects_after"] == len(dst)


def test_already_sharded_arrays_are_resharded_chunks_as_stored():
    src: dict = {}
    values = _fill(src)
    once: dict = {}
    convert(src, once, 2)
    twice: dict = {}
    report = convert(once, twice, 3)
    assert {a.chunks_per_shard for a in report.arrays} == {(3,), (3, 3), (3, 3, 3)}
    for name, want in values.items():
        before, after = ShardedStore(once), ShardedStore(twice)
        np.testing.assert_array_equal(_read(after, name), want)
        chunk_keys = sorted(k for k in before if k.startswith(f"{name}/") and k[len(name) + 1].isdigit())
        assert chunk_keys == sorted(k for k in after if k.startswith(f"{name}/") and k[len(name) + 1].isdigit())
        assert {k: bytes(after[k]) for k in chunk_keys} == {k: bytes(before[k]) for k in chunk_keys}


def test_non_empty_destination_needs_overwrite(tmp_path):
    src: dict = {}
    values = _fill(src)
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "old-file").write_bytes(b"x")
    with pytest.raises(DestinationNotEmptyError):
        convert(src, str(dst), 2)
    assert (dst / "old-file").exists()
    convert(src, str(dst), 2, overwrite=True)
    assert not (dst / "old-file").exists()
    np.testing.assert_array_equal(_read(ShardedStore(str(dst)), "a2"), values["a2"])


def test_empty_existing_destination_is_fine(tmp_path):
    src: dict = {}
    _fill(src)
    (tmp_path / "out").mkdir()
    assert convert(src, str(tmp_path / "out"), 2).sharded


@pytest.mark.parametrize("dst_name", ["in.zarr", "in.zarr/sharded"])
def test_overlapping_source_and_destination_are_refused(tmp_path, dst_name):
    _fill(zarr.DirectoryStore(str(tmp_path / "in.zarr")))
    with pytest.raises(SameLocationError):
        convert(str(tmp_path / "in.zarr"), str(tmp_path / dst_name), 2, overwrite=True)
    src: dict = {}
    _fill(src)
    with pytest.raises(SameLocationError):
        convert(src, src, 2, overwrite=True)


@pytest.mark.parametrize("src", [{}, {"data.bin": b"x"}, {"zarr.json": b"{}"}], ids=["empty", "no-zgroup", "v3"])
def test_not_a_zarr_v2_hierarchy(src):
    with pytest.raises(NotAHierarchyError):
        convert(src, {}, 2)


@pytest.mark.parametrize("value", [0, -1, True, (), (2, 0), "a", 1.5, (2, 1.5)])
def test_invalid_chunks_per_shard(value):
    with pytest.raises(ConfigurationError):
        check_chunks_per_shard(value)


def test_invalid_index_location():
    src: dict = {}
    _fill(src)
    with pytest.raises(ConfigurationError):
        convert(src, {}, 2, index_location="middle")


@pytest.mark.parametrize(
    "text, expected",
    [
        ("4", 4),
        ("2,2,1", (2, 2, 1)),
        (" 3 , 1", (3, 1)),
        ("7,", None),
        ("0", None),
        ("a,b", None),
        ("", None),
        ("-2", None),
    ],
)
def test_parse_chunks_per_shard(text, expected):
    if expected is None:
        with pytest.raises(ConfigurationError):
            parse_chunks_per_shard(text)
    else:
        assert parse_chunks_per_shard(text) == expected


def test_memory_url_and_progress_bar(capsys):
    import fsspec

    src = fsspec.get_mapper("memory://shardkv-test-convert/in.zarr")
    values = _fill(src)
    report = convert(
        "memory://shardkv-test-convert/in.zarr", "memory://shardkv-test-convert/out.zarr", 4, progress=True
    )
    assert "shardkv convert" in capsys.readouterr().err
    store = ShardedStore("memory://shardkv-test-convert/out.zarr")
    for name, data in values.items():
        np.testing.assert_array_equal(_read(store, name), data)
    assert report.objects_after == len(fsspec.get_mapper("memory://shardkv-test-convert/out.zarr"))
    fsspec.filesystem("memory").rm("/shardkv-test-convert", recursive=True)


def test_root_array():
    src: dict = {}
    z = zarr.create(shape=(10, 10), chunks=(3, 3), dtype="<u2", store=src)
    data = np.arange(100, dtype="<u2").reshape(10, 10)
    z[...] = data
    dst: dict = {}
    report = convert(src, dst, 2)
    assert [(a.path, a.sharded, a.shards) for a in report.arrays] == [("", True, 4)]
    assert "zarr.json" in dst and "0.0" in dst and "3.3" not in dst
    np.testing.assert_array_equal(zarr.open_array(ShardedStore(dst), mode="r")[...], data)
