"""``open_kv``: which store each kind of user store becomes, the refusals, and the contract through it."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import fsspec
import pytest
import zarr
from fsspec.implementations.dirfs import DirFileSystem
from kv_contract import KVContract

from shardkv.errors import ConfigurationError
from shardkv.storage.fsspec import FsspecStore
from shardkv.storage.kv import KVStore
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


@pytest.mark.parametrize("kind", ["path", "pathlike", "file-url", "DirectoryStore", "FSMap", "FSStore", "DirFileSystem"])
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
        assert type(kv) is MappingStore and kv.caps.in_process and not kv.caps.ranged
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


def test_old_adapters_are_unwrapped(tmp_path: Path) -> None:
    from shardkv.storage.adapters import adapt

    assert type(open_kv(adapt(str(tmp_path)))) is LocalStore
    d: dict[str, bytes] = {}
    kv = open_kv(adapt(d))
    assert type(kv) is MappingStore and kv.mapping is d  # type: ignore[attr-defined]
    from shardkv.proxy.presenting import PresentingAdapter  # the command line's read view

    presented = open_kv(PresentingAdapter(adapt(str(tmp_path))))
    assert type(presented) is LocalStore and presented.location == open_kv(str(tmp_path)).location


def test_refusals_keep_their_messages(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="normalize_keys=True lowercases"):
        open_kv(zarr.storage.DirectoryStore(str(tmp_path), normalize_keys=True))
    with pytest.raises(ConfigurationError, match="key_separator='/' rewrites"):
        open_kv(zarr.storage.FSStore(str(tmp_path), key_separator="/"))
    with pytest.raises(TypeError, match="cannot use int as a store"):
        open_kv(3)
