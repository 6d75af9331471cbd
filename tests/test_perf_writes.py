"""Write path costs, measured: bytes and requests reaching the base store.

The array: float64, shape (32, 48), inner chunks (8, 8) (512 bytes each, no
compressor: deterministic sizes), chunks_per_shard (2, 3) -> chunk grid (4, 6),
shard grid (2, 2), 6 chunks per shard. It is written the way legacy code
does it: zarr-python 2.18, one ``z[block] = ...`` per inner chunk.

Writes are recorded by a counting fsspec filesystem (``memory://``) or, on a
local directory, by wrapping the adapter's atomic writes and positional writes
(:func:`counting_fs.record_local_writes`).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from counting_fs import Request, local_mapper, memory_mapper, record_local_writes

from shardkv import ShardedStore

SHAPE, CHUNKS, CPS = (32, 48), (8, 8), (2, 3)
GRID = (4, 6)
CHUNK_NBYTES = 8 * 8 * 8
DATA = np.arange(32 * 48, dtype="f8").reshape(SHAPE)
ARRAY_NBYTES = DATA.nbytes


def blocks() -> Iterator[tuple[tuple[int, int], tuple[slice, slice]]]:
    """Every inner chunk's coords and region, in row-major order of the chunk grid."""
    for i, j in itertools.product(range(GRID[0]), range(GRID[1])):
        yield (i, j), (slice(8 * i, 8 * i + 8), slice(8 * j, 8 * j + 8))


def shard_of(chunk: tuple[int, int]) -> str:
    return f"a/{chunk[0] // CPS[0]}.{chunk[1] // CPS[1]}"


def last_chunk_of_each_shard() -> dict[str, tuple[int, int]]:
    last: dict[str, tuple[int, int]] = {}
    for chunk, _ in blocks():
        last[shard_of(chunk)] = chunk  # row-major: the last one seen wins
    return last


class Probe:
    """Data (non-metadata) reads and writes of one base store."""

    def __init__(self, mapper: Any, fs: Any, local_log: list[Request] | None) -> None:
        self.mapper, self.fs, self.local_log = mapper, fs, local_log

    def reset(self) -> None:
        self.fs.reset()
        if self.local_log is not None:
            self.local_log.clear()

    def writes(self) -> list[Request]:
        if self.local_log is not None:
            return [r for r in self.local_log if not r.key.endswith((".zarray", "zarr.json", ".zattrs"))]
        return self.fs.writes()

    def reads(self) -> list[Request]:
        return self.fs.reads()


@pytest.fixture(params=["memory", "local"])
def probe(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Probe]:
    if request.param == "memory":
        mapper, fs = memory_mapper()
        yield Probe(mapper, fs, None)
        fs.rm(fs.count_root, recursive=True)
    else:
        mapper, fs = local_mapper(str(tmp_path / "store"))
        yield Probe(mapper, fs, record_local_writes(monkeypatch, str(tmp_path / "store")))


def create(store: ShardedStore) -> Any:
    return zarr.open_array(store, mode="w", path="a", shape=SHAPE, chunks=CHUNKS, dtype="f8", compressor=None)


def write_chunk_by_chunk(z: Any, data: np.ndarray, after_each: Callable[[tuple[int, int]], None] | None = None) -> None:
    for chunk, region in blocks():
        z[region] = data[region]
        if after_each is not None:
            after_each(chunk)


# -- write-back: each shard written once ------------------------------------------------


def test_write_back_writes_each_shard_once_when_complete(probe: Probe) -> None:
    store = ShardedStore(probe.mapper, chunks_per_shard=CPS, buffer_bytes=1 << 20)
    z = create(store)
    probe.reset()
    written_at: dict[str, tuple[int, int]] = {}

    def note(chunk: tuple[int, int]) -> None:
        for w in probe.writes():
            written_at.setdefault(w.key, chunk)

    write_chunk_by_chunk(z, DATA, note)
    writes = probe.writes()
    assert Counter(w.key for w in writes) == {k: 1 for k in last_chunk_of_each_shard()}
    assert written_at == last_chunk_of_each_shard()  # written as soon as complete, not at flush
    assert probe.reads() == []  # complete shards need no read
    ratio = sum(w.nbytes for w in writes) / ARRAY_NBYTES
    assert ratio <= 1.1

    probe.reset()
    store.flush()
    assert probe.writes() == []  # nothing was left in the buffer
    np.testing.assert_array_equal(zarr.open_array(ShardedStore(probe.mapper), mode="r", path="a")[:], DATA)


def test_without_write_back_each_chunk_rewrites_its_shard(probe: Probe) -> None:
    store = ShardedStore(probe.mapper, chunks_per_shard=CPS)
    z = create(store)
    probe.reset()
    write_chunk_by_chunk(z, DATA)
    writes = probe.writes()
    assert len(writes) == GRID[0] * GRID[1]  # one shard write per chunk write
    assert Counter(w.key for w in writes) == {k: 6 for k in last_chunk_of_each_shard()}
    ratio = sum(w.nbytes for w in writes) / ARRAY_NBYTES
    assert ratio > 2  # O(chunks per shard): 1 + 2 + ... + 6 chunks per shard, about 3.5x
    assert len(probe.reads()) > 0  # read-modify-write of partly written shards
    np.testing.assert_array_equal(z[:], DATA)


def test_write_back_with_a_small_buffer_still_writes_less_than_without(probe: Probe) -> None:
    """A buffer that holds less than one shard forces shards out early; they are merged, not lost."""
    store = ShardedStore(probe.mapper, chunks_per_shard=CPS, buffer_bytes=3 * CHUNK_NBYTES)
    z = create(store)
    probe.reset()
    write_chunk_by_chunk(z, DATA)
    store.flush()
    ratio = sum(w.nbytes for w in probe.writes()) / ARRAY_NBYTES
    assert ratio < 3.5
    np.testing.assert_array_equal(zarr.open_array(ShardedStore(probe.mapper), mode="r", path="a")[:], DATA)
