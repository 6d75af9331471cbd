"""The store contract on mappings (:class:`MappingStore`) and the process stamps that give them generations."""

from __future__ import annotations

import pickle
import threading
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import pytest
import zarr
from kv_contract import KVContract, put_ok

from shardkv.format.ranges import ByteRange
from shardkv.storage.kv import STAMPS, KVStore, ProcessStamps, StoreLocation
from shardkv.storage.mapping import MappingStore

pytestmark = pytest.mark.zarr2


class UserMapping(MutableMapping):
    """A mapping that is no dict and no zarr store (no getitems, no setitems)."""

    def __init__(self) -> None:
        self._d: dict[str, bytes] = {}

    def __getitem__(self, key: str) -> bytes:
        return self._d[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self._d[key] = bytes(value)

    def __delitem__(self, key: str) -> None:
        del self._d[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)


def _base(kind: str, tmp_path: Path) -> MutableMapping:
    if kind == "dict":
        return {}
    if kind == "user":
        return UserMapping()
    if kind == "MemoryStore":
        return zarr.storage.MemoryStore()
    if kind == "KVStore":
        return zarr.storage.KVStore({})
    if kind == "SQLiteStore":
        return zarr.storage.SQLiteStore(str(tmp_path / "s.sqlite"))
    if kind == "DBMStore":
        import dbm.dumb

        return zarr.storage.DBMStore(str(tmp_path / "s.dbm"), open=dbm.dumb.open)
    if kind == "ZipStore":  # appends only: no deletes, no overwrites, so not under the contract
        return zarr.storage.ZipStore(str(tmp_path / "s.zip"), mode="w")
    raise AssertionError(kind)


class TestMappingContract(KVContract):
    @pytest.fixture(params=["dict", "user", "MemoryStore", "KVStore"])
    def kv(self, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[KVStore]:
        store = MappingStore(_base(request.param, tmp_path))
        yield store
        store.close()


class TestPersistentContract(KVContract):
    thread_safe = False  # zarr 2's SQLiteStore shares one sqlite3 connection between threads (it crashes)

    @pytest.fixture(params=["SQLiteStore", "DBMStore"])
    def kv(self, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[KVStore]:
        store = MappingStore(_base(request.param, tmp_path))
        yield store
        store.close()


@pytest.mark.parametrize(
    ("kind", "in_process", "lock_dir"),
    [
        ("dict", True, False),
        ("user", False, False),  # other processes may share what a mapping of one's own keeps
        ("MemoryStore", True, False),
        ("KVStore", False, False),  # wraps a mapping shardkv does not look into
        ("SQLiteStore", False, False),
        ("DBMStore", False, False),
        ("ZipStore", False, False),
    ],
)
def test_caps_per_kind(kind: str, in_process: bool, lock_dir: bool, tmp_path: Path) -> None:
    store = MappingStore(_base(kind, tmp_path))
    caps = store.caps
    assert (caps.in_process, caps.lock_dir) == (in_process, lock_dir)
    assert not caps.ranged and caps.stamps == "process" and not caps.conditional_put and not caps.round_trips
    assert store.location.namespace == ("mapping", id(store.mapping))
    store.close()


def test_nested_directory_store_is_a_directory(tmp_path: Path) -> None:
    store = MappingStore(zarr.storage.NestedDirectoryStore(str(tmp_path)))
    assert store.kind == "directory"
    assert store.caps.lock_dir and not store.caps.in_process
    assert store.location == StoreLocation(("file",), str(tmp_path.resolve()), str(tmp_path.resolve()))


def test_zip_store_writes_and_reads(tmp_path: Path) -> None:
    store = MappingStore(_base("ZipStore", tmp_path))
    g = put_ok(store, "a/0", [b"ab", b"cd"])
    r = store.get("a/0", [ByteRange(1, 3)])
    assert r.generation == g and [bytes(b) for b in r.values or []] == [b"bc"]
    store.close()


def test_two_stores_over_one_dict_share_stamps() -> None:
    data: dict[str, bytes] = {}
    one, two = MappingStore(data), MappingStore(data)
    g = put_ok(one, "k", b"v1")
    assert two.get("k").generation == g
    assert two.put("k", b"v2", if_generation=g) is not None
    assert one.get("k", if_generation=g).state == "stale"  # the other object's write is seen
    assert one.put("k", b"v3", if_generation=g) is None


def test_a_read_overlapping_a_write_in_flight_is_stale() -> None:
    store = MappingStore({})
    g = put_ok(store, "k", b"v1")
    with STAMPS.writing(store.location, ["k"]) as write:
        assert store.get("k", if_generation=g).found  # the writer only holds the lock so far
        write.begin(["k"])  # a write of k has begun and not ended
        assert store.get("k", if_generation=g).state == "stale"
        during = store.get("k")
        assert during.found and during.generation != g
        assert store.get("k", if_generation=during.generation).state == "stale"  # equals no generation
    after = store.get("k")
    assert after.generation != g and store.get("k", if_generation=after.generation).found


def test_conditional_puts_from_threads_serialise() -> None:
    store = MappingStore({})
    store.put("n", b"0")
    wins: list[int] = []

    def bump(n_rounds: int) -> None:
        done = 0
        for _ in range(2000):  # bounded: each round retries until it wins
            if done == n_rounds:
                return
            r = store.get("n")
            value = int(bytes(r.whole())) + 1
            if store.put("n", str(value).encode(), if_generation=r.generation) is not None:
                wins.append(value)
                done += 1

    threads = [threading.Thread(target=bump, args=(50,)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert bytes(store.get("n").whole()) == b"200"
    assert sorted(wins) == list(range(1, 201))  # no lost update: every increment won exactly once


def test_stamps_of_other_stores_are_apart() -> None:
    a, b = MappingStore({}), MappingStore({})
    ga = put_ok(a, "k", b"v")
    b.put("other", b"v")
    assert a.get("k", if_generation=ga).found


def test_stamps_bounded_and_striped() -> None:
    stamps = ProcessStamps(n_stripes=2)
    loc = StoreLocation(("mapping", 1), "")
    keys = [f"k{i}" for i in range(20)]
    assert {stamps.stripe(loc, k) for k in keys} <= {0, 1}
    ticket = stamps.begin_read(loc, "k0")
    g = stamps.current(ticket)
    with stamps.writing(loc, keys) as w:  # every stripe, in one order: no deadlock
        assert w.before["k0"] == g
        w.begin(keys)
    assert stamps.current(stamps.begin_read(loc, "k0")) not in (None, g)
    assert stamps.current(stamps.begin_read(loc, "k0")) == w.after["k0"]
    with pytest.raises(ValueError, match="n_stripes"):
        ProcessStamps(0)


def test_pickle_keeps_the_mapping() -> None:
    store = MappingStore({"k": b"v"})
    copy = pickle.loads(pickle.dumps(store))
    assert isinstance(copy, MappingStore) and bytes(copy.get("k").whole()) == b"v"
    assert copy.location != store.location  # a copied dict is other data


def test_nested_writes_on_one_stripe_do_not_deadlock() -> None:
    stamps = ProcessStamps(n_stripes=1)  # every key of every store in one stripe
    outer, inner = StoreLocation(("mapping", 1), ""), StoreLocation(("mapping", 2), "")
    with stamps.writing(outer, ["a"]) as w1:
        w1.begin(["a"])
        with stamps.writing(inner, ["b"]) as w2:  # the same thread, the same stripe
            w2.begin(["b"])
    assert w2.after["b"] != w2.before["b"] and w1.after["a"] != w1.before["a"]
