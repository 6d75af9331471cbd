"""The store adapters: one contract for every kind of base store, plus their special rules
(ranged reads, "not found" vs other errors, atomic local writes, dispatch in ``adapt``)."""

from __future__ import annotations

import os
import uuid
from collections.abc import MutableMapping
from pathlib import Path
from typing import Iterator

import fsspec
import pytest
import zarr
from fsspec.implementations.memory import MemoryFileSystem
from range_cases import GET_RANGE_CASES, STORED

from shardkv.format.ranges import ByteRange
from shardkv.storage.adapters import TEMP_MARKER, FSMapAdapter, MappingAdapter, StoreAdapter, adapt


@pytest.fixture(params=["dict", "memory", "local", "zarr-DirectoryStore"])
def adapter(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreAdapter]:
    kind = request.param
    if kind == "dict":
        yield adapt({})
    elif kind == "memory":
        root = f"memory://shardkv-test-stores-{uuid.uuid4().hex}"
        yield adapt(root)
        fs = fsspec.filesystem("memory")
        if fs.exists(root):
            fs.rm(root, recursive=True)
    elif kind == "local":
        yield adapt(str(tmp_path / "store"))
    else:
        yield adapt(zarr.storage.DirectoryStore(str(tmp_path / "ds")))


def test_adapter_kinds(adapter: StoreAdapter) -> None:
    assert isinstance(adapter, (MappingAdapter, FSMapAdapter))
    assert adapter.supports_ranges is isinstance(adapter, FSMapAdapter)


def test_get_set_contains(adapter: StoreAdapter) -> None:
    adapter.set("a/b/0.0", b"hello")
    assert adapter.get("a/b/0.0") == b"hello"
    assert adapter.contains("a/b/0.0")
    assert not adapter.contains("a/b/0.1")
    assert not adapter.contains("a/b")  # a directory is not a key
    assert adapter.size("a/b/0.0") == 5


def test_missing_is_key_error(adapter: StoreAdapter) -> None:
    with pytest.raises(KeyError):
        adapter.get("nope")
    with pytest.raises(KeyError):
        adapter.size("nope")
    with pytest.raises(KeyError):
        adapter.delete("nope")


def test_get_many_leaves_out_missing(adapter: StoreAdapter) -> None:
    adapter.set_many({"x": b"1", "d/y": b"22"})
    assert {k: bytes(v) for k, v in adapter.get_many(["x", "missing", "d/y"]).items()} == {"x": b"1", "d/y": b"22"}
    assert adapter.get_many([]) == {}
    assert {k: bytes(v) for k, v in adapter.get_many(["x"]).items()} == {"x": b"1"}


@pytest.mark.parametrize("byte_range, expected", GET_RANGE_CASES)
def test_get_ranges(adapter: StoreAdapter, byte_range: ByteRange, expected: bytes) -> None:
    adapter.set("s/0", STORED)
    out = adapter.get_ranges([("s/0", byte_range), ("s/missing", ByteRange(0, 1))])
    assert [None if v is None else bytes(v) for v in out] == [expected, None]


def test_delete(adapter: StoreAdapter) -> None:
    adapter.set_many({"a": b"1", "b": b"2"})
    adapter.delete("a")
    adapter.delete_many(["b", "never-there"])
    assert not adapter.contains("a") and not adapter.contains("b")


def test_listing(adapter: StoreAdapter) -> None:
    adapter.set_many({"g/.zgroup": b"{}", "g/a/0.0": b"x", "g/a/0.1": b"y", "top": b"z"})
    assert sorted(adapter.iter_keys()) == ["g/.zgroup", "g/a/0.0", "g/a/0.1", "top"]
    assert sorted(adapter.iter_keys("g/a/")) == ["g/a/0.0", "g/a/0.1"]
    assert list(adapter.iter_keys("nothing/")) == []
    assert adapter.list_dir("") == ["g", "top"]
    assert adapter.list_dir("g") == [".zgroup", "a"]
    assert adapter.list_dir("missing") == []


def test_rmdir(adapter: StoreAdapter) -> None:
    adapter.set_many({"g/a/0": b"x", "g/b": b"y", "h": b"z"})
    adapter.rmdir("g")
    assert sorted(adapter.iter_keys()) == ["h"]
    adapter.rmdir("")
    assert list(adapter.iter_keys()) == []


# -- local files ---------------------------------------------------------------


def test_local_writes_leave_no_temporary_files(tmp_path: Path) -> None:
    adapter = adapt(str(tmp_path))
    adapter.set_many({"a/0": b"x" * 100, "a/1": b"y"})
    adapter.set("a/0", b"z")  # overwrite
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names == ["0", "1"]
    assert (tmp_path / "a" / "0").read_bytes() == b"z"


def test_temporary_files_are_never_listed(tmp_path: Path) -> None:
    adapter = adapt(str(tmp_path))
    adapter.set("a/0", b"x")
    (tmp_path / "a" / f"{TEMP_MARKER}dead").write_bytes(b"partial")
    assert list(adapter.iter_keys()) == ["a/0"]
    assert adapter.list_dir("a") == ["0"]


def test_local_paths_and_pathlike(tmp_path: Path) -> None:
    adapt(tmp_path).set("k", b"v")
    assert (tmp_path / "k").read_bytes() == b"v"


# -- errors other than "not found" propagate ------------------------------------------


class _DenyingFS(MemoryFileSystem):
    """A memory filesystem that refuses every read with PermissionError."""

    store: dict = {}
    pseudo_dirs = [""]

    def cat_file(self, path, start=None, end=None, **kwargs):  # type: ignore[override]
        raise PermissionError(f"access denied: {path}")


def test_fs_permission_error_is_not_key_error() -> None:
    fs = _DenyingFS(skip_instance_cache=True)
    fs.pipe("/root/k", b"v")
    adapter = FSMapAdapter(fs, "/root")
    with pytest.raises(PermissionError):
        adapter.get("k")
    with pytest.raises(PermissionError):
        adapter.get_many(["k"])
    with pytest.raises(PermissionError):
        adapter.get_ranges([("k", ByteRange(0, 1))])


class _DenyingMapping(MutableMapping):
    def __init__(self) -> None:
        self.data = {"k": b"v"}

    def __getitem__(self, key):
        raise PermissionError(f"access denied: {key}")

    def __setitem__(self, key, value):
        self.data[key] = value

    def __delitem__(self, key):
        del self.data[key]

    def __iter__(self):
        return iter(self.data)

    def __len__(self):
        return len(self.data)


def test_mapping_permission_error_is_not_key_error() -> None:
    adapter = adapt(_DenyingMapping())
    for call in (lambda: adapter.get("k"), lambda: adapter.get_many(["k"]), lambda: adapter.get_ranges([("k", ByteRange(0, 1))])):
        with pytest.raises(PermissionError):
            call()


# -- adapt ---------------------------------------------------------------------


def test_adapt_dispatch(tmp_path: Path) -> None:
    assert isinstance(adapt({}), MappingAdapter)
    assert isinstance(adapt(fsspec.get_mapper(f"memory://x-{uuid.uuid4().hex}")), FSMapAdapter)
    assert isinstance(adapt(str(tmp_path)), FSMapAdapter)
    assert isinstance(adapt(zarr.storage.DirectoryStore(str(tmp_path / "d"))), FSMapAdapter)
    assert isinstance(adapt(zarr.storage.MemoryStore()), MappingAdapter)
    a = adapt({})
    assert adapt(a) is a


def test_directory_store_files_are_shared(tmp_path: Path) -> None:
    ds = zarr.storage.DirectoryStore(str(tmp_path / "d"))
    adapt(ds).set("a/0.0", b"bytes")
    assert ds["a/0.0"] == b"bytes"
    assert os.path.isfile(tmp_path / "d" / "a" / "0.0")


@pytest.mark.parametrize("store", [pytest.param(42, id="int"), pytest.param(object(), id="object"), pytest.param([1], id="list")])
def test_adapt_rejects(store: object) -> None:
    with pytest.raises(TypeError, match="cannot use"):
        adapt(store)


def test_size_if_free(adapter: StoreAdapter) -> None:
    """Sizes that cost no request (local files, in-memory filesystems) are given; others are None."""
    adapter.set("s/0", b"0123456789")
    size = adapter.size_if_free("s/0")
    if isinstance(adapter, FSMapAdapter):
        assert size == 10
        assert adapter.size_if_free("s/missing") is None
    else:
        assert size is None
