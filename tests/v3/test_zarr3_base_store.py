"""shardkv.zarr3.ShardedStore is the store it wraps where zarr asks what a store is.

* Capabilities: every ``supports_*`` flag of zarr 3's ``Store`` is the base store's
  (zarr decides from them what it may do: ``ZipStore`` cannot delete, a store may
  keep its own consolidated metadata), so zarr's public API gives through shardkv
  what it gives on the base store alone.
* Identity: two stores are equal when their base stores are the same store and
  their options are the same; equal stores hash alike.
* Stores that cannot overwrite (``supports_deletes`` false: zarr's ``ZipStore``):
  each shard is written once, on ``close()``, and zarr 3 alone reads the archive.
"""

from __future__ import annotations

import pickle
import warnings
import zipfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

pytest.importorskip("zarr.abc.store")

import zarr  # noqa: E402
from zarr.abc.store import Store  # noqa: E402
from zarr.errors import ContainsArrayError  # noqa: E402
from zarr.storage import LocalStore, MemoryStore, ZipStore  # noqa: E402

from shardkv.errors import ConfigurationError  # noqa: E402
from shardkv.zarr3 import ShardedStore  # noqa: E402

pytestmark = pytest.mark.zarr3

FLAGS = sorted(name for name in dir(Store) if name.startswith("supports_"))


class _KeepsOwnConsolidation(MemoryStore):
    """A store that consolidates metadata its own way (zarr's documented reason for the flag)."""

    supports_consolidated_metadata = False  # type: ignore[assignment]


class _CannotList(MemoryStore):
    supports_listing = False  # type: ignore[assignment]


class _CannotWrite(MemoryStore):
    supports_writes = False  # type: ignore[assignment]


def _zip(tmp_path: Path, name: str = "data.zip") -> ZipStore:
    return ZipStore(tmp_path / name, mode="w")


BASES: dict[str, Callable[[Path], Store]] = {
    "memory": lambda tmp: MemoryStore(),
    "local": lambda tmp: LocalStore(str(tmp / "data.zarr")),
    "zip": _zip,
    "own-consolidation": lambda tmp: _KeepsOwnConsolidation(),
    "cannot-list": lambda tmp: _CannotList(),
    "cannot-write": lambda tmp: _CannotWrite(),
}


def test_the_flags_checked_are_all_of_zarrs_store() -> None:
    # a flag added to zarr's Store ABC is checked below without editing this file
    assert {"supports_writes", "supports_deletes", "supports_partial_writes", "supports_listing",
            "supports_consolidated_metadata"} <= set(FLAGS)


@pytest.mark.parametrize("kind", sorted(BASES))
@pytest.mark.parametrize("flag", FLAGS)
def test_every_capability_flag_is_the_base_stores(kind: str, flag: str, tmp_path: Path) -> None:
    base = BASES[kind](tmp_path)
    store = ShardedStore(base, chunks_per_shard=2, concurrency="process")
    assert getattr(store, flag) == getattr(base, flag)
    if kind != "zip":  # (ZipStore has no with_read_only)
        assert getattr(store.with_read_only(True), flag) == getattr(base, flag)
    if kind != "zip":  # (an unpickled ZipStore would reopen the archive being written)
        assert getattr(pickle.loads(pickle.dumps(store)), flag) == getattr(base, flag)


def _error_of(call: Callable[[], object]) -> type[BaseException] | None:
    try:
        call()
    except Exception as exc:  # the error itself is what is compared
        return type(exc)
    return None


def test_zip_overwriting_an_array_fails_as_on_the_zip_store_alone(tmp_path: Path) -> None:
    alone = _zip(tmp_path, "alone.zip")
    store = ShardedStore(_zip(tmp_path, "sharded.zip"), chunks_per_shard=2, concurrency="process")
    for target in (alone, store):
        zarr.create_array(target, name="a", shape=(8,), chunks=(2,), dtype="i4")
    # zarr asks the store whether it can delete before it replaces an array
    with pytest.raises(ContainsArrayError):
        zarr.create_array(alone, name="a", shape=(8,), chunks=(2,), dtype="i4", overwrite=True)
    with pytest.raises(ContainsArrayError):
        zarr.create_array(store, name="a", shape=(8,), chunks=(2,), dtype="i4", overwrite=True)


def test_consolidation_refused_where_the_base_store_refuses_it() -> None:
    alone = _KeepsOwnConsolidation()
    store = ShardedStore(_KeepsOwnConsolidation(), chunks_per_shard=2)
    for target in (alone, store):
        zarr.create_array(target, name="a", shape=(8,), chunks=(2,), dtype="i4")
    expected = _error_of(lambda: zarr.consolidate_metadata(alone))
    assert expected is TypeError
    assert _error_of(lambda: zarr.consolidate_metadata(store)) is expected


def test_listing_refused_where_the_base_store_cannot_list() -> None:
    alone = _CannotList()
    store = ShardedStore(_CannotList(), chunks_per_shard=2)
    for target in (alone, store):
        zarr.create_group(target).create_array("a", shape=(8,), chunks=(2,), dtype="i4")[:] = np.arange(8)
    np.testing.assert_array_equal(zarr.open_array(store, path="a", mode="r")[:], np.arange(8))
    expected = _error_of(lambda: list(zarr.open_group(alone, mode="r", use_consolidated=False).members()))
    assert expected is ValueError
    assert _error_of(lambda: list(zarr.open_group(store, mode="r", use_consolidated=False).members())) is expected


# -- equality --------------------------------------------------------------------------


def test_stores_over_two_memory_stores_are_not_equal() -> None:
    assert ShardedStore(MemoryStore(), 2) != ShardedStore(MemoryStore(), 2)
    base = MemoryStore()
    assert ShardedStore(base, 2) == ShardedStore(base, 2)
    assert hash(ShardedStore(base, 2)) == hash(ShardedStore(base, 2))
    # zarr's read-only view of the same dict is the same data
    assert ShardedStore(base, 2, read_only=True) == ShardedStore(base, 2).with_read_only(True)


def test_equality_needs_the_same_options(tmp_path: Path) -> None:
    base = LocalStore(str(tmp_path))
    store = ShardedStore(base, 2)
    assert store == ShardedStore(LocalStore(str(tmp_path)), 2)
    assert hash(store) == hash(ShardedStore(LocalStore(str(tmp_path)), 2))
    assert store == pickle.loads(pickle.dumps(store))
    assert hash(store) == hash(pickle.loads(pickle.dumps(store)))
    assert store != ShardedStore(base, 4)
    assert store != ShardedStore(base, 2, index_location="start")
    assert store != ShardedStore(LocalStore(str(tmp_path / "other")), 2)
    assert store != ShardedStore(base, {"a": 2})
    hash(ShardedStore(base, {"a": 2}))  # an option that is a mapping still hashes


def test_from_array_between_two_memory_stores_with_equal_contents() -> None:
    source, target = ShardedStore(MemoryStore(), 2), ShardedStore(MemoryStore(), 2)
    data = np.arange(16, dtype="i4")
    for store in (source, target):  # equal contents: MemoryStore's own == says equal
        zarr.create_array(store, name="a", shape=(16,), chunks=(2,), dtype="i4")[:] = data
    a = zarr.open_array(source, path="a")
    copied = zarr.from_array(target, name="a", data=a, overwrite=True)
    np.testing.assert_array_equal(copied[:], data)
    # within one store the paths do overlap, as zarr says on its own stores
    with pytest.raises(ValueError, match="overlap"):
        zarr.from_array(source, name="a", data=a, overwrite=True)
