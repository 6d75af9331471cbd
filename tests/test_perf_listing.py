"""Listings built from shard indexes: the keys are right, and each is built without per-key work it does not need.

Pure checks of :mod:`shardkv.keys.listing` against a key-by-key reference
(every encoding, edge shards, sparse and full shards), then counts through
``ShardedStore``: ``list(store.keys())`` enumerates the base listing once,
``len`` and zarr-python 2's ``nchunks_initialized`` (``listdir`` of the array)
read each index once and build no chunk key through the encoder, and
``listdir`` returns what zarr 2's ``DirectoryStore`` returns for the same
chunks unsharded.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterator, KeysView, MutableMapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

from shardkv import ShardedStore
from shardkv.format.layout import ShardLayout
from shardkv.keys.listing import shard_chunk_count, shard_chunk_keys, sorted_chunk_names
from shardkv.keys.space import (
    ChunkKeyEncoding,
    DefaultChunkKeyEncoding,
    Draft2022ChunkKeyEncoding,
    ShardedArray,
    V2ChunkKeyEncoding,
)
from shardkv.storage.kv import Generation, ReadRequest, ReadResult
from shardkv.storage.local import LocalStore

ENCODINGS = [
    V2ChunkKeyEncoding("."),
    V2ChunkKeyEncoding("/"),
    DefaultChunkKeyEncoding("/"),
    DefaultChunkKeyEncoding("."),
    Draft2022ChunkKeyEncoding("/"),
]


def array(
    shape: tuple[int, ...] | None, cps: tuple[int, ...], enc: ChunkKeyEncoding, prefix: str = "g/a/"
) -> ShardedArray:
    chunks = None if shape is None else (1,) * len(cps)
    return ShardedArray("g/a", prefix, shape, chunks, ShardLayout.v3(cps), enc, enc)


def reference_keys(arr: ShardedArray, shard: tuple[int, ...], mask: np.ndarray, in_grid_only: bool) -> list[str]:
    """Key by key, through the encoder: the stored local coords in row-major order, in the grid when asked."""
    out = []
    for local in itertools.product(*(range(n) for n in arr.chunks_per_shard)):
        coords = arr.chunk_coords(shard, local)
        if mask[local] and (not in_grid_only or arr.in_grid(coords)):
            out.append(arr.chunk_key(coords))
    return out


MASKS = ["full", "empty", "half", "sparse", "one"]


def make_mask(kind: str, cps: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if kind == "full":
        return np.ones(cps, dtype=bool)
    if kind == "empty":
        return np.zeros(cps, dtype=bool)
    if kind == "one":
        mask = np.zeros(cps, dtype=bool)
        mask[tuple(n - 1 for n in cps)] = True
        return mask
    return rng.random(cps) < (0.5 if kind == "half" else 0.05)


@pytest.mark.parametrize("enc", ENCODINGS, ids=lambda e: f"{e.name}{e.separator}")
@pytest.mark.parametrize(
    "shape, cps, shard",
    [
        ((10,), (4,), (0,)),
        ((10,), (4,), (2,)),  # edge shard: 2 of 4 chunks in the grid
        ((23, 17), (4, 8), (5, 2)),  # edge in both dimensions
        ((23, 17), (4, 8), (1, 0)),
        ((5, 6, 7), (2, 3, 4), (2, 1, 1)),
        (None, (3, 4), (7, 11)),  # unknown grid: every chunk of the shard counts
    ],
)
@pytest.mark.parametrize("kind", MASKS)
@pytest.mark.parametrize("in_grid_only", [True, False])
def test_shard_chunk_keys_match_the_encoder_key_by_key(
    enc: ChunkKeyEncoding, shape: Any, cps: tuple[int, ...], shard: tuple[int, ...], kind: str, in_grid_only: bool
) -> None:
    arr = array(shape, cps, enc)
    mask = make_mask(kind, cps, np.random.default_rng(sum(shard) + len(kind)))
    expected = reference_keys(arr, shard, mask, in_grid_only)
    assert shard_chunk_keys(arr, shard, mask, in_grid_only) == expected
    assert shard_chunk_count(arr, shard, mask, in_grid_only) == len(expected)


def test_shard_chunk_keys_of_a_root_array_and_a_0d_array() -> None:
    root = array((9, 9), (4, 4), V2ChunkKeyEncoding("."), prefix="")
    mask = np.ones((4, 4), dtype=bool)
    assert shard_chunk_keys(root, (2, 0), mask) == ["8.0", "8.1", "8.2", "8.3"]
    zero_d = ShardedArray("z", "z/", (), (), ShardLayout.v3(()), V2ChunkKeyEncoding("."), V2ChunkKeyEncoding("."))
    assert shard_chunk_keys(zero_d, (), np.ones((), dtype=bool)) == ["z/0"]
    assert shard_chunk_keys(zero_d, (), np.zeros((), dtype=bool)) == []


@pytest.mark.parametrize("shape, cps", [((130, 7), (8, 4)), ((25,), (4,)), ((11, 12, 13), (4, 4, 4))])
@pytest.mark.parametrize("kind", MASKS)
def test_sorted_chunk_names_are_the_sorted_suffixes(shape: tuple[int, ...], cps: tuple[int, ...], kind: str) -> None:
    arr = array(shape, cps, V2ChunkKeyEncoding("."))
    rng = np.random.default_rng(len(shape) + len(kind))
    grid = arr.shard_grid_shape
    assert grid is not None
    shards = [(s, make_mask(kind, cps, rng)) for s in itertools.product(*(range(n) for n in grid))]
    stored = shards[::2] if kind == "half" else shards  # some shards not stored at all
    expected = sorted(k[len(arr.key_prefix) :] for s, m in stored for k in reference_keys(arr, s, m, True))
    assert sorted_chunk_names(arr, reversed(stored), len(stored)) == expected


def test_sorted_chunk_names_declines_other_forms_and_sparse_grids() -> None:
    full = np.ones((4, 4), dtype=bool)
    nested = array((40, 40), (4, 4), V2ChunkKeyEncoding("/"))
    assert sorted_chunk_names(nested, [((0, 0), full)], 100) is None  # names are first coordinates
    default = array((40, 40), (4, 4), DefaultChunkKeyEncoding("."))
    assert sorted_chunk_names(default, [((0, 0), full)], 100) is None  # names start with "c"
    huge = array((10**6, 10**6), (4, 4), V2ChunkKeyEncoding("."))
    assert sorted_chunk_names(huge, [((0, 0), full)], 1) is None  # a grid mask would be 10**12 entries


# -- through the proxy: counts ------------------------------------------------------


class CountingMapping(MutableMapping[str, Any]):
    """A base store that counts listings (``__iter__``) and reads (``__getitem__``, per key)."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}
        self.listings = 0
        self.reads: Counter[str] = Counter()

    def __getitem__(self, key: str) -> Any:
        self.reads[key] += 1
        return self.data[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self.data[key] = value

    def __delitem__(self, key: str) -> None:
        del self.data[key]

    def __iter__(self) -> Iterator[str]:
        self.listings += 1
        return iter(list(self.data))

    def __len__(self) -> int:
        return len(self.data)

    def reset(self) -> None:
        self.listings = 0
        self.reads.clear()


SHAPE, CHUNKS, CPS = (36, 28), (2, 2), 4  # chunk grid 18 x 14, shard grid 5 x 4 (edge shards)


def written(base: MutableMapping[str, Any], path: str = "arr") -> tuple[ShardedStore, np.ndarray]:
    """An array with a few chunks left unwritten (fill value, ``write_empty_chunks=False``)."""
    store = ShardedStore(base, chunks_per_shard=CPS, concurrency="process")
    z = zarr.open_array(
        store,
        mode="w",
        path=path,
        shape=SHAPE,
        chunks=CHUNKS,
        dtype="i2",
        fill_value=0,
        write_empty_chunks=False,
        compressor=None,
    )
    data = np.arange(np.prod(SHAPE), dtype="i2").reshape(SHAPE) % 97 + 1
    data[:6, :6] = 0  # 9 chunks of fill value: not stored
    data[30:, 20:] = 0  # 12 more at an edge
    z[...] = data
    return store, data


@pytest.fixture
def counted() -> tuple[CountingMapping, int]:
    base = CountingMapping()
    store, _ = written(base)
    shards = sum(1 for k in base.data if k.startswith("arr/") and k[4:][0].isdigit())
    return base, shards


@pytest.fixture
def no_encoder(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Counts the chunk keys built one by one through :meth:`ShardedArray.chunk_key`."""
    calls: Counter[str] = Counter()
    original = ShardedArray.chunk_key

    def chunk_key(self: ShardedArray, coords: Any) -> str:
        calls["chunk_key"] += 1
        return original(self, coords)

    monkeypatch.setattr(ShardedArray, "chunk_key", chunk_key)
    return calls


def test_keys_enumerates_the_base_listing_once(counted: tuple[CountingMapping, int], no_encoder: Counter[str]) -> None:
    base, n_shards = counted
    store = ShardedStore(base, concurrency="process")
    base.reset()
    keys = list(store.keys())
    assert base.listings == 1
    assert {k for k, n in base.reads.items() if not k.endswith("zarr.json")} == {
        k for k in base.data if k.startswith("arr/") and k[4:][0].isdigit()
    }
    assert all(n == 1 for n in base.reads.values())  # each shard (a mapping: read whole) once
    assert len(keys) == len(set(keys)) == len(store)
    assert no_encoder["chunk_key"] == 0


def test_len_and_nchunks_initialized_read_each_index_once_and_build_no_key_one_by_one(
    counted: tuple[CountingMapping, int], no_encoder: Counter[str]
) -> None:
    base, n_shards = counted
    store = ShardedStore(base, concurrency="process")
    z = zarr.open_array(store, mode="r", path="arr")
    base.reset()
    assert z.nchunks_initialized == 18 * 14 - 21
    shard_reads = {k: n for k, n in base.reads.items() if not k.endswith(("zarr.json", ".zarray", ".zattrs"))}
    assert len(shard_reads) == n_shards and set(shard_reads.values()) == {1}
    assert base.listings == 1
    base.reset()
    store = ShardedStore(base, concurrency="process")
    assert len(store) == 18 * 14 - 21 + 2  # the chunks, .zarray and .zgroup (.zattrs: none written)
    assert base.listings == 1
    assert no_encoder["chunk_key"] == 0


@pytest.mark.parametrize("path", ["arr", ""])
def test_listing_matches_zarr2_directory_store(tmp_path: Path, path: str) -> None:
    store, data = written(str(tmp_path / "sharded"), path)  # type: ignore[arg-type]
    plain = zarr.DirectoryStore(str(tmp_path / "plain"))
    z = zarr.open_array(
        plain,
        mode="w",
        path=path,
        shape=SHAPE,
        chunks=CHUNKS,
        dtype="i2",
        fill_value=0,
        write_empty_chunks=False,
        compressor=None,
    )
    z[...] = data
    fresh = ShardedStore(str(tmp_path / "sharded"))
    names = fresh.listdir(path)
    assert names == sorted(names) and ".zarray" in names and "zarr.json" not in names
    chunk_names = [n for n in plain.listdir(path) if not n.startswith(".")]
    assert [n for n in names if not n.startswith(".")] == chunk_names
    prefix = f"{path}/" if path else ""
    assert sorted(k for k in fresh.keys() if not k.endswith((".zarray", ".zattrs", ".zgroup"))) == sorted(
        prefix + n for n in chunk_names
    )
    zs = zarr.open_array(fresh, mode="r", path=path)
    assert zs.nchunks_initialized == zarr.open_array(plain, mode="r", path=path).nchunks_initialized
    np.testing.assert_array_equal(zs[...], data)


def test_keys_is_a_set_like_view_with_current_membership() -> None:
    base: dict[str, Any] = {}
    store, _ = written(base)
    keys = store.keys()
    assert isinstance(keys, KeysView)
    assert "arr/10.10" in keys and "arr/0.0" not in keys and "arr/.zarray" in keys
    assert keys == set(store) and len(keys & {"arr/10.10", "nope"}) == 1
    del store["arr/10.10"]
    assert "arr/10.10" not in keys  # `in` asks the store


# -- list(store): at most two listings, and every later len current -----------------------------------------------


def unsharded_keys(data: np.ndarray, path: str = "arr") -> set[str]:
    """The keys zarr-python 2 stores for ``data`` written as :func:`written` writes it, unsharded (the oracle)."""
    plain: dict[str, Any] = {}
    z = zarr.open_array(
        plain,
        mode="w",
        path=path,
        shape=SHAPE,
        chunks=CHUNKS,
        dtype="i2",
        fill_value=0,
        write_empty_chunks=False,
        compressor=None,
    )
    z[...] = data
    return set(plain)


def test_list_of_the_store_enumerates_the_base_listing_at_most_twice(counted: tuple[CountingMapping, int]) -> None:
    base, _ = counted
    store = ShardedStore(base, concurrency="process")
    data = zarr.open_array(store, mode="r", path="arr")[...]
    base.reset()
    keys = list(store)  # iter(store) lists, then len(store) as a length hint counts (a listing of its own)
    assert base.listings <= 2
    assert len(keys) == len(set(keys)) and set(keys) == unsharded_keys(data)
    base.reset()
    assert sorted(store) == sorted(keys) and base.listings <= 2
    base.reset()
    assert sorted(store.keys()) == sorted(keys) and base.listings == 1  # keys(): one listing for iter and len


def _fill_a_stored_chunk_and_a_new_one(store: ShardedStore) -> None:
    """Write one chunk that was fill value (a new key) through ``store``."""
    z = zarr.open_array(store, mode="r+", path="arr")
    z[0:2, 0:2] = 7


def test_len_after_list_is_current_after_a_write_through_the_store(counted: tuple[CountingMapping, int]) -> None:
    base, _ = counted
    store = ShardedStore(base, concurrency="process")
    before = list(store)
    _fill_a_stored_chunk_and_a_new_one(store)
    base.reset()
    assert len(store) == len(before) + 1  # a listing of its own, not the count list() left
    assert base.listings == 1


@pytest.mark.parametrize("kind", ["dict", "directory"])
def test_len_after_list_is_current_after_a_write_by_another_store(tmp_path: Path, kind: str) -> None:
    base: Any = {} if kind == "dict" else str(tmp_path / "data")
    first, data = written(base)
    store = ShardedStore(base)
    before = list(store)
    assert set(before) == unsharded_keys(data)
    _fill_a_stored_chunk_and_a_new_one(ShardedStore(base))  # another store object over the same base
    assert len(store) == len(before) + 1
    data[0:2, 0:2] = 7
    assert set(store) == unsharded_keys(data)


@pytest.mark.parametrize("writer", ["this store", "another store"])
def test_len_after_an_unconsumed_iter_is_current(counted: tuple[CountingMapping, int], writer: str) -> None:
    base, _ = counted
    store = ShardedStore(base, concurrency="process")
    n = len(list(store))
    it = iter(store)
    _fill_a_stored_chunk_and_a_new_one(store if writer == "this store" else ShardedStore(base, concurrency="process"))
    base.reset()
    assert len(store) == n + 1  # len() is not iter()'s length hint here: it lists
    assert base.listings == 1
    assert len(list(it)) == n  # the iterator holds the keys listed when it was made


def test_len_after_a_for_loop_lists_afresh(counted: tuple[CountingMapping, int]) -> None:
    base, _ = counted
    store = ShardedStore(base, concurrency="process")
    n = 0
    for _ in store:
        n += 1
    _fill_a_stored_chunk_and_a_new_one(ShardedStore(base, concurrency="process"))
    base.reset()
    assert len(store) == n + 1
    assert base.listings == 1


# -- warm listings take the generations the store's listing returns --------------------------------------


class CountingLocal(LocalStore):
    """A local directory store that counts listings and the read requests of each key."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.listings = 0
        self.reads: Counter[str] = Counter()

    def get_many(self, reads: Sequence[ReadRequest]) -> list[ReadResult]:
        for key, _, _ in reads:
            self.reads[key] += 1
        return super().get_many(reads)

    def list_prefix(self, prefix: str) -> Iterator[str]:
        self.listings += 1
        return super().list_prefix(prefix)

    def list_generations(
        self, prefix: str, wanted: Callable[[str], bool] | None = None
    ) -> Iterator[tuple[str, Generation | None]]:
        self.listings += 1
        yield from LocalStore.list_generations(self, prefix, wanted)

    def reset(self) -> None:
        self.listings = 0
        self.reads.clear()


def _shard_keys(kv: LocalStore) -> set[str]:
    return {k for k in kv.list_prefix("arr/") if k[4:][0].isdigit()}


LISTINGS: dict[str, Callable[[ShardedStore], object]] = {
    "list": list,
    "len": len,
    "keys": lambda s: list(s.keys()),
    "keys_under": lambda s: list(s.keys_under("arr")),
    "listdir": lambda s: s.listdir("arr"),
    "nchunks_initialized": lambda s: zarr.open_array(s, mode="r", path="arr").nchunks_initialized,
}


@pytest.mark.parametrize("listing", list(LISTINGS))
def test_a_warm_local_listing_reads_no_shard(tmp_path: Path, listing: str) -> None:
    root = str(tmp_path / "data")
    _, data = written(root)
    kv = CountingLocal(root)
    store = ShardedStore(kv)
    run = LISTINGS[listing]
    cold = run(store)  # reads each index once (and caches it with its generation)
    shards = _shard_keys(kv)
    assert {k for k in kv.reads if k in shards} == shards
    kv.reset()
    assert run(store) == cold
    assert not {k for k in kv.reads if k in shards}  # the listing's stat confirmed every cached index
    assert kv.listings == (2 if listing == "list" else 1)  # list(): iter lists, its length hint counts


def test_a_shard_rewritten_by_another_store_is_read_again_by_the_next_listing(tmp_path: Path) -> None:
    root = str(tmp_path / "data")
    _, data = written(root)
    kv = CountingLocal(root)
    store = ShardedStore(kv)
    assert set(store) == unsharded_keys(data)  # warm: every index cached
    _fill_a_stored_chunk_and_a_new_one(ShardedStore(root))  # rewrites shard arr/0.0 (a new file)
    data[0:2, 0:2] = 7
    kv.reset()
    keys = set(store)
    assert keys == unsharded_keys(data) and "arr/0.0" in keys
    assert {k: n for k, n in kv.reads.items() if k in _shard_keys(kv)} == {"arr/0.0": 1}  # the changed one only
