"""What a reader with and without shardkv can get while a shard is rewritten whole (README, "Limitations").

zarr-python 3 reads a shard's index and then its chunks in separate requests, each opening the file
anew. A shard replaced whole (by zarr 3 itself, or by shardkv where it rewrites shards) between the
two requests is read with the old index over the new file. Here the new file has chunk 2's bytes
where the old index says chunk 1 is: zarr 3 returns chunk 2's values for chunk 1, without an
error. That is the limitation the documentation states. zarr 3 reading through shardkv
conditions every chunk read on the generation of the index it uses: racing a writer process that
rewrites the shard whole in a loop (its first chunk coming and going, so the others move), reader
processes read old or new values only (as tests/test_concurrency_readers.py shows for the zarr 2
proxy). Loops are bounded in count and time; processes are joined with a timeout.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.abc.store import SuffixByteRequest
from zarr.storage import LocalStore, WrapperStore


class _ReplacedAfterIndex(WrapperStore[LocalStore]):
    """A local store whose shard ``c/0`` is replaced by the file ``new`` right after its index is read."""

    def __init__(self, store: LocalStore, shard: Path, new: Path) -> None:
        super().__init__(store)
        self.shard, self.new = shard, new
        self.index_reads = 0

    def _with_store(self, store: LocalStore) -> _ReplacedAfterIndex:
        return _ReplacedAfterIndex(store, self.shard, self.new)

    async def get(self, key: str, prototype: Any, byte_range: Any = None) -> Any:
        value = await super().get(key, prototype, byte_range)
        if key == "c/0" and isinstance(byte_range, SuffixByteRequest) and self.index_reads == 0:
            self.index_reads += 1
            os.replace(self.new, self.shard)  # a whole-shard rewrite, as atomic as a rename is
        return value


def _write(root: Path, values: np.ndarray) -> None:
    z = zarr.create_array(
        LocalStore(root), shape=(12,), chunks=(4,), shards=(12,), dtype="uint8", compressors=None, fill_value=0
    )
    z[:] = values


def test_a_zarr3_reader_can_combine_an_old_index_with_a_new_shard(tmp_path: Path) -> None:
    old = np.repeat(np.array([1, 2, 3], dtype="uint8"), 4)  # chunks 0, 1, 2 at offsets 0, 4, 8
    new = np.repeat(np.array([0, 5, 6], dtype="uint8"), 4)  # chunk 0 is fill: chunks 1, 2 at offsets 0, 4
    _write(tmp_path / "a", old)
    _write(tmp_path / "b", new)
    staged = tmp_path / "a" / "c" / "new"
    shutil.copyfile(tmp_path / "b" / "c" / "0", staged)
    store = _ReplacedAfterIndex(LocalStore(tmp_path / "a"), tmp_path / "a" / "c" / "0", staged)
    reader = zarr.open_array(store, mode="r")
    got = reader[4:8]
    assert reader.store.index_reads == 1
    # neither the old chunk 1 (2) nor the new one (5): the new chunk 2, silently
    np.testing.assert_array_equal(got, np.full(4, 6, dtype="uint8"))
    np.testing.assert_array_equal(zarr.open_array(LocalStore(tmp_path / "a"), mode="r")[:], new)  # read again: new


_N = 16  # chunks of 64 uint16 in one shard


def _values(version: int, chunk: int) -> np.ndarray:
    return np.full(64, 1000 * (version % 60) + chunk, dtype="uint16")


def _rewriter(root: str, stop: Any, started: Any) -> None:
    from shardkv.zarr3 import ShardedStore

    z = zarr.open_array(ShardedStore(root), mode="r+")
    for version in range(1, 100_000):  # until the readers are done (bounded)
        if stop.is_set():
            return
        data = np.concatenate([_values(version, c) for c in range(_N)])
        if version % 2:
            data[:64] = 0  # chunk 0 is fill: every other chunk moves
        z[:] = data
        started.set()


def _shardkv_reader(root: str, out: Any) -> None:
    from shardkv.zarr3 import ShardedStore

    z = zarr.open_array(ShardedStore(root, read_only=True), mode="r")
    reads = wrong = 0
    deadline = time.monotonic() + 8
    while reads < 4000 and time.monotonic() < deadline:
        c = 1 + reads % (_N - 1)
        got = z[64 * c : 64 * (c + 1)]
        reads += 1
        wrong += not (np.all(got == got[0]) and int(got[0]) % 1000 == c)
    out.put((reads, wrong))


def test_zarr3_through_shardkv_reads_old_or_new_values_while_shards_are_rewritten(tmp_path: Path) -> None:
    from shardkv.zarr3 import ShardedStore

    root = str(tmp_path / "a")
    zarr.create_array(
        ShardedStore(root, chunks_per_shard=_N), shape=(64 * _N,), chunks=(64,), dtype="uint16", compressors=None
    )
    ctx = mp.get_context("spawn")
    stop, started, out = ctx.Event(), ctx.Event(), ctx.Queue()
    writer = ctx.Process(target=_rewriter, args=(root, stop, started))
    writer.start()
    readers = []
    try:
        assert started.wait(120), "the writer never wrote"
        readers = [ctx.Process(target=_shardkv_reader, args=(root, out)) for _ in range(2)]
        for r in readers:
            r.start()
        results = [out.get(timeout=180) for _ in readers]
    finally:
        stop.set()
        for p in [writer, *readers]:
            p.join(60)
    assert all(reads > 0 for reads, _ in results)
    assert [wrong for _, wrong in results] == [0, 0]  # no other chunk's values, no fill
    final = zarr.open_array(LocalStore(root), mode="r")[:]
    assert all(int(final[64 * c]) % 1000 == c for c in range(1, _N))  # the last write, whole
