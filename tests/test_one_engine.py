"""One engine under every path: the draft transformer uses ShardIO's cache, range merging and merge rule.

* Request counts at the bottom of the stack (a counting fsspec memory
  filesystem under ``AdapterStore``): a warm single-chunk read through the
  2022 draft transformer is one request; a batch of adjacent chunks of one
  shard is one ranged request covering exactly their bytes.
* The out-of-grid rule: a shard holding chunks outside the current chunk
  grid (written with a larger shape) is merged the same way through
  ``ShardedStore``, the draft proxy and the transformer: the out-of-grid
  chunks are dropped, the in-grid ones kept. Shards are parsed with an
  independent ``struct`` reader.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from typing import Any

import pytest
from counting_fs import memory_mapper

from shardkv import ShardedStore, open_store
from shardkv.format.ranges import ByteRange, ReadPolicy
from shardkv.metadata.documents import DRAFT_ZARR_FORMAT
from shardkv.proxy.draft import DraftShardedStore
from shardkv.transformers import AdapterStore, ShardingStorageTransformer

EMPTY = 2**64 - 1
CPS = (2, 3)
CHUNK_NBYTES = 32


def value_for(coords: tuple[int, int], tag: bytes = b"") -> bytes:
    return (tag + bytes([16 * coords[0] + coords[1]]) * CHUNK_NBYTES)[:CHUNK_NBYTES]


@pytest.fixture
def counted() -> Any:
    mapper, fs = memory_mapper()
    yield mapper, fs
    fs.rm(fs.count_root, recursive=True)


def transformer(under: Any, shape: tuple[int, int] = (8, 12), **options: Any) -> ShardingStorageTransformer:
    return ShardingStorageTransformer(under, CPS, array_path="a", shape=shape, chunk_shape=(2, 2), **options)


def shard_chunks(blob: bytes, checksum: bool) -> dict[tuple[int, int], bytes]:
    """Independent reader of an index-at-the-end shard: {local coords: chunk bytes}."""
    n = CPS[0] * CPS[1]
    start = len(blob) - 16 * n - (4 if checksum else 0)
    out = {}
    for i in range(n):
        offset, nbytes = struct.unpack_from("<QQ", blob, start + 16 * i)
        if (offset, nbytes) != (EMPTY, EMPTY):
            assert offset + nbytes <= start
            out[divmod(i, CPS[1])] = blob[offset : offset + nbytes]
    return out


# -- (a) the index cache and range merging, counted at the bottom of the stack ----------------------


def test_warm_single_chunk_read_is_one_request(counted) -> None:
    mapper, fs = counted
    t = transformer(AdapterStore(mapper))
    t.set_values({t.chunk_key((i, j)): value_for((i, j)) for i in range(2) for j in range(3)})
    reader = transformer(AdapterStore(mapper))
    fs.reset()
    assert reader.get(reader.chunk_key((1, 1))) == value_for((1, 1))
    assert [(r.start, r.end) for r in fs.reads()][0] == (-16 * 6, None)  # cold: index, then chunk
    assert len(fs.reads()) == 2
    fs.reset()
    assert reader.get(reader.chunk_key((0, 2))) == value_for((0, 2))
    assert [r.nbytes for r in fs.reads()] == [CHUNK_NBYTES]  # warm: the chunk's bytes only
    assert reader.index_cache.hits == 1
    fs.reset()
    assert t.get(t.chunk_key((1, 2))) == value_for((1, 2))  # the writer cached what it wrote
    assert len(fs.reads()) == 1


@pytest.mark.parametrize("fraction", [0.5, 2.0], ids=["whole-shard-allowed", "ranges-only"])
def test_adjacent_chunks_of_one_shard_are_one_ranged_request(counted, fraction: float) -> None:
    mapper, fs = counted
    t = transformer(AdapterStore(mapper), read_policy=ReadPolicy(whole_shard_fraction=fraction))
    t.set_values({t.chunk_key((i, j)): value_for((i, j)) for i in range(2) for j in range(3)})
    wanted = [(0, 1), (0, 2), (1, 0)]  # local coords 1, 2, 3: adjacent in the shard, 3 of 6 chunks
    fs.reset()
    got = t.get_partial_values([(t.chunk_key(c), ByteRange(0)) for c in wanted])
    assert got == [value_for(c) for c in wanted]
    reads = fs.reads()
    assert len(reads) == 1 and fs.batches == ["cat_ranges"]
    if fraction > 1:
        assert (reads[0].start, reads[0].end) == (CHUNK_NBYTES, 4 * CHUNK_NBYTES)  # exactly their bytes
    else:
        assert reads[0].nbytes == 6 * CHUNK_NBYTES + 16 * 6  # half the shard: the whole shard, one request


def test_byte_ranges_inside_chunks_ride_on_the_merged_request(counted) -> None:
    mapper, fs = counted
    t = transformer(AdapterStore(mapper), read_policy=ReadPolicy(whole_shard_fraction=2.0))
    t.set_values({t.chunk_key((0, j)): value_for((0, j), b"abcdef") for j in range(3)})
    fs.reset()
    k0, k1 = t.chunk_key((0, 0)), t.chunk_key((0, 1))
    got = t.get_partial_values([(k0, ByteRange(2, 5)), (k1, ByteRange.suffix(4)), (k1, ByteRange(0, 3))])
    assert got == [b"cde", value_for((0, 1), b"abcdef")[-4:], b"abc"]
    assert len(fs.reads()) == 1


# -- (b) the out-of-grid rule, the same on every path ------------------------------------------------------

BIG, SMALL = (8, 12), (5, 7)  # chunk grids (4, 6) and (3, 4); shard (1, 0) keeps only chunk row 2
SHARD_CHUNKS = [(2, 0), (2, 1), (2, 2), (3, 0), (3, 1), (3, 2)]
EXPECTED = {(0, 0): value_for((2, 0)), (0, 1): value_for((2, 1), b"new"), (0, 2): value_for((2, 2))}


def _zarray(shape: tuple[int, int]) -> bytes:
    return json.dumps(
        {
            "zarr_format": 2,
            "shape": list(shape),
            "chunks": [2, 2],
            "dtype": "|u1",
            "compressor": None,
            "fill_value": 0,
            "filters": None,
            "order": "C",
            "dimension_separator": ".",
        }
    ).encode()


def _via_sharded_store(base: dict, **options: Any) -> tuple[bytes, Callable[[tuple[int, int]], bytes]]:
    big = ShardedStore({}, chunks_per_shard=CPS, **options)
    big[".zarray"] = _zarray(BIG)
    big.setitems({f"{i}.{j}": value_for((i, j)) for i, j in SHARD_CHUNKS})
    small = ShardedStore(base, chunks_per_shard=CPS, **options)
    small[".zarray"] = _zarray(SMALL)
    small.base.put("1.0", big.base.get("1.0").whole())  # a shard another writer stored with the larger shape
    small["2.1"] = value_for((2, 1), b"new")
    return bytes(small.base.get("1.0").whole()), lambda c: small[f"{c[0]}.{c[1]}"]


def _draft_meta(shape: tuple[int, int]) -> bytes:
    return json.dumps(
        {
            "shape": list(shape),
            "data_type": "|u1",
            "chunk_memory_layout": "C",
            "fill_value": 0,
            "chunk_grid": {"type": "regular", "chunk_shape": [2, 2], "separator": "/"},
            "extensions": [],
            "attributes": {},
        }
    ).encode()


def via_draft_proxy(base: dict) -> tuple[bytes, Callable[[tuple[int, int]], bytes]]:
    base["zarr.json"] = json.dumps({"zarr_format": DRAFT_ZARR_FORMAT, "metadata_key_suffix": ".json"}).encode()
    proxy = open_store(base, chunks_per_shard=CPS, layout="draft2022")
    assert isinstance(proxy, DraftShardedStore)
    proxy["meta/root/a.array.json"] = _draft_meta(BIG)
    proxy.setitems({f"data/root/a/c{i}/{j}": value_for((i, j)) for i, j in SHARD_CHUNKS})
    proxy["meta/root/a.array.json"] = _draft_meta(SMALL)  # a shrink the proxy does not trim
    proxy["data/root/a/c2/1"] = value_for((2, 1), b"new")
    return base["data/root/a/c1/0"], lambda c: proxy[f"data/root/a/c{c[0]}/{c[1]}"]


def via_transformer(base: dict) -> tuple[bytes, Callable[[tuple[int, int]], bytes]]:
    under = AdapterStore(base)
    transformer(under, BIG).set_values({f"data/root/a/c{i}/{j}": value_for((i, j)) for i, j in SHARD_CHUNKS})
    t = transformer(under, SMALL)
    t.set("data/root/a/c2/1", value_for((2, 1), b"new"))
    return base["data/root/a/c1/0"], lambda c: t.get(t.chunk_key(c))


PATHS = {
    "ShardedStore": (lambda base: _via_sharded_store(base), True),
    "ShardedStore-no-crc": (lambda base: _via_sharded_store(base, index_checksum=False), False),
    "draft-proxy": (via_draft_proxy, False),
    "transformer": (via_transformer, False),
}


@pytest.mark.parametrize("path", list(PATHS))
def test_merging_a_shard_drops_chunks_outside_the_grid_on_every_path(path: str) -> None:
    build, checksum = PATHS[path]
    shard, read = build({})
    assert shard_chunks(shard, checksum) == EXPECTED
    for (i, j), local in zip(SHARD_CHUNKS[:3], EXPECTED, strict=True):
        assert read((i, j)) == EXPECTED[local]


def test_every_path_stores_the_same_chunk_bytes() -> None:
    results = {name: shard_chunks(build({})[0], checksum) for name, (build, checksum) in PATHS.items()}
    assert all(r == results["transformer"] for r in results.values())
    draft, transformed = via_draft_proxy({})[0], via_transformer({})[0]
    assert draft == transformed  # same layout, same merge: the same bytes
