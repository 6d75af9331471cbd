"""O(chunk) shard updates as zarr 3 and tensorstore see them (the zarr 3 environment).

* a whole-array write through ``shardkv.zarr3.ShardedStore`` (zarr 3 hands the store a few
  chunks per call) writes each shard whole once and then only its new chunks: with default
  options on a reflink file system (clones), with ``shard_updates="append"`` on ext4;
* kill -9 at every step of an update (tests/tail_kill.py): zarr 3 and tensorstore read old or
  new chunks with no recovery on the clone path, old or new or an error on the in-place path,
  and old or new once a writable shardkv store has read (and so repaired) the shard; a read-only
  one (zarr's ``mode="r"`` makes one), ``shardkv info`` and ``verify`` change no byte;
* shards with dead bytes, and compacted ones, read the same in zarr 3 and tensorstore.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("zarr", minversion="3")
import tensorstore as ts  # noqa: E402
import zarr  # noqa: E402

import shardkv.storage.local as local_mod  # noqa: E402
from shardkv.cli.main import main as cli_main  # noqa: E402
from shardkv.zarr3 import ShardedStore  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the kill harness
from local_io import LocalIO  # noqa: E402
from tail_kill import MAX_STEPS, check_old_or_new, create_zarr3, new_data, run_held  # noqa: E402


def read_zarr3(root: Path, path: str = "") -> np.ndarray:
    return zarr.open_array(str(root), path=path, mode="r")[...]


def read_tensorstore(root: Path) -> np.ndarray:
    arr = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": str(root)}}, open=True).result()
    return arr.read().result()


@pytest.mark.parametrize("place", ["default on reflinks", "append on ext4"])
def test_whole_array_write_puts_each_shard_whole_once(
    place: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The benchmark workload (512**3 uint16, 64**3 chunks, 4x4x4 per shard, zstd level 0): about the bytes stored."""
    on_reflinks = place.startswith("default")
    root = (request.getfixturevalue("reflink_dir") if on_reflinks else tmp_path) / "data.zarr"
    options = {} if on_reflinks else {"shard_updates": "append"}
    data = np.random.default_rng(0).integers(0, 16, size=(512, 512, 512), dtype=np.uint16)
    store = ShardedStore(str(root), chunks_per_shard=4, **options)
    z = zarr.create_array(
        store, name="a", shape=data.shape, chunks=(64, 64, 64), dtype="uint16",
        compressors=[{"name": "zstd", "configuration": {"level": 0}}],
    )  # fmt: skip
    writes = LocalIO()
    for name, wrapper in writes.wrappers(local_mod).items():
        monkeypatch.setattr(local_mod, name, wrapper)
    z[...] = data
    shards = [str(p) for p in (root / "a" / "c").rglob("*") if p.is_file()]
    stored = sum(os.path.getsize(p) for p in shards)
    assert len(shards) == 8
    assert set(writes.whole) <= set(shards)
    assert max(writes.whole.values()) <= 2, writes.whole  # created whole, then O(chunk) updates
    assert writes.written <= 1.1 * stored, (writes.written, stored)
    np.testing.assert_array_equal(read_zarr3(root, "a"), data)
    del data


@pytest.mark.parametrize("torn", [False, True], ids=["between-steps", "torn-write"])
@pytest.mark.parametrize("place", ["auto on reflinks", "append on ext4"])
def test_kill_at_every_step_read_by_zarr3_and_tensorstore(
    place: str, torn: bool, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    clone = place.startswith("auto")
    base = request.getfixturevalue("reflink_dir") if clone else tmp_path
    mode = place.split()[0]
    killed = 0
    for hold_at in range(1, MAX_STEPS):
        root = base / f"a{hold_at}"
        create_zarr3(root)
        outcome = run_held(root, mode, hold_at, torn)
        acknowledged = outcome == "done"
        killed += not acknowledged
        for read in (read_zarr3, read_tensorstore):  # no recovery yet
            try:
                check_old_or_new(read(root), acknowledged)
            except AssertionError:
                raise
            except Exception as exc:  # a damaged index met: allowed on the in-place path only, never wrong values
                assert not clone, f"{read.__name__} after a kill at step {hold_at} of a clone update: {exc!r}"
        check_old_or_new(zarr.open_array(ShardedStore(str(root)), mode="r+")[...], acknowledged)  # repairs
        for read in (read_zarr3, read_tensorstore):
            check_old_or_new(read(root), acknowledged)
        if acknowledged:
            np.testing.assert_array_equal(read_tensorstore(root), new_data())
            break
    else:
        pytest.fail(f"the update did not finish within {MAX_STEPS} steps")
    assert killed >= 5


@pytest.mark.parametrize("place", ["auto on reflinks", "append on ext4"])
def test_dead_bytes_and_compacted_shards_read_by_zarr3_and_tensorstore(
    place: str, tmp_path: Path, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    base = request.getfixturevalue("reflink_dir") if place.startswith("auto") else tmp_path
    root, fresh = base / "a.zarr", tmp_path / "fresh.zarr"
    options = {"shard_updates": place.split()[0], "max_dead_fraction": 0.9}
    z = zarr.create_array(
        ShardedStore(str(root), chunks_per_shard=4, **options), shape=(32, 32), chunks=(4, 4), dtype="uint16",
        compressors=None,
    )  # fmt: skip
    data = np.arange(32 * 32, dtype="uint16").reshape(32, 32)
    z[...] = data
    for i in range(12):  # single chunks of shard (0, 0): O(chunk) updates that leave dead bytes
        r, c = divmod(i % 16, 4)
        z[r * 4 : r * 4 + 4, c * 4 : c * 4 + 4] = 1000 + i
        data[r * 4 : r * 4 + 4, c * 4 : c * 4 + 4] = 1000 + i
    shard = root / "c" / "0" / "0"
    grown = shard.stat().st_size
    np.testing.assert_array_equal(read_zarr3(root), data)
    np.testing.assert_array_equal(read_tensorstore(root), data)
    assert cli_main(["compact", str(root)]) == 0
    assert "bytes reclaimed" in capsys.readouterr().out
    plain = zarr.create_array(
        ShardedStore(str(fresh), chunks_per_shard=4), shape=(32, 32), chunks=(4, 4), dtype="uint16", compressors=None
    )
    plain[...] = data
    assert shard.stat().st_size < grown
    for name in ("0/0", "0/1", "1/0", "1/1"):  # compacted: exactly the shard a fresh write stores
        assert (root / "c" / name).read_bytes() == (fresh / "c" / name).read_bytes()
    np.testing.assert_array_equal(read_zarr3(root), data)
    np.testing.assert_array_equal(read_tensorstore(root), data)


def test_zarr3_local_stores_reach_the_local_kv(tmp_path: Path) -> None:
    from shardkv.storage.local import LocalStore

    for base in (str(tmp_path / "p"), zarr.storage.LocalStore(str(tmp_path / "z"))):
        store = ShardedStore(base, chunks_per_shard=2)
        zarr.create_array(store, shape=(4,), chunks=(1,), dtype="uint8")[...] = 1
        kv = store._engine.kv
        assert isinstance(kv, LocalStore), kv
        assert kv.caps.tail_updates and kv.tail_method("c/0", False) is None  # /tmp: ext4, no clones


def _files_and_times(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``root`` (lock files too): its bytes and mtime (ns)."""
    return {str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("concurrency", ["auto", "files"])
def test_a_read_only_store_never_repairs_a_killed_append(concurrency: str, tmp_path: Path) -> None:
    """A read-only store that meets a torn append changes no byte: it fails naming the shard and `shardkv compact`."""
    from shardkv.errors import CorruptShardError

    root = tmp_path / "a"
    create_zarr3(root)
    assert run_held(root, "append", 6, True) == "killed"  # half of the new chunks written, then kill -9
    before = _files_and_times(root)
    store = ShardedStore(str(root), read_only=True, concurrency=concurrency)
    with pytest.raises(CorruptShardError) as raised:
        zarr.open_array(store, mode="r")[...]
    said = str(raised.value)
    assert "'c/0'" in said and f"shardkv compact {root}" in said, said
    assert _files_and_times(root) == before  # not a byte, not an mtime
    with pytest.raises(CorruptShardError):  # zarr's mode="r" reads through a read-only copy of the store
        zarr.open_array(ShardedStore(str(root)), mode="r")[...]
    assert _files_and_times(root) == before
    check_old_or_new(zarr.open_array(ShardedStore(str(root)), mode="r+")[...], False)  # a writable store repairs it
    check_old_or_new(read_zarr3(root), False)


def test_a_read_only_store_never_changes_a_lock_files_mode(tmp_path: Path) -> None:
    """A read-only store waits on a lock file an older shardkv left 0644 without narrowing it (no fchmod)."""
    from shardkv.errors import CorruptShardError

    root = tmp_path / "a"
    create_zarr3(root)
    assert run_held(root, "append", 6, True) == "killed"
    lock_files = sorted((root / ".shardkv-locks").glob("*.lock"))
    assert lock_files
    for lock_file in lock_files:
        lock_file.chmod(0o644)
    with pytest.raises(CorruptShardError):
        zarr.open_array(ShardedStore(str(root), read_only=True), mode="r")[...]
    assert {p.name: p.stat().st_mode & 0o777 for p in lock_files} == {p.name: 0o644 for p in lock_files}


@pytest.mark.parametrize("command", ["info", "verify"])
def test_info_and_verify_never_repair_a_killed_append(command: str, tmp_path: Path, capsys) -> None:
    root = tmp_path / "a"
    create_zarr3(root)
    assert run_held(root, "append", 6, True) == "killed"
    before = _files_and_times(root)
    assert cli_main([command, str(root)]) == 1
    said = capsys.readouterr()
    assert "c/0" in said.out + said.err and "shardkv compact" in said.out + said.err, said
    assert _files_and_times(root) == before
    assert cli_main(["compact", str(root)]) == 0
    assert cli_main([command, str(root)]) == 0


def test_every_state_a_power_loss_may_leave_reads_old_or_new_in_zarr3_and_tensorstore(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """tests/test_tail_power_loss.py with zarr 3 and tensorstore as the readers without recovery."""
    import shutil

    from crash_states import IORecorder, files_of, placed_states

    chunk, n_chunks, updated = 2048, 8, 3  # uint16: one 4 KiB block per chunk, no compressor (no checksum)
    old = np.repeat(np.arange(1, n_chunks + 1, dtype="u2"), chunk)
    new = old.copy()
    new[: chunk * updated] = np.repeat(np.arange(100, 100 + updated, dtype="u2"), chunk)
    root = tmp_path / "a"
    store = ShardedStore(str(root), chunks_per_shard=4, shard_updates="append", max_dead_fraction=1.0)
    z = zarr.create_array(store, shape=old.shape, chunks=(chunk,), dtype="uint16", compressors=None)
    z[:] = old
    pristine = tmp_path / "pristine"
    shutil.copytree(root, pristine)
    before = files_of(root)
    recorder = IORecorder(str(root))
    with monkeypatch.context() as patched:
        recorder.install(patched, local_mod)
        z[: chunk * updated] = new[: chunk * updated]
    ops = recorder.ops
    durable_from = max(i for i, op in enumerate(ops) if op[:2] == ("sync", "c/0")) + 1

    def check(got: np.ndarray, new_only: bool, where: str) -> None:
        for c in range(n_chunks):
            span = slice(c * chunk, (c + 1) * chunk)
            allowed = [new[span]] if new_only else [old[span], new[span]]
            assert any(np.array_equal(got[span], a) for a in allowed), f"{where}: chunk {c} holds {set(got[span])}"

    states = 0
    for crash_at, where in placed_states(root, pristine, before, ops):
        states += 1
        for read in (read_zarr3, read_tensorstore):  # no recovery
            try:
                got = read(root)
            except Exception:  # a damaged index: an error, never values
                continue
            check(got, False, f"{where}, {read.__name__}")
        assert cli_main(["compact", str(root)]) == 0, capsys.readouterr()
        for read in (read_zarr3, read_tensorstore):
            check(read(root), crash_at >= durable_from, f"{where}, {read.__name__} after compact")
    capsys.readouterr()
    assert 20 <= states <= 600, states


def test_a_read_only_store_waits_for_a_live_append_and_reads_it(tmp_path: Path) -> None:
    """A read-only store that meets the torn tail of a live writer's append waits on its lock file, then reads."""
    import threading

    from tail_kill import start_held

    root = tmp_path / "a"
    create_zarr3(root)
    child, release, state = start_held(root, "append", 6, True)  # held with half of the new chunks written
    assert state == "held"
    try:
        store = ShardedStore(str(root), read_only=True)
        reads = store._engine.reads
        real_repair, met = reads.repair, threading.Event()

        def repair(shard_key, arr):
            met.set()
            return real_repair(shard_key, arr)

        reads.repair = repair
        got: dict[str, np.ndarray] = {}
        reader = threading.Thread(target=lambda: got.update(v=zarr.open_array(store, mode="r")[...]))
        reader.start()
        assert met.wait(60)  # the reader met the damage and waits for the writer's lock
        os.write(release, b"g")  # the writer finishes its append
        reader.join(60)
        assert not reader.is_alive()
    finally:
        os.close(release)
        child.wait(60)
    assert child.returncode == 0
    np.testing.assert_array_equal(got["v"], new_data())
