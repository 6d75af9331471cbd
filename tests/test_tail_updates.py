"""O(chunk) shard updates (``shard_updates=``): a clone plus the new chunks on reflink file systems,
an in-place append with a write-ahead intent elsewhere (opt-in), whole rewrites past the dead-bytes
threshold, and ``compact``.

Bytes are counted where they are handed to the kernel: the local store's two low-level writes
(``_pwrite_all``, ``write_parts``) and its reads (``pread_exact``). The clone path runs on a real
reflink file system (the ``reflink_dir`` fixture: an XFS image mounted with reflinks), the append
and rewrite paths on this machine's temporary directory (ext4: no clones).
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import shutil
from pathlib import Path

import numcodecs
import numpy as np
import pytest
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st
from local_io import LocalIO

import shardkv.storage.local as local_mod
from shardkv import ShardedStore
from shardkv.engine.options import Options
from shardkv.errors import ConfigurationError
from shardkv.format.layout import ShardLayout
from shardkv.format.tail import AppendIntent, dead_fraction, old_tail_range, parts_crc32c, plan_tail_update
from shardkv.storage.files import clones_files
from shardkv.storage.kv import LOCK_DIR
from shardkv.storage.local import LocalStore

# -- the counting hooks ----------------------------------------------------------------------------


def _count_io(monkeypatch: pytest.MonkeyPatch) -> LocalIO:
    """Count the local store's low-level I/O (monkeypatched on its module) for this test."""
    io = LocalIO()
    for name, wrapper in io.wrappers(local_mod).items():
        monkeypatch.setattr(local_mod, name, wrapper)
    return io


def _shard_files(root: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in root.iterdir() if p.name[0].isdigit()}


# -- the option --------------------------------------------------------------------------------------


def test_options_defaults_and_checks() -> None:
    assert Options().shard_updates == "auto"
    assert Options().max_dead_fraction == 0.5
    assert Options.from_keywords(shard_updates="append", max_dead_fraction=1).shard_updates == "append"
    for bad in ({"shard_updates": "inplace"}, {"shard_updates": None}):
        with pytest.raises(ConfigurationError, match="shard_updates must be one of"):
            Options.from_keywords(**bad)
    for dead in (0, 0.0, -0.1, 1.5, float("nan"), True, "0.5"):
        with pytest.raises(ConfigurationError, match="max_dead_fraction"):
            Options(max_dead_fraction=dead)


# -- the pure plan and the intent record -------------------------------------------------------------


@pytest.mark.parametrize("how", ["clone", "append"])
@pytest.mark.parametrize("location", ["end", "start"])
def test_plan_keeps_old_offsets_and_reads_back(how: str, location: str) -> None:
    layout = ShardLayout.v3((2, 2), location)
    old = {(0, 0): b"aaaa", (0, 1): b"bb", (1, 1): b"cccccc"}
    parts, index = layout.encode_shard_with_index(old)
    shard = b"".join(parts)
    if how == "append" and location == "start":
        with pytest.raises(ValueError, match="index at the end"):
            plan_tail_update(layout, index, len(shard), {(0, 1): b"B"}, how)
        return
    plan = plan_tail_update(layout, index, len(shard), {(0, 1): b"BBB", (1, 1): None, (1, 0): b"dd"}, how)
    new = bytearray(shard)
    for offset, writes in plan.writes:
        blob = b"".join(writes)
        if how == "append":
            assert offset >= len(shard)  # nothing before the old size is written in place
        new[offset : offset + len(blob)] = blob
    del new[plan.nbytes :]
    assert len(new) == plan.nbytes
    assert plan.index.get((0, 0)) == index.get((0, 0))  # an unchanged chunk keeps its offset
    assert layout.chunks_of_shard(bytes(new), "s") == {(0, 0): b"aaaa", (0, 1): b"BBB", (1, 0): b"dd"}
    assert plan.used_nbytes == 4 + 3 + 2 + layout.index_nbytes
    assert dead_fraction(plan) == (plan.nbytes - plan.used_nbytes) / plan.nbytes


_LOCALS = [(i, j) for i in range(2) for j in range(3)]
_VALUES = st.one_of(st.none(), st.binary(max_size=12))


@settings(max_examples=300, deadline=None)
@given(
    old=st.dictionaries(st.sampled_from(_LOCALS), st.binary(max_size=12)),
    updates=st.dictionaries(st.sampled_from(_LOCALS), _VALUES, min_size=1),
    how=st.sampled_from(["clone", "append"]),
    location=st.sampled_from(["end", "start"]),
    checksum=st.booleans(),
)
def test_plan_applied_reads_as_the_merge_and_never_touches_old_chunks(old, updates, how, location, checksum) -> None:
    """Property: applying a plan gives the merged chunks, and no write lands on bytes an old index entry points at."""
    if how == "append" and location == "start":
        return
    layout = ShardLayout.v3((2, 3), location, index_checksum=checksum)
    parts, index = layout.encode_shard_with_index(old)
    shard = b"".join(parts)
    plan = plan_tail_update(layout, index, len(shard), updates, how)
    new = bytearray(shard)
    old_spans = [(o, o + n) for _, o, n in index.stored_entries() if n]
    for offset, writes in plan.writes:
        blob = b"".join(writes)
        assert not any(offset < stop and start < offset + len(blob) for start, stop in old_spans)
        if how == "append":
            assert offset >= len(shard)
        new[offset : offset + len(blob)] = blob
    del new[plan.nbytes :]
    merged = {k: v for k, v in {**old, **updates}.items() if v is not None}
    assert {k: bytes(v) for k, v in layout.chunks_of_shard(bytes(new), "s").items()} == merged
    assert plan.used_nbytes == sum(map(len, merged.values())) + layout.index_nbytes <= plan.nbytes


def test_intent_round_trip_and_torn_records() -> None:
    intent = AppendIntent("/data/a b/é/0.0", 123456789, 1000, 2024, 0x0BADF00D, 0xDEADBEEF)
    raw = intent.encode()
    assert AppendIntent.decode(raw) == intent
    assert AppendIntent.decode(raw + b"\0" * 10) == intent
    assert AppendIntent.decode(b"") is None
    for cut in range(len(raw)):  # a record torn while written reads as none
        assert AppendIntent.decode(raw[:cut]) is None
    for flip in range(len(raw)):  # so does any damaged byte
        damaged = bytearray(raw)
        damaged[flip] ^= 0x40
        assert AppendIntent.decode(bytes(damaged)) is None


def test_clone_detection(tmp_path: Path, reflink_dir: Path) -> None:
    assert clones_files(str(reflink_dir)) is True
    assert clones_files(str(tmp_path)) is False  # this machine's /tmp: ext4
    assert not [p for p in reflink_dir.iterdir()]  # the probe's temporary files are gone


# -- the benchmark workload: one 64**3 chunk in each of 8 shards of a 512**3 uint16 array ---------------

_SHAPE, _CHUNKS = (512, 512, 512), (64, 64, 64)


@pytest.fixture(scope="module")
def big_array(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    """The benchmark array written once (8 shards of 4x4x4 chunks, zstd level 0), and its data."""
    root = tmp_path_factory.mktemp("big") / "a"
    data = np.random.default_rng(0).integers(0, 16, size=_SHAPE, dtype=np.uint16)
    z = zarr.create(
        shape=_SHAPE,
        chunks=_CHUNKS,
        dtype="u2",
        compressor=numcodecs.Zstd(level=0),
        store=ShardedStore(root, chunks_per_shard=4),
    )
    z[:] = data
    return root, data


def _update_one_chunk_per_shard(root: Path, shard_updates: str, io: LocalIO) -> tuple[ShardedStore, np.ndarray]:
    store = ShardedStore(root, shard_updates=shard_updates)
    z = zarr.open(store, mode="r+")
    new = np.random.default_rng(1).integers(0, 16, size=_CHUNKS, dtype=np.uint16)  # as incompressible as the rest
    io.reset()
    for corner in np.ndindex(2, 2, 2):  # chunk (1,1,1) of each shard: one 64**3 chunk per shard
        sl = tuple(slice(c * 256 + 64, c * 256 + 128) for c in corner)
        z[sl] = new
    return store, new


@pytest.mark.parametrize("place", ["auto on reflinks", "append on ext4"])
def test_one_chunk_per_shard_costs_the_chunks(
    place: str, big_array: tuple[Path, np.ndarray], tmp_path: Path, request: pytest.FixtureRequest, monkeypatch
) -> None:
    src, data = big_array
    base = request.getfixturevalue("reflink_dir") if place.startswith("auto") else tmp_path
    root = base / "a"
    shutil.copytree(src, root)
    io = _count_io(monkeypatch)
    store, new = _update_one_chunk_per_shard(root, place.split()[0], io)
    whole = sum(_shard_files(root).values())  # what rewriting the 8 shards whole writes (and reads)
    assert store._engine.stats.tail_updates == 8
    assert io.written <= whole / 8, (io.written, whole)
    assert io.read == 8 * (16 * 64 + 4), io.read  # the 8 indexes, nothing of the chunks
    expected = data.copy()
    for corner in np.ndindex(2, 2, 2):
        expected[tuple(slice(c * 256 + 64, c * 256 + 128) for c in corner)] = new
    assert np.array_equal(zarr.open(ShardedStore(root), mode="r")[:], expected)


def test_rewrite_writes_whole_shards(big_array: tuple[Path, np.ndarray], tmp_path: Path, monkeypatch) -> None:
    src, _ = big_array
    root = tmp_path / "a"
    shutil.copytree(src, root)
    io = _count_io(monkeypatch)
    store, _ = _update_one_chunk_per_shard(root, "rewrite", io)
    assert store._engine.stats.tail_updates == 0
    assert io.written == sum(_shard_files(root).values())


def test_auto_on_ext4_rewrites_whole(tmp_path: Path) -> None:
    """No clones and no opt-in: readers without shardkv never meet a torn tail."""
    st = ShardedStore(tmp_path / "a", chunks_per_shard=2)
    z = zarr.create(shape=(8,), chunks=(2,), dtype="u1", store=st, compressor=None)
    z[:] = 1
    inode = (tmp_path / "a" / "0").stat().st_ino
    z[0:2] = 2
    assert st._engine.stats.tail_updates == 0
    assert (tmp_path / "a" / "0").stat().st_ino != inode  # a new file renamed over the shard


# -- dead bytes: the automatic threshold and compact -------------------------------------------------


def _small(root: Path, **options) -> zarr.Array:
    st = ShardedStore(root, chunks_per_shard=4, **options)
    return zarr.create(shape=(32, 32), chunks=(4, 4), dtype="u2", store=st, compressor=None)


@pytest.mark.parametrize("place", ["auto on reflinks", "append on ext4"])
@pytest.mark.parametrize("max_dead", [0.5, 0.25])
def test_dead_bytes_bounded_then_compacted(
    place: str, max_dead: float, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    base = request.getfixturevalue("reflink_dir") if place.startswith("auto") else tmp_path
    root = base / "a"
    z = _small(root, shard_updates=place.split()[0], max_dead_fraction=max_dead)
    data = np.arange(32 * 32, dtype="u2").reshape(32, 32)
    z[:] = data
    layout = ShardLayout.v3((4, 4))
    engine = z.store._engine
    rewrites_seen = 0
    previous = (root / "0.0").stat().st_size
    for i in range(60):  # one chunk of shard 0.0 at a time, round the shard's chunks
        r, c = divmod(i % 16, 4)
        data[r * 4 : r * 4 + 4, c * 4 : c * 4 + 4] = i
        z[r * 4 : r * 4 + 4, c * 4 : c * 4 + 4] = i
        blob = (root / "0.0").read_bytes()
        index = layout.index_of_shard(blob, "0.0")
        used = index.used_nbytes() + layout.index_nbytes
        assert len(blob) - used <= max_dead * len(blob), (i, len(blob), used)
        assert len(blob) <= used / (1 - max_dead) + layout.index_nbytes
        rewrites_seen += len(blob) < previous
        previous = len(blob)
    if max_dead == 0.5:  # mostly O(chunk), compacted now and then
        assert engine.stats.tail_updates >= 30 and rewrites_seen >= 2
    assert np.array_equal(z[:], data)
    loose = zarr.open(ShardedStore(root, shard_updates=place.split()[0], max_dead_fraction=1.0), mode="r+")
    loose[0:4, 0:4] = 99  # dead bytes left for compact
    data[0:4, 0:4] = 99
    assert loose.store._engine.stats.tail_updates == 1
    assert z.store.compact() > 0
    fresh = _small(tmp_path / "fresh")
    fresh[:] = data
    for name in ("0.0", "0.1", "1.0", "1.1"):  # compacted: exactly what a fresh write stores
        assert (root / name).read_bytes() == (tmp_path / "fresh" / name).read_bytes()
    assert z.store.compact() == 0


# -- warm reads after another process's O(chunk) update ------------------------------------------------


def _update_in_child(root: str, shard_updates: str, value: int) -> None:
    z = zarr.open(ShardedStore(root, shard_updates=shard_updates), mode="r+")
    z[0:4, 0:4] = value


@pytest.mark.parametrize("place", ["auto on reflinks", "append on ext4"])
def test_warm_reads_see_another_process_update(place: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    base = request.getfixturevalue("reflink_dir") if place.startswith("auto") else tmp_path
    root = base / "a"
    z = _small(root)
    z[:] = 1
    assert (z[0:4, 0:4] == 1).all()  # warm: the index of 0.0 is cached with its generation
    reader = z.store._engine
    entry = reader.cache.peek("0.0")
    assert entry is not None and entry.size is not None
    ctx = multiprocessing.get_context("fork")
    for value in (2, 3):
        child = ctx.Process(target=_update_in_child, args=(str(root), place.split()[0], value))
        child.start()
        child.join(60)
        assert child.exitcode == 0
        stale = reader.stats.read_stale
        assert (z[0:4, 0:4] == value).all()
        assert reader.stats.read_stale == stale + 1  # the cached entry was refused, not served
        assert (z[4:8, 0:4] == 1).all()


def test_local_store_reached_from_every_face(tmp_path: Path) -> None:
    from shardkv.engine.engine import ShardEngine  # noqa: F401  (the engine over the opened store)

    for base in (str(tmp_path / "p"), zarr.storage.DirectoryStore(str(tmp_path / "d"))):
        st = ShardedStore(base, chunks_per_shard=2)
        assert isinstance(st._engine.kv, LocalStore)
        assert st._engine.kv.caps.tail_updates


def test_update_tail_refuses_a_stale_generation(tmp_path: Path, reflink_dir: Path) -> None:
    for root, how in ((reflink_dir, "clone"), (tmp_path, "append")):
        kv = LocalStore(root)
        kv.put("k", b"0123456789")
        old = kv.get("k").generation
        kv.put("k", b"abcdefghij")
        with open(root / "intent", "w+b") as intent:
            assert kv.update_tail("k", [(10, b"XY")], 12, old, how, intent.fileno()) is None
        assert kv.get("k").whole() == b"abcdefghij"
        assert not [p for p in os.listdir(root) if ".shardkv-tmp-" in p]


@pytest.mark.parametrize("place", ["auto on reflinks", "auto on ext4", "append on ext4"])
def test_one_read_per_shard_and_round(place: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch) -> None:
    """A rewritten shard is read once, whole; an O(chunk) update reads its index; a new shard is read once."""
    base = request.getfixturevalue("reflink_dir") if "reflinks" in place else tmp_path
    z = _small(base / "a", shard_updates=place.split()[0])
    z[0:16, 0:16] = 1  # shard 0.0 stored whole; 0.1 not stored
    calls: list[list[tuple[str, object]]] = []
    real = LocalStore.get_many

    def get_many(self, reads):
        calls.append([(k, r) for k, r, _ in reads])
        return real(self, reads)

    monkeypatch.setattr(LocalStore, "get_many", get_many)
    z[0:4, 0:4] = 2  # a stored shard covered in part
    z[0:4, 16:20] = 3  # a shard not stored yet
    o_chunk = place != "auto on ext4"
    assert [[k for k, _ in c] for c in calls] == [["0.0"], ["0.1"]]  # one request per shard
    # O(chunk): the cached index checked by a zero-range read, the new shard's index range; else whole reads
    assert calls[0][0][1] == ([] if o_chunk else None)
    assert (calls[1][0][1] is None) is not o_chunk


@pytest.mark.parametrize(
    ("place", "layout", "o_chunk"),
    [
        ("auto on reflinks", {"index_location": "start"}, True),  # the clone's start index rewritten in place
        ("auto on reflinks", {"index_checksum": False}, True),
        ("append on ext4", {"index_location": "start"}, False),  # in place it would overwrite the live index
        ("append on ext4", {"index_checksum": False}, False),  # a torn tail could read as numbers
        ("append on ext4", {}, True),
    ],
    ids=["clone-start", "clone-no-crc", "append-start", "append-no-crc", "append-end-crc"],
)
def test_layouts_each_path_takes(
    place: str, layout: dict, o_chunk: bool, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    base = request.getfixturevalue("reflink_dir") if "reflinks" in place else tmp_path
    z = _small(base / "a", shard_updates=place.split()[0], max_dead_fraction=1.0, **layout)
    data = np.arange(32 * 32, dtype="u2").reshape(32, 32)
    z[:] = data
    for i in range(3):
        z[4:8, 8:12] = 500 + i
        data[4:8, 8:12] = 500 + i
    assert z.store._engine.stats.tail_updates == (3 if o_chunk else 0)
    assert np.array_equal(zarr.open(ShardedStore(base / "a"), mode="r")[:], data)
    shard = ShardLayout.v3(
        (4, 4), layout.get("index_location", "end"), index_checksum=layout.get("index_checksum", True)
    )
    chunks = shard.chunks_of_shard((base / "a" / "0.0").read_bytes(), "0.0")  # as readers without shardkv decode it
    assert np.frombuffer(chunks[(1, 2)], dtype="u2").tolist() == [502] * 16


def test_a_file_that_will_not_clone_is_rewritten_whole(reflink_dir: Path, monkeypatch) -> None:
    """The probe said yes, this shard's clone says EINVAL: the round goes again without clones, and nothing is lost."""
    import errno
    import fcntl

    import shardkv.storage.files as files_mod

    z = _small(reflink_dir / "a")
    z[:] = 1
    assert clones_files(str(reflink_dir / "a"))
    real_ioctl = fcntl.ioctl

    def ioctl(fd, request, arg=0, *rest):
        if request == files_mod.FICLONE:
            raise OSError(errno.EINVAL, "cannot clone this file")
        return real_ioctl(fd, request, arg, *rest)

    monkeypatch.setattr(files_mod.fcntl, "ioctl", ioctl)
    monkeypatch.setattr(files_mod, "_CLONES", {})  # this process forgets its probes (restored after the test)
    monkeypatch.setattr(files_mod, "_CLONE_DIRS", {})
    monkeypatch.setitem(files_mod._CLONES, os.stat(reflink_dir).st_dev, True)
    z[0:4, 0:4] = 2
    engine = z.store._engine
    assert engine.stats.tail_updates == 0 and engine.stats.write_lost == 1  # one round lost, then a whole rewrite
    assert not clones_files(str(reflink_dir / "a"))
    assert (z[0:4, 0:4] == 2).all() and (z[4:, :] == 1).all()
    assert not [p for p in (reflink_dir / "a").iterdir() if ".shardkv-tmp-" in p.name]


@pytest.mark.parametrize("place", ["auto on reflinks", "append on ext4"])
def test_an_update_sweeps_stale_temporaries(place: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Clones of killed writers are temporaries like any other: the next write into their directory removes them."""
    import time

    from shardkv.storage import local
    from shardkv.storage.kv import TEMP_MARKER

    base = request.getfixturevalue("reflink_dir") if "reflinks" in place else tmp_path
    z = _small(base / "a", shard_updates=place.split()[0])
    z[:] = 1
    old = base / "a" / f"{TEMP_MARKER}killed-clone"
    old.write_bytes(b"a clone left by a killed writer")
    hour_ago = time.time() - 3700
    os.utime(old, (hour_ago, hour_ago))
    local._SWEPT.clear()  # as in a new process
    z[0:4, 0:4] = 2
    assert z.store._engine.stats.tail_updates == 1
    assert not old.exists()


def _intent_for(path: Path, appended: bytes) -> AppendIntent:
    """The intent an append of ``appended`` to the file at ``path`` records (its state now is the old one)."""
    data = path.read_bytes()
    old_tail = data[slice(*old_tail_range(len(data)))]
    return AppendIntent(
        os.path.realpath(path),
        path.stat().st_ino,
        len(data),
        len(data) + len(appended),
        parts_crc32c([old_tail]),
        parts_crc32c([appended]),
    )


@pytest.mark.parametrize(
    "case",
    ["torn", "zeros at the new size", "complete", "later append", "rewritten shorter", "rewritten longer", "untouched"],
)
def test_recovery_cuts_only_a_torn_append(case: str, tmp_path: Path) -> None:
    """recover_append cuts a torn append back to the old size and leaves every other file as it is."""
    shard, lock = tmp_path / "0", tmp_path / "0.lock"
    old, appended = bytes(range(200)) * 30, b"N" * 500  # 6000 bytes: more than the old tail checked
    shard.write_bytes(old)
    intent = _intent_for(shard, appended)
    lock.write_bytes(intent.encode())
    now = {
        "torn": old + appended[:123],
        "zeros at the new size": old + bytes(len(appended)),
        "complete": old + appended,
        "later append": old + appended + b"L" * 40,  # a later writer's bytes after the append stay
        "rewritten shorter": b"R" * 100,  # the same inode number given to a shard rewritten since
        "rewritten longer": b"R" * (len(old) + 100),
        "untouched": old,
    }[case]
    with open(shard, "r+b") as f:  # in place: the inode stays
        f.write(now)
        f.truncate(len(now))
    expected = old if case in ("torn", "zeros at the new size") else now
    fd = os.open(lock, os.O_RDWR)
    try:
        assert LocalStore(str(tmp_path)).recover_tail(fd) == os.path.realpath(shard)
        assert shard.read_bytes() == expected
        assert AppendIntent.decode(lock.read_bytes()) is None  # the intent is cleared (its slot stays)
        assert LocalStore(str(tmp_path)).recover_tail(fd) is None  # and a second recovery changes nothing
    finally:
        os.close(fd)
    assert shard.read_bytes() == expected


def test_a_shard_linked_to_another_file_system_is_rewritten_whole(
    reflink_dir: Path, tmp_path: Path, monkeypatch
) -> None:
    """A shard that is a symbolic link to a file on ext4, in an array directory on XFS with reflinks: its clone
    beside the link fails (EXDEV); the update is written whole instead of losing every round."""
    import shardkv.storage.files as files_mod

    monkeypatch.setattr(files_mod, "_CLONES", {})  # this process forgets its probes (restored after the test)
    monkeypatch.setattr(files_mod, "_CLONE_DIRS", {})
    z = _small(reflink_dir / "a")
    z[:] = 1
    shard = reflink_dir / "a" / "0.0"
    (tmp_path / "0.0").write_bytes(shard.read_bytes())
    shard.unlink()
    shard.symlink_to(tmp_path / "0.0")
    z = zarr.open(ShardedStore(str(reflink_dir / "a")), mode="r+")
    z[0:4, 0:4] = 2
    assert (z[0:4, 0:4] == 2).all() and (z[4:, :] == 1).all()
    assert not [p for p in (reflink_dir / "a").iterdir() if ".shardkv-tmp-" in p.name]


@pytest.mark.parametrize("place", ["auto on reflinks", "append on ext4"])
def test_a_full_file_system_fails_the_update_and_leaves_the_shard(
    place: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch
) -> None:
    """ENOSPC in the middle of an update's writes: the error is raised (no KeyError, no retry), the clone is
    removed, the shard keeps its bytes, and the next write (the disk freed) stores the update."""
    import errno

    base = request.getfixturevalue("reflink_dir") if place.startswith("auto") else tmp_path
    mode = place.split()[0]
    z = _small(base / "a", shard_updates=mode)
    z[:] = 1
    before = (base / "a" / "0.0").read_bytes()
    real_pwrite, real_parts = local_mod._pwrite_all, local_mod.write_parts
    calls, fail_at = [0], 1 if mode == "auto" else 2  # the clone's one write; the append after its intent

    def full(*args):
        calls[0] += 1
        if calls[0] == fail_at:
            raise OSError(errno.ENOSPC, "No space left on device")
        return (real_pwrite if len(args) == 3 else real_parts)(*args)

    monkeypatch.setattr(local_mod, "_pwrite_all", full)
    monkeypatch.setattr(local_mod, "write_parts", full)
    with pytest.raises(OSError) as raised:
        z[0:4, 0:4] = 2
    assert raised.value.errno == errno.ENOSPC and calls[0] == fail_at
    assert (base / "a" / "0.0").read_bytes()[: len(before)] == before
    assert not [p for p in (base / "a").iterdir() if ".shardkv-tmp-" in p.name]
    monkeypatch.setattr(local_mod, "_pwrite_all", real_pwrite)
    monkeypatch.setattr(local_mod, "write_parts", real_parts)
    assert (zarr.open(ShardedStore(str(base / "a")), mode="r")[:] == 1).all()  # repairs a torn append first
    z[0:4, 0:4] = 2
    assert (z[0:4, 0:4] == 2).all() and (z[4:, :] == 1).all()
    assert z.store._engine.stats.tail_updates == 1  # the update took the O(chunk) path


# -- the append intent's slot in the lock file ------------------------------------------------------


def test_append_intents_overwrite_their_slot_and_never_resize_the_lock_file(tmp_path: Path, monkeypatch) -> None:
    """After the first intent, an append's intent write and its clearing are overwrites of the lock file's start.

    So the intent's fdatasync flushes its block alone: a lock file whose size
    changed (cut to 0 to clear, grown by the next record) also needs a
    journal commit, which waits for every other file's ordered data.
    """
    root = tmp_path / "a"
    z = _small(root, shard_updates="append", max_dead_fraction=1.0)  # every update an append
    z[:] = np.arange(32 * 32, dtype="u2").reshape(32, 32)
    z[0:4, 0:4] = 1  # the first append writes the lock file's first record
    (lock_file,) = [p for p in (root / ".shardkv-locks").glob("*.lock") if p.stat().st_size]
    size = lock_file.stat().st_size
    assert size > 0 and AppendIntent.decode(lock_file.read_bytes()) is None  # cleared, kept in place
    resized: list[int] = []
    real_ftruncate = os.ftruncate
    monkeypatch.setattr(os, "ftruncate", lambda fd, n: (resized.append(n), real_ftruncate(fd, n)))
    for i in range(2, 6):
        z[0:4, 0:4] = i
        assert lock_file.stat().st_size == size
        assert AppendIntent.decode(lock_file.read_bytes()) is None
    assert resized == [] and z.store._engine.stats.tail_updates == 5
    assert np.array_equal(z[0:4, 0:4], np.full((4, 4), 5, dtype="u2"))


def test_a_write_reads_no_lock_file_that_never_recorded_an_append(tmp_path: Path, monkeypatch) -> None:
    """An empty lock file records no append: a write hold asks the store to recover only non-empty ones."""
    recovered: list[str | None] = []
    real = LocalStore.recover_tail

    def counting(self: LocalStore, fd: int, path: str | None = None, repair: bool = True) -> str | None:
        recovered.append(path)
        return real(self, fd, path, repair)

    monkeypatch.setattr(LocalStore, "recover_tail", counting)
    plain = _small(tmp_path / "plain")
    plain[:] = 1
    for i in range(3):
        plain[0:4, 0:4] = i  # a whole rewrite under the lock file of shard 0, which stays empty
    assert recovered == [] and all(p.stat().st_size == 0 for p in (tmp_path / "plain" / LOCK_DIR).iterdir())
    root = tmp_path / "a"
    z = _small(root, shard_updates="append", max_dead_fraction=1.0)
    z[:] = 1
    z[0:4, 0:4] = 2  # the first append records (and clears) its intent in the lock file of shard 0
    recovered.clear()
    z[0:4, 0:4] = 3  # that lock file is no longer empty: the hold recovers it (nothing to do)
    (lock_file,) = [p for p in (root / LOCK_DIR).glob("*.lock") if p.stat().st_size]
    assert recovered == [str(lock_file)] and (z[0:4, 0:4] == 3).all()


@pytest.mark.parametrize("inside", [True, False])
def test_recovery_touches_only_files_under_the_store_root(inside: bool, tmp_path: Path) -> None:
    """A record naming a file outside the store's root (a crafted or moved record) is never acted on.

    Lock files may be writable by the array's group; a record in one must not
    let recovery cut a file elsewhere. The same record naming a shard under
    the root is recovered (the control).
    """
    root = tmp_path / "root"
    (root / "a").mkdir(parents=True)
    target = (root / "a" / "0") if inside else (tmp_path / "elsewhere")
    old, appended = bytes(range(200)) * 30, b"N" * 500
    target.write_bytes(old)
    intent = _intent_for(target, appended)
    target.write_bytes(old + appended[:123])  # a torn append, as far as the record can tell
    lock = root / "a" / "stripe.lock"
    lock.write_bytes(intent.encode())
    fd = os.open(lock, os.O_RDWR)
    try:
        LocalStore(str(root)).recover_tail(fd)
    finally:
        os.close(fd)
    assert target.read_bytes() == (old if inside else old + appended[:123])


@pytest.mark.parametrize("durable", [True, False])
def test_the_first_append_into_a_lock_file_makes_its_entry_durable(durable: bool, tmp_path: Path, monkeypatch) -> None:
    """Before the first intent it records in a lock file, a durable store syncs the lock file's directory and that
    directory's own (the lock file or directory may have been made by this very hold); once per lock file; a store
    whose fsync is off syncs nothing.
    """
    import stat

    root = tmp_path / "a"
    z = _small(root, shard_updates="append", max_dead_fraction=1.0)
    z[:] = np.arange(32 * 32, dtype="u2").reshape(32, 32)
    z.store.engine.kv.fsync = durable
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    z[0:4, 0:4] = 1  # the first append through this lock file
    (lock_file,) = [p for p in (root / LOCK_DIR).glob("*.lock") if p.stat().st_size]
    lock_dir = os.path.realpath(lock_file.parent)
    expected = [lock_dir, os.path.dirname(lock_dir)] if durable else []
    assert sorted(synced) == sorted(expected)
    synced.clear()
    z[0:4, 0:4] = 2  # the same lock file again
    assert synced == [] and z.store.engine.stats.tail_updates == 2


@pytest.mark.parametrize("target", ["in the array", "in another array", "through a link", "through '..'"])
def test_recovery_in_a_linked_array_touches_only_its_real_directory(target: str, tmp_path: Path) -> None:
    """With the lock file's path, recovery acts on files in that array's real directory only, by their real path.

    The array is a symbolic link out of the store's root; a record in its lock
    file naming a file of another array, a path through a link in the array
    (to a file elsewhere), or one with ``..`` is left alone; the array's own
    shard is recovered (the control).
    """
    root, real = tmp_path / "root", tmp_path / "elsewhere" / "arr"
    (real / LOCK_DIR).mkdir(parents=True)
    (tmp_path / "other").mkdir()
    root.mkdir()
    (root / "arr").symlink_to(real, target_is_directory=True)
    (real / "link").symlink_to(tmp_path / "other", target_is_directory=True)
    files = {
        "in the array": real / "0",
        "in another array": tmp_path / "other" / "0",
        "through a link": tmp_path / "other" / "0",
        "through '..'": tmp_path / "other" / "0",
    }
    shard = files[target]
    old, appended = bytes(range(200)) * 30, b"N" * 500
    shard.write_bytes(old)
    intent = _intent_for(shard, appended)
    recorded = {"through a link": str(real / "link" / "0"), "through '..'": f"{real}/../../other/0"}.get(target)
    if recorded is not None:
        intent = AppendIntent(recorded, *dataclasses.astuple(intent)[1:])
    shard.write_bytes(old + appended[:123])  # a torn append, as far as the record can tell
    lock = real / LOCK_DIR / "7.lock"
    lock.write_bytes(intent.encode())
    fd = os.open(lock, os.O_RDWR)
    try:
        LocalStore(str(root)).recover_tail(fd, os.path.join(os.path.realpath(root / "arr"), LOCK_DIR, "7.lock"))
    finally:
        os.close(fd)
    assert shard.read_bytes() == (old if target == "in the array" else old + appended[:123])
    assert (AppendIntent.decode(lock.read_bytes()) is None) == (target == "in the array")  # others' stay


def test_recovery_checks_the_file_it_opened_not_only_the_path(tmp_path: Path, monkeypatch) -> None:
    """A directory of the recorded path swapped for a link after the path was checked: the file opened is elsewhere.

    ``O_NOFOLLOW`` guards only the last component; recovery therefore checks
    where the descriptor it opened really is, and leaves a file outside the
    array's directory alone. Here the swap is made to have happened by letting
    the path check pass for a path through a link (the race's outcome).
    """
    from shardkv.storage import local_tail

    root, real = tmp_path / "root", tmp_path / "root" / "arr"
    (real / LOCK_DIR).mkdir(parents=True)
    (tmp_path / "other").mkdir()
    (real / "sub").symlink_to(tmp_path / "other", target_is_directory=True)
    victim = tmp_path / "other" / "0"
    old, appended = bytes(range(200)) * 30, b"N" * 500
    victim.write_bytes(old)
    intent = AppendIntent(str(real / "sub" / "0"), *dataclasses.astuple(_intent_for(victim, appended))[1:])
    victim.write_bytes(old + appended[:123])  # a torn append, as far as the record can tell
    lock = real / LOCK_DIR / "7.lock"
    lock.write_bytes(intent.encode())
    monkeypatch.setattr(local_tail, "inside", lambda path, directory: True)  # the check ran before the swap
    fd = os.open(lock, os.O_RDWR)
    try:
        LocalStore(str(root)).recover_tail(fd, str(real / LOCK_DIR / "7.lock"))
    finally:
        os.close(fd)
    assert victim.read_bytes() == old + appended[:123]
