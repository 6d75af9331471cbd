"""Write-back mode (``buffer_bytes``): what is buffered, when it is written, and that nothing is lost.

The buffer's books are tested directly (:class:`shardkv.engine.writeback.WriteBuffer`);
the proxy is tested black-box: a second proxy without a buffer, over the same
base store, shows what has reached the base store.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest
import zarr

from shardkv import ShardedStore
from shardkv.engine.writeback import WriteBuffer
from shardkv.format.layout import ShardLayout
from shardkv.keys.space import ShardedArray, V2ChunkKeyEncoding

# -- the buffer's books ------------------------------------------------------------------


def test_without_a_buffer_a_write_goes_to_the_engine_itself(tmp_path: Path) -> None:
    """No layer between the facade and the engine's write when nothing is buffered (none that only forwards)."""
    store = ShardedStore(str(tmp_path / "through"), chunks_per_shard=2)
    assert store._writer.write == store.engine.writes.write
    buffered = ShardedStore(str(tmp_path / "back"), chunks_per_shard=2, buffer_bytes=2**20)
    assert buffered._writer.write != buffered.engine.writes.write
    z = zarr.open_array(store, mode="w", shape=(8,), chunks=(2,), dtype="u1")
    z[:] = 3
    assert (z[:] == 3).all()


def sharded_array(
    shape: tuple[int, ...] = (16,), chunks: tuple[int, ...] = (2,), cps: tuple[int, ...] = (4,), path: str = "a"
) -> ShardedArray:
    return ShardedArray(
        path=path,
        key_prefix=f"{path}/",
        shape=shape,
        chunks=chunks,
        layout=ShardLayout.v3(cps),
        chunk_key_encoding=V2ChunkKeyEncoding("."),
        shard_key_encoding=V2ChunkKeyEncoding("."),
    )


def test_buffer_counts_bytes_across_overwrites_and_deletes() -> None:
    arr = sharded_array()
    buf = WriteBuffer(100)
    buf.add("a/0", arr, (0,), (0,), b"x" * 10)
    buf.add("a/0", arr, (0,), (1,), b"y" * 5)
    assert buf.nbytes == 15
    buf.add("a/0", arr, (0,), (0,), b"z" * 3)  # overwrite: 10 -> 3
    assert buf.nbytes == 8
    buf.add("a/0", arr, (0,), (1,), None)  # delete: 5 -> 0
    assert buf.nbytes == 3
    assert buf.lookup("a/0", (0,)) == (True, b"z" * 3)
    assert buf.lookup("a/0", (1,)) == (True, None)
    assert buf.lookup("a/0", (2,)) == (False, None)
    assert buf.lookup("a/1", (0,)) == (False, None)
    assert buf.pop("a/0").nbytes == 3 and buf.nbytes == 0 and len(buf) == 0


def test_buffer_complete_means_every_in_grid_chunk_has_bytes() -> None:
    arr = sharded_array(shape=(14,))  # chunk grid 7: shard 1 holds chunks 4, 5, 6 only
    buf = WriteBuffer(1000)
    for local in range(3):
        buf.add("a/1", arr, (1,), (local,), b"v")
    buf.add("a/0", arr, (0,), (0,), b"v")
    taken = buf.take_complete(["a/0", "a/1"])
    assert list(taken) == ["a/1"]  # the edge shard is complete with 3
    buf.settle("a/1", taken["a/1"])
    assert "a/1" not in buf
    for local in range(1, 4):
        buf.add("a/0", arr, (0,), (local,), None if local == 3 else b"v")
    assert buf.take_complete(["a/0"]) == {}  # a delete needs the stored shard: not complete
    assert "a/0" in buf


def test_buffer_over_limit_pops_oldest_first() -> None:
    arr = sharded_array(shape=(64,))
    buf = WriteBuffer(25)
    for shard in range(4):
        buf.add(f"a/{shard}", arr, (shard,), (0,), b"x" * 10)
    taken = buf.take_over_limit()
    assert list(taken) == ["a/0", "a/1"]
    for key, change in taken.items():
        buf.settle(key, change)
    assert buf.nbytes == 20 <= buf.max_bytes
    assert list(buf.take_all()) == ["a/2", "a/3"]


def test_buffer_take_all_of_one_array() -> None:
    a, b = sharded_array(path="a"), sharded_array(path="b")
    buf = WriteBuffer(1000)
    buf.add("a/0", a, (0,), (0,), b"1")
    buf.add("b/0", b, (0,), (0,), b"2")
    taken = buf.take_all("b")
    assert list(taken) == ["b/0"]
    buf.settle("b/0", taken["b/0"])
    assert list(buf.take_all()) == ["a/0"]


def test_negative_buffer_is_rejected(tmp_path) -> None:
    with pytest.raises(ValueError, match="buffer_bytes"):
        ShardedStore(str(tmp_path), chunks_per_shard=(2,), buffer_bytes=-1)


# -- the proxy in write-back mode ------------------------------------------------------------

N_CHUNKS, CPS = 64, 4  # 16 shards of 4 chunks


def zarray(n_chunks: int = N_CHUNKS, chunk: int = 16) -> bytes:
    doc = {
        "zarr_format": 2,
        "shape": [n_chunks * chunk],
        "chunks": [chunk],
        "dtype": "|u1",
        "compressor": None,
        "fill_value": 0,
        "filters": None,
        "order": "C",
    }
    return json.dumps(doc).encode()


@pytest.fixture(params=["dict", "memory", "local"])
def base(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    if request.param == "dict":
        yield {}
    elif request.param == "memory":
        url = f"memory://shardkv-wb-{uuid.uuid4().hex}"
        yield url
        fs = fsspec.filesystem("memory")
        if fs.exists(url):
            fs.rm(url, recursive=True)
    else:
        yield str(tmp_path / "store")


def new_store(base: Any, **kwargs: Any) -> ShardedStore:
    store = ShardedStore(base, chunks_per_shard=CPS, **kwargs)
    store["a/.zarray"] = zarray()
    return store


def stored(base: Any) -> dict[str, bytes]:
    """The chunks that have reached the base store (read by a proxy without a buffer)."""
    view = ShardedStore(base)
    return {k: view[k] for k in view.keys_under("a") if not k.endswith(".zarray")}


def test_buffer_limit_is_respected_and_forced_shards_are_merged(base: Any) -> None:
    limit = 100
    store = new_store(base, buffer_bytes=limit)
    model: dict[str, bytes] = {}
    rng = random.Random(3)
    for step in range(150):
        keys = {f"a/{rng.randrange(N_CHUNKS)}" for _ in range(rng.randrange(1, 4))}
        values = {k: f"{step:04d}".encode() * rng.randrange(1, 5) for k in keys}  # 4..16 bytes, unique per step
        store.setitems(values)
        model.update(values)
        on_base = stored(base)
        unwritten = sum(len(v) for k, v in model.items() if on_base.get(k) != v)
        assert unwritten <= limit, f"step {step}: {unwritten} bytes held, limit {limit}"
        probe = rng.sample(sorted(model), min(3, len(model)))
        assert store.getitems(probe) == {k: model[k] for k in probe}  # reads see the buffer
    store.flush()
    assert stored(base) == model


def test_reads_see_buffered_writes_before_flush(base: Any) -> None:
    store = new_store(base, buffer_bytes=1 << 20)
    store.setitems({"a/0": b"zero", "a/5": b"five"})
    store["a/5"] = b"FIVE"
    assert stored(base) == {}
    assert store["a/0"] == b"zero" and store["a/5"] == b"FIVE"
    assert "a/0" in store and "a/1" not in store
    assert store.getitems(["a/0", "a/1", "a/5"]) == {"a/0": b"zero", "a/5": b"FIVE"}
    assert store.get("a/1") is None
    assert stored(base) == {}  # reading did not write
    store.flush()
    assert stored(base) == {"a/0": b"zero", "a/5": b"FIVE"}


def test_flush_close_and_with_write_everything(tmp_path: Path) -> None:
    root = str(tmp_path / "store")
    store = new_store(root, buffer_bytes=1 << 20)
    store["a/0"] = b"a"
    assert stored(root) == {}
    store.flush()
    assert stored(root) == {"a/0": b"a"}
    store["a/9"] = b"b"
    store.close()
    assert stored(root) == {"a/0": b"a", "a/9": b"b"}
    with ShardedStore(root, buffer_bytes=1 << 20) as again:
        again["a/20"] = b"c"
        assert "a/20" not in stored(root)
    assert stored(root) == {"a/0": b"a", "a/9": b"b", "a/20": b"c"}


def test_listing_flushes_first(base: Any) -> None:
    store = new_store(base, buffer_bytes=1 << 20)
    store.setitems({"a/0": b"x", "a/7": b"y"})
    assert sorted(k for k in store if not k.endswith((".zarray", ".zgroup"))) == ["a/0", "a/7"]
    assert stored(base) == {"a/0": b"x", "a/7": b"y"}


def test_delete_of_buffered_and_of_stored_chunks(base: Any) -> None:
    store = new_store(base, buffer_bytes=1 << 20)
    store.setitems({"a/0": b"s0", "a/1": b"s1", "a/2": b"s2"})
    store.flush()
    store["a/3"] = b"buffered"
    del store["a/3"]  # never reached the base store
    del store["a/1"]  # stored: the delete is buffered
    assert "a/3" not in store and "a/1" not in store
    with pytest.raises(KeyError):
        store["a/3"]
    with pytest.raises(KeyError):
        del store["a/3"]
    assert stored(base) == {"a/0": b"s0", "a/1": b"s1", "a/2": b"s2"}
    store.flush()
    assert stored(base) == {"a/0": b"s0", "a/2": b"s2"}

    store.delitems(["a/0", "a/2"])  # the shard's last chunks: the shard goes away
    store.flush()
    assert stored(base) == {}
    assert ShardedStore(base).base.contains("a/0") is False


def test_delete_then_rewrite_in_the_buffer(base: Any) -> None:
    store = new_store(base, buffer_bytes=1 << 20)
    store["a/4"] = b"old"
    store.flush()
    del store["a/4"]
    store["a/4"] = b"new"
    store.flush()
    assert stored(base) == {"a/4": b"new"}


def test_complete_shard_is_written_without_flush(base: Any) -> None:
    store = new_store(base, buffer_bytes=1 << 20)
    store.setitems({f"a/{i}": bytes([i]) for i in range(CPS)})  # every chunk of shard 0
    assert stored(base) == {f"a/{i}": bytes([i]) for i in range(CPS)}


def zarr_ops(z: Any) -> None:
    """The same sequence of zarr operations, applied to the proxy and to the oracle."""
    rng = np.random.default_rng(5)
    z[0:13, 0:7] = rng.integers(0, 100, (13, 7))
    z[5:9, 10:19] = 7
    z[18:20, 0:20] = rng.integers(0, 100, (2, 20))
    z.resize(11, 13)  # shrink with chunks in the buffer
    z[2:4, 2:12] = -1
    z.resize(23, 17)  # grow again: the dropped region reads as fill_value
    z[20:23, 14:17] = 3


@pytest.mark.parametrize("buffer_bytes", [1 << 20, 300], ids=["roomy", "tight"])
def test_resize_with_buffered_chunks_matches_zarr_on_a_dict(base: Any, buffer_bytes: int) -> None:
    store = ShardedStore(base, chunks_per_shard=(2, 2), buffer_bytes=buffer_bytes)
    oracle: dict[str, bytes] = {}
    arrays = [
        zarr.open_array(
            s, mode="w", path="a", shape=(20, 20), chunks=(3, 4), dtype="i4", fill_value=-9, compressor=None
        )
        for s in (store, oracle)
    ]
    for z in arrays:
        zarr_ops(z)
    np.testing.assert_array_equal(arrays[0][:], arrays[1][:])
    store.flush()
    reread = zarr.open_array(ShardedStore(base), mode="r", path="a")
    np.testing.assert_array_equal(reread[:], arrays[1][:])
    chunk_keys = sorted(k for k in ShardedStore(base).keys_under("a") if not k.rsplit("/", 1)[-1].startswith("."))
    assert chunk_keys == sorted(k for k in oracle if not k.rsplit("/", 1)[-1].startswith("."))


@pytest.mark.parametrize("how", ["rmdir", "del-zarray"])
def test_deleted_array_is_not_resurrected_by_a_later_flush(how: str) -> None:
    """Buffered writes of an array that is then deleted are dropped, not flushed into the new array."""
    base: dict = {}
    store = ShardedStore(base, chunks_per_shard=4, buffer_bytes=10**9)
    z = zarr.create(shape=(100,), chunks=(10,), dtype="i4", store=store, path="a")
    z[:5] = 1
    if how == "rmdir":
        store.rmdir("a")
    else:
        del store["a/.zarray"]
    fresh = zarr.create(shape=(100,), chunks=(10,), dtype="i4", store=store, path="a", overwrite=True)
    store.flush()
    assert (fresh[:] == 0).all()
    assert not [k for k in base if k.startswith("a/") and k.split("/")[-1][0].isdigit()]
