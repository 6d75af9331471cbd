"""The draft 2022 sharding storage transformer, operation by operation, over a dict.

Each operation of the draft's "API implementation" is run against a dict-backed
underlying store wrapped in a counter of abstract-store calls, so the request
plans the draft prescribes are asserted, not assumed.
"""

from __future__ import annotations

import itertools
import struct
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformer_mapping import CountingAbstractStore

from shardkv.errors import CorruptShardError, InvalidKeyError, UnsupportedError
from shardkv.format.ranges import ByteRange
from shardkv.transformers import AbstractStore, AdapterStore, ShardingStorageTransformer

EMPTY = 2**64 - 1


def parse_shard(blob: bytes, n_chunks: int) -> list[tuple[int, int]]:
    """Independent reader of the draft 'indexed' index: n little-endian (offset, nbytes) uint64 pairs at the end."""
    index = blob[len(blob) - 16 * n_chunks :]
    return [struct.unpack_from("<QQ", index, 16 * i) for i in range(n_chunks)]


def chunk_value(coords: tuple[int, ...]) -> bytes:
    return ("chunk" + "-".join(map(str, coords))).encode() * (1 + sum(coords) % 3)


@pytest.fixture
def under() -> CountingAbstractStore:
    return CountingAbstractStore()


def make(under: AbstractStore, separator: str = "/", cps=(2, 3), shape=(10, 11), chunks=(2, 2), path="foo/bar"):
    return ShardingStorageTransformer(under, cps, array_path=path, separator=separator, shape=shape, chunk_shape=chunks)


def key(t: ShardingStorageTransformer, coords) -> str:
    return t.chunk_key(coords)


def fill(t: ShardingStorageTransformer, coords_list) -> dict[str, bytes]:
    values = {key(t, c): chunk_value(c) for c in coords_list}
    t.set_values(values)
    return values


GRID = list(itertools.product(range(5), range(6)))  # chunk grid of shape (10, 11) / chunks (2, 2)


@pytest.mark.parametrize("separator", ["/", "."], ids=["slash", "dot"])
def test_keys_rewritten_to_shard_keys_with_the_same_separator(under, separator):
    t = make(under, separator)
    fill(t, [(3, 4)])
    # chunk (3, 4) with chunks_per_shard (2, 3) is in shard (1, 1)
    assert list(under.data) == [f"data/root/foo/bar/c1{separator}1"]


def test_draft_example_key_rewriting(under):
    t = ShardingStorageTransformer(under, (32, 2), array_path="foo/baz", separator="/")
    t.set_values({"data/root/foo/baz/c96/18": b"x", "data/root/foo/baz/c127/19": b"y"})
    assert list(under.data) == ["data/root/foo/baz/c3/9"]
    assert t.get("data/root/foo/baz/c96/18") == b"x"
    assert t.get("data/root/foo/baz/c127/19") == b"y"


@pytest.mark.parametrize("n_shards", [1, 3, 6])
def test_get_partial_values_two_calls_for_n_chunks_in_k_shards(under, n_shards):
    t = make(under)
    values = fill(t, GRID)
    shard_coords = list(itertools.product(range(3), range(2)))[:n_shards]
    wanted = [c for c in GRID if (c[0] // 2, c[1] // 3) in shard_coords]
    wanted_keys = [key(t, c) for c in wanted] + ["zarr.json", "meta/root/foo/bar.array.json"]
    under.data["zarr.json"] = b"{}"
    reader = make(under)  # a reader that did not write: no index cached
    under.reset()
    got = reader.get_partial_values([(k, ByteRange(0)) for k in wanted_keys])
    assert got[:-2] == [values[k] for k in wanted_keys[:-2]]
    assert got[-2:] == [b"{}", None]  # relayed keys ride along in the first call
    assert under.calls == Counter({"get_partial_values": 2})
    first, second = (arg for _, arg in under.requests)
    assert len(first) == n_shards + 2  # one index read per shard + the relayed keys
    assert all(r == [ByteRange.suffix(16 * 6)] for _, r in first[:n_shards])
    assert len(second) == n_shards  # the adjacent chunks of one shard merged into one request
    assert sorted(k for k, _ in second) == sorted({k for k, _ in first[:n_shards]})


def test_get_partial_values_ranges_inside_chunks(under):
    t = make(under)
    values = fill(t, [(0, 0), (1, 2)])
    k = key(t, (1, 2))
    v = values[k]
    got = t.get_partial_values(
        [
            (k, ByteRange(2, 5)),
            (k, ByteRange(3)),
            (k, ByteRange.suffix(4)),
            (k, ByteRange(0, 10**6)),
            (k, ByteRange(10**6)),
        ]
    )
    assert got == [v[2:5], v[3:], v[-4:], v, b""]


def test_get_partial_values_missing_chunk_and_shard(under):
    t = make(under)
    fill(t, [(0, 0)])
    under.reset()
    got = t.get_partial_values([(key(t, (0, 1)), ByteRange(0)), (key(t, (4, 5)), ByteRange(0))])
    assert got == [None, None]
    assert under.calls == Counter({"get_partial_values": 1})  # nothing to read in round two
    with pytest.raises(KeyError):
        t.get(key(t, (0, 1)))


def test_set_values_whole_shard_built_without_reading(under):
    t = make(under)
    # shard (2, 1) at the edge of the grid: chunks (4, 3..5) are its only available chunks
    under.reset()
    fill(t, [(4, 3), (4, 4), (4, 5)])
    assert under.calls == Counter({"set_values": 1})


def test_set_values_partial_shard_reads_once_and_writes_once(under):
    t = make(under)
    old = fill(t, [(0, 0), (0, 1), (1, 0)])
    under.reset()
    new = fill(t, [(0, 1), (1, 2), (4, 4)])  # shards (0, 0) and (2, 1)
    assert under.calls == Counter({"get_partial_values": 1, "set_values": 1})
    assert len(under.requests[1][1]) == 2  # both shards in one write
    expect = {**old, **new}
    assert {k: t.get(k) for k in expect} == expect
    assert sorted(t.list()) == sorted(expect)


def test_set_partial_values_patches_bytes_of_a_chunk(under):
    t = make(under)
    k = key(t, (2, 2))
    t.set(k, b"abcdef")
    t.set_partial_values([(k, 2, b"XY"), (k, 6, b"gh"), (key(t, (2, 3)), 0, b"new")])
    assert t.get(k) == b"abXYefgh"
    assert t.get(key(t, (2, 3))) == b"new"
    t.set_partial_values([(k, -2, b"!!")])
    assert t.get(k) == b"abXYef!!"
    with pytest.raises(ValueError, match="gap"):
        t.set_partial_values([(k, 100, b"z")])


def test_erase_values_rewrites_the_shard_through_the_engine(under):
    """The draft allows an in-place index or "a larger rewrite": the index has no checksum, so a torn
    in-place one could not be told; the shard is rewritten by the one write path, its generation new."""
    t = make(under)
    fill(t, [(0, 0), (0, 1), (0, 2)])
    shard_key = "data/root/foo/bar/c0/0"
    before = under.data[shard_key]
    under.reset()
    t.erase_values([key(t, (0, 1)), key(t, (3, 3))])  # (3, 3): shard not stored
    assert under.calls == Counter({"get_partial_values": 1, "set_values": 1})
    after = under.data[shard_key]
    assert len(after) == len(before) - len(chunk_value((0, 1)))  # compact: the chunk's bytes are gone
    entries = parse_shard(after, 6)
    assert entries[1] == (EMPTY, EMPTY) and entries[0] != (EMPTY, EMPTY) and entries[2] != (EMPTY, EMPTY)
    assert not t.contains(key(t, (0, 1)))
    assert t.get(key(t, (0, 2))) == chunk_value((0, 2))


def test_erase_values_whole_shard_without_reading(under):
    t = make(under)
    fill(t, [(4, 3), (4, 4), (4, 5), (0, 0)])
    under.reset()
    t.erase_values([key(t, (4, 3)), key(t, (4, 4)), key(t, (4, 5))])
    assert under.calls == Counter({"erase_values": 1})
    assert "data/root/foo/bar/c2/1" not in under.data


def test_erase_values_last_chunk_erases_the_shard(under):
    t = make(under)
    fill(t, [(0, 0)])
    t.erase(key(t, (0, 0)))
    assert under.data == {}
    with pytest.raises(KeyError):
        t.erase(key(t, (0, 0)))


def test_erase_prefix_relayed_when_it_covers_the_array(under):
    t = make(under)
    fill(t, GRID[:7])
    under.data["meta/root/foo/bar.array.json"] = b"{}"
    under.reset()
    t.erase_prefix("data/root/foo/bar/")
    assert under.calls == Counter({"list_prefix": 1, "erase_values": 1})  # relayed: the base store's erase_prefix
    assert list(under.data) == ["meta/root/foo/bar.array.json"]


def test_erase_prefix_inside_the_chunk_grid(under):
    t = make(under)
    fill(t, GRID)
    t.erase_prefix("data/root/foo/bar/c3/")  # row 3: half of shard row 1
    assert sorted(t.list()) == sorted(key(t, c) for c in GRID if c[0] != 3)
    assert len(under.data) == 6  # no shard emptied
    t.erase_prefix("data/root/foo/bar/c2/")  # row 2: the other half -> shard row 1 gone
    assert sorted(t.list()) == sorted(key(t, c) for c in GRID if c[0] not in (2, 3))
    assert sorted(under.data) == [f"data/root/foo/bar/c{i}/{j}" for i in (0, 2) for j in (0, 1)]


def test_erase_prefix_whole_shards_are_erased_not_rewritten():
    under = CountingAbstractStore()
    t = make(under, cps=(1, 3))
    fill(t, GRID)
    under.reset()
    t.erase_prefix("data/root/foo/bar/c3/")  # exactly the shards (3, 0) and (3, 1)
    assert under.calls["set_values"] == 0 and under.calls["set_partial_values"] == 0
    assert sorted(k for k in under.data if k.startswith("data/root/foo/bar/c3/")) == []
    assert len(t.list()) == len(GRID) - 6


@pytest.mark.parametrize("separator", ["/", "."], ids=["slash", "dot"])
def test_list_and_list_prefix(under, separator):
    t = make(under, separator)
    present = [(0, 0), (1, 4), (3, 2), (4, 5)]
    fill(t, present)
    under.data["zarr.json"] = b"{}"
    assert sorted(t.list()) == sorted([key(t, c) for c in present] + ["zarr.json"])
    assert t.list() == t.list_prefix("/")
    assert sorted(t.list_prefix("data/root/foo/bar/")) == sorted(key(t, c) for c in present)
    assert sorted(t.list_prefix("data/root/foo")) == sorted(key(t, c) for c in present)
    assert t.list_prefix(f"data/root/foo/bar/c3{separator}") == [key(t, (3, 2))]
    assert sorted(t.list_prefix("data/root/foo/bar/c1")) == [key(t, (1, 4))]
    assert t.list_prefix("data/root/foo/bar/x") == []


def test_list_prefix_reads_indexes_in_one_call(under):
    t = make(under)
    fill(t, GRID)
    t.refresh()  # indexes not cached
    under.reset()
    assert len(t.list_prefix("data/root/foo/bar/c2/")) == 6
    # the prefix names chunk row 2, so only shard row 1 is listed; its 2 indexes in one read
    assert under.requests[0] == ("list_prefix", "data/root/foo/bar/c1/")
    assert under.calls == Counter({"list_prefix": 1, "get_partial_values": 1})
    assert len(under.requests[1][1]) == 2


def test_list_dir_prefixes_of_partial_shards_and_keys_of_existing_chunks(under):
    t = make(under)
    fill(t, [(0, 0), (3, 5)])
    keys, prefixes = t.list_dir("data/root/foo/bar/")
    # retrieved prefixes c0/ and c1/ (partial shard keys) become every chunk-row prefix they can hold
    assert keys == []
    assert prefixes == [f"data/root/foo/bar/c{i}/" for i in range(4)]
    keys, prefixes = t.list_dir("data/root/foo/bar/c2/")  # a listed prefix with no chunk (draft note)
    assert (keys, prefixes) == ([], [])
    keys, prefixes = t.list_dir("data/root/foo/bar/c3/")
    assert (keys, prefixes) == (["data/root/foo/bar/c3/5"], [])  # full keys only for stored chunks


def test_list_dir_edge_shard_prefixes_clipped_to_the_grid(under):
    t = make(under)
    fill(t, [(4, 0)])  # shard row 2 holds chunk rows 4 and 5, but the grid has 5 rows
    assert t.list_dir("data/root/foo/bar/")[1] == ["data/root/foo/bar/c4/"]


def test_list_dir_dot_separator_lists_chunk_keys(under):
    t = make(under, ".")
    fill(t, [(0, 0), (3, 5)])
    assert t.list_dir("data/root/foo/bar/") == (["data/root/foo/bar/c0.0", "data/root/foo/bar/c3.5"], [])
    assert t.list_dir("data/root/foo/bar/c3.") == (["data/root/foo/bar/c3.5"], [])


def test_list_dir_above_the_array_is_relayed(under):
    t = make(under)
    fill(t, [(0, 0)])
    under.data["meta/root/foo/bar.array.json"] = b"{}"
    assert t.list_dir("data/root/") == ([], ["data/root/foo/"])
    assert t.list_dir("meta/root/foo/") == (["meta/root/foo/bar.array.json"], [])
    assert t.list_dir("/") == ([], ["data/", "meta/"])


def test_three_dimensional_list_dir(under):
    t = ShardingStorageTransformer(under, (2, 2, 1), array_path="a", shape=(6, 6, 3), chunk_shape=(1, 2, 1))
    t.set_values({t.chunk_key(c): b"v" for c in [(1, 0, 2), (4, 2, 0)]})
    # shards (0, 0, 2) and (2, 1, 0) are stored: shard rows 0 and 2 hold chunk rows 0, 1 and 4, 5
    assert t.list_dir("data/root/a/")[1] == [f"data/root/a/c{i}/" for i in (0, 1, 4, 5)]
    # shard (2, 1) along the first two dims holds chunk columns 2 and 3, but the grid has 3 columns
    assert t.list_dir("data/root/a/c4/") == ([], ["data/root/a/c4/2/"])
    assert t.list_dir("data/root/a/c4/2/") == (["data/root/a/c4/2/0"], [])
    assert t.list_dir("data/root/a/c1/0/") == (["data/root/a/c1/0/2"], [])


def test_other_keys_are_relayed_unchanged(under):
    t = make(under)
    t.set_values({"zarr.json": b"z", "meta/root/foo/bar.array.json": b"m", "data/root/other/c0/0": b"o"})
    assert under.data == {"zarr.json": b"z", "meta/root/foo/bar.array.json": b"m", "data/root/other/c0/0": b"o"}
    assert t.get("data/root/other/c0/0") == b"o"
    t.erase_values(["data/root/other/c0/0"])
    assert "data/root/other/c0/0" not in under.data


def test_keys_under_the_array_that_are_not_chunk_keys_are_refused(under):
    t = make(under)
    for bad in ["data/root/foo/bar/c1", "data/root/foo/bar/c1/2/3", "data/root/foo/bar/x", "data/root/foo/bar/c01/2"]:
        with pytest.raises(InvalidKeyError, match="not one of its chunk keys"):
            t.set(bad, b"x")


def test_truncated_shard_is_an_error_not_wrong_bytes(under):
    t = make(under)
    fill(t, [(0, 0), (0, 1)])
    shard_key = "data/root/foo/bar/c0/0"
    blob = under.data[shard_key]
    entries = parse_shard(blob, 6)
    # keep the index but drop the bytes of chunk (0, 1): its entry now points past the data
    offset, nbytes = entries[1]
    under.data[shard_key] = blob[:offset] + blob[-16 * 6 :]
    with pytest.raises(CorruptShardError):
        t.get(key(t, (0, 1)))
    under.data[shard_key] = blob[-16 * 6 :]  # the index alone: every entry points into it
    with pytest.raises(CorruptShardError, match="too early"):
        t.get(key(t, (0, 0)))
    under.data[shard_key] = blob[-10:]
    with pytest.raises(CorruptShardError, match="truncated"):
        t.get(key(t, (0, 0)))


def test_a_transformer_sits_on_the_store_itself(under):
    """Stacked on another transformer, or on an AbstractStore without generations, it is refused;
    what an AdapterStore takes is wrapped in one."""
    inner = ShardingStorageTransformer(under, (2, 1), array_path="s", shape=(8, 8), chunk_shape=(2, 4))
    with pytest.raises(UnsupportedError, match=r"'s': 2 sharding storage transformers are stacked"):
        ShardingStorageTransformer(inner, (1, 2), array_path="s", shape=(8, 8), chunk_shape=(2, 2))

    class Custom(AbstractStore):
        get_partial_values = set_partial_values = set_values = under.get_partial_values  # type: ignore[assignment]
        erase_values = erase_prefix = list_prefix = list_dir = under.list_dir  # type: ignore[assignment]

    with pytest.raises(UnsupportedError, match=r"over Custom is not supported.*pass the store itself"):
        ShardingStorageTransformer(Custom(), (2,))
    data: dict[str, bytes] = {}
    t = ShardingStorageTransformer(data, (2,), shape=(4,), chunk_shape=(1,))
    t.set_values({"data/root/c1": b"x"})
    assert list(data) == ["data/root/c0"] and isinstance(t.underlying, AdapterStore)


# -- a property: the transformer behaves like a dict of chunk keys ------------------------------

OPS = st.lists(
    st.tuples(
        st.sampled_from(["set", "erase", "patch"]),
        st.lists(st.sampled_from(GRID), min_size=1, max_size=8, unique=True),
        st.binary(min_size=0, max_size=12),
    ),
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(ops=OPS, separator=st.sampled_from(["/", "."]))
def test_behaves_like_a_dict_of_chunks(ops, separator):
    under = CountingAbstractStore()
    t = make(under, separator)
    model: dict[str, bytes] = {}
    for op, coords, payload in ops:
        keys = [key(t, c) for c in coords]
        if op == "set":
            t.set_values({k: payload + k.encode() for k in keys})
            model.update({k: payload + k.encode() for k in keys})
        elif op == "erase":
            t.erase_values(keys)
            for k in keys:
                model.pop(k, None)
        else:
            t.set_partial_values([(k, 0, payload) for k in keys])
            for k in keys:
                old = bytearray(model.get(k, b""))
                old[0 : len(payload)] = payload
                model[k] = bytes(old)
        assert sorted(t.list()) == sorted(model)
    got = t.get_partial_values([(key(t, c), ByteRange(0)) for c in GRID])
    assert dict(zip([key(t, c) for c in GRID], got, strict=True)) == {key(t, c): model.get(key(t, c)) for c in GRID}
    for blob in under.data.values():
        for offset, nbytes in parse_shard(blob, 6):
            assert (offset, nbytes) == (EMPTY, EMPTY) or offset + nbytes <= len(blob) - 16 * 6
