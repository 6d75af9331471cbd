"""ShardEngine over a KVStore: the one read path, the one write path, listings, compaction, modes."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from engine_kv import CountingKV

from shardkv.engine.engine import ShardEngine
from shardkv.engine.merge import ChunkPatch, ShardChange, merge_chunks, out_of_grid
from shardkv.engine.options import Options
from shardkv.engine.retry import Backoff
from shardkv.errors import ConcurrentUpdateError, ConfigurationError, CorruptShardError
from shardkv.format.layout import ShardLayout
from shardkv.format.ranges import ByteRange
from shardkv.keys.space import DefaultChunkKeyEncoding, ShardedArray, V2ChunkKeyEncoding
from shardkv.storage.kv import ANY, Capabilities, Generation, ReadResult


def array(
    shape: tuple[int, ...] = (16, 16),
    chunks: tuple[int, ...] = (2, 2),
    cps: tuple[int, ...] = (2, 2),
    location: str = "end",
    v3: bool = False,
) -> ShardedArray:
    enc = DefaultChunkKeyEncoding("/") if v3 else V2ChunkKeyEncoding(".")
    return ShardedArray("a", "a/", shape, chunks, ShardLayout.v3(cps, index_location=location), enc, enc)


def change(arr: ShardedArray, values: dict[tuple[int, ...], object]) -> dict[str, ShardChange]:
    out: dict[str, ShardChange] = {}
    for coords, value in values.items():
        ref = arr.locate(arr.chunk_key(coords))
        out.setdefault(ref.shard_key, ShardChange(arr, ref.shard_coords)).chunks[ref.local_coords] = value
    return out


def read(engine: ShardEngine, arr: ShardedArray, *coords: tuple[int, ...]) -> dict[str, bytes]:
    found = engine.reads.read_chunks([arr.locate(arr.chunk_key(c)) for c in coords])
    return {k: bytes(v) for k, v in found.items()}


@pytest.mark.parametrize("location", ["start", "end"])
def test_write_then_read_round_trip(location: str) -> None:
    kv, arr = CountingKV(), array(location=location)
    engine = ShardEngine(kv)
    engine.writes.write(change(arr, {(0, 0): b"A" * 5, (1, 1): b"BB", (4, 4): b"C"}))
    assert read(engine, arr, (0, 0), (1, 1), (0, 1), (4, 4)) == {"a/0.0": b"A" * 5, "a/1.1": b"BB", "a/4.4": b"C"}
    fresh = ShardEngine(kv)  # no cache: reads the indexes
    assert read(fresh, arr, (0, 0), (2, 2)) == {"a/0.0": b"A" * 5}


def test_warm_read_is_one_conditional_request_for_exactly_the_chunk_bytes() -> None:
    kv, arr = (
        CountingKV(
            Capabilities(ranged=True, round_trips=True, stamps="native", conditional_put=True, conditional_delete=True)
        ),
        array(cps=(4, 4)),
    )
    engine = ShardEngine(kv)
    engine.writes.write(change(arr, {(i, j): bytes([i * 4 + j]) * 256 for i in range(4) for j in range(4)}))
    kv.log.clear()
    assert read(engine, arr, (1, 2)) == {"a/1.2": bytes([6]) * 256}
    gets = kv.gets()
    assert len(gets) == 1
    assert gets[0][3] == 256  # exactly the chunk's bytes: the write cached the index and the shard's size


def test_stale_cached_index_costs_one_refetch_never_a_torn_read() -> None:
    kv, arr = CountingKV(), array()
    a, b = ShardEngine(kv), ShardEngine(kv)
    a.writes.write(change(arr, {(0, 0): b"old", (0, 1): b"x"}))
    assert read(b, arr, (0, 0)) == {"a/0.0": b"old"}  # b caches the index
    a.writes.write(change(arr, {(0, 0): b"a much longer new value"}))
    kv.log.clear()
    assert read(b, arr, (0, 0)) == {"a/0.0": b"a much longer new value"}
    assert b.stats.read_stale == 1
    assert len(kv.gets()) == 3  # refused chunk read, index read, chunk read


def test_absent_chunk_of_a_cached_index_is_proved_current() -> None:
    kv, arr = CountingKV(), array()
    a, b = ShardEngine(kv), ShardEngine(kv)
    a.writes.write(change(arr, {(0, 0): b"x"}))
    assert read(b, arr, (0, 1)) == {}
    a.writes.write(change(arr, {(0, 1): b"new"}))
    assert read(b, arr, (0, 1)) == {"a/0.1": b"new"}  # another writer's chunk is never reported missing


def test_deleted_shard_reads_as_missing() -> None:
    kv, arr = CountingKV(), array()
    a, b = ShardEngine(kv), ShardEngine(kv)
    a.writes.write(change(arr, {(0, 0): b"x"}))
    assert read(b, arr, (0, 0)) == {"a/0.0": b"x"}
    a.writes.write(change(arr, {(0, 0): None}))
    assert "a/0" not in kv.data and "a/0.0" not in kv.data
    assert read(b, arr, (0, 0)) == {}


def test_partial_ranges_and_patches() -> None:
    kv, arr = CountingKV(), array()
    engine = ShardEngine(kv)
    engine.writes.write(change(arr, {(0, 0): b"0123456789"}))
    ref = arr.locate("a/0.0")
    got = engine.reads.read_ranges(
        [(ref, ByteRange(2, 5)), (ref, ByteRange.suffix(3)), (arr.locate("a/0.1"), ByteRange(0))]
    )
    assert [None if g is None else bytes(g) for g in got] == [b"234", b"789", None]
    engine.writes.write(change(arr, {(0, 0): ChunkPatch("a/0.0", [(2, b"xy")])}))
    assert read(engine, arr, (0, 0)) == {"a/0.0": b"01xy456789"}


def test_shard_written_whole_needs_no_read() -> None:
    kv, arr = CountingKV(), array()
    engine = ShardEngine(kv)
    kv.log.clear()
    engine.writes.write(change(arr, {(0, 0): b"a", (0, 1): b"b", (1, 0): b"c", (1, 1): b"d"}))
    assert kv.gets() == []
    engine.writes.write(change(arr, {(0, 0): b"z"}))
    assert len(kv.gets()) == 1  # partly covered: one read of the old shard


def test_conditional_write_retries_only_the_lost_shard(monkeypatch: pytest.MonkeyPatch) -> None:
    kv, arr = CountingKV(), array()
    engine = ShardEngine(kv)
    engine.writes.write(change(arr, {(0, 0): b"a", (2, 2): b"b"}))
    elsewhere = CountingKV()  # another process's view: it writes the shard a/0.0 meanwhile
    elsewhere.data = dict(kv.data)
    ShardEngine(elsewhere).writes.write(change(arr, {(0, 1): b"theirs"}))
    real_put_many = kv.put_many
    puts = []

    def racing_put_many(writes):  # type: ignore[no-untyped-def]
        puts.append(sorted(writes))
        if len(puts) == 1:
            real_put_many({"a/0.0": (elsewhere.data["a/0.0"][0], ANY)})
        return real_put_many(writes)

    monkeypatch.setattr(kv, "put_many", racing_put_many)
    engine.writes.write(change(arr, {(0, 0): b"mine", (2, 3): b"mine too"}))
    monkeypatch.undo()
    assert read(ShardEngine(kv), arr, (0, 0), (0, 1), (2, 2), (2, 3)) == {
        "a/0.0": b"mine",
        "a/0.1": b"theirs",
        "a/2.2": b"b",
        "a/2.3": b"mine too",
    }
    assert puts == [["a/0.0", "a/1.1"], ["a/0.0"]]  # only the lost shard goes round again
    assert engine.stats.write_lost == 1
    assert engine.stats.write_attempts == 1 + 2  # the first write, then a lost round and a won one


def test_conditional_write_gives_up_after_bounded_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    kv, arr = CountingKV(), array()
    engine = ShardEngine(kv)
    engine.writes.write(change(arr, {(0, 0): b"a"}))
    monkeypatch.setattr(kv, "put_many", lambda writes: dict.fromkeys(writes))
    monkeypatch.setattr("shardkv.engine.writes.WRITE_BACKOFF", Backoff(0.0, 1.0, 0.0))
    with pytest.raises(ConcurrentUpdateError, match="a/0"):
        engine.writes.write(change(arr, {(0, 0): b"b"}))
    assert engine.stats.write_attempts == 1 + 16


def test_a_read_whose_shard_changes_every_round_gives_up_saying_it_was_a_read(monkeypatch: pytest.MonkeyPatch) -> None:
    kv, arr = CountingKV(), array()
    engine = ShardEngine(kv)
    engine.writes.write(change(arr, {(0, 0): b"a"}))
    real_get_many = kv.get_many

    def always_changed(reads):  # the shard is rewritten during every read of it (a store answers "stale")
        return [
            ReadResult("stale", None, Generation(("elsewhere", n))) if key == "a/0.0" else result
            for n, ((key, _, _), result) in enumerate(zip(reads, real_get_many(reads), strict=True))
        ]

    monkeypatch.setattr(kv, "get_many", always_changed)
    monkeypatch.setattr("shardkv.engine.reads.READ_BACKOFF", Backoff(0.0, 1.0, 0.0))
    with pytest.raises(ConcurrentUpdateError, match=r"conditional read of 'a/0\.0' failed") as info:
        read(engine, arr, (0, 0))
    assert info.value.operation == "read" and info.value.key == "a/0.0"
    assert "update" not in str(info.value) and "shard-aligned" not in str(info.value)


def test_store_without_conditional_delete_keeps_an_empty_shard() -> None:
    kv = CountingKV(Capabilities(ranged=True, stamps="native", conditional_put=True, conditional_delete=False))
    arr = array()
    engine = ShardEngine(kv)
    engine.writes.write(change(arr, {(0, 0): b"a"}))
    engine.writes.write(change(arr, {(0, 0): None}))
    assert "a/0.0" in kv.data and read(engine, arr, (0, 0)) == {}
    assert list(engine.reads.chunk_keys({"a/0.0": arr})) == []


def test_listing_counts_and_keys_from_current_indexes() -> None:
    kv, arr = CountingKV(), array(shape=(5, 5))
    engine = ShardEngine(kv)
    engine.writes.write(change(arr, {(0, 0): b"a", (2, 1): b"b", (2, 2): b"c"}))
    shards = {k: arr for k in kv.list_prefix("a/")}
    assert sorted(engine.reads.chunk_keys(shards)) == ["a/0.0", "a/2.1", "a/2.2"]
    assert engine.reads.count_chunks(shards) == 3
    other = ShardEngine(kv)
    other.writes.write(change(arr, {(0, 1): b"d"}))
    assert engine.reads.count_chunks(shards) == 4  # the cached index was checked, not trusted
    generations = {k: g for k, (_, g) in kv.data.items()}
    kv.log.clear()
    assert engine.reads.count_chunks(shards, generations=generations) == 4
    assert kv.gets() == []  # generations from a listing: no request


def test_listing_leaves_out_chunks_outside_the_grid() -> None:
    kv, big, small = CountingKV(), array(shape=(8, 8)), array(shape=(5, 5))
    ShardEngine(kv).writes.write(change(big, {(2, 2): b"in", (3, 3): b"out"}))
    engine = ShardEngine(kv)
    assert list(engine.reads.chunk_keys({"a/1.1": small})) == ["a/2.2"]
    assert sorted(engine.reads.chunk_keys({"a/1.1": small}, in_grid_only=False)) == ["a/2.2", "a/3.3"]
    assert engine.reads.count_chunks({"a/1.1": small}) == 1


@pytest.mark.parametrize("shape", [(8, 8), (5, 5), (8, 5), (7, 8)], ids=lambda s: "x".join(map(str, s)))
def test_out_of_grid_matches_each_chunk_checked_and_reads_no_chunk_of_an_inner_shard(shape: tuple[int, ...]) -> None:
    # every task of an unaligned dask write asks this of its shard: a shard wholly inside the grid is answered
    # from its corner, without going through the chunks its index holds (64 in a 4x4x4 shard)
    arr = array(shape=shape)
    every = [(i, j) for i in range(2) for j in range(2)]
    for shard_coords in [(i, j) for i in range(2) for j in range(2)]:
        seen: list[tuple[int, ...]] = []

        def present(seen: list[tuple[int, ...]] = seen) -> Iterator[tuple[int, ...]]:
            for local in every:
                seen.append(local)
                yield local

        expected = [loc for loc in every if not arr.in_grid(arr.chunk_coords(shard_coords, loc))]
        assert out_of_grid(arr, shard_coords, present()) == expected
        inner = not expected
        assert seen == ([] if inner else every)
        assert arr.shard_in_grid(shard_coords) == inner


def test_v3_chunk_keys_are_built_from_the_encoding() -> None:
    kv, arr = CountingKV(), array(v3=True)
    engine = ShardEngine(kv)
    engine.writes.write(change(arr, {(3, 1): b"x"}))
    assert list(engine.reads.chunk_keys({k: arr for k in kv.list_prefix("a/")})) == ["a/c/3/1"]
    assert engine.reads.has_chunks([arr.locate("a/c/3/1"), arr.locate("a/c/3/0")]) == [True, False]


def test_compact_reclaims_unused_bytes_written_by_others() -> None:
    kv, arr = CountingKV(), array()
    engine = ShardEngine(kv)
    engine.writes.write(change(arr, {(0, 0): b"a" * 10}))
    data, _ = kv.data["a/0.0"]
    n = arr.layout.index_nbytes
    kv.put("a/0.0", data[:-n] + b"\0" * 7 + data[-n:])  # 7 unused bytes (as other writers may leave)
    assert read(engine, arr, (0, 0)) == {"a/0.0": b"a" * 10}
    assert engine.writes.compact(arr, ["a/0.0", "a/1.1"]) == 7
    assert read(ShardEngine(kv), arr, (0, 0)) == {"a/0.0": b"a" * 10}
    assert engine.writes.compact(arr) == 0


def test_truncated_shard_is_refused() -> None:
    kv, arr = CountingKV(), array(location="start")
    engine = ShardEngine(kv)
    engine.writes.write(change(arr, {(0, 0): b"a" * 10, (0, 1): b"b" * 10}))
    data, _ = kv.data["a/0.0"]
    kv.put("a/0.0", data[:-5])
    with pytest.raises(CorruptShardError):
        read(ShardEngine(kv), arr, (0, 1))


def test_store_without_ranges_reads_whole_shards_and_caches_nothing() -> None:
    kv, arr = CountingKV(Capabilities(ranged=False, in_process=True)), array()
    engine = ShardEngine(kv)
    engine.writes.write(change(arr, {(0, 0): b"a"}))
    kv.log.clear()
    assert read(engine, arr, (0, 0), (0, 1)) == {"a/0.0": b"a"}
    assert kv.gets() == [("get", "a/0.0", None, len(kv.data["a/0.0"][0]))]


def test_erase_deletes_shards() -> None:
    kv, arr = CountingKV(), array()
    engine = ShardEngine(kv)
    engine.writes.write(change(arr, {(0, 0): b"a", (4, 4): b"b"}))
    engine.writes.erase({"a/0.0": arr, "a/2.2": arr})
    assert list(kv.data) == []


def test_modes_resolve_from_capabilities() -> None:
    assert ShardEngine(CountingKV()).locks.mode == "conditional"
    files = CountingKV(Capabilities(ranged=True, stamps="native", lock_dir=True))
    with pytest.raises(ConfigurationError, match="directory"):
        ShardEngine(CountingKV(), Options(concurrency="files"))
    persistent = CountingKV(Capabilities(ranged=False))
    with pytest.raises(ConfigurationError, match="neither lock files nor conditional"):
        ShardEngine(persistent)
    assert ShardEngine(persistent, Options(concurrency="process")).locks.mode == "process"
    assert ShardEngine(persistent, Options(concurrency="none")).locks.mode == "none"
    with pytest.raises(ConfigurationError):
        ShardEngine(persistent, Options(concurrency="conditional"))
    with pytest.raises(ConfigurationError):
        Options(index_cache_bytes=-1)
    assert files.caps.lock_dir


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("index_location", "middle"),
        ("index_checksum", "no"),  # a truthy string would have turned checksums on
        ("index_checksum", 0),
        ("index_cache_bytes", -1),
        ("index_cache_bytes", 1.5),
        ("read_policy", 3),
        ("buffer_bytes", True),
        ("concurrency", "threads"),
        ("lock_timeout", -1.0),
        ("lock_timeout", float("nan")),
        ("lock_timeout", "5"),
    ],
)
def test_each_option_refuses_a_value_of_the_wrong_kind_naming_itself(option: str, value: object) -> None:
    with pytest.raises(ConfigurationError, match=option):
        Options.from_keywords(None, **{option: value})  # type: ignore[arg-type]


def test_write_back_writes_each_shard_once_and_replays_its_journal(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from shardkv.engine.writeback import WriteBack

    kv, arr = CountingKV(), array()
    back = WriteBack(ShardEngine(kv), buffer_bytes=1 << 20)
    assert back.attach_journal(tmp_path / "j", arr.locate) == 0
    back.write(change(arr, {(0, 0): b"a", (0, 1): b"b"}))
    assert kv.data == {} and back.lookup("a/0.0", (0, 1)) == (True, b"b")
    back.write(change(arr, {(1, 0): b"c", (1, 1): b"d"}))  # the shard is complete: written once, unread
    assert list(kv.data) == ["a/0.0"] and kv.gets() == []
    back.write(change(arr, {(2, 2): b"e"}))
    back.close()  # killed before a flush: the journal holds the chunk
    again = WriteBack(ShardEngine(kv), buffer_bytes=1 << 20)
    assert again.attach_journal(tmp_path / "j", arr.locate) == 1
    assert read(ShardEngine(kv), arr, (2, 2)) == {"a/2.2": b"e"}
    again.close()


def test_write_back_reads_see_buffered_chunks_beside_stored_ones_of_the_same_shard() -> None:
    from shardkv.engine.writeback import WriteBack

    kv, arr = CountingKV(), array()
    ShardEngine(kv).writes.write(change(arr, {(0, 0): b"aa", (0, 1): b"bbb", (1, 1): b"dddd"}))
    back = WriteBack(ShardEngine(kv), buffer_bytes=1 << 20)
    back.write(change(arr, {(0, 1): b"xxxxx", (1, 1): None}))  # shard a/0.0: one chunk replaced, one deleted
    refs = [arr.locate(arr.chunk_key(c)) for c in [(0, 0), (0, 1), (1, 0), (1, 1)]]
    assert back.chunk_sizes(refs) == [2, 5, None, None]
    assert {k: bytes(v) for k, v in back.read_chunks(refs).items()} == {"a/0.0": b"aa", "a/0.1": b"xxxxx"}
    assert [back.has_chunk(ref) for ref in refs] == [True, True, False, False]
    back.flush()
    assert back.chunk_sizes(refs) == [2, 5, None, None]


def test_write_through_reports_each_write() -> None:
    from shardkv.engine.writeback import WriteBack

    seen: list[list[str]] = []
    kv, arr = CountingKV(), array()
    back = WriteBack(ShardEngine(kv), None, on_write_through=lambda changes: seen.append(sorted(changes)))
    back.write(change(arr, {(0, 0): b"a", (4, 4): b"b"}))
    assert seen == [["a/0.0", "a/2.2"]] and back.lookup("a/0.0", (0, 0)) == (False, None)


def test_cache_keeps_the_shard_size_the_write_returned() -> None:
    kv, arr = CountingKV(), array()
    engine = ShardEngine(kv)
    engine.writes.write(change(arr, {(0, 0): b"a" * 10, (0, 1): b"b" * 3}))
    entry = engine.cache.peek("a/0.0")
    assert entry is not None and entry.size == len(kv.data["a/0.0"][0])


def test_merge_rules_for_a_shard_written_whole_and_for_other_bytes_like_values() -> None:
    """covers_shard and merge_chunks check value types in one pass; other bytes-like values still count."""
    arr = array(cps=(2, 1))
    whole = {(0, 0): b"a", (1, 0): np.frombuffer(b"bb", dtype=np.uint8)}
    assert ShardChange(arr, (0, 0), whole).covers_shard()
    assert not ShardChange(arr, (0, 0), {(0, 0): b"a", (1, 0): None}).covers_shard()
    assert not ShardChange(arr, (0, 0), {(0, 0): b"a", (1, 0): ChunkPatch("a/1.0", [(0, b"b")])}).covers_shard()
    merged = merge_chunks(arr, (0, 0), {}, whole)
    assert merged == whole and merged is not whole
    old = {(0, 0): b"old0", (1, 0): b"old1"}
    assert merge_chunks(arr, (0, 0), old, {(1, 0): None}) == {(0, 0): b"old0"}
    assert merge_chunks(arr, (0, 0), {}, {(0, 0): None, (1, 0): ChunkPatch("a/1.0", [(0, b"new")])}) == {(1, 0): b"new"}
