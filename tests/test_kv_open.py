"""``open_kv``: which store each kind of user store becomes, the refusals, and the contract through it."""

from __future__ import annotations

import uuid
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import fsspec
import pytest
import zarr
from fsspec.implementations.dirfs import DirFileSystem
from fsspec.implementations.memory import MemoryFileSystem
from kv_contract import KVContract

from shardkv.errors import ConfigurationError
from shardkv.format.ranges import ByteRange
from shardkv.storage.fsspec import FsspecStore
from shardkv.storage.kv import ANY, KVStore
from shardkv.storage.local import LocalStore
from shardkv.storage.mapping import MappingStore
from shardkv.storage.obstore import ObstoreStore
from shardkv.storage.open import open_kv

pytestmark = pytest.mark.zarr2


def _local_kinds(tmp_path: Path) -> dict[str, Any]:
    d = tmp_path / "store"
    d.mkdir(exist_ok=True)
    return {
        "path": str(d),
        "pathlike": d,
        "file-url": f"file://{d}",
        "DirectoryStore": zarr.storage.DirectoryStore(str(d)),
        "FSMap": fsspec.get_mapper(str(d)),
        "FSStore": zarr.storage.FSStore(str(d)),
        "DirFileSystem": fsspec.FSMap("", DirFileSystem(str(d), fsspec.filesystem("file"))),
    }


@pytest.mark.parametrize(
    "kind", ["path", "pathlike", "file-url", "DirectoryStore", "FSMap", "FSStore", "DirFileSystem"]
)
def test_local_kinds_become_local_stores(tmp_path: Path, kind: str) -> None:
    kv = open_kv(_local_kinds(tmp_path)[kind])
    assert type(kv) is LocalStore
    assert kv.location.local_dir == str((tmp_path / "store").resolve())
    assert kv.caps.stamps == "native" and kv.caps.lock_dir and kv.caps.ranged


class TestContractThroughOpenKV(KVContract):
    @pytest.fixture(params=["path", "DirectoryStore", "DirFileSystem", "memory"])
    def kv(self, request: pytest.FixtureRequest, tmp_path: Path) -> KVStore:
        if request.param == "memory":
            return open_kv(f"memory://kv-open-{uuid.uuid4().hex[:12]}")
        return open_kv(_local_kinds(tmp_path)[request.param])


def test_mappings_and_memory(tmp_path: Path) -> None:
    mappings: list[Any] = [{}, zarr.storage.MemoryStore(), zarr.storage.KVStore({})]
    for mapping in mappings:
        kv = open_kv(mapping)
        assert type(kv) is MappingStore and not kv.caps.ranged
        # a KVStore keeps its mapping private: not known to be in this process
        assert kv.caps.in_process == (not isinstance(mapping, zarr.storage.KVStore))
    nested = open_kv(zarr.storage.NestedDirectoryStore(str(tmp_path)))  # rewrites keys: through its own methods
    assert type(nested) is MappingStore and nested.caps.lock_dir
    memory = open_kv("memory://open-kv-test")
    assert type(memory) is FsspecStore and memory.caps.in_process and memory.location.namespace == ("memory",)
    kv = LocalStore(tmp_path)
    assert open_kv(kv) is kv


def test_obstore_kinds(tmp_path: Path) -> None:
    obstore = pytest.importorskip("obstore.store")
    assert type(open_kv(obstore.MemoryStore())) is ObstoreStore
    local = open_kv(obstore.LocalStore(str(tmp_path)))
    assert type(local) is LocalStore and local.location.local_dir == str(tmp_path.resolve())
    by_url = open_kv(f"file://{tmp_path}", {"client": "obstore"})
    assert type(by_url) is LocalStore


def test_refusals_keep_their_messages(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="normalize_keys=True lowercases"):
        open_kv(zarr.storage.DirectoryStore(str(tmp_path), normalize_keys=True))
    with pytest.raises(ConfigurationError, match="key_separator='/' rewrites"):
        open_kv(zarr.storage.FSStore(str(tmp_path), key_separator="/"))
    with pytest.raises(TypeError, match="cannot use int as a store"):
        open_kv(3)


# -- errors other than "not found" propagate (never a KeyError, never "missing") -------------------


class _DenyingFS(MemoryFileSystem):
    """A memory filesystem that refuses every read with PermissionError."""

    store: dict = {}
    pseudo_dirs = [""]

    def cat_file(self, path: str, start: Any = None, end: Any = None, **kwargs: Any) -> bytes:  # type: ignore[override]
        raise PermissionError(f"access denied: {path}")

    def cat_ranges(self, paths: Any, starts: Any, ends: Any, *args: Any, **kwargs: Any) -> list[bytes]:  # type: ignore[override]
        raise PermissionError(f"access denied: {paths}")

    def cat(self, path: Any, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        raise PermissionError(f"access denied: {path}")


class _DenyingMapping(MutableMapping):
    def __init__(self) -> None:
        self.data = {"k": b"v"}

    def __getitem__(self, key: str) -> bytes:
        raise PermissionError(f"access denied: {key}")

    def __setitem__(self, key: str, value: bytes) -> None:
        self.data[key] = value

    def __delitem__(self, key: str) -> None:
        del self.data[key]

    def __iter__(self) -> Any:
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)


@pytest.mark.parametrize("kind", ["fsspec", "mapping"])
def test_permission_errors_propagate(kind: str) -> None:
    if kind == "fsspec":
        fs = _DenyingFS(skip_instance_cache=True)
        fs.pipe(f"/deny-{uuid.uuid4().hex}/k", b"v")
        root = [p for p in fs.store if p.endswith("/k")][-1].rsplit("/", 1)[0]
        kv = FsspecStore(fs, root)
    else:
        kv = open_kv(_DenyingMapping())
    calls = [
        lambda: kv.get("k"),
        lambda: kv.get("k", [ByteRange(0, 1)]),
        lambda: kv.values(["k"]),
        lambda: kv.get_many([("k", None, ANY)]),
    ]
    for call in calls:
        with pytest.raises(PermissionError, match="access denied"):
            call()
