"""Readers never see a torn state.

A chunk read returns the value of some completed write of that chunk: never
a mix of an old index and new bytes, never the fill value for an
acknowledged chunk, never an older value than one the same reader saw.

* S3 (moto on 127.0.0.1), readers in two spawned processes racing a writer
  process, with their indexes cached: every chunk read is pinned to the
  generation (ETag) of the index it uses (:mod:`shardkv.engine.generation_reads`);
* a deterministic S3 case: an index cached by one store, the shard replaced
  by another (``concurrency="none"`` on both), the next read gets a ``412``,
  re-reads the index and returns the new value;
* ``memory://`` (separate stores in one process: the stored object's
  identity is the validator) and ``dict`` (no ranged reads: every shard is
  read whole, self-consistent) with reader threads racing a writer thread.

The writer moves chunks inside their shards: besides rewriting each data
chunk with a growing version (one chunk per call, so every call rewrites a
shard), it makes the first chunk of the shard come and go, which shifts the
offset of every other chunk. Uncompressed chunks make a torn read silently
wrong numbers; the value ``1000 * version + chunk`` tells whose bytes a read
returned. Every loop is bounded in count and time; processes and threads are
joined with a timeout.
"""

from __future__ import annotations

import threading
import time
import traceback
import uuid
from typing import Any

import numpy as np
import pytest
from concurrency_harness import SPAWN, MotoS3, moto_s3, run_threads  # noqa: F401  (fixture)

from shardkv import ShardedStore
from shardkv.storage.kv import ANY, KVStore, ReadResult

zarr = pytest.importorskip("zarr")
if not zarr.__version__.startswith("2."):
    pytest.skip("zarr-python 2 only", allow_module_level=True)
pytestmark = pytest.mark.filterwarnings("ignore::shardkv.PartialShardWriteWarning")  # chunk-by-chunk on purpose

L = 16  # elements per chunk (int64: 128 bytes uncompressed)
CPS = 8  # chunks per shard
N_CHUNKS = 32  # 4 shards
SCRATCH = [c for c in range(N_CHUNKS) if c % CPS == 0]  # come and go: every other offset of the shard moves
DATA_CHUNKS = [c for c in range(N_CHUNKS) if c % CPS]
FILL = -1
MAX_READS = 20_000  # per reader
MIN_READS = 20  # per reader, however loaded the machine
MAX_PROBLEMS = 20
JOIN_S = 90.0


def _value(c: int, version: int) -> int:
    return 1000 * version + c


def _compressor(name: str) -> Any:
    if name == "raw":
        return None
    import numcodecs

    return numcodecs.Zlib(level=1)


def _create(store: Any, compressor: str) -> None:
    arr = zarr.open_array(
        store=store,
        mode="w",
        shape=(N_CHUNKS * L,),
        chunks=(L,),
        dtype="i8",
        fill_value=FILL,
        compressor=_compressor(compressor),
        write_empty_chunks=False,
    )
    arr[:] = np.repeat([_value(c, 0) for c in range(N_CHUNKS)], L)  # every chunk acknowledged first


def _write_rounds(store: Any, rounds: int, budget_s: float) -> int:
    """Rewrite every data chunk ``rounds`` times (one chunk per call); the last complete round."""
    arr = zarr.open_array(store=store, mode="r+", write_empty_chunks=False)
    present = dict.fromkeys(SCRATCH, True)
    deadline = time.monotonic() + budget_s
    done = 0
    for version in range(1, rounds + 1):
        for c in DATA_CHUNKS:
            if done and time.monotonic() > deadline:  # one whole round at least, however loaded the machine
                return done
            arr[c * L : (c + 1) * L] = _value(c, version)
            s = c - c % CPS  # the shard's scratch chunk: deleted (fill) or stored again
            arr[s * L : (s + 1) * L] = FILL if present[s] else _value(s, version)
            present[s] = not present[s]
        done = version
    return done


def _check(c: int, chunk: np.ndarray, seen: dict[int, int]) -> str | None:
    if (chunk == FILL).any():
        return f"chunk {c} read as fill after it was written"
    first = int(chunk[0])
    if (chunk != first).any():
        return f"chunk {c} torn: {sorted(set(chunk.tolist()))[:4]}"
    if first % 1000 != c:
        return f"chunk {c} returned the bytes of chunk {first % 1000} (value {first}): old offsets into new data"
    if first < seen.get(c, 0):
        return f"chunk {c} went back from {seen[c]} to {first}"
    seen[c] = first
    return None


def _read_loop(store: Any, r: int, stop: Any, budget_s: float) -> tuple[int, list[str]]:
    """Read data chunks until ``stop`` (or the budget, or MAX_READS); reads made and problems seen."""
    view = zarr.open_array(store=store, mode="r")
    deadline = time.monotonic() + budget_s
    problems: list[str] = []
    seen: dict[int, int] = {}
    n = 0
    for i in range(MAX_READS):
        if i >= MIN_READS and (stop.is_set() or time.monotonic() > deadline or len(problems) >= MAX_PROBLEMS):
            break  # (MIN_READS at least: a fast writer may be done before a loaded reader starts)
        c = DATA_CHUNKS[(r * 7 + i) % len(DATA_CHUNKS)]
        try:
            problem = _check(c, view[c * L : (c + 1) * L], seen)
        except Exception as exc:  # a decode error of torn bytes, or a corrupt-shard error: a finding
            problem = f"chunk {c}: {exc!r}"
        if problem is not None:
            problems.append(f"reader {r}: {problem}")
        n += 1
    return n, problems


def _final_check(store: Any, last_round: int) -> None:
    data = zarr.open_array(store=store, mode="r")[:]
    for c in DATA_CHUNKS:
        chunk = data[c * L : (c + 1) * L]
        assert _check(c, chunk, {}) is None, (c, chunk)
        assert int(chunk[0]) // 1000 in (last_round, last_round + 1), (c, chunk)


# -- S3: readers in other processes --------------------------------------------------------


def _s3_store(endpoint: str, bucket: str, root: str, **options: Any) -> ShardedStore:
    return ShardedStore(MotoS3(endpoint, bucket).filesystem().get_mapper(f"{bucket}/{root}"), **options)


def _open(where: tuple[str, ...], **options: Any) -> ShardedStore:
    """A store at ``("s3", endpoint, bucket, root)`` or ``("local", path)``."""
    return _s3_store(*where[1:], **options) if where[0] == "s3" else ShardedStore(where[1], **options)


def _reader(where: tuple[str, ...], r: int, barrier: Any, stop: Any, results: Any) -> None:
    try:
        store = _open(where)  # its own index cache, kept across reads (default options)
        barrier.wait(60)
        n, problems = _read_loop(store, r, stop, budget_s=40.0)
        results.put((f"reader {r}", n, store.engine.stats.read_stale, problems))
    except Exception:  # reported to the parent, which fails the test with the traceback
        results.put((f"reader {r}", 0, 0, [traceback.format_exc()]))


def _writer(where: tuple[str, ...], barrier: Any, stop: Any, results: Any) -> None:
    try:
        store = _open(where, chunks_per_shard=CPS)
        barrier.wait(60)
        done = _write_rounds(store, rounds=6, budget_s=8.0)
        results.put(("writer", done, 0, []))
    except Exception:  # reported to the parent
        results.put(("writer", -1, 0, [traceback.format_exc()]))
    finally:
        stop.set()


@pytest.mark.parametrize("compressor", ["raw", "zlib"])
@pytest.mark.parametrize("kind", ["s3", "local"])
def test_readers_in_other_processes_never_see_a_torn_chunk(tmp_path, moto_s3, kind, compressor) -> None:  # noqa: F811
    root = f"readers-{uuid.uuid4().hex[:8]}"
    where = ("s3", moto_s3.endpoint_url, moto_s3.bucket, root) if kind == "s3" else ("local", str(tmp_path / root))
    _create(_open(where, chunks_per_shard=CPS), compressor)
    barrier, stop, results = SPAWN.Barrier(3), SPAWN.Event(), SPAWN.Queue()
    procs = [SPAWN.Process(target=_reader, args=(where, r, barrier, stop, results), name=f"r{r}") for r in (1, 2)]
    procs.append(SPAWN.Process(target=_writer, args=(where, barrier, stop, results), name="writer"))
    for p in procs:
        p.start()
    reports = {}
    try:
        for _ in procs:
            name, n, refused, problems = results.get(timeout=JOIN_S)
            reports[name] = (n, refused, problems)
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.terminate()
                p.join(5)
    assert [p for _, _, problems in reports.values() for p in problems] == []
    last_round = reports["writer"][0]
    assert last_round >= 1, reports
    if kind == "s3":  # the race was run: cached indexes went stale and chunk reads were refused (412), then redone
        assert sum(reports[f"reader {r}"][1] for r in (1, 2)) > 0, reports
    _final_check(_open(where), last_round)


# -- S3: deterministic ---------------------------------------------------------------------


def _client_store(moto_s3, root: str, client: str, **options: Any) -> ShardedStore:  # noqa: F811
    if client == "s3fs":
        return ShardedStore(moto_s3.filesystem().get_mapper(root), **options)
    obstore_options = {
        "client": "obstore",
        "endpoint": moto_s3.endpoint_url,
        "region": "us-east-1",
        "access_key_id": "testing",
        "secret_access_key": "testing",
        "client_options": {"allow_http": True},
    }
    return ShardedStore(f"s3://{root}", storage_options=obstore_options, **options)


@pytest.mark.parametrize("client", ["s3fs", "obstore"])
def test_a_cached_index_of_a_shard_replaced_elsewhere_is_refused_and_read_again(moto_s3, client) -> None:  # noqa: F811
    root = f"{moto_s3.bucket}/pinned-{uuid.uuid4().hex[:8]}"
    writer = _client_store(moto_s3, root, client, chunks_per_shard=8, concurrency="none")
    arr = zarr.open_array(
        store=writer,
        mode="w",
        shape=(64,),
        chunks=(8,),
        dtype="i8",
        fill_value=-1,
        compressor=None,
        write_empty_chunks=False,
    )
    arr[8:64] = np.repeat(np.arange(11, 18), 8)  # one shard: chunks 1..7 hold 11..17, chunk 0 absent
    reader = _client_store(moto_s3, root, client, concurrency="none")  # no locks, no CAS
    assert reader.engine.kv.caps.stamps == "native" and reader.engine.kv.caps.round_trips
    view = zarr.open_array(store=reader, mode="r")
    np.testing.assert_array_equal(view[24:32], 13)  # chunk 3 at bytes [128, 192); its index cached
    stats = reader.engine.stats
    assert stats.read_stale == 0 and len(reader.index_cache) == 1

    arr[0:32] = np.repeat([100, 101, 102, 103], 8)  # one call: chunk 0 appears, chunk 3 moves to [192, 256)
    attempts = stats.read_attempts
    # the old offsets would read chunk 2's new bytes (102); the pinned read is refused and redone
    np.testing.assert_array_equal(view[24:32], 103)
    assert stats.read_stale == 1 and stats.read_attempts == attempts + 2

    arr[:] = -1  # every chunk fill: the shard is deleted
    np.testing.assert_array_equal(view[24:32], -1)  # the cached index is refused again: not stored now
    assert stats.read_stale == 2


def test_readers_pin_generations_whatever_the_concurrency_mode(moto_s3) -> None:  # noqa: F811
    from shardkv.storage.fsspec import FsspecStore
    from shardkv.storage.s3 import S3Store

    mapper = moto_s3.filesystem().get_mapper(f"{moto_s3.bucket}/modes-{uuid.uuid4().hex[:8]}")
    for mode in ("auto", "conditional", "process", "none"):
        kv = ShardedStore(mapper, concurrency=mode).engine.kv  # chunk reads are conditioned on ETags
        assert isinstance(kv, S3Store) and kv.caps.stamps == "native" and kv.caps.round_trips, mode
    memory = ShardedStore("memory://modes-pinned").engine.kv  # in-process: stamps see every shardkv write to it
    assert isinstance(memory, FsspecStore) and memory.caps.in_process and memory.caps.stamps == "process"


def test_obstore_memory_stores_pin_their_reads_and_local_stores_have_validators(tmp_path) -> None:
    from shardkv.storage.local import LocalStore
    from shardkv.storage.obstore import ObstoreStore

    obstore_store = pytest.importorskip("obstore.store")
    memory = obstore_store.MemoryStore()
    for mode in ("auto", "conditional", "process", "none"):
        kv = ShardedStore(memory, concurrency=mode).engine.kv
        assert isinstance(kv, ObstoreStore) and kv.caps.stamps == "native" and not kv.caps.round_trips, mode
    local = ShardedStore(obstore_store.LocalStore(str(tmp_path))).engine.kv
    assert isinstance(local, LocalStore)  # a local directory: generations from fstat
    assert local.get("absent").state == "missing"


def test_a_dir_filesystem_over_a_local_directory_is_that_local_directory(tmp_path) -> None:
    from fsspec.implementations.dirfs import DirFileSystem
    from fsspec.implementations.local import LocalFileSystem

    from shardkv.storage.local import LocalStore

    store = ShardedStore(DirFileSystem(str(tmp_path), LocalFileSystem()).get_mapper("sub/data.zarr"))
    base = store.engine.kv
    assert isinstance(base, LocalStore) and base.root == f"{tmp_path}/sub/data.zarr"
    assert store.concurrency_mode == "files" and base.get("absent").state == "missing"


def test_s3_batched_generation_reads_keep_order_and_sort_answers(moto_s3) -> None:  # noqa: F811
    from shardkv.format.ranges import ByteRange
    from shardkv.storage.kv import NO_VALUE, Generation
    from shardkv.storage.s3 import S3Store

    kv = S3Store(moto_s3.filesystem(), f"{moto_s3.bucket}/batch-{uuid.uuid4().hex[:8]}")
    generations = [kv.put(f"k{i}", bytes([i]) * 10, if_generation=NO_VALUE) for i in range(40)]  # > 32 in flight
    found = kv.get_many([(f"k{i}", [ByteRange(i % 10)], ANY) for i in range(40)] + [("none", None, ANY)])
    assert [(None if r.values is None else bytes(r.values[0]), r.generation) for r in found] == [
        (bytes([i]) * (10 - i % 10), generations[i]) for i in range(40)
    ] + [(None, NO_VALUE)]
    stale = Generation('"stale"')
    requests = [("k0", [ByteRange(2, 4)], generations[0]), ("k1", [ByteRange(0, 2)], stale), ("k2", None, NO_VALUE)]
    requests += [("none", None, generations[3]), ("k3", [ByteRange(20, 30)], generations[3])]  # past the end
    requests += [("k4", [ByteRange(5, 5)], generations[4])]  # an empty range
    results = [(r.found, None if not r.values else bytes(r.values[0])) for r in kv.get_many(requests)]
    assert results == [
        (True, b"\0\0"),
        (False, None),
        (False, None),
        (False, None),
        (True, b""),
        (True, b""),
    ]


# -- in one process: memory:// and dict with separate stores -------------------------------


@pytest.mark.parametrize("kind", ["memory", "dict"])
@pytest.mark.parametrize("compressor", ["raw", "zlib"])
def test_readers_with_their_own_stores_racing_a_writer_see_only_complete_values(kind, compressor) -> None:
    base: Any = f"memory://readers-{uuid.uuid4().hex[:8]}" if kind == "memory" else {}
    _create(ShardedStore(base, chunks_per_shard=CPS), compressor)
    stop = threading.Event()
    problems: list[str] = []
    last_round = [0]

    def run(i: int) -> None:
        if i == 0:
            try:
                last_round[0] = _write_rounds(ShardedStore(base, chunks_per_shard=CPS), rounds=6, budget_s=10.0)
            finally:
                stop.set()
            return
        # its own store, default options (memory://: cached indexes checked by identity; dict: whole shards)
        n, found = _read_loop(ShardedStore(base), i, stop, budget_s=30.0)
        problems.extend(found)
        assert n >= 1

    assert run_threads(run, 3, JOIN_S) == []
    assert problems == []
    _final_check(ShardedStore(base), last_round[0])


def test_dict_and_memory_reads_are_consistent_by_construction() -> None:
    # a mapping has no ranged reads: every shard is read whole, index and chunks from one value
    from shardkv.storage.open import open_kv

    assert open_kv({}).caps.ranged is False
    # memory://: a rewrite stores a new file object, and the generation is its identity
    memory = open_kv(f"memory://validator-{uuid.uuid4().hex[:8]}")
    assert memory.get("a", []).generation.is_missing
    memory.put("a", b"1")
    first = memory.get("a", []).generation
    assert first == memory.get("a", []).generation and hash(first) == hash(memory.get("a", []).generation)
    memory.put("a", b"1")  # same bytes, new object: a rewrite is seen
    assert memory.get("a", []).generation != first


class _AlwaysChanged(KVStore):
    """A store whose chunk reads conditioned on a generation are always refused (a writer without pause)."""

    def __init__(self, inner: KVStore) -> None:
        self.inner = inner
        self.caps = inner.caps
        self.whole_reads = 0

    @property
    def location(self) -> Any:
        return self.inner.location

    def get_many(self, reads: Any) -> Any:
        self.whole_reads += sum(ranges is None for _, ranges, _ in reads)
        out = self.inner.get_many(reads)
        return [
            ReadResult("stale", None, ANY) if not cond.is_any and ranges is not None else r
            for (_, ranges, cond), r in zip(reads, out, strict=True)
        ]

    def put_many(self, writes: Any) -> Any:
        return self.inner.put_many(writes)

    def list_prefix(self, prefix: str) -> Any:
        return self.inner.list_prefix(prefix)


def test_a_shard_refused_twice_is_read_whole_so_the_reader_makes_progress() -> None:
    base = f"memory://contended-{uuid.uuid4().hex[:8]}"
    arr = zarr.open_array(store=ShardedStore(base, chunks_per_shard=8), mode="w", shape=(64,), chunks=(8,), dtype="i8")
    arr[:] = np.arange(64)
    reader = ShardedStore(base)
    fake = reader.engine.reads.kv = _AlwaysChanged(reader.engine.kv)  # the reads go through it
    stats = reader.engine.stats
    np.testing.assert_array_equal(zarr.open_array(store=reader, mode="r")[8:16], np.arange(8, 16))
    # index + refused range, twice; then the whole shard in one read (index and chunks of one generation)
    assert (stats.read_attempts, stats.read_stale, fake.whole_reads) == (3, 2, 1)


_IN_PROCESS_KINDS = ["local", "memory", "obstore-local", "obstore-memory", "dirfs"]


def _two_stores(tmp_path: Any, kind: str, **options: Any) -> tuple[ShardedStore, ShardedStore]:
    """A writer (with ``options``) and a reader (defaults) over one store, each built from its own objects.

    ``obstore-memory`` shares the one ``MemoryStore`` object (its data); every other kind
    makes a new base store object for each (a path, a URL, a ``LocalStore``, a ``DirFileSystem`` mapper).
    """
    if kind == "local":
        base = str(tmp_path / "two.zarr")
        return ShardedStore(base, **options), ShardedStore(base)
    if kind == "memory":
        base = f"memory://two-{uuid.uuid4().hex[:8]}"
        return ShardedStore(base, **options), ShardedStore(base)
    if kind == "dirfs":
        from fsspec.implementations.dirfs import DirFileSystem
        from fsspec.implementations.local import LocalFileSystem

        def make() -> Any:
            return DirFileSystem(str(tmp_path), LocalFileSystem()).get_mapper("two.zarr")

        return ShardedStore(make(), **options), ShardedStore(make())
    obstore_store = pytest.importorskip("obstore.store")
    if kind == "obstore-memory":
        shared = obstore_store.MemoryStore()
        return ShardedStore(shared, **options), ShardedStore(shared)
    path = tmp_path / "two.zarr"
    path.mkdir()
    return ShardedStore(obstore_store.LocalStore(str(path)), **options), ShardedStore(
        obstore_store.LocalStore(str(path))
    )


@pytest.mark.parametrize("kind", _IN_PROCESS_KINDS)
def test_a_cached_index_of_a_local_shard_rewritten_by_another_store_is_not_trusted(tmp_path, kind) -> None:
    # another store (as another process would) moves chunk 3 inside the shard; the reader's
    # default index cache must not send it to the old offsets (they hold chunk 2's new bytes)
    writer, reader = _two_stores(tmp_path, kind, chunks_per_shard=8)
    arr = zarr.open_array(
        store=writer,
        mode="w",
        shape=(64,),
        chunks=(8,),
        dtype="i8",
        fill_value=-1,
        compressor=None,
        write_empty_chunks=False,
    )
    arr[8:64] = np.repeat(np.arange(11, 18), 8)  # chunk 0 absent
    # the reader has default options (its cached index is trusted only as far as the shard's generation)
    view = zarr.open_array(store=reader, mode="r")
    np.testing.assert_array_equal(view[24:32], 13)
    assert len(reader.index_cache) == 1
    arr[0:32] = np.repeat([100, 101, 102, 103], 8)  # chunk 0 appears: chunk 3 moves
    np.testing.assert_array_equal(view[24:32], 103)
    np.testing.assert_array_equal(
        view[:], np.concatenate([np.repeat([100, 101, 102, 103], 8), np.repeat(np.arange(14, 18), 8)])
    )


@pytest.mark.parametrize("kind", [*_IN_PROCESS_KINDS, "s3fs", "obstore"])
def test_a_chunk_absent_from_a_cached_index_but_written_since_is_read(tmp_path, moto_s3, kind) -> None:  # noqa: F811
    # zarr patches a partly written chunk from what a read returns: a stale "missing" would make it
    # write fill values over another process's chunk
    if kind in ("s3fs", "obstore"):
        root = f"{moto_s3.bucket}/absent-{uuid.uuid4().hex[:8]}"
        writer = _client_store(moto_s3, root, kind, chunks_per_shard=8, concurrency="none")
        reader = _client_store(moto_s3, root, kind, concurrency="none")
    else:
        writer, reader = _two_stores(tmp_path, kind, chunks_per_shard=8)
    arr = zarr.open_array(
        store=writer,
        mode="w",
        shape=(64,),
        chunks=(8,),
        dtype="i8",
        fill_value=-1,
        compressor=None,
        write_empty_chunks=False,
    )
    arr[8:16] = 11  # the shard exists; chunk 0 does not
    view = zarr.open_array(store=reader, mode="r")
    np.testing.assert_array_equal(view[0:16], [-1] * 8 + [11] * 8)  # the index is cached: chunk 0 absent
    arr[0:8] = 100  # written by another store
    np.testing.assert_array_equal(view[0:8], 100)


def test_an_index_read_while_its_shard_appeared_is_not_cached_against_missing(tmp_path) -> None:
    # a shard stored just before the index read, then deleted: never cached as missing
    path = str(tmp_path / "appear.zarr")
    writer = ShardedStore(path, chunks_per_shard=4)
    arr = zarr.open_array(store=writer, mode="w", shape=(16,), chunks=(2,), dtype="i4", fill_value=0)
    reader = ShardedStore(path)
    zarr.open_array(store=reader, mode="r")  # metadata read before the race
    kv = reader.engine.kv
    real_get_many = kv.get_many
    raced: list[bool] = []

    def write_first(requests):
        if not raced:
            raced.append(True)
            arr[0:2] = 7  # shard 0 appears just before the index read
        return real_get_many(requests)

    kv.get_many = write_first
    assert "0" in reader and raced  # read through the race
    kv.get_many = real_get_many
    del writer["0"]  # the shard's only chunk: the shard is deleted
    assert "0" not in reader and "0" not in list(reader.keys())
