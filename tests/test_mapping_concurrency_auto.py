"""``concurrency="auto"`` over mappings: silent only for data known to live in this process.

A ``shelve`` file or a SQLite-backed dict may be shared by other processes, so
``"auto"`` refuses them with an error that names the store and says what each
mode means; ``concurrency="process"`` opens them. A ``dict`` (and subclasses),
zarr 2's ``MemoryStore`` and ``memory://`` stay silent. zarr 2's stores are
recognised by class, not by class name.
"""

from __future__ import annotations

import shelve
import sqlite3
from collections.abc import Iterator, MutableMapping
from pathlib import Path

import numpy as np
import pytest
import zarr

from shardkv import ShardedStore
from shardkv.errors import ConfigurationError
from shardkv.storage.local import LocalStore
from shardkv.storage.mapping import MappingStore

pytestmark = pytest.mark.zarr2


class SQLiteDict(MutableMapping):
    """A user's mapping over one SQLite file (any process can open the file too)."""

    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self.db.execute("CREATE TABLE IF NOT EXISTS kv (k TEXT PRIMARY KEY, v BLOB)")

    def __getitem__(self, key: str) -> bytes:
        row = self.db.execute("SELECT v FROM kv WHERE k = ?", (key,)).fetchone()
        if row is None:
            raise KeyError(key)
        return bytes(row[0])

    def __setitem__(self, key: str, value: bytes) -> None:
        self.db.execute("REPLACE INTO kv VALUES (?, ?)", (key, bytes(value)))

    def __delitem__(self, key: str) -> None:
        if self.db.execute("DELETE FROM kv WHERE k = ?", (key,)).rowcount == 0:
            raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter([k for (k,) in self.db.execute("SELECT k FROM kv")])

    def __len__(self) -> int:
        return int(self.db.execute("SELECT COUNT(*) FROM kv").fetchone()[0])


def _shared_mapping(kind: str, tmp_path: Path) -> MutableMapping:
    if kind == "shelve":
        return shelve.open(str(tmp_path / "data.shelf"))
    return SQLiteDict(tmp_path / "data.sqlite")


@pytest.mark.parametrize("kind", ["shelve", "sqlite"])
def test_a_mapping_other_processes_may_share_needs_concurrency(kind: str, tmp_path: Path) -> None:
    mapping = _shared_mapping(kind, tmp_path)
    with pytest.raises(ConfigurationError) as caught:
        ShardedStore(mapping, chunks_per_shard=2)
    message = str(caught.value)
    assert type(mapping).__name__ in message  # the store named
    for mode, meaning in [("process", "this process"), ("none", "no locks"), ("files", "directory")]:
        assert f"'{mode}'" in message and meaning in message, (mode, message)
    with pytest.raises(ConfigurationError, match="conditional"):
        ShardedStore(mapping, concurrency="conditional")  # no conditional writes: not a silent fallback either


@pytest.mark.parametrize("kind", ["shelve", "sqlite"])
def test_a_shared_mapping_opens_with_an_explicit_mode(kind: str, tmp_path: Path) -> None:
    mapping = _shared_mapping(kind, tmp_path)
    store = ShardedStore(mapping, chunks_per_shard=2, concurrency="process")
    z = zarr.create(shape=(8,), chunks=(2,), dtype="i4", store=store, compressor=None)
    z[:] = np.arange(8, dtype="i4")
    assert store.engine.locks.mode == "process"
    np.testing.assert_array_equal(zarr.open_array(ShardedStore(mapping, concurrency="none"), mode="r")[:], np.arange(8))


class _Sub(dict):
    pass


@pytest.mark.parametrize(
    "make",
    [dict, _Sub, zarr.storage.MemoryStore, lambda: "memory://auto-silent"],
    ids=["dict", "dict-subclass", "zarr2-MemoryStore", "memory-url"],
)
def test_data_in_this_process_stays_silent(make) -> None:
    store = ShardedStore(make(), chunks_per_shard=2)
    assert store.engine.locks.mode == "conditional"
    z = zarr.create(shape=(4,), chunks=(2,), dtype="i4", store=store, compressor=None)
    z[:] = 7
    assert list(z[:]) == [7] * 4


def _impostor(name: str, **attributes: object) -> MutableMapping:
    """A user's dict-backed mapping whose class is named like a zarr 2 store, from a module named ``zarr``."""

    def init(self: object) -> None:
        self.__dict__.update(attributes, data={})

    cls = type(
        name,
        (MutableMapping,),
        {
            "__init__": init,
            "__module__": "zarr.storage",
            "__getitem__": lambda self, k: self.data[k],
            "__setitem__": lambda self, k, v: self.data.__setitem__(k, bytes(v)),
            "__delitem__": lambda self, k: self.data.__delitem__(k),
            "__iter__": lambda self: iter(list(self.data)),
            "__len__": lambda self: len(self.data),
        },
    )
    return cls()


def test_zarr2_stores_are_recognised_by_class_not_by_name(tmp_path: Path) -> None:
    memory = _impostor("MemoryStore")
    assert MappingStore(memory).kind == "persistent" and not MappingStore(memory).caps.in_process
    with pytest.raises(ConfigurationError, match="MemoryStore"):
        ShardedStore(memory)
    directory = _impostor("DirectoryStore", path=str(tmp_path))
    assert MappingStore(directory).kind == "persistent"
    assert not isinstance(ShardedStore(directory, concurrency="process").base, LocalStore)
    assert not (tmp_path / "0").exists()
    # the real classes are
    assert MappingStore(zarr.storage.MemoryStore()).kind == "memory"
    assert isinstance(ShardedStore(zarr.storage.DirectoryStore(str(tmp_path))).base, LocalStore)
    assert MappingStore(zarr.storage.NestedDirectoryStore(str(tmp_path))).kind == "directory"


@pytest.mark.parametrize("kind", ["SQLiteStore", "ZipStore", "DBMStore", "LRUStoreCache", "KVStore"])
def test_zarr2_stores_other_processes_may_share_need_concurrency(kind: str, tmp_path: Path) -> None:
    if kind == "SQLiteStore":
        base: MutableMapping = zarr.storage.SQLiteStore(str(tmp_path / "s.sqlite"))
    elif kind == "ZipStore":
        base = zarr.storage.ZipStore(str(tmp_path / "s.zip"), mode="w")
    elif kind == "DBMStore":
        import dbm.dumb

        base = zarr.storage.DBMStore(str(tmp_path / "s.dbm"), open=dbm.dumb.open)
    elif kind == "LRUStoreCache":  # a cache: another process's writes to what it caches are not seen
        base = zarr.storage.LRUStoreCache(zarr.storage.DirectoryStore(str(tmp_path / "d")), max_size=None)
    else:  # wraps a mapping shardkv cannot see
        base = zarr.storage.KVStore(_shared_mapping("shelve", tmp_path))
    with pytest.raises(ConfigurationError, match=kind):
        ShardedStore(base)
    assert ShardedStore(base, concurrency="process").engine.locks.mode == "process"
