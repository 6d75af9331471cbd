"""The contract every :class:`~shardkv.storage.kv.KVStore` keeps (in the style of zarr-python's ``StoreTests``).

Subclass :class:`KVContract` in a ``tests/test_kv_*.py`` module and give it a
``kv`` fixture that yields an empty store; every test here then runs against
it. The contract is the one of ``shardkv/storage/kv.py``: "missing" is a state,
never an exception; ranged reads (prefix, middle, suffix, open-ended, past the
end, empty) answer alike on every store; a multi-range read comes from one
stored value; a read conditioned on a generation that no longer holds reads
nothing ("stale"); conditional puts and deletes create, update, or lose a race
by returning ``None``/``False``; listings never show shardkv's own hidden files.
"""

from __future__ import annotations

import pickle
import threading
from typing import Any

import pytest
from range_cases import GET_RANGE_CASES, STORED

from shardkv.format.ranges import ByteRange
from shardkv.storage.kv import ANY, LOCK_DIR, NO_VALUE, TEMP_MARKER, Generation, KVStore, Value

__all__ = ["KVContract", "put_ok"]


def as_bytes(buf: Any) -> bytes:
    return bytes(buf)


def put_ok(kv: KVStore, key: str, value: Value, if_generation: Generation = ANY) -> Generation:
    """``kv.put`` that must succeed: the generation stored."""
    generation = kv.put(key, value, if_generation=if_generation)
    assert generation is not None, f"put of {key!r} refused"
    return generation


class KVContract:
    """Tests of the store interface; a subclass gives the ``kv`` fixture (an empty store)."""

    @pytest.fixture
    def kv(self) -> KVStore:
        raise NotImplementedError("a KVContract subclass gives the kv fixture")

    # -- missing is a state ---------------------------------------------------

    def test_missing_is_a_state(self, kv: KVStore) -> None:
        for ranges in (None, [ByteRange(0, 2)], []):
            r = kv.get("a/missing", ranges)
            assert r.state == "missing" and not r.found
            assert r.values is None and r.generation == NO_VALUE and r.generation.is_missing
        assert kv.values(["a/missing"]) == {}
        with pytest.raises(ValueError):
            kv.get("a/missing").whole()

    def test_put_returns_the_generation_a_read_sees(self, kv: KVStore) -> None:
        g = put_ok(kv, "a/b/c", STORED)
        assert isinstance(g, Generation) and not g.is_any and not g.is_missing
        r = kv.get("a/b/c")
        assert r.state == "value" and r.found
        assert as_bytes(r.whole()) == STORED
        assert r.generation == g
        assert r.size in (None, len(STORED))

    def test_values_are_read_only(self, kv: KVStore) -> None:
        kv.put("k", STORED)
        for buf in kv.get("k", [ByteRange(0, 4), ByteRange(2)]).values or []:
            assert isinstance(buf, (bytes, memoryview))
            if isinstance(buf, memoryview):
                assert buf.readonly

    def test_value_from_parts(self, kv: KVStore) -> None:
        parts: list[bytes | bytearray | memoryview] = [b"01", bytearray(b"234"), memoryview(b"56789")]
        kv.put("parts", parts)
        assert as_bytes(kv.get("parts").whole()) == STORED
        kv.put("tuple", (b"ab", b"cd"))
        assert as_bytes(kv.get("tuple").whole()) == b"abcd"

    def test_empty_value(self, kv: KVStore) -> None:
        g = put_ok(kv, "empty", b"")
        r = kv.get("empty")
        assert r.found and as_bytes(r.whole()) == b"" and r.generation == g
        ranged = kv.get("empty", [ByteRange(0, 3), ByteRange.suffix(2)])
        assert ranged.found and [as_bytes(b) for b in ranged.values or []] == [b"", b""]

    # -- ranges ---------------------------------------------------------------

    @pytest.mark.parametrize(("byte_range", "expected"), GET_RANGE_CASES)
    def test_range(self, kv: KVStore, byte_range: ByteRange, expected: bytes) -> None:
        g = put_ok(kv, "r", STORED)
        r = kv.get("r", [byte_range])
        assert r.found and r.generation == g
        assert [as_bytes(b) for b in r.values or []] == [expected]

    def test_many_ranges_of_one_value_share_one_generation(self, kv: KVStore) -> None:
        g = put_ok(kv, "r", STORED)
        cases: list[Any] = [p.values for p in GET_RANGE_CASES]
        r = kv.get("r", [c[0] for c in cases])
        assert r.found and r.generation == g
        assert [as_bytes(b) for b in r.values or []] == [c[1] for c in cases]

    def test_get_many_keeps_order_and_mixes_states(self, kv: KVStore) -> None:
        g1 = put_ok(kv, "x/1", b"one")
        g2 = put_ok(kv, "x/2", b"two")
        results = kv.get_many(
            [
                ("x/2", None, ANY),
                ("x/none", [ByteRange(0, 1)], ANY),
                ("x/1", [ByteRange(1, 3)], ANY),
                ("x/2", [ByteRange.suffix(1)], g2),
                ("x/1", None, g1),
            ]
        )
        assert [r.state for r in results] == ["value", "missing", "value", "value", "value"]
        assert as_bytes(results[0].whole()) == b"two" and results[0].generation == g2
        assert [as_bytes(b) for b in results[2].values or []] == [b"ne"] and results[2].generation == g1
        assert [as_bytes(b) for b in results[3].values or []] == [b"o"]
        assert as_bytes(results[4].whole()) == b"one"
        assert kv.get_many([]) == []

    # -- conditional reads ----------------------------------------------------

    def test_read_conditioned_on_the_current_generation(self, kv: KVStore) -> None:
        g = put_ok(kv, "k", STORED)
        r = kv.get("k", [ByteRange(2, 4)], if_generation=g)
        assert r.found and r.generation == g and [as_bytes(b) for b in r.values or []] == [b"23"]
        assert as_bytes(kv.get("k", if_generation=g).whole()) == STORED

    def test_stale_conditional_read_reads_nothing(self, kv: KVStore) -> None:
        old = put_ok(kv, "k", STORED)
        new = put_ok(kv, "k", b"9876543210")  # same size, other bytes
        assert new != old
        for ranges in (None, [ByteRange(0, 2)], [ByteRange(0, 1), ByteRange.suffix(3)]):
            r = kv.get("k", ranges, if_generation=old)
            assert r.state == "stale" and not r.found and r.values is None
            assert r.generation in (ANY, new)
        assert kv.get("k", if_generation=new).found

    def test_zero_range_check(self, kv: KVStore) -> None:
        g = put_ok(kv, "k", STORED)
        r = kv.get("k", [], if_generation=g)
        assert r.state == "value" and r.values == [] and r.generation == g
        kv.put("k", b"other")
        assert kv.get("k", [], if_generation=g).state == "stale"

    def test_read_conditioned_on_a_deleted_key(self, kv: KVStore) -> None:
        g = put_ok(kv, "k", STORED)
        assert kv.delete("k")
        r = kv.get("k", [ByteRange(0, 2)], if_generation=g)
        assert r.state in ("missing", "stale") and r.values is None

    def test_read_conditioned_on_no_value(self, kv: KVStore) -> None:
        assert kv.get("k", if_generation=NO_VALUE).state == "missing"
        kv.put("k", STORED)
        r = kv.get("k", if_generation=NO_VALUE)
        assert r.state == "stale" and r.values is None

    # -- conditional writes ---------------------------------------------------

    def test_create_only_if_missing(self, kv: KVStore) -> None:
        g = put_ok(kv, "k", b"first", if_generation=NO_VALUE)
        assert g is not None and kv.get("k").generation == g
        assert kv.put("k", b"second", if_generation=NO_VALUE) is None
        assert as_bytes(kv.get("k").whole()) == b"first"

    def test_update_only_if_unchanged(self, kv: KVStore) -> None:
        g1 = put_ok(kv, "k", b"v1")
        assert g1 is not None
        g2 = put_ok(kv, "k", b"v2", if_generation=g1)
        assert g2 is not None and g2 != g1
        assert kv.get("k").generation == g2
        assert kv.put("k", b"v3", if_generation=g1) is None  # g1 no longer holds: nothing written
        r = kv.get("k")
        assert as_bytes(r.whole()) == b"v2" and r.generation == g2

    def test_update_of_a_missing_key_fails(self, kv: KVStore) -> None:
        g = put_ok(kv, "k", b"v1")
        assert kv.delete("k")
        assert g is not None and kv.put("k", b"v2", if_generation=g) is None
        assert kv.get("k").state == "missing"

    def test_lost_race(self, kv: KVStore) -> None:
        base = put_ok(kv, "k", b"base")
        assert base is not None
        seen_a, seen_b = kv.get("k").generation, kv.get("k").generation  # two writers read the same value
        assert seen_a == seen_b == base
        won = kv.put("k", b"A", if_generation=seen_a)
        lost = kv.put("k", b"B", if_generation=seen_b)
        assert won is not None and lost is None
        assert as_bytes(kv.get("k").whole()) == b"A"

    def test_put_many_writes_the_keys_whose_condition_holds(self, kv: KVStore) -> None:
        g = put_ok(kv, "a", b"a0")
        kv.put("b", b"b0")
        assert g is not None
        out = kv.put_many({"a": (b"a1", g), "b": (b"b1", NO_VALUE), "c": (b"c1", NO_VALUE), "d": (None, ANY)})
        assert set(out) == {"a", "b", "c", "d"}
        assert out["a"] is not None and out["b"] is None and out["c"] is not None and out["d"] == NO_VALUE
        assert {k: as_bytes(v) for k, v in kv.values(["a", "b", "c", "d"]).items()} == {
            "a": b"a1",
            "b": b"b0",
            "c": b"c1",
        }
        assert kv.put_many({}) == {}

    def test_no_lost_update_between_threads(self, kv: KVStore) -> None:
        """Threads that read, add one and put conditioned on what they read: every increment lands once."""
        if not self.thread_safe:
            pytest.skip("the base store is not safe to use from several threads")
        kv.put("n", b"0")
        wins: list[int] = []
        errors: list[BaseException] = []

        def bump(rounds: int) -> None:
            try:
                for _ in range(50 * rounds):  # bounded: a lost race retries
                    if rounds == 0:
                        return
                    r = kv.get("n")
                    value = int(bytes(r.whole())) + 1
                    if kv.put("n", str(value).encode(), if_generation=r.generation) is not None:
                        wins.append(value)
                        rounds -= 1
            except BaseException as exc:  # reported by the main thread
                errors.append(exc)

        threads = [threading.Thread(target=bump, args=(self.increments,)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not errors and not any(t.is_alive() for t in threads)
        total = 4 * self.increments
        assert bytes(kv.get("n").whole()) == str(total).encode()
        assert sorted(wins) == list(range(1, total + 1))

    increments = 10
    """Increments per thread in :meth:`test_no_lost_update_between_threads`."""
    thread_safe = True
    """False for a base store that threads may not share (zarr 2's SQLiteStore)."""

    # -- deletes --------------------------------------------------------------

    def test_delete(self, kv: KVStore) -> None:
        kv.put("k", b"v")
        assert kv.delete("k") is True
        assert kv.get("k").state == "missing"
        assert kv.delete("k") is True  # deleting a missing key is no failure
        assert kv.delete("never") is True

    def test_conditional_delete(self, kv: KVStore) -> None:
        old = put_ok(kv, "k", b"v1")
        new = put_ok(kv, "k", b"v2")
        assert old is not None and new is not None
        assert kv.delete("k", if_generation=old) is False
        assert as_bytes(kv.get("k").whole()) == b"v2"
        assert kv.delete("k", if_generation=new) is True
        assert kv.get("k").state == "missing"

    # -- contains, size, deleting a prefix (what the proxies' listings, in, getsize and rmdir use) ----

    def test_contains_and_size(self, kv: KVStore) -> None:
        assert not kv.contains("a/b") and kv.size("a/b") is None
        put_ok(kv, "a/b", STORED)
        put_ok(kv, "a/e", b"")
        assert kv.contains("a/b") and kv.size("a/b") == len(STORED)
        assert kv.contains("a/e") and kv.size("a/e") == 0
        assert not kv.contains("a") and kv.size("a") is None  # a path holding keys is not a value
        assert kv.delete("a/b")
        assert not kv.contains("a/b") and kv.size("a/b") is None

    def test_delete_prefix(self, kv: KVStore) -> None:
        for key in ("p/x", "p/q/y", "pq", "r/z"):
            put_ok(kv, key, b"1")
        kv.delete_prefix("p/")
        assert sorted(kv.list_prefix("")) == ["pq", "r/z"]
        assert kv.list_dir("") == (["pq"], ["r"])  # no empty directory is left where p was
        assert not kv.contains("p/x") and kv.get("p/q/y").state == "missing"
        kv.delete_prefix("")
        assert list(kv.list_prefix("")) == [] and kv.list_dir("") == ([], [])

    def test_a_value_lists_no_children(self, kv: KVStore) -> None:
        put_ok(kv, "v", b"1")
        put_ok(kv, "w/x", b"2")
        assert kv.list_dir("v/") == ([], [])
        assert kv.list_dir("w/") == (["x"], [])

    # -- listings -------------------------------------------------------------

    def _tree(self, kv: KVStore) -> None:
        for key in ("zarr.json", "a/zarr.json", "a/c/0/0", "a/c/0/1", "a/c/1/0", "b/x", "ab"):
            kv.put(key, b"v")

    def test_list_prefix(self, kv: KVStore) -> None:
        self._tree(kv)
        assert sorted(kv.list_prefix("")) == ["a/c/0/0", "a/c/0/1", "a/c/1/0", "a/zarr.json", "ab", "b/x", "zarr.json"]
        assert sorted(kv.list_prefix("a/")) == ["a/c/0/0", "a/c/0/1", "a/c/1/0", "a/zarr.json"]
        assert sorted(kv.list_prefix("a/c/0/")) == ["a/c/0/0", "a/c/0/1"]
        assert sorted(kv.list_prefix("nothing/")) == []

    def test_list_dir(self, kv: KVStore) -> None:
        self._tree(kv)
        assert kv.list_dir("") == (["ab", "zarr.json"], ["a", "b"])
        assert kv.list_dir("a/") == (["zarr.json"], ["c"])
        assert kv.list_dir("a/c/") == ([], ["0", "1"])
        assert kv.list_dir("nothing/") == ([], [])

    def test_list_generations(self, kv: KVStore) -> None:
        g = put_ok(kv, "a/k", b"v")
        listed = dict(kv.list_generations("a/"))
        assert list(listed) == ["a/k"]
        assert listed["a/k"] in (None, g)

    def test_hidden_files_are_never_listed(self, kv: KVStore) -> None:
        kv.put("a/x", b"v")
        kv.put(f"a/{TEMP_MARKER}0123", b"partial")
        kv.put(f"{LOCK_DIR}/a.lock", b"")
        kv.put(f"a/{LOCK_DIR}/s.lock", b"")
        assert sorted(kv.list_prefix("")) == ["a/x"]
        assert kv.list_dir("") == ([], ["a"])
        assert kv.list_dir("a/") == (["x"], [])

    def test_values(self, kv: KVStore) -> None:
        kv.put("m/1", b"one")
        kv.put("m/2", [b"t", b"wo"])
        got = kv.values(["m/1", "m/2", "m/3"])
        assert {k: as_bytes(v) for k, v in got.items()} == {"m/1": b"one", "m/2": b"two"}

    def test_location_is_stable(self, kv: KVStore) -> None:
        assert kv.location == kv.location
        hash(kv.location)

    def test_caps(self, kv: KVStore) -> None:
        caps = kv.caps
        assert caps.stamps in ("native", "process")
        if caps.stamps == "process":
            assert not caps.conditional_put and not caps.conditional_delete

    def test_generations_pickle(self, kv: KVStore) -> None:
        g = put_ok(kv, "k", b"v")
        assert g is not None and pickle.loads(pickle.dumps(g)) == g
        for special in (ANY, NO_VALUE):
            assert pickle.loads(pickle.dumps(special)) == special
