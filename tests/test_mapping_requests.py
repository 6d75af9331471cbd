"""Request counts: what the proxy asks of the base store, counted, never timed.

* On a plain MutableMapping (CountingStore): a full write of an array of 64 chunks in
  4 shards is 4 writes and 0 reads; updating one chunk of a shard is 1 read + 1 write.
* On an fsspec filesystem (a recording MemoryFileSystem): reading one chunk reads the
  shard's index (a suffix or prefix range of exactly ``index_nbytes``) and that chunk's
  exact byte range, and never the whole shard.
"""

from __future__ import annotations

import struct
from math import prod
from typing import Any

import fsspec
import numpy as np
import pytest
import zarr
from fsspec.implementations.memory import MemoryFileSystem

from shardkv import ShardedStore
from shardkv.format.ranges import ReadPolicy

# 16 x 16 elements in 2 x 2 chunks: a grid of 8 x 8 = 64 chunks; 4 x 4 chunks per shard: 4 shards
SHAPE, CHUNKS, CPS = (16, 16), (2, 2), (4, 4)
SHARD_KEYS = {"arr/0.0", "arr/0.1", "arr/1.0", "arr/1.1"}


def _create(store: Any, **kwargs: Any) -> Any:
    return zarr.open_array(
        store, path="arr", mode="w", shape=SHAPE, chunks=CHUNKS, dtype="<i4", compressor=None, fill_value=-1, **kwargs
    )


# -- counting store --------------------------------------------------------------------


def test_full_write_is_one_write_per_shard_and_no_read(counting_store) -> None:
    proxy = ShardedStore(counting_store, chunks_per_shard=CPS, concurrency="process")
    z = _create(proxy)
    data = np.arange(256, dtype="<i4").reshape(SHAPE)
    counting_store.reset()
    z[:] = data
    assert counting_store.reads == 0, counting_store.log
    assert counting_store.writes == 4, counting_store.log
    assert counting_store.deletes == 0
    assert {key for op, key in counting_store.log if op == "set"} == SHARD_KEYS
    np.testing.assert_array_equal(z[:], data)


def test_partial_update_of_one_shard_is_one_read_and_one_write(counting_store) -> None:
    proxy = ShardedStore(counting_store, chunks_per_shard=CPS, concurrency="process")
    z = _create(proxy)
    z[:] = 1
    counting_store.reset()
    z[2:4, 10:12] = 7  # exactly chunk (1, 5), in shard (0, 1)
    assert counting_store.reads == 1, counting_store.log
    assert counting_store.writes == 1, counting_store.log
    assert counting_store.log == [("get", "arr/0.1"), ("set", "arr/0.1")]
    expected = np.ones(SHAPE, dtype="<i4")
    expected[2:4, 10:12] = 7
    np.testing.assert_array_equal(z[:], expected)


def test_update_spanning_two_shards_is_two_reads_and_two_writes(counting_store) -> None:
    proxy = ShardedStore(counting_store, chunks_per_shard=CPS, concurrency="process")
    z = _create(proxy)
    z[:] = 1
    counting_store.reset()
    z[6:10, 0:2] = 3  # chunks (3, 0) and (4, 0): shards (0, 0) and (1, 0)
    assert counting_store.reads == 2 and counting_store.writes == 2, counting_store.log
    assert {k for _, k in counting_store.log} == {"arr/0.0", "arr/1.0"}


def test_whole_shard_write_needs_no_read(counting_store) -> None:
    proxy = ShardedStore(counting_store, chunks_per_shard=CPS, concurrency="process")
    z = _create(proxy)
    z[:] = 1
    counting_store.reset()
    z[8:16, 0:8] = 5  # every chunk of shard (1, 0)
    assert counting_store.log == [("set", "arr/1.0")]


def test_reads_on_a_mapping_fetch_each_shard_once(counting_store) -> None:
    proxy = ShardedStore(counting_store, chunks_per_shard=CPS, concurrency="process")
    z = _create(proxy)
    z[:] = 2
    counting_store.reset()
    assert (z[:] == 2).all()
    assert counting_store.writes == 0
    assert sorted(k for op, k in counting_store.log if op == "get") == sorted(SHARD_KEYS)
    counting_store.reset()
    assert (z[0:2, 0:2] == 2).all()
    assert counting_store.log == [("get", "arr/0.0")]


def test_deleting_by_fill_value_rewrites_one_shard(counting_store) -> None:
    proxy = ShardedStore(counting_store, chunks_per_shard=CPS, concurrency="process")
    z = _create(proxy, write_empty_chunks=False)
    z[:] = 1
    counting_store.reset()
    z[8:16, 8:16] = -1  # the whole of shard (1, 1) back to fill: the shard is deleted
    assert counting_store.writes == 0
    assert ("del", "arr/1.1") in counting_store.log
    assert "arr/1.1" not in counting_store.data


# -- recording fsspec filesystem ---------------------------------------------------------


class RecordingFS(MemoryFileSystem):
    """An in-memory filesystem (private to the instance) that records every read."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.store = {}  # not the class-wide dict every MemoryFileSystem shares
        self.pseudo_dirs = [""]
        self.calls: list[tuple] = []

    def cat_file(self, path, start=None, end=None, **kwargs):  # type: ignore[override]
        self.calls.append(("cat_file", self._strip_protocol(path), start, end))
        return super().cat_file(path, start, end, **kwargs)

    def cat_ranges(self, paths, starts, ends, *args, **kwargs):  # type: ignore[override]
        self.calls.append(("cat_ranges", len(paths)))
        return super().cat_ranges(paths, starts, ends, *args, **kwargs)

    def cat(self, path, *args, **kwargs):  # type: ignore[override]
        self.calls.append(("cat", path))
        return super().cat(path, *args, **kwargs)

    def _open(self, path, mode="rb", **kwargs):  # type: ignore[override]
        if "r" in mode:
            self.calls.append(("open", self._strip_protocol(path)))
        return super()._open(path, mode, **kwargs)

    def file_reads(self, path: str) -> list[tuple[Any, Any]]:
        return [(s, e) for op, p, *rest in self.calls if op == "cat_file" and p == path for s, e in [rest]]


def entries_of(shard: bytes, location: str, checksum: bool) -> list[tuple[int, int]]:
    """(offset, nbytes) per inner chunk, C order, read independently with struct."""
    n = prod(CPS)
    index_nbytes = 16 * n + 4 * checksum
    raw = shard[:index_nbytes] if location == "start" else shard[-index_nbytes:]
    words = struct.unpack("<" + "Q" * (2 * n), raw[: 16 * n])
    return list(zip(words[::2], words[1::2], strict=True))


@pytest.fixture
def recording_fs() -> RecordingFS:
    return RecordingFS(skip_instance_cache=True)


LOCATIONS = [
    pytest.param("end", True, id="index-end-crc32c"),
    pytest.param("start", True, id="index-start-crc32c"),
    pytest.param("end", False, id="index-end-nocrc"),
    pytest.param("start", False, id="index-start-nocrc"),
]


@pytest.mark.parametrize("location, checksum", LOCATIONS)
@pytest.mark.parametrize("via", ["zarr", "mapping"])
def test_reading_one_chunk_reads_the_index_and_that_chunk_only(
    recording_fs: RecordingFS, location: str, checksum: bool, via: str
) -> None:
    root = "/data.zarr"
    writer = ShardedStore(
        fsspec.FSMap(root, recording_fs), chunks_per_shard=CPS, index_location=location, index_checksum=checksum
    )
    z = _create(writer)
    data = np.arange(256, dtype="<i4").reshape(SHAPE)
    z[:] = data

    shard_path = f"{root}/arr/1.1"
    shard = bytes(recording_fs.cat_file(shard_path))
    index_nbytes = 16 * prod(CPS) + 4 * checksum
    local = (1, 2)  # chunk (5, 6) of the grid
    offset, nbytes = entries_of(shard, location, checksum)[local[0] * CPS[1] + local[1]]
    assert nbytes == 2 * 2 * 4 and offset != 2**64 - 1

    reader = ShardedStore(fsspec.FSMap(root, recording_fs))  # fresh: no cached index
    zr = zarr.open_array(reader, path="arr", mode="r")
    # the proxy discovers an array's sharding (its .zarray and zarr.json) once, on first use
    assert reader["arr/0.0"] == data[0:2, 0:2].tobytes()
    recording_fs.calls.clear()
    if via == "zarr":
        np.testing.assert_array_equal(zr[10:12, 12:14], data[10:12, 12:14])
    else:
        assert reader["arr/5.6"] == data[10:12, 12:14].tobytes()

    index_read = (-index_nbytes, None) if location == "end" else (0, index_nbytes)
    assert recording_fs.file_reads(shard_path) == [index_read, (offset, offset + nbytes)]
    touched = {c[1] for c in recording_fs.calls if c[0] in ("cat_file", "open")}
    assert touched == {shard_path}  # no other shard, no metadata, no whole-file open
    assert all(not (s in (None, 0) and e is None) for s, e in recording_fs.file_reads(shard_path))

    # with the index cached, the next chunk of that shard costs one ranged read
    recording_fs.calls.clear()
    assert reader["arr/4.4"] == data[8:10, 8:10].tobytes()
    offset0, nbytes0 = entries_of(shard, location, checksum)[0]
    assert recording_fs.file_reads(shard_path) == [(offset0, offset0 + nbytes0)]


def test_several_chunks_in_two_shards_are_two_batched_requests(recording_fs: RecordingFS) -> None:
    root = "/batch.zarr"
    writer = ShardedStore(fsspec.FSMap(root, recording_fs), chunks_per_shard=CPS)
    z = _create(writer)
    z[:] = np.arange(256, dtype="<i4").reshape(SHAPE)
    # no merging of neighbours, no whole-shard reads: one range per chunk
    reader = ShardedStore(fsspec.FSMap(root, recording_fs), read_policy=ReadPolicy(max_gap=0, whole_shard_fraction=2.0))
    reader["arr/0.0"]  # discover the array's metadata first: count only shard reads
    reader.index_cache.clear()
    recording_fs.calls.clear()
    found = reader.getitems(["arr/0.0", "arr/2.2", "arr/7.7", "arr/5.4", "arr/6.6"])
    assert sorted(found) == ["arr/0.0", "arr/2.2", "arr/5.4", "arr/6.6", "arr/7.7"]
    batches = [c for c in recording_fs.calls if c[0] == "cat_ranges"]
    assert batches == [("cat_ranges", 2), ("cat_ranges", 5)]  # 2 indexes, then 5 chunk ranges
    per_file = {}
    for _, path, *_ in [c for c in recording_fs.calls if c[0] == "cat_file"]:
        per_file[path] = per_file.get(path, 0) + 1
    assert per_file == {f"{root}/arr/0.0": 1 + 2, f"{root}/arr/1.1": 1 + 3}


def test_missing_shard_costs_one_index_request(recording_fs: RecordingFS) -> None:
    root = "/missing.zarr"
    proxy = ShardedStore(fsspec.FSMap(root, recording_fs), chunks_per_shard=CPS)
    z = _create(proxy)
    z[0:2, 0:2] = 1  # only shard (0, 0) exists
    recording_fs.calls.clear()
    with pytest.raises(KeyError):
        proxy["arr/7.7"]
    assert recording_fs.file_reads(f"{root}/arr/1.1") == [(-(16 * 16 + 4), None)]
