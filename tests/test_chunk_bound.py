"""Index entry bound derived from the inner chunk.

Layouts built from array metadata bound each index entry's ``nbytes`` by
``prod(inner chunk shape) * itemsize * 2 + 65536``. On a store that does not
tell sizes for free (fsspec ``memory://``), an entry just above that bound is refused before any read of its
size; an entry at the bound is still requested.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterator
from typing import Any

import crc32c
import fsspec
import numpy as np
import pytest
import zarr

from shardkv import ShardedStore
from shardkv.errors import CorruptShardError
from shardkv.format.layout import chunk_nbytes_bound
from shardkv.metadata.v3_view import sharding_spec_from_v3
from shardkv.storage.fsspec import FsspecStore
from transformers.sharding import ShardingStorageTransformer

CPS = 4
CHUNK = 8
INDEX_NBYTES = 16 * CPS + 4
BOUND = CHUNK * 1 * 2 + 65536  # u1 chunks of 8 elements


@pytest.fixture()
def sizeless(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, list[int]]]:
    """A ``memory://`` root whose sizes are not free, and the lengths of every ranged read issued."""
    lengths: list[int] = []
    original = FsspecStore.get_many

    def counting(self: FsspecStore, requests: Any) -> Any:
        for _, ranges, _ in requests:
            for r in ranges or ():
                lengths.append(-1 if r.stop is None else r.stop - r.start)
        return [dataclasses.replace(result, size=None) for result in original(self, requests)]  # sizes not free

    monkeypatch.setattr(FsspecStore, "get_many", counting)
    root = f"memory://bound-{uuid.uuid4().hex}"
    yield root, lengths
    fs = fsspec.filesystem("memory")
    for path in list(fs.store):
        if root.split("://")[1] in path:
            fs.rm(path)


def _write(root: str) -> bytes:
    store = ShardedStore(root, chunks_per_shard=CPS)
    z = zarr.open_array(store, mode="w", path="a", shape=(32,), chunks=(CHUNK,), dtype="u1", compressor=None)
    z[:] = np.arange(32, dtype="u1")
    return bytes(store.base.get("a/0").whole())


def _with_entry(valid: bytes, nbytes: int) -> bytes:
    entries = np.frombuffer(valid[-INDEX_NBYTES:-4], dtype="<u8").reshape(CPS, 2).copy()
    entries[0] = (0, nbytes)
    raw = entries.tobytes()
    return valid[:-INDEX_NBYTES] + raw + crc32c.crc32c(raw).to_bytes(4, "little")


def test_layout_from_metadata_carries_the_derived_bound(sizeless: tuple[str, list[int]]) -> None:
    root, _ = sizeless
    _write(root)
    stored = json.loads(fsspec.filesystem("memory").cat_file(root.split("://")[1] + "/a/zarr.json"))
    spec = sharding_spec_from_v3(stored, "a")
    assert spec is not None and spec.layout.max_chunk_nbytes == BOUND == chunk_nbytes_bound((CHUNK,), 1)


def test_entry_above_the_bound_is_refused_without_reading_it(sizeless: tuple[str, list[int]]) -> None:
    root, lengths = sizeless
    valid = _write(root)
    fs = fsspec.filesystem("memory")
    fs.pipe_file(root.split("://")[1] + "/a/0", _with_entry(valid, BOUND + 1))
    lengths.clear()
    store = ShardedStore(root, index_cache_bytes=0)
    with pytest.raises(CorruptShardError, match="a/0") as info:
        store["a/0"]
    assert info.value.shard_key.endswith("a/0")
    assert lengths and max(lengths) < BOUND  # the index was read, the bogus chunk never was


def test_entry_within_the_bound_still_reads(sizeless: tuple[str, list[int]]) -> None:
    root, lengths = sizeless
    valid = _write(root)
    store = ShardedStore(root, index_cache_bytes=0)
    lengths.clear()
    assert bytes(store["a/0"]) == bytes(range(CHUNK))
    assert lengths and max(lengths) < BOUND
    fs = fsspec.filesystem("memory")
    fs.pipe_file(root.split("://")[1] + "/a/0", _with_entry(valid, BOUND))
    lengths.clear()
    with pytest.raises(CorruptShardError, match="short|a/0"):  # requested, then found short
        store["a/0"]
    assert max(lengths) >= BOUND  # the read of the entry's size was issued


def _v3(data_type: Any, inner_codecs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "zarr_format": 3,
        "node_type": "array",
        "shape": [64, 64],
        "data_type": data_type,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [32, 32]}},
        "chunk_key_encoding": {"name": "default"},
        "fill_value": 0,
        "codecs": [
            {
                "name": "sharding_indexed",
                "configuration": {
                    "chunk_shape": [8, 4],
                    "codecs": inner_codecs or [{"name": "bytes", "configuration": {"endian": "little"}}],
                    "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
                },
            }
        ],
    }


@pytest.mark.parametrize(
    "data_type, expected",
    [
        ("float64", 8 * 4 * 8 * 2 + 65536),
        ("bool", 8 * 4 * 2 + 65536),
        ({"name": "fixed_length_utf32", "configuration": {"length_bytes": 12}}, 8 * 4 * 12 * 2 + 65536),
        ({"name": "numpy.datetime64", "configuration": {"unit": "ns", "scale_factor": 1}}, 8 * 4 * 8 * 2 + 65536),
        ("shardkv.opaque", None),
        ({"name": "some.extension"}, None),
    ],
    ids=["float64", "bool", "utf32", "datetime64", "opaque", "extension"],
)
def test_v3_spec_bound_per_data_type(data_type: Any, expected: int | None) -> None:
    spec = sharding_spec_from_v3(_v3(data_type))
    assert spec is not None
    assert spec.layout.max_chunk_nbytes == expected


def test_nested_sharding_keeps_the_default_bound() -> None:
    nested = [{"name": "sharding_indexed", "configuration": {"chunk_shape": [1, 1]}}]
    spec = sharding_spec_from_v3(_v3("uint8", nested))
    assert spec is not None and spec.layout.max_chunk_nbytes is None


@pytest.mark.parametrize(
    "data_type, expected",
    [("<f4", 4 * 6 * 4 * 2 + 65536), ("bool", 4 * 6 * 2 + 65536), ("r16", 4 * 6 * 2 * 2 + 65536), ("x?", None)],
)
def test_draft_transformer_bound(data_type: str, expected: int | None) -> None:
    meta = {"shape": [8, 12], "data_type": data_type, "chunk_grid": {"chunk_shape": [4, 6], "separator": "/"}}
    entry = {"type": "indexed", "configuration": {"chunks_per_shard": [2, 2]}}
    t = ShardingStorageTransformer.from_metadata(entry, meta, "a", {})  # type: ignore[arg-type]
    assert t.layout.max_chunk_nbytes == expected
