"""kill -9 at every step of an O(chunk) shard update, on both paths (tests/tail_kill.py holds the child).

For each step (and, for a write step, with half its bytes written): readers without shardkv (the
shard's bytes decoded by the layout, as zarr 3 and tensorstore do: tests/v3/test_tail_kill_v3.py
runs them) read old or new chunks, or for the in-place append only, meet a damaged index; never
other values. The clone path needs no recovery at all. shardkv reads old or new (repairing an
interrupted append under its lock), an acknowledged update is never lost, and the next write
through shardkv clears every intent.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import zarr
from tail_kill import CHUNK, MAX_STEPS, PER_SHARD, UPDATED, check_old_or_new, create_zarr2, new_data, old_data, run_held

from shardkv import ShardedStore
from shardkv.errors import CorruptShardError
from shardkv.format.layout import ShardLayout
from shardkv.format.tail import AppendIntent

LAYOUT = ShardLayout.v3((PER_SHARD,))


def raw_shard(root: Path) -> np.ndarray:
    """Shard 0 as a reader without shardkv decodes it (raises CorruptShardError on a damaged index)."""
    chunks = LAYOUT.chunks_of_shard((root / "0").read_bytes(), "0")
    fill = np.zeros(CHUNK * PER_SHARD, dtype="u2")
    for (c,), value in chunks.items():
        fill[c * CHUNK : (c + 1) * CHUNK] = np.frombuffer(value, dtype="u2")
    return fill


def intents(root: Path) -> list[AppendIntent]:
    found = [AppendIntent.decode(p.read_bytes()) for p in (root / ".shardkv-locks").glob("*.lock")]
    return [i for i in found if i is not None]


@pytest.mark.parametrize("torn", [False, True], ids=["between-steps", "torn-write"])
@pytest.mark.parametrize("place", ["auto on reflinks", "append on ext4"])
def test_kill_at_every_step(place: str, torn: bool, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    clone = place.startswith("auto")
    base = request.getfixturevalue("reflink_dir") if clone else tmp_path
    mode = place.split()[0]
    outcomes = []
    for hold_at in range(1, MAX_STEPS):
        root = base / f"a{hold_at}"
        create_zarr2(root)
        outcome = run_held(root, mode, hold_at, torn)
        outcomes.append(outcome)
        acknowledged = outcome == "done"
        try:  # no recovery yet: what zarr 3 or tensorstore would read
            check_old_or_new(np.concatenate([raw_shard(root), old_data()[CHUNK * PER_SHARD :]]), acknowledged)
        except CorruptShardError:
            assert not clone, f"the clone path left a damaged shard at step {hold_at}"
        if clone:
            assert not intents(root)
        got = zarr.open(ShardedStore(str(root)), mode="r")[:]  # repairs an interrupted append
        check_old_or_new(got, acknowledged)
        raw_shard(root)  # shardkv's read left a shard every reader decodes
        z = zarr.open(ShardedStore(str(root), shard_updates=mode), mode="r+")
        z[3 * CHUNK : 4 * CHUNK] = 55  # a write of the same stripe recovers any intent left first
        assert not intents(root)
        after = z[:]
        assert (after[3 * CHUNK : 4 * CHUNK] == 55).all()
        after[3 * CHUNK : 4 * CHUNK] = old_data()[3 * CHUNK : 4 * CHUNK]
        check_old_or_new(after, acknowledged)
        if acknowledged:
            assert np.array_equal(got, new_data())
            break
    else:
        pytest.fail(f"the update did not finish within {MAX_STEPS} steps")
    assert outcomes.count("killed") >= 5, outcomes  # the steps: clone probe, ioctl or intent, writes, syncs, rename
    assert len(UPDATED) == 3


def test_a_reader_meeting_an_append_in_flight_waits_for_it(tmp_path: Path) -> None:
    """A shardkv read that meets the torn tail of a live writer's append takes the lock and reads the result."""
    import os
    import threading

    from tail_kill import start_held

    root = tmp_path / "a"
    create_zarr2(root)
    # steps of the child: 1 clone probe, 2-3 the lock file's entry synced, 4 intent write, 5 its fdatasync,
    # 6 the new chunks (held half written), 7 their fdatasync, 8 the new index, 9 its fdatasync, 10 intent cleared
    child, release, state = start_held(root, "append", 6, True)
    assert state == "held"
    try:
        with pytest.raises(CorruptShardError):
            raw_shard(root)  # the torn tail, as a reader without shardkv meets it
        store = ShardedStore(str(root))
        reads = store._engine.reads
        real_repair, met = reads.repair, threading.Event()

        def repair(shard_key, arr):
            met.set()
            return real_repair(shard_key, arr)

        reads.repair = repair
        got: dict[str, np.ndarray] = {}
        reader = threading.Thread(target=lambda: got.update(v=zarr.open(store, mode="r")[:]))
        reader.start()
        assert met.wait(60)  # the reader met the damage and waits for the writer's lock
        os.write(release, b"g")  # the writer finishes its append
        reader.join(60)
        assert not reader.is_alive()
    finally:
        os.close(release)
        child.wait(60)
    assert child.returncode == 0
    assert np.array_equal(got["v"], new_data())  # the writer's update, read once it was complete
    assert not intents(root)


def test_a_listing_that_meets_a_killed_append_repairs_it(tmp_path: Path) -> None:
    root = tmp_path / "a"
    create_zarr2(root)
    assert run_held(root, "append", 6, True) == "killed"  # half of the append written, then kill -9
    with pytest.raises(CorruptShardError):
        raw_shard(root)
    assert intents(root)
    store = ShardedStore(str(root))
    assert sorted(k for k in store if k[0].isdigit()) == [str(c) for c in range(8)]  # the index read repairs
    assert not intents(root)
    assert np.array_equal(raw_shard(root), old_data()[: CHUNK * PER_SHARD])  # cut back to the old shard


@pytest.mark.parametrize("step", [4, 6, 8, 9], ids=["intent-torn", "chunks-torn", "index-torn", "append-written"])
def test_the_compact_command_repairs_killed_appends(step: int, tmp_path: Path, capsys) -> None:
    from shardkv.cli.main import main

    root = tmp_path / "a"
    create_zarr2(root)
    assert run_held(root, "append", step, True) == "killed"
    assert main(["compact", str(root)]) == 0
    assert "bytes reclaimed" in capsys.readouterr().out
    assert not intents(root)
    shard = raw_shard(root)  # decodes: kept whole or cut back, then compacted
    check_old_or_new(np.concatenate([shard, old_data()[CHUNK * PER_SHARD :]]), False)
    assert (root / "0").stat().st_size == LAYOUT.index_nbytes + CHUNK * PER_SHARD * 2  # no unused byte left


def test_a_stale_intent_never_cuts_a_shard_rewritten_since(tmp_path: Path) -> None:
    """An intent left by a completed append names an inode; the shard rewritten since (by a writer that recovers
    nothing) may get that inode number back (ext4 hands a freed number to the next file made: two rewrites give
    it back, unless another process takes it first). The next recovery must leave that shard alone."""
    root = tmp_path / "a"
    create_zarr2(root)
    assert run_held(root, "append", 10, False) == "killed"  # the append written and synced; its intent not cleared
    (stale,) = intents(root)
    keep = tmp_path / "inode"
    os.link(root / "0", keep)  # the intent's inode number, given back below whatever other processes do meanwhile
    # a writer without lock files rewrites shard 0 whole (chunk 3 written as fill: not stored, a shorter shard)
    other = zarr.open(ShardedStore(str(root), concurrency="process"), mode="r+", write_empty_chunks=False)
    expected = new_data()
    expected[3 * CHUNK : 4 * CHUNK] = 0
    other[: CHUNK * PER_SHARD] = expected[: CHUNK * PER_SHARD]
    rewritten = (root / "0").read_bytes()
    with open(keep, "r+b") as f:  # the rewritten shard in a file with the intent's inode number
        f.write(rewritten)
        f.truncate(len(rewritten))
    os.replace(keep, root / "0")
    assert (root / "0").stat().st_ino == stale.inode
    assert (root / "0").stat().st_size < stale.old_nbytes
    z = zarr.open(ShardedStore(str(root), shard_updates="append"), mode="r+")
    z[CHUNK : 2 * CHUNK] = 77  # holds the stripe's lock file: recovers the stale intent first
    expected[CHUNK : 2 * CHUNK] = 77
    assert not intents(root)
    assert np.array_equal(zarr.open(ShardedStore(str(root)), mode="r")[:], expected)
    raw_shard(root)  # decodes without shardkv too


_NOBODY_READER = """
import os, sys
import zarr
from shardkv import ShardedStore
import shardkv.errors, shardkv.engine.writes  # imported as root: the interpreter's files may be root's only
os.setgroups([])
os.setresgid(65534, 65534, 65534)
os.setresuid(65534, 65534, 65534)  # an account that may read the array, not write it
try:
    zarr.open(ShardedStore(sys.argv[1]), mode="r")[:]
except Exception as exc:
    print(type(exc).__name__, exc)
else:
    print("read")
"""


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to become another account")
def test_a_reader_that_may_not_write_is_told_how_to_repair(tmp_path: Path) -> None:
    """A reader without write permission meets a killed append: a clear error naming the repair, never KeyError."""
    parent = Path(tempfile.mkdtemp(dir="/tmp"))  # outside pytest's 0700 directory, so another account can read it
    try:
        os.chmod(parent, 0o755)
        root = parent / "a"
        create_zarr2(root)
        assert run_held(root, "append", 6, True) == "killed"  # half of the append written
        said = subprocess.run(
            [sys.executable, "-c", _NOBODY_READER, str(root)], capture_output=True, text=True, timeout=120
        )
        assert said.returncode == 0, said.stderr
        assert said.stdout.startswith("CorruptShardError"), said.stdout
        assert f"shardkv compact {root}" in said.stdout and "'0'" in said.stdout, said.stdout
        assert intents(root)  # nothing was repaired by that reader
        assert np.array_equal(zarr.open(ShardedStore(str(root)), mode="r")[:], old_data())  # a writer repairs it
    finally:
        shutil.rmtree(parent)


def test_verify_names_an_interrupted_append_and_its_repair(tmp_path: Path, capsys) -> None:
    from shardkv.cli.main import main

    root = tmp_path / "a"
    create_zarr2(root)
    assert run_held(root, "append", 6, True) == "killed"  # half of the append written
    assert main(["verify", str(root)]) == 1  # damaged until repaired
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if "DAMAGED" in x]
    assert line.startswith("  DAMAGED 0:") and "interrupted in-place append" in line and "shardkv compact" in line, out
    assert intents(root)  # verify only reads
    assert main(["compact", str(root)]) == 0
    assert main(["verify", str(root)]) == 0
    assert np.array_equal(raw_shard(root), old_data()[: CHUNK * PER_SHARD])


@pytest.mark.parametrize("command", ["info", "unshard"])
def test_commands_that_read_raw_shards_point_at_the_repair(command: str, tmp_path: Path, capsys) -> None:
    """info and unshard read shards without locks: on a killed append they fail, saying what tells and repairs."""
    from shardkv.cli.main import main

    root = tmp_path / "a"
    create_zarr2(root)
    assert run_held(root, "append", 6, True) == "killed"
    args = [command, str(root)] + ([str(tmp_path / "out")] if command == "unshard" else [])
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "corrupt shard '0'" in err and f"shardkv verify {root}" in err and f"shardkv compact {root}" in err, err
    assert main(["compact", str(root)]) == 0
    assert main(args) == 0


def _symlinked_array(tmp_path: Path) -> tuple[Path, Path]:
    """A hierarchy at ``root`` whose array ``arr`` is a symbolic link to a directory elsewhere; (root, real array)."""
    root, real = tmp_path / "root", tmp_path / "elsewhere" / "arr"
    create_zarr2(real)
    zarr.group(store=ShardedStore(str(root)))
    (root / "arr").symlink_to(real, target_is_directory=True)
    return root, real


@pytest.mark.parametrize("repair", ["read", "write", "compact"])
def test_a_killed_append_in_a_symlinked_array_is_repaired(repair: str, tmp_path: Path, capsys) -> None:
    """The intent names the shard in the array's real directory, outside the store's root: it is repaired there."""
    from shardkv.cli.main import main

    root, real = _symlinked_array(tmp_path)
    assert run_held(root, "append", 6, True, "arr") == "killed"  # half of the new chunks written
    with pytest.raises(CorruptShardError):
        raw_shard(real)
    assert [i.path for i in intents(real)] == [str(real / "0")]
    if repair == "read":
        got = zarr.open(ShardedStore(str(root)), mode="r", path="arr")[:]
        assert np.array_equal(got, old_data())
    elif repair == "write":
        z = zarr.open(ShardedStore(str(root), shard_updates="append"), mode="r+", path="arr")
        z[3 * CHUNK : 4 * CHUNK] = 55
        expected = old_data()
        expected[3 * CHUNK : 4 * CHUNK] = 55
        assert np.array_equal(z[:], expected)
    else:
        assert main(["compact", str(root)]) == 0, capsys.readouterr()
        assert main(["verify", str(root)]) == 0, capsys.readouterr()
    assert not intents(real)
    raw_shard(real)  # decodes without shardkv


def test_appends_in_a_symlinked_array_finish_and_a_shard_linked_out_of_it_is_rewritten_whole(tmp_path: Path) -> None:
    """Appends go to shards in the array's real directory; a shard file linked elsewhere is written whole (which
    puts it in the array's directory), since recovery acts only on files there."""
    root, real = _symlinked_array(tmp_path)
    z = zarr.open(ShardedStore(str(root), shard_updates="append", max_dead_fraction=1.0), mode="r+", path="arr")
    z[0:CHUNK] = 7
    assert z.store.engine.stats.tail_updates == 1  # an append in the linked array
    outside = tmp_path / "outside-1"
    os.replace(real / "1", outside)
    (real / "1").symlink_to(outside)
    z[PER_SHARD * CHUNK : (PER_SHARD + 1) * CHUNK] = 9  # shard 1, through its link
    assert z.store.engine.stats.tail_updates == 1  # not appended through the link: written whole
    assert not (real / "1").is_symlink()
    expected = old_data()
    expected[0:CHUNK], expected[PER_SHARD * CHUNK : (PER_SHARD + 1) * CHUNK] = 7, 9
    assert np.array_equal(zarr.open(ShardedStore(str(root)), mode="r", path="arr")[:], expected)
    assert not intents(real)


@pytest.mark.parametrize("command", ["info", "verify"])
def test_info_and_verify_change_no_byte_of_a_killed_append(command: str, tmp_path: Path, capsys) -> None:
    from shardkv.cli.main import main

    root = tmp_path / "a"
    create_zarr2(root)
    assert run_held(root, "append", 6, True) == "killed"
    files = [p for p in root.rglob("*") if p.is_file()]
    before = [(p.read_bytes(), p.stat().st_mtime_ns) for p in files]
    assert main([command, str(root)]) == 1
    said = capsys.readouterr()
    assert "corrupt shard '0'" in said.err or "DAMAGED 0:" in said.out, said
    assert "shardkv compact" in said.out + said.err, said
    assert [(p.read_bytes(), p.stat().st_mtime_ns) for p in files] == before
    assert sorted(root.rglob("*")) == sorted({*files, *(p for p in root.rglob("*") if p.is_dir())})
