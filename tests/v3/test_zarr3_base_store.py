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
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("zarr.abc.store")

import zarr  # noqa: E402
from zarr.abc.store import Store  # noqa: E402
from zarr.core.sync import sync  # noqa: E402
from zarr.errors import ContainsArrayError  # noqa: E402
from zarr.storage import LocalStore, MemoryStore, ZipStore  # noqa: E402

from shardkv.errors import UnsupportedError  # noqa: E402
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
    assert {
        "supports_writes",
        "supports_deletes",
        "supports_partial_writes",
        "supports_listing",
        "supports_consolidated_metadata",
    } <= set(FLAGS)


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


# -- a store that cannot replace a value: each shard written once -----------------------


def _zip_names(path: Path) -> list[str]:
    with zipfile.ZipFile(path) as archive:
        return archive.namelist()


def _no_duplicate_warnings(caught: list[warnings.WarningMessage]) -> None:
    assert not [w for w in caught if "Duplicate name" in str(w.message)]


@pytest.mark.parametrize("concurrency", ["process", "none"])
def test_zip_store_written_chunk_by_chunk_holds_each_shard_once(tmp_path: Path, concurrency: str) -> None:
    data = np.arange(8 * 6, dtype="i4").reshape(8, 6)
    store = ShardedStore(_zip(tmp_path), chunks_per_shard=2, concurrency=concurrency)  # type: ignore[arg-type]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        z = zarr.create_array(store, name="g/a", shape=(8, 6), chunks=(2, 2), dtype="i4", attributes={"u": "K"})
        z[0:2, 4:] = -1  # written again below while its shard is incomplete (zarr alone stores it twice)
        for i in range(4):  # two chunks at a time, then each chunk of the last shard column alone
            z[2 * i : 2 * i + 2, :4] = data[2 * i : 2 * i + 2, :4]
        for i in range(4):
            z[2 * i : 2 * i + 2, 4:] = data[2 * i : 2 * i + 2, 4:]
        np.testing.assert_array_equal(z[:], data)  # buffered writes are read back before close
        store.close()
    _no_duplicate_warnings(caught)
    names = _zip_names(tmp_path / "data.zip")
    assert len(names) == len(set(names))
    # 4 x 3 chunks of 2 x 2 -> 2 x 2 shards, written once each
    assert sorted(n for n in names if "/c/" in n) == ["g/a/c/0/0", "g/a/c/0/1", "g/a/c/1/0", "g/a/c/1/1"]

    # zarr 3 alone (no shardkv) reads the archive
    alone = ZipStore(tmp_path / "data.zip", mode="r")
    raw = zarr.open_array(alone, path="g/a", mode="r")
    assert raw.shards == (4, 4) and raw.chunks == (2, 2) and raw.attrs["u"] == "K"
    np.testing.assert_array_equal(raw[:], data)
    # and through shardkv, as written
    again = ShardedStore(ZipStore(tmp_path / "data.zip", mode="r"), chunks_per_shard=2, concurrency="none")
    np.testing.assert_array_equal(zarr.open_array(again, path="g/a", mode="r")[:], data)
    # a read-only store writes nothing: its default concurrency needs no locks the zip store cannot give
    default = ShardedStore(ZipStore(tmp_path / "data.zip", mode="r"), chunks_per_shard=2)
    assert default.concurrency_mode == "none"
    np.testing.assert_array_equal(zarr.open_array(default, path="g/a", mode="r")[:], data)
    assert default._options.concurrency == "auto"  # kept as given: a writable copy resolves "auto" again


def test_zip_store_same_entries_as_zarr_alone_writes_once_per_chunk(tmp_path: Path) -> None:
    """The snippet of the issue: 8 chunk writes of 4 shards used to leave 8 shard entries."""
    store = ShardedStore(_zip(tmp_path), chunks_per_shard=2, concurrency="process")
    z = zarr.create_array(store, name="a", shape=(8,), chunks=(1,), dtype="i4")
    for i in range(8):
        z[i] = i
    store.close()
    names = _zip_names(tmp_path / "data.zip")
    assert sorted(names) == ["a/c/0", "a/c/1", "a/c/2", "a/c/3", "a/zarr.json", "zarr.json"]
    np.testing.assert_array_equal(zarr.open_array(ZipStore(tmp_path / "data.zip"), path="a")[:], np.arange(8))


def test_zip_store_refuses_to_write_a_stored_shard_again(tmp_path: Path) -> None:
    store = ShardedStore(_zip(tmp_path), chunks_per_shard=2, concurrency="process")
    z = zarr.create_array(store, name="a", shape=(8,), chunks=(2,), dtype="i4")
    z[:4] = [1, 2, 3, 4]  # shard a/c/0 complete: written now
    with pytest.raises(UnsupportedError, match="'a/c/0'") as info:
        z[0] = 9
    assert isinstance(info.value, NotImplementedError)  # what the zip store raises for a delete
    assert "ZipStore('zip://" in str(info.value) and "close()" in str(info.value)
    np.testing.assert_array_equal(z[:4], [1, 2, 3, 4])  # the refused write is not applied
    z[4:] = [5, 6, 7, 8]
    store.close()
    names = _zip_names(tmp_path / "data.zip")
    assert len(names) == len(set(names))
    np.testing.assert_array_equal(zarr.open_array(ZipStore(tmp_path / "data.zip"), path="a")[:], np.arange(1, 9))


def test_zip_store_opened_to_append_refuses_a_stored_shard_and_writes_a_new_one(tmp_path: Path) -> None:
    store = ShardedStore(_zip(tmp_path), chunks_per_shard=2, concurrency="process")
    zarr.create_array(store, name="a", shape=(8,), chunks=(2,), dtype="i4")[:4] = [1, 2, 3, 4]
    store.close()
    store = ShardedStore(ZipStore(tmp_path / "data.zip", mode="a"), chunks_per_shard=2, concurrency="process")
    z = zarr.open_array(store, path="a")
    with pytest.raises(UnsupportedError, match="'a/c/0'"):
        z[1] = 0
    z[6] = 7  # a shard not stored yet: held until close
    store.close()
    names = _zip_names(tmp_path / "data.zip")
    assert len(names) == len(set(names))
    np.testing.assert_array_equal(
        zarr.open_array(ZipStore(tmp_path / "data.zip"), path="a")[:], [1, 2, 3, 4, 0, 0, 7, 0]
    )


def test_zip_store_delete_dir_refused_keeps_the_chunks_held(tmp_path: Path) -> None:
    store = ShardedStore(_zip(tmp_path), chunks_per_shard=2, concurrency="process")
    z = zarr.create_array(store, name="a", shape=(8,), chunks=(2,), dtype="i4")
    z[:4] = [1, 2, 3, 4]  # shard a/c/0: complete, stored
    z[4:6] = [5, 6]  # shard a/c/1: held until close
    with pytest.raises(NotImplementedError):  # the zip store cannot delete what it holds
        sync(store.delete_dir("a"))
    np.testing.assert_array_equal(z[:], [1, 2, 3, 4, 5, 6, 0, 0])
    store.close()
    np.testing.assert_array_equal(
        zarr.open_array(ZipStore(tmp_path / "data.zip"), path="a")[:], [1, 2, 3, 4, 5, 6, 0, 0]
    )


def test_a_zip_store_without_a_concurrency_mode_is_refused_naming_it_and_what_to_do(tmp_path: Path) -> None:
    """A store with neither lock files nor conditional writes: the error names the user's store, not an adapter."""
    from shardkv.errors import ConfigurationError

    with pytest.raises(ConfigurationError) as refused:
        ShardedStore(_zip(tmp_path), chunks_per_shard=2)
    message = str(refused.value)
    assert f"ZipStore at 'zip://{tmp_path / 'data.zip'}'" in message
    assert "concurrency='process'" in message and "concurrency='none'" in message
    assert "StoreMapping" not in message and "StoreLocation" not in message
