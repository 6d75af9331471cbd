"""Shards are written from their parts, chunks are read as views,
and many keys are routed in one batch with exactly the results and errors of one-by-one routing."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st

from shardkv import ShardedStore
from shardkv.errors import ChunkOutOfGridError, ConfigurationError, InvalidKeyError
from shardkv.format.layout import ShardLayout
from shardkv.keys.space import DefaultChunkKeyEncoding, Draft2022ChunkKeyEncoding, ShardedArray, V2ChunkKeyEncoding

pytestmark = pytest.mark.zarr2

SHAPE, CHUNKS, CPS = (70, 50), (10, 10), 2  # a 7 x 5 chunk grid, edge shards in part
GRID = (7, 5)


def _write(store: Any, data: np.ndarray) -> Any:
    z = zarr.create(shape=SHAPE, chunks=CHUNKS, dtype="f4", store=store, path="a", compressor=None, fill_value=0)
    z[...] = data
    return z


# -- layout: parts, not one joined blob ------------------------------------------------------------


@pytest.mark.parametrize("location", ["end", "start"])
def test_shard_parts_are_the_chunks_themselves(location: str) -> None:
    layout = ShardLayout.v3((2, 3), index_location=location)  # type: ignore[arg-type]
    chunks = {(1, 2): b"late", (0, 0): b"first", (0, 1): memoryview(b"xview")[1:], (1, 0): np.arange(3, dtype="<u2")}
    parts, index = layout.encode_shard_with_index(chunks)
    in_order = [chunks[local] for local in sorted(chunks)]
    body = [p for p in parts if p is not None and any(p is c for c in in_order)]
    assert len(body) == len(in_order) and all(a is b for a, b in zip(body, in_order, strict=True))  # not copied
    shard = b"".join(parts)
    assert layout.index_of_shard(shard, "s") == index
    assert {k: bytes(v) for k, v in layout.chunks_of_shard(shard, "s").items()} == {
        k: bytes(memoryview(v).cast("B")) for k, v in chunks.items()
    }
    assert layout.encode_shard(chunks) == shard


def test_shard_parts_refuse_coords_outside_the_shard_as_before() -> None:
    layout = ShardLayout.v3((2, 2))
    for bad in [(2, 0), (0, -1), (0,), (0, 0, 0)]:
        with pytest.raises(ConfigurationError, match=re.escape(f"local coords {bad} lie outside chunks_per_shard")):
            layout.encode_shard_with_index({(0, 0): b"ok", bad: b"x"})
    parts, index = ShardLayout.v3(()).encode_shard_with_index({(): b"0-d"})
    assert index.get(()) == (0, 3) and parts[0] == b"0-d"


# -- reads: views into what the base store returned ------------------------------------------------


@pytest.mark.parametrize("base", ["dict", "local"])
def test_chunks_are_read_only_views_equal_to_zarrs_own(base: str, tmp_path: Path) -> None:
    data = np.random.default_rng(1).standard_normal(SHAPE).astype("f4")
    plain: dict[str, bytes] = {}
    _write(plain, data)  # zarr 2 on a plain dict: the reference bytes
    sharded: Any = {} if base == "dict" else str(tmp_path / "store")
    _write(ShardedStore(sharded, chunks_per_shard=CPS), data)
    store = ShardedStore(sharded)
    keys = [f"a/{i}.{j}" for i, j in itertools.product(range(GRID[0]), range(GRID[1]))]
    got = store.getitems(keys, contexts={})
    assert sorted(got) == sorted(keys)
    for key in keys:
        value = got[key]
        assert isinstance(value, memoryview) and value.readonly
        assert bytes(value) == plain[key]
    if base == "dict":  # views of the stored shard object itself: nothing was copied
        assert got["a/0.0"].obj is sharded["a/0.0"] and got["a/1.1"].obj is sharded["a/0.0"]
    assert type(store["a/6.4"]) is bytes and store["a/6.4"] == plain["a/6.4"]  # alone: a copy of the chunk only
    np.testing.assert_array_equal(zarr.open_array(store, path="a", mode="r")[...], data)


def test_mutable_stored_shards_are_copied_not_viewed() -> None:
    base: dict[str, Any] = {}
    _write(ShardedStore(base, chunks_per_shard=CPS), np.ones(SHAPE, "f4"))
    base["a/0.0"] = bytearray(base["a/0.0"])  # someone else's mutable buffer
    value = ShardedStore(base)["a/0.0"]
    base["a/0.0"][:] = bytes(len(base["a/0.0"]))  # the owner changes its buffer afterwards
    assert bytes(value) == np.ones(CHUNKS, "f4").tobytes()  # what was read is a copy, not a view of it


# -- writes: the shard goes to the base store as parts holding the values given --------------------


def test_full_shards_are_written_from_the_values_given() -> None:
    store = ShardedStore({}, chunks_per_shard=CPS)
    zarr.create(shape=SHAPE, chunks=CHUNKS, dtype="f4", store=store, path="a", compressor=None)
    received: list[dict[str, Any]] = []
    put_many = store.engine.kv.put_many

    def recording(writes: Any) -> Any:  # what the base store's KVStore receives
        received.append({k: v for k, (v, _) in writes.items()})
        return put_many(writes)

    store.engine.kv.put_many = recording  # type: ignore[method-assign]
    values = {f"a/{i}.{j}": bytes([i * 10 + j]) * 400 for i, j in itertools.product(range(2), range(2))}
    store.setitems(values)
    (call,) = received
    (parts,) = call.values()
    assert list(call) == ["a/0.0"] and isinstance(parts, list)
    assert [p for p in parts[:4]] == [values[k] for k in ["a/0.0", "a/0.1", "a/1.0", "a/1.1"]]
    assert all(p is values[k] for p, k in zip(parts[:4], ["a/0.0", "a/0.1", "a/1.0", "a/1.1"], strict=True))
    assert bytes(store["a/1.0"]) == values["a/1.0"]


# -- batch routing = key-by-key routing ------------------------------------------------------------


ARRAYS = {
    "v2-dot": ("g/a/", V2ChunkKeyEncoding(".")),
    "v2-slash": ("g/a/", V2ChunkKeyEncoding("/")),
    "v2-root": ("", V2ChunkKeyEncoding(".")),
    "default": ("a/", DefaultChunkKeyEncoding("/")),
    "default-dot": ("a/", DefaultChunkKeyEncoding(".")),
    "draft": ("data/root/a/", Draft2022ChunkKeyEncoding("/")),
}


def _array(name: str, shape: tuple[int, ...] | None = (70, 50, 30), cps: tuple[int, ...] = (2, 3, 4)) -> ShardedArray:
    prefix, encoding = ARRAYS[name]
    return ShardedArray(
        "a",
        prefix,
        shape,
        (10, 10, 10),
        ShardLayout.v3(cps),
        encoding,
        V2ChunkKeyEncoding("."),
    )


@pytest.mark.parametrize("name", sorted(ARRAYS))
def test_locate_batch_equals_locate_one_by_one(name: str) -> None:
    arr = _array(name)
    coords = list(itertools.product(range(7), range(5), range(3)))
    keys = [arr.chunk_key(c) for c in reversed(coords)] + [arr.chunk_key((6, 4, 2))]  # any order, repeats
    batch = arr.locate_batch(keys)
    assert batch == [arr.locate(k) for k in keys]
    assert [r.chunk_coords for r in batch] == [arr.chunk_coords_of(k) for k in keys]  # type: ignore[union-attr]
    # one tuple per distinct shard / local coords, shared by the keys that have them
    assert len({id(r.shard_coords) for r in batch}) == len({r.shard_coords for r in batch})  # type: ignore[union-attr]
    assert arr.locate_batch(keys, check_grid=False) == batch


@pytest.mark.parametrize("name", sorted(ARRAYS))
def test_locate_batch_declines_what_locate_refuses(name: str) -> None:
    arr = _array(name)
    good = [arr.chunk_key((i, 0, 0)) for i in range(5)]
    prefix = ARRAYS[name][0]
    bad_keys = [
        arr.chunk_key((7, 0, 0)),  # outside the grid
        arr.chunk_key((1, 0, 0)).replace("1", "01", 1),  # not canonical
        prefix + "x",
        arr.chunk_key((1, 0)),  # too few coords
        arr.chunk_key((10**18, 0, 0)),  # beyond int64 parsing: the slow path decides
        "\n".join([arr.chunk_key((0, 0, 0)), arr.chunk_key((1, 0, 0))]),  # looks like two keys
        prefix + ".zarray",
    ]
    for bad in bad_keys:
        keys = good + [bad]
        assert arr.locate_batch(keys) is None, bad
        with pytest.raises((InvalidKeyError, ChunkOutOfGridError)):
            arr.locate(bad)
    assert arr.locate_batch(good + [1]) is None  # type: ignore[list-item]
    assert arr.locate_batch([]) is None
    outside = [arr.chunk_key((7, 0, 0))]
    assert arr.locate_batch(outside, check_grid=False) == [arr.locate(outside[0], check_grid=False)]


def test_locate_batch_without_a_grid_and_in_0d() -> None:
    arr = _array("v2-dot", shape=None)
    keys = [arr.chunk_key((100, 200, 3000)), arr.chunk_key((0, 0, 0)), arr.chunk_key((10**12, 1, 1))]
    assert arr.locate_batch(keys) == [arr.locate(k) for k in keys]
    far = keys + [arr.chunk_key((10**17, 10**17, 1))]  # shards too far apart to number: key by key
    assert arr.locate_batch(far) is None
    zero_d = ShardedArray("z", "z/", (), (), ShardLayout.v3(()), V2ChunkKeyEncoding("."), V2ChunkKeyEncoding("."))
    assert zero_d.locate_batch(["z/0"]) is None


def _zarr_store() -> tuple[dict[str, Any], ShardedStore]:
    base: dict[str, Any] = {}
    store = ShardedStore(base, chunks_per_shard=CPS)
    _write(store, np.arange(np.prod(SHAPE), dtype="f4").reshape(SHAPE))
    return base, store


def test_proxy_batches_keep_every_error_of_one_by_one_routing() -> None:
    base, store = _zarr_store()
    keys = [f"a/{i}.{j}" for i, j in itertools.product(range(GRID[0]), range(GRID[1]))]
    cases = [
        ("a/7.0", ChunkOutOfGridError, "outside the chunk grid"),
        ("a/01.0", InvalidKeyError, "canonical"),
        ("a//1.0", InvalidKeyError, "empty path segment"),
        ("a/1.0/..", InvalidKeyError, "only periods"),
    ]
    for bad, error, message in cases:
        with pytest.raises(error, match=message):
            store.getitems(keys + [bad])
        with pytest.raises(error, match=message):
            store.setitems({k: b"x" for k in keys + [bad]})
    with pytest.raises(TypeError, match="store keys are str"):
        store.getitems(keys + [3])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="value for key 'a/0.1' must be bytes-like"):
        store.setitems({k: (object() if k == "a/0.1" else b"x") for k in keys})
    expected = np.arange(np.prod(SHAPE), dtype="f4").reshape(SHAPE)[:10, :10].tobytes()
    assert bytes(store["a/0.0"]) == expected  # nothing was written
    store.delitems(keys[:10] + ["a/7.0", "a/9.9"])  # out-of-grid keys are ignored, as before
    assert not any(k in store for k in keys[:10]) and "a/2.0" in store


def test_proxy_batches_of_mixed_keys_route_each_key() -> None:
    base, store = _zarr_store()
    keys = ["a/.zarray", "a/.zattrs"] + [f"a/{i}.0" for i in range(GRID[0])]
    got = store.getitems(keys)
    assert "a/.zarray" in got and set(keys[2:]) <= set(got)
    store.setitems({"a/.zattrs": b'{"x": 1}', **{k: bytes(got[k]) for k in keys[2:]}})
    assert json.loads(store["a/.zattrs"]) == {"x": 1}  # presented from the array's zarr.json
    assert store.getitems(["a/zarr.json"] + keys[2:]).keys() == set(keys[2:])  # the managed zarr.json stays hidden


@settings(max_examples=200, deadline=None)
@given(
    name=st.sampled_from(sorted(ARRAYS)),
    coords=st.lists(st.tuples(st.integers(0, 8), st.integers(0, 6), st.integers(0, 4)), min_size=1, max_size=40),
    mutation=st.sampled_from(["", "0", "x", ".", "/", "\n"]),
    where=st.integers(0, 39),
)
def test_locate_batch_is_locate_or_declines(name: str, coords: list, mutation: str, where: int) -> None:
    arr = _array(name)
    keys = [arr.chunk_key(c) for c in coords]
    if mutation:
        i = where % len(keys)
        keys[i] = keys[i][: where % (len(keys[i]) + 1)] + mutation + keys[i][where % (len(keys[i]) + 1) :]
    batch = arr.locate_batch(keys)
    try:
        one_by_one = [arr.locate(k) for k in keys]
    except (InvalidKeyError, ChunkOutOfGridError):
        assert batch is None
        return
    assert batch is None or batch == one_by_one
    if not mutation:
        assert batch == one_by_one  # in-grid canonical keys always take the batch path
