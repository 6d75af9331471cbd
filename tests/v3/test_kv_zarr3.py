"""The store contract on :class:`~shardkv.zarr3.bases.Zarr3KV`, and the base :func:`engine_base` picks per store.

``Zarr3KV`` reaches a zarr-python 3 store through its public async API only:
a ``MemoryStore`` (data in this process), and any store shardkv has no adapter
of its own for (here a ``LoggingStore`` and a ``LocalStore`` taken as such).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("zarr.abc.store")

import zarr  # noqa: E402
from fsspec.mapping import FSMap  # noqa: E402
from kv_contract import KVContract, put_ok  # noqa: E402
from zarr.storage import FsspecStore, LocalStore, LoggingStore, ManagedMemoryStore, MemoryStore  # noqa: E402

from shardkv.storage.kv import KVStore  # noqa: E402
from shardkv.zarr3 import ShardedStore  # noqa: E402
from shardkv.zarr3.bases import Zarr3KV, engine_base  # noqa: E402

pytestmark = pytest.mark.zarr3


def _zarr3_store(kind: str, tmp_path: Path) -> Any:
    if kind == "MemoryStore":
        return MemoryStore()
    if kind == "ManagedMemoryStore":
        return ManagedMemoryStore(path="sub")
    if kind == "LoggingStore":
        return LoggingStore(MemoryStore())
    if kind == "LocalStore":
        return LocalStore(str(tmp_path / "data"))
    raise AssertionError(kind)


class TestZarr3KVContract(KVContract):
    @pytest.fixture(params=["MemoryStore", "ManagedMemoryStore", "LoggingStore", "LocalStore"])
    def kv(self, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[KVStore]:
        store = _zarr3_store(request.param, tmp_path)
        kv = Zarr3KV(store)
        yield kv
        kv.close()


@pytest.mark.parametrize(
    ("kind", "base"),
    [
        ("MemoryStore", Zarr3KV),
        ("ManagedMemoryStore", Zarr3KV),
        ("LoggingStore", Zarr3KV),
        ("LocalStore", str),
    ],
)
def test_engine_base_by_store_class(kind: str, base: type, tmp_path: Path) -> None:
    store = _zarr3_store(kind, tmp_path)
    opened = engine_base(store)
    assert isinstance(opened, base)
    if isinstance(opened, Zarr3KV):
        in_process = kind.endswith("MemoryStore")
        assert (opened.caps.in_process, opened.kind) == (in_process, "memory" if in_process else "persistent")
    else:
        assert opened == str(tmp_path / "data")


def test_engine_base_of_an_fsspec_store(tmp_path: Path) -> None:
    assert engine_base(FsspecStore.from_url(f"file://{tmp_path}")) == str(tmp_path)
    assert isinstance(engine_base(FsspecStore.from_url("memory://bases")), FSMap)


def test_engine_base_of_an_object_store() -> None:
    obstore = pytest.importorskip("obstore")
    from zarr.storage import ObjectStore

    inner = obstore.store.MemoryStore()
    assert engine_base(ObjectStore(inner)) is inner


def test_a_memory_store_is_reached_through_its_public_api() -> None:
    data: dict[str, Any] = {}
    kv = engine_base(MemoryStore(data))
    put_ok(kv, "a/k", b"value")
    assert list(data) == ["a/k"] and data["a/k"].to_bytes() == b"value"  # the store's own Buffer
    assert bytes(kv.get("a/k").whole()) == b"value" and list(kv.list_prefix("")) == ["a/k"]


def test_a_managed_memory_store_keeps_its_path() -> None:
    store = ManagedMemoryStore(path="group")
    kv = engine_base(store)
    put_ok(kv, "k", b"v")
    assert [k for k in ManagedMemoryStore.from_url(f"memory://{store.name}")._store_dict] == ["group/k"]


@pytest.mark.parametrize("kind", ["MemoryStore", "LoggingStore"])
def test_two_kvs_over_one_zarr3_store_share_stamps(kind: str, tmp_path: Path) -> None:
    base = _zarr3_store(kind, tmp_path)
    one, two = engine_base(base), engine_base(base)
    assert one.location == two.location
    g = put_ok(one, "k", b"v1")
    assert two.put("k", b"v2", if_generation=g) is not None
    assert one.get("k", if_generation=g).state == "stale"  # the other object's write is seen


def test_a_sharded_store_sees_another_sharded_stores_writes_over_one_memory_store() -> None:
    base = MemoryStore()
    first = ShardedStore(base, chunks_per_shard=2)
    z = zarr.create_array(first, name="a", shape=(8, 8), chunks=(2, 2), dtype="i4", fill_value=0)
    z[:] = 1
    np.testing.assert_array_equal(zarr.open_array(first, path="a")[:], 1)  # first caches the indexes
    second = ShardedStore(base, chunks_per_shard=2)
    zarr.open_array(second, path="a", mode="r+")[0:2, 0:2] = 7  # rewrites shard c/0/0 (chunks of other sizes)
    second.flush()
    expected = np.ones((8, 8), dtype="i4")
    expected[0:2, 0:2] = 7
    np.testing.assert_array_equal(zarr.open_array(first, path="a")[:], expected)
