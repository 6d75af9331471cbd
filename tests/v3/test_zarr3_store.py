"""shardkv.zarr3.ShardedStore with zarr-python 3 and tensorstore as oracles.

zarr 3 writes ordinary (unsharded) arrays through the store; storage then
holds one object per shard and a standard v3 sharded zarr.json, which zarr 3
and tensorstore read at the root without shardkv. Everything seen through the
store (documents, keys, listings, values) is compared with the same writes made
to a plain zarr 3 MemoryStore.
"""

from __future__ import annotations

import asyncio
import json
import pickle
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("zarr.abc.store")

import tensorstore as ts  # noqa: E402
import zarr  # noqa: E402
from fsspec.implementations.asyn_wrapper import AsyncFileSystemWrapper  # noqa: E402
from zarr.core.buffer import cpu, default_buffer_prototype  # noqa: E402
from zarr.core.sync import _collect_aiterator, sync  # noqa: E402
from zarr.storage import FsspecStore, LocalStore, MemoryStore  # noqa: E402

from shardkv.errors import ChunkOutOfGridError, UnflushedWritesError  # noqa: E402
from shardkv.zarr3 import ShardedStore  # noqa: E402
from shardkv.zarr3.metadata import MARKER  # noqa: E402

pytestmark = pytest.mark.zarr3

DATA = np.arange(400 * 300, dtype="f4").reshape(400, 300) / 7


def _keys(store: Any, prefix: str = "") -> list[str]:
    return sorted(sync(_collect_aiterator(store.list_prefix(prefix))))


def _raw(store: Any, key: str) -> bytes | None:
    value = sync(store.get(key, prototype=default_buffer_prototype()))
    return None if value is None else value.to_bytes()


def _write(store: Any, **kwargs: Any) -> zarr.Array:
    z = zarr.create_array(store, name="a", shape=(400, 300), chunks=(50, 50), dtype="f4", **kwargs)
    z[:] = DATA
    return z


@pytest.fixture(params=["memory", "local", "obstore-memory", "obstore-local"])
def base(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param.startswith("obstore"):
        obstore = pytest.importorskip("obstore")
        from zarr.storage import ObjectStore

        if request.param == "obstore-memory":
            return ObjectStore(obstore.store.MemoryStore())
        (tmp_path / "data.zarr").mkdir()
        return ObjectStore(obstore.store.LocalStore(str(tmp_path / "data.zarr")))
    return MemoryStore() if request.param == "memory" else LocalStore(str(tmp_path / "data.zarr"))


def test_unsharded_array_is_stored_one_object_per_shard_and_read_without_shardkv(base: Any, tmp_path: Path) -> None:
    store = ShardedStore(base, chunks_per_shard=4)
    z = _write(store, compressors=[{"name": "zstd", "configuration": {"level": 1}}], attributes={"units": "K"})
    plain = MemoryStore()
    _write(plain, compressors=[{"name": "zstd", "configuration": {"level": 1}}], attributes={"units": "K"})

    # storage: the array's zarr.json and one object per shard (8 x 6 chunks -> 2 x 2 shards)
    # (plus, on a local directory, the lock files of the writes: .shardkv-locks/)
    stored_keys = [k for k in _keys(base, "a/") if "/.shardkv-locks/" not in k]
    assert stored_keys == ["a/c/0/0", "a/c/0/1", "a/c/1/0", "a/c/1/1", "a/zarr.json"]
    stored = json.loads(_raw(base, "a/zarr.json") or b"")
    assert stored["chunk_grid"]["configuration"]["chunk_shape"] == [200, 200]
    (codec,) = stored["codecs"]
    assert codec["name"] == "sharding_indexed"
    assert codec["configuration"]["chunk_shape"] == [50, 50]
    assert codec["configuration"]["codecs"] == json.loads(_raw(plain, "a/zarr.json") or b"")["codecs"]
    assert stored[MARKER]["must_understand"] is False

    # through the store: the document and the keys zarr 3 wrote to a plain store, and the data
    assert json.loads(_raw(store, "a/zarr.json") or b"") == json.loads(_raw(plain, "a/zarr.json") or b"")
    assert _keys(store) == _keys(plain)
    np.testing.assert_array_equal(zarr.open_array(store, path="a", mode="r")[:], DATA)
    np.testing.assert_array_equal(z[17:233, 41:299], DATA[17:233, 41:299])

    # at the root without shardkv: zarr 3 sees a sharded array and reads it equal
    raw = zarr.open_array(base, path="a", mode="r")
    assert raw.shards == (200, 200) and raw.chunks == (50, 50)
    assert raw.attrs["units"] == "K"
    np.testing.assert_array_equal(raw[:], DATA)
    if (tmp_path / "data.zarr").is_dir():  # and tensorstore, a second v1.0 codec reader
        t = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": str(tmp_path / "data.zarr/a")}}).result()
        np.testing.assert_array_equal(t.read().result(), DATA)


@pytest.mark.parametrize(
    "encoding",
    [{"name": "v2", "separator": "."}, {"name": "default", "separator": "."}, {"name": "v2", "separator": "/"}],
    ids=["v2-dot", "default-dot", "v2-slash"],
)
def test_chunk_key_encodings_seen_as_written(encoding: dict[str, str]) -> None:
    base = MemoryStore()
    store = ShardedStore(base, chunks_per_shard=(2, 3))
    plain = MemoryStore()
    for target in (store, plain):
        z = zarr.create_array(target, name="g/a", shape=(9, 10), chunks=(2, 2), dtype="i2", chunk_key_encoding=encoding)
        z[1:8, 3:] = np.arange(49, dtype="i2").reshape(7, 7)
    assert _keys(store) == _keys(plain)
    for prefix in ("g/", "g/a/", "g/a/c", "g/a/1", "g/a/c/1/"):
        assert _keys(store, prefix) == _keys(plain, prefix), prefix
    for directory in ("", "g", "g/a", "g/a/c"):
        names = sorted(sync(_collect_aiterator(store.list_dir(directory))))
        assert names == sorted(sync(_collect_aiterator(plain.list_dir(directory)))), directory
    # chunk rows 0-3 x chunk columns 1-4 written -> shards (0-1) x (0-1), named in the array's own encoding
    shards = [k for k in _keys(base, "g/a/") if not k.endswith("zarr.json")]
    sep = encoding["separator"]
    head = "c" + sep if encoding["name"] == "default" else ""
    assert shards == sorted(f"g/a/{head}{i}{sep}{j}" for i in range(2) for j in range(2))
    np.testing.assert_array_equal(zarr.open_array(base, path="g/a")[:], zarr.open_array(plain, path="g/a")[:])


def test_resize_overwrite_and_deletes_match_a_plain_store() -> None:
    base = MemoryStore()
    store = ShardedStore(base, chunks_per_shard=2)
    plain = MemoryStore()
    for target in (store, plain):
        z = zarr.create_array(target, name="a", shape=(10, 10), chunks=(3, 3), dtype="i4", fill_value=0)
        z[:] = np.arange(100, dtype="i4").reshape(10, 10)
        z[0:3, 0:3] = 0  # an all-fill chunk: zarr deletes it
        z.resize((7, 12))
        z[:, 10:] = 5
    assert _keys(store) == _keys(plain)
    assert json.loads(_raw(store, "a/zarr.json") or b"") == json.loads(_raw(plain, "a/zarr.json") or b"")
    np.testing.assert_array_equal(zarr.open_array(store, path="a")[:], zarr.open_array(plain, path="a")[:])
    for key in _keys(plain, "a/c/"):  # chunk sizes from the shard indexes, as stored by a plain store
        assert sync(store.getsize(key)) == sync(plain.getsize(key)), key
    assert sync(store.getsize_prefix("a/c")) == sync(plain.getsize_prefix("a/c"))
    with pytest.raises(FileNotFoundError):
        sync(store.getsize("a/c/0/0"))  # the all-fill chunk zarr deleted
    np.testing.assert_array_equal(zarr.open_array(base, path="a")[:], zarr.open_array(plain, path="a")[:])
    # overwrite with another chunk shape: zarr deletes the old array first
    for target in (store, plain):
        z = zarr.create_array(target, name="a", shape=(4,), chunks=(1,), dtype="u1", overwrite=True)
        z[:] = [1, 2, 3, 4]
    assert _keys(store) == _keys(plain)
    assert _keys(base, "a/") == ["a/c/0", "a/c/1", "a/zarr.json"]
    np.testing.assert_array_equal(zarr.open_array(base, path="a")[:], [1, 2, 3, 4])


def test_arrays_that_ask_for_shards_and_groups_pass_through() -> None:
    base = MemoryStore()
    store = ShardedStore(base, chunks_per_shard=2)
    plain = MemoryStore()
    for target in (store, plain):
        zarr.create_group(target, path="g", attributes={"k": 1})
        z = zarr.create_array(target, name="g/s", shape=(8, 8), chunks=(2, 2), shards=(4, 4), dtype="u2")
        z[:] = np.arange(64, dtype="u2").reshape(8, 8)
        zarr.create_array(target, name="g/scalar", shape=(), dtype="f8", fill_value=1.5)[...] = 2.5
    for key in _keys(plain):
        assert _raw(base, key) == _raw(plain, key), key  # stored exactly as written
    assert _keys(store) == _keys(plain)
    np.testing.assert_array_equal(zarr.open_array(store, path="g/s")[:], np.arange(64).reshape(8, 8))
    assert zarr.open_array(store, path="g/scalar")[...] == 2.5


def test_an_array_named_like_a_chunk_coordinate_inside_a_group_is_sharded_and_read_by_tensorstore(
    tmp_path: Path,
) -> None:
    base = LocalStore(tmp_path / "data")
    store = ShardedStore(base, chunks_per_shard=2)
    zarr.create_group(store, path="g")
    z = zarr.create_array(store, name="g/0", shape=(8, 8), chunks=(2, 2), dtype="u2")
    z[:] = np.arange(64, dtype="u2").reshape(8, 8)
    # the group g above the array named "0" owns none of its chunks: they are stored in shards of 4 x 4
    stored = [k for k in _keys(base, "g/0/") if "/.shardkv-locks/" not in k]
    assert stored == [f"g/0/c/{i}/{j}" for i in range(2) for j in range(2)] + ["g/0/zarr.json"]
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(tmp_path / "data" / "g" / "0")}}
    np.testing.assert_array_equal(ts.open(spec).result().read().result(), np.arange(64).reshape(8, 8))
    np.testing.assert_array_equal(zarr.open_array(store, path="g/0")[:], np.arange(64).reshape(8, 8))


def test_chunk_keys_outside_the_grid() -> None:
    store = ShardedStore(MemoryStore(), chunks_per_shard=2)
    zarr.create_array(store, name="a", shape=(4, 4), chunks=(2, 2), dtype="u1")
    value = cpu.Buffer.from_bytes(b"\x00" * 4)
    with pytest.raises(ChunkOutOfGridError):
        sync(store.set("a/c/2/0", value))
    assert sync(store.get("a/c/2/0", prototype=default_buffer_prototype())) is None
    assert not sync(store.exists("a/c/2/0"))
    sync(store.delete("a/c/2/0"))  # nothing stored there: no error


def test_read_only_store_refuses_writes_and_reads_shards(tmp_path: Path) -> None:
    _write(ShardedStore(LocalStore(str(tmp_path)), chunks_per_shard=4))
    reader = ShardedStore(str(tmp_path), chunks_per_shard=4, read_only=True)
    np.testing.assert_array_equal(zarr.open_array(reader, path="a", mode="r")[:], DATA)
    with pytest.raises(ValueError, match="read-only"):
        sync(reader.set("a/c/0/0", cpu.Buffer.from_bytes(b"x")))


# the counting filesystem is synchronous on purpose (it counts the calls), wrapped for FsspecStore
@pytest.mark.filterwarnings("ignore:fs .* was not created with `asynchronous=True`")
def test_write_back_writes_each_shard_once(tmp_path: Path) -> None:
    import counting_fs

    fs = counting_fs.CountingMemoryFS(skip_instance_cache=True)
    fs.count_root = "/zarr3-writeback"
    fs.mkdir(fs.count_root)
    store = ShardedStore(
        FsspecStore(AsyncFileSystemWrapper(fs), path=fs.count_root), chunks_per_shard=4, buffer_bytes=64 * 2**20
    )
    z = zarr.create_array(store, name="a", shape=(400, 300), chunks=(50, 50), dtype="f4")
    fs.reset()
    for i in range(0, 400, 50):  # row by row, as a chunk-by-chunk writer would
        z[i : i + 50] = DATA[i : i + 50]
        if i == 50:  # rows 0-1 of 4: nothing complete, nothing written, and no pickling of held data
            assert fs.writes() == []
            with pytest.raises(UnflushedWritesError):
                pickle.dumps(store)
    store.flush()
    np.testing.assert_array_equal(zarr.open_array(pickle.loads(pickle.dumps(store)), path="a")[:], DATA)
    assert sorted(r.key for r in fs.writes()) == ["a/c/0/0", "a/c/0/1", "a/c/1/0", "a/c/1/1"]
    np.testing.assert_array_equal(zarr.open_array(store.base, path="a")[:], DATA)
    fs.rm(fs.count_root, recursive=True)


def test_warm_chunk_read_is_one_pread_of_the_chunk_bytes_as_with_the_zarr2_proxy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cold: the shard's index, then the chunk; warm (index cached): the chunk's bytes only, one ``pread``."""
    import os

    import shardkv.storage.local as local

    reads: list[tuple[str, int]] = []
    pread = local.pread_exact

    def counting_pread(fd: int, start: int, stop: int) -> bytes:
        data = pread(fd, start, stop)
        reads.append((os.path.relpath(os.readlink(f"/proc/self/fd/{fd}"), tmp_path), len(data)))
        return data

    monkeypatch.setattr(local, "pread_exact", counting_pread)
    store = ShardedStore(LocalStore(str(tmp_path)), chunks_per_shard=4)
    z = zarr.create_array(store, name="a", shape=(400, 300), chunks=(50, 50), dtype="f4", compressors=None)
    z[:] = DATA
    chunk_nbytes = 50 * 50 * 4
    index_nbytes = 16 * 16 + 4
    reader = zarr.open_array(ShardedStore(LocalStore(str(tmp_path)), chunks_per_shard=4), path="a", mode="r")
    reads.clear()
    np.testing.assert_array_equal(reader[0:50, 0:50], DATA[0:50, 0:50])
    assert reads == [("a/c/0/0", index_nbytes), ("a/c/0/0", chunk_nbytes)]
    reads.clear()
    np.testing.assert_array_equal(reader[50:100, 100:150], DATA[50:100, 100:150])  # same shard: warm
    assert reads == [("a/c/0/0", chunk_nbytes)]


def test_each_zarr3_store_kind_gets_the_zarr2_proxys_concurrency(tmp_path: Path) -> None:
    obstore = pytest.importorskip("obstore")
    from zarr.storage import ObjectStore

    assert ShardedStore(LocalStore(str(tmp_path)), chunks_per_shard=2).concurrency_mode == "files"
    assert ShardedStore(MemoryStore(), chunks_per_shard=2).concurrency_mode == "conditional"  # in-process
    assert ShardedStore(ObjectStore(obstore.store.MemoryStore()), chunks_per_shard=2).concurrency_mode == "conditional"
    assert (
        ShardedStore(ObjectStore(obstore.store.LocalStore(str(tmp_path))), chunks_per_shard=2).concurrency_mode
        == "files"
    )


def test_any_other_zarr3_store_works_and_asks_for_a_concurrency_choice() -> None:
    from zarr.storage import LoggingStore

    from shardkv.errors import ConfigurationError

    inner = MemoryStore()
    with pytest.raises(ConfigurationError, match="concurrency='process'"):
        ShardedStore(LoggingStore(inner, log_level="ERROR"), chunks_per_shard=2)
    store = ShardedStore(LoggingStore(inner, log_level="ERROR"), chunks_per_shard=2, concurrency="process")
    _write(store)
    assert _keys(inner, "a/") == sorted([f"a/c/{i}/{j}" for i in range(4) for j in range(3)] + ["a/zarr.json"])
    np.testing.assert_array_equal(zarr.open_array(inner, path="a")[:], DATA)
    np.testing.assert_array_equal(zarr.open_array(store, path="a")[:], DATA)


def test_a_url_with_storage_options_and_a_path_open_the_same_data(tmp_path: Path) -> None:
    _write(ShardedStore(str(tmp_path / "d.zarr"), chunks_per_shard=2))
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "d.zarr"), path="a")[:], DATA)
    url = f"file://{tmp_path / 'd.zarr'}"
    np.testing.assert_array_equal(zarr.open_array(ShardedStore(url, chunks_per_shard=2), path="a")[:], DATA)
    mem = ShardedStore("memory://zarr3-url-test", chunks_per_shard=2, storage_options={"skip_instance_cache": False})
    _write(mem)
    np.testing.assert_array_equal(zarr.open_array(FsspecStore.from_url("memory://zarr3-url-test"), path="a")[:], DATA)
    assert mem.concurrency_mode == "conditional"
    assert ShardedStore(str(tmp_path / "d.zarr")).concurrency_mode == "files"


def test_import_shardkv_does_not_import_zarr3_support() -> None:
    import subprocess
    import sys

    code = "import sys, shardkv; assert 'shardkv.zarr3' not in sys.modules; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr


@pytest.mark.parametrize("name", ["x.shardkv-tmp-1", ".shardkv-locks"])
@pytest.mark.parametrize("base", ["memory", "local"])
def test_a_node_named_like_shardkvs_own_files_is_refused(name: str, base: str, tmp_path: Path) -> None:
    """Never a node that every listing hides (it would vanish from ``members()``)."""
    from shardkv.errors import ReservedKeyError

    under = MemoryStore() if base == "memory" else LocalStore(str(tmp_path))
    store = ShardedStore(under, chunks_per_shard=2)
    root = zarr.open_group(store, mode="w")
    with pytest.raises(ReservedKeyError, match=name.replace(".", r"\.")):
        root.create_array(name, shape=(4,), chunks=(2,), dtype="i4")
    with pytest.raises(ReservedKeyError):
        root.create_group(f"g/{name}")
    root.create_array("ok", shape=(4,), chunks=(2,), dtype="i4")[:] = 1
    stored = _keys(under)
    assert not [k for k in stored if k.startswith((f"{name}/", f"g/{name}/"))]  # nothing of a hidden node
    assert "ok" in [k for k, _ in root.members()]


def test_byte_ranges_partial_values_and_set_if_not_exists_on_sharded_chunk_keys() -> None:
    """The Store API on chunk keys of a sharded array answers as a plain store holding the same chunks."""
    from zarr.abc.store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest

    store, plain = ShardedStore(MemoryStore(), chunks_per_shard=4), MemoryStore()
    for s in (store, plain):
        _write(s, compressors=None)
    proto = default_buffer_prototype()
    key = "a/c/3/2"
    whole = _raw(plain, key)
    assert whole is not None and _raw(store, key) == whole
    for request in (RangeByteRequest(8, 100), OffsetByteRequest(9000), SuffixByteRequest(17)):
        got = sync(store.get(key, prototype=proto, byte_range=request))
        want = sync(plain.get(key, prototype=proto, byte_range=request))
        assert got is not None and want is not None and got.to_bytes() == want.to_bytes(), request
    pairs = [(key, RangeByteRequest(0, 4)), ("a/c/0/0", None), ("a/c/7/5", SuffixByteRequest(3)), ("a/c/9/9", None)]
    got_many = sync(store.get_partial_values(proto, pairs))
    want_many = sync(plain.get_partial_values(proto, pairs))
    assert [None if v is None else v.to_bytes() for v in got_many] == [
        None if v is None else v.to_bytes() for v in want_many
    ]
    other = cpu.Buffer.from_bytes(b"\0" * len(whole))
    sync(store.set_if_not_exists(key, other))  # stored: left as it is
    assert _raw(store, key) == whole
    sync(store.delete(key))
    sync(store.set_if_not_exists(key, other))  # missing: written into its shard
    assert _raw(store, key) == other.to_bytes()
    assert zarr.open_array(store, path="a", mode="r")[150:200, 100:150].sum() == 0


def test_a_shard_whose_chunks_zarr3_writes_at_once_is_put_at_most_twice(tmp_path: Path) -> None:
    """Default options: chunk writes made while a shard write runs are stored together by the next one.

    One shard of 2 x 2 x 2 chunks, fewer than zarr's ``async.concurrency`` (10), so zarr has every
    chunk write in flight at once. The first shard put is held inside the store until all 8 reached
    the store: then the shard is put at most twice (the first write, then the rest together). A whole
    array of many shards is not: zarr keeps only 10 chunk writes in flight, spread over the shards it
    is filling, so each shard is rewritten several times (benchmarks W29-1).
    """
    arrived = threading.Event()
    n_sets = [0]

    class CountingSets(ShardedStore):
        async def set(self, key: str, value: Any) -> None:
            if "/c/" in key:
                n_sets[0] += 1
                if n_sets[0] == 8:
                    arrived.set()
            await super().set(key, value)

    root = tmp_path / "data.zarr"
    store = CountingSets(str(root), chunks_per_shard=2)
    z = zarr.create_array(store, name="a", shape=(32, 32, 32), chunks=(16, 16, 16), dtype="u2", fill_value=0)
    kv = store._engine.kv  # the engine's store: every shard put goes through its put_many
    put_many, shard_puts = kv.put_many, []

    def held_put_many(writes: Any) -> Any:
        if not shard_puts and not arrived.wait(30):
            raise TimeoutError("zarr 3 never had all 8 chunk writes of the shard in flight")
        shard_puts.extend(writes)
        return put_many(writes)

    kv.put_many = held_put_many
    data = np.arange(32**3, dtype="u2").reshape(32, 32, 32)
    z[...] = data
    assert n_sets[0] == 8
    assert shard_puts in (["a/c/0/0/0"], ["a/c/0/0/0"] * 2)
    np.testing.assert_array_equal(zarr.open_array(store.base, path="a")[...], data)
    t = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": str(root / "a")}}).result()
    np.testing.assert_array_equal(t.read().result(), data)


def test_options_are_given_as_keywords_or_as_one_options_object() -> None:
    from shardkv.engine.options import Options
    from shardkv.errors import ConfigurationError

    by_keywords = ShardedStore(MemoryStore(), 2, index_location="start", buffer_bytes=1 << 16)
    options = Options.from_keywords(2, index_location="start", buffer_bytes=1 << 16)
    by_object = ShardedStore(MemoryStore(), options=options)
    assert by_keywords._options == by_object._options == options
    with pytest.raises(ConfigurationError, match="index_checksum"):
        ShardedStore(MemoryStore(), options=options, index_checksum=False)
    with pytest.raises(TypeError, match="buffer"):
        ShardedStore(MemoryStore(), buffer=1)  # type: ignore[call-arg]


def test_a_zarr_json_nested_too_deeply_is_stored_as_given() -> None:
    base = MemoryStore()
    store = ShardedStore(base, chunks_per_shard=2)
    hostile = b"[" * 100_000 + b"]" * 100_000
    sync(store.set("x/zarr.json", cpu.Buffer.from_bytes(hostile)))
    assert _raw(base, "x/zarr.json") == hostile
    assert _raw(store, "x/zarr.json") == hostile


def test_listing_an_arrays_chunk_keys_reads_its_own_zarr_json_alone() -> None:
    class CountingMemoryStore(MemoryStore):
        gets: list[str] = []

        async def get(self, key: str, *args: Any, **kwargs: Any) -> Any:
            self.gets.append(key)
            return await super().get(key, *args, **kwargs)

    base = CountingMemoryStore()
    writer = ShardedStore(base, chunks_per_shard=2)
    zarr.create_group(writer, path="g")
    zarr.create_array(writer, name="g/a", shape=(4, 4), chunks=(2, 2), dtype="u1")[:] = 1
    reader = ShardedStore(base)  # nothing cached
    base.gets.clear()
    keys = _keys(reader, "g/a/")
    assert keys == ["g/a/c/0/0", "g/a/c/0/1", "g/a/c/1/0", "g/a/c/1/1", "g/a/zarr.json"]
    # the owner rule: neither the root nor the group g can own g/a/'s keys, so neither is read
    assert [k for k in base.gets if k.endswith("zarr.json")] == ["g/a/zarr.json"]


class _HeldRead(MemoryStore):
    """A memory store whose next read of ``held`` finds the value stored then, and returns it once the test lets go."""

    def __init__(self) -> None:
        super().__init__()
        self.held: str | None = None
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def get(self, key: str, prototype: Any, byte_range: Any = None) -> Any:
        value = await super().get(key, prototype, byte_range)
        if key == self.held:
            self.held = None
            self.entered.set()
            await asyncio.wait_for(self.release.wait(), 30)
        return value


def test_a_document_read_while_it_is_rewritten_does_not_replace_the_node_of_the_rewrite() -> None:
    """zarr 3 reads and writes ``zarr.json`` in tasks of one loop: a read begun before a write ends after it."""
    base = _HeldRead()
    store = ShardedStore(base, chunks_per_shard=4)
    _write(store)
    grown = json.loads(_raw(store, "a/zarr.json") or b"")
    grown["shape"] = [800, 300]
    prototype = default_buffer_prototype()

    async def read_across_a_resize() -> None:
        base.held = "a/zarr.json"
        reader = asyncio.ensure_future(store.get("a/zarr.json", prototype=prototype))
        await base.entered.wait()  # the read has found the old document
        await store.set("a/zarr.json", cpu.Buffer.from_bytes(json.dumps(grown).encode()))
        base.release.set()
        await reader

    sync(read_across_a_resize())
    chunk = bytes(range(200))
    sync(store.set("a/c/12/0", cpu.Buffer.from_bytes(chunk)))  # a chunk only the grown array has
    assert _raw(store, "a/c/12/0") == chunk


def test_copies_unpickled_per_task_parse_the_arrays_zarr_json_once_and_see_a_resize(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a dask worker unpickles a new store for each task: each copy reads the array's zarr.json (it may have
    # changed), but the same bytes are parsed once in the process; a resized document is parsed again
    import shardkv.zarr3.nodes as nodes_mod

    store = ShardedStore(str(tmp_path / "data.zarr"), chunks_per_shard=2)
    # a document of this test alone (no other test's bytes are built already)
    z = zarr.create_array(
        store, name="a", shape=(8, 8), chunks=(2, 2), dtype="u1", fill_value=0, attributes={"at": str(tmp_path)}
    )
    blob = pickle.dumps(z)
    parsed: list[bytes] = []
    real_parse = nodes_mod.parse_document

    def parse_document(raw: bytes) -> Any:
        parsed.append(raw)
        return real_parse(raw)

    monkeypatch.setattr(nodes_mod, "parse_document", parse_document)
    for i in range(10):
        pickle.loads(blob)[i % 8, 0] = i + 1  # a task: the array (with its store) unpickled, one chunk written
    stored_json = [raw for raw in parsed if b'"node_type": "array"' in raw and b"sharding_indexed" in raw]
    assert len(stored_json) <= 1, len(stored_json)  # built when it was written, or by the first task
    zarr.open_array(pickle.loads(blob).store, path="a", mode="r+").resize((12, 8))
    zarr.open_array(pickle.loads(blob).store, path="a", mode="r+")[10, 0] = 99  # a chunk only the new shape has
    expected = np.zeros((12, 8), dtype="u1")
    expected[:8, 0] = [9, 10, 3, 4, 5, 6, 7, 8]
    expected[10, 0] = 99
    np.testing.assert_array_equal(zarr.open_array(ShardedStore(str(tmp_path / "data.zarr")), path="a")[:], expected)
