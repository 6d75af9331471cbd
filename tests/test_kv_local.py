"""The store contract on local directories (:class:`LocalStore`), and what is local's own.

Syscalls of a warm read, files that are not values (FIFO, socket, device,
directory), keys that would leave the root, atomic writes and the sweep of
stale temporaries.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kv_contract import KVContract, put_ok

from shardkv.errors import InvalidKeyError
from shardkv.format.ranges import ByteRange
from shardkv.storage import local
from shardkv.storage.kv import NO_VALUE, TEMP_MARKER, KVStore
from shardkv.storage.local import LocalStore

pytestmark = pytest.mark.zarr2


class TestLocalContract(KVContract):
    @pytest.fixture
    def kv(self, tmp_path: Path) -> KVStore:
        return LocalStore(tmp_path / "store")


class TestLocalContractNoFsync(KVContract):
    @pytest.fixture
    def kv(self, tmp_path: Path) -> KVStore:
        return LocalStore(str(tmp_path / "store"), fsync=False)


class Syscalls:
    """Counts the os calls a read makes (wrapping os.open/fstat/pread/close/stat/lstat)."""

    NAMES = ("open", "fstat", "pread", "close", "stat", "lstat", "read")

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.counts = dict.fromkeys(self.NAMES, 0)
        for name in self.NAMES:
            monkeypatch.setattr(os, name, self._counting(name, getattr(os, name)))

    def _counting(self, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.counts[name] += 1
            return real(*args, **kwargs)

        return call

    def reset(self) -> None:
        self.counts = dict.fromkeys(self.NAMES, 0)


def test_warm_ranged_read_is_open_fstat_pread_per_range_close(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kv = LocalStore(tmp_path)
    g = put_ok(kv, "c/0/0", bytes(range(200)))
    kv.get("c/0/0", [ByteRange(0, 1)])  # warm
    calls = Syscalls(monkeypatch)
    r = kv.get("c/0/0", [ByteRange(10, 20), ByteRange.suffix(16), ByteRange(100)], if_generation=g)
    monkeypatch.undo()
    assert r.found and [len(b) for b in r.values or []] == [10, 16, 100]
    assert calls.counts == {"open": 1, "fstat": 1, "pread": 3, "close": 1, "stat": 0, "lstat": 0, "read": 0}


def test_stale_read_reads_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kv = LocalStore(tmp_path)
    old = put_ok(kv, "k", b"0123456789")
    kv.put("k", b"9876543210")
    calls = Syscalls(monkeypatch)
    r = kv.get("k", [ByteRange(0, 4)], if_generation=old)
    monkeypatch.undo()
    assert r.state == "stale" and r.generation == kv.get("k").generation and r.size == 10
    assert calls.counts["pread"] == 0 and calls.counts["stat"] == 0


def test_generation_is_the_files_fstat(tmp_path: Path) -> None:
    kv = LocalStore(tmp_path)
    g = put_ok(kv, "a/k", [b"ab", b"cd"])
    st = os.stat(tmp_path / "a" / "k")
    assert g is not None and g.token == (st.st_ino, st.st_mtime_ns, st.st_size)
    assert dict(kv.list_generations("")) == {"a/k": g}


def test_list_generations_stats_only_the_wanted_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kv = LocalStore(tmp_path)
    g = put_ok(kv, "a/k", b"v")
    put_ok(kv, "a/j", b"w")
    stats: list[str] = []

    class Entry:  # os.DirEntry cannot be patched: wrap the entries scandir yields
        def __init__(self, entry: os.DirEntry[str]) -> None:
            self._entry = entry
            self.name, self.path = entry.name, entry.path

        def is_dir(self) -> bool:
            return self._entry.is_dir()

        def stat(self) -> os.stat_result:
            stats.append(self.name)
            return self._entry.stat()

    scandir = os.scandir
    monkeypatch.setattr(local.os, "scandir", lambda path: [Entry(e) for e in scandir(path)])
    assert dict(kv.list_generations("a/", {"a/k"}.__contains__)) == {"a/j": None, "a/k": g}
    assert stats == ["k"]  # one stat, of the wanted file


def test_fifo_at_a_key_is_damage_and_never_blocks(tmp_path: Path) -> None:
    kv = LocalStore(tmp_path)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(OSError, match="'fifo' is a FIFO, not a regular file"):  # returns at once (O_NONBLOCK)
        kv.get("fifo", [ByteRange(0, 4)])
    with pytest.raises(OSError, match="FIFO"):
        kv.values(["fifo"])


def test_socket_at_a_key_is_damage(tmp_path: Path) -> None:
    kv = LocalStore(tmp_path)
    path = tmp_path / "sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        with pytest.raises(OSError, match="'sock' is (a socket|not a regular file)"):
            kv.get("sock")


def test_device_at_a_key_is_damage(tmp_path: Path) -> None:
    kv = LocalStore(tmp_path)
    os.symlink("/dev/null", tmp_path / "dev")
    with pytest.raises(OSError, match="'dev' is a character device"):
        kv.get("dev")


def test_directory_at_a_key_is_damage_not_missing(tmp_path: Path) -> None:
    kv = LocalStore(tmp_path)
    kv.put("c/0/0", b"x")
    with pytest.raises(IsADirectoryError, match="'c/0' is a directory"):
        kv.get("c/0", [ByteRange(0, 1)])
    with pytest.raises(IsADirectoryError):
        kv.get_many([("c/0/0", None, NO_VALUE), ("c", None, NO_VALUE)])
    assert kv.get("c/0/0/deeper").state == "missing"  # below a file: nothing stored there


@pytest.mark.parametrize(
    "key", ["..", "../x", "a/../../x", "/etc/passwd", "a//b", "a/", "", ".", "a/./b", "..\\x", "a\x00b", "a/.."]
)
def test_keys_never_leave_the_root(tmp_path: Path, key: str) -> None:
    (tmp_path / "store").mkdir()
    (tmp_path / "x").write_bytes(b"precious")
    kv = LocalStore(tmp_path / "store")
    with pytest.raises(InvalidKeyError):
        kv.get(key)
    with pytest.raises(InvalidKeyError):
        kv.put(key, b"overwritten")
    with pytest.raises(InvalidKeyError):
        kv.delete(key)
    with pytest.raises(InvalidKeyError):
        kv.get_many([("ok", None, NO_VALUE), (key, None, NO_VALUE)])
    assert (tmp_path / "x").read_bytes() == b"precious"
    assert sorted(os.listdir(tmp_path)) == ["store", "x"]


def test_permission_error_is_not_missing(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads every file")
    kv = LocalStore(tmp_path)
    kv.put("k", b"v")
    os.chmod(tmp_path / "k", 0)
    try:
        with pytest.raises(PermissionError):
            kv.get("k")
    finally:
        os.chmod(tmp_path / "k", 0o644)


def test_failed_write_leaves_the_old_value_and_no_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kv = LocalStore(tmp_path)
    g = put_ok(kv, "k", b"old")

    def fail(fd: int, data: Any, offset: int = 0) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(local, "_pwrite_all", fail)
    monkeypatch.setattr(local, "write_parts", fail)
    for value in (b"new", [b"n", b"ew"]):
        with pytest.raises(OSError, match="No space"):
            kv.put("k", value)
    monkeypatch.undo()
    r = kv.get("k")
    assert bytes(r.whole()) == b"old" and r.generation == g
    assert sorted(os.listdir(tmp_path)) == ["k"]


def test_create_only_is_a_link(tmp_path: Path) -> None:
    kv = LocalStore(tmp_path)
    (tmp_path / "k").write_bytes(b"someone else's")
    assert kv.put("k", b"mine", if_generation=NO_VALUE) is None
    assert (tmp_path / "k").read_bytes() == b"someone else's"
    assert sorted(os.listdir(tmp_path)) == ["k"]  # the temporary file is gone


def test_stale_temporaries_swept_once_per_directory(tmp_path: Path) -> None:
    kv = LocalStore(tmp_path)
    kv.put("a/k", b"v")
    old, young = tmp_path / "a" / f"{TEMP_MARKER}old", tmp_path / "a" / f"{TEMP_MARKER}young"
    far = tmp_path / "b" / f"{TEMP_MARKER}far"
    far.parent.mkdir()
    for p in (old, young, far):
        p.write_bytes(b"left by a killed writer")
    hour_ago = time.time() - 3700
    for p in (old, far):
        os.utime(p, (hour_ago, hour_ago))
    local._SWEPT.clear()  # as in a new process
    assert kv.find_stale_temporaries() == sorted([str(old), str(far)])
    kv.put("a/k2", b"v")
    assert not old.exists() and young.exists() and far.exists()  # only the directory written into
    assert kv.remove_stale_temporaries() == [str(far)]
    assert kv.remove_stale_temporaries(min_age_seconds=0) == [str(young)]


_PAUSED_WRITER = """
import os, sys
from shardkv.storage import local
real = local._pwrite_all
def paused(fd, data, offset):  # the temporary file is written: tell its inode, wait for the test
    real(fd, data, offset)
    print(os.fstat(fd).st_ino, flush=True)
    sys.stdin.readline()
local._pwrite_all = paused
local.LocalStore(sys.argv[1]).put(sys.argv[2], b"x" * 100)
"""


def _paused_writer(root: Path, key: str) -> tuple[subprocess.Popen, int]:
    """A writer process stopped inside the write of ``key``'s temporary file, and that file's inode."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _PAUSED_WRITER, str(root), key], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 120)
    assert ready, "the writer never reached its write"
    return proc, int(proc.stdout.readline())


def test_a_killed_writers_temporary_is_removed_at_once_a_live_writers_kept(tmp_path: Path) -> None:
    killed, killed_ino = _paused_writer(tmp_path, "a/0")
    live, live_ino = _paused_writer(tmp_path, "a/1")
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=60)
        temporaries = {os.stat(p).st_ino: str(p) for p in (tmp_path / "a").iterdir() if TEMP_MARKER in p.name}
        assert set(temporaries) == {killed_ino, live_ino}  # both just written: no age tells them apart
        kv = LocalStore(tmp_path)
        assert kv.find_stale_temporaries(min_age_seconds=0) == [temporaries[killed_ino]]  # not the live one
        assert kv.remove_stale_temporaries() == [temporaries[killed_ino]]  # at once, with the hour's age guard
        assert os.path.exists(temporaries[live_ino])
        local._SWEPT.clear()  # as in a new process
        kv.put("a/2", b"v")  # a write sweeping its directory keeps the live writer's file too
        assert os.path.exists(temporaries[live_ino])
    finally:
        assert live.stdin is not None
        live.stdin.write("go\n")
        live.stdin.close()
        assert live.wait(timeout=60) == 0
    assert (tmp_path / "a" / "1").read_bytes() == b"x" * 100  # the live writer's rename found its file
    assert not kv.find_stale_temporaries(min_age_seconds=0) and not (tmp_path / "a" / "0").exists()


def test_a_writer_whose_new_temporary_a_sweeper_took_starts_again_under_a_new_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shardkv.storage import files

    taken: list[str] = []
    real_flock = files.fcntl.flock

    def sweeper_first(fd: int, operation: int) -> None:
        if not taken:  # a sweeper of another process locked and removed the first file between open and flock
            taken.append(os.readlink(f"/proc/self/fd/{fd}"))
            os.remove(taken[0])
        real_flock(fd, operation)

    monkeypatch.setattr(files.fcntl, "flock", sweeper_first)
    kv = LocalStore(tmp_path)
    kv.put("k", b"v")
    assert (tmp_path / "k").read_bytes() == b"v" and len(taken) == 1
    assert sorted(os.listdir(tmp_path)) == ["k"]  # the write went on under another name, nothing left


def test_a_sweeper_keeps_a_live_temporary_of_its_own_process_named_by_another_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On NFS, flock is a POSIX record lock of the process: a sweeper there must know its own writers by file.

    The same directory reached through a symbolic link: the sweeper's path of the
    writer's temporary differs from the writer's, and the lock (emulated as NFS
    does, with ``lockf``) is this process's own.
    """
    import fcntl
    import threading

    from shardkv.storage import files

    monkeypatch.setattr(files.fcntl, "flock", fcntl.lockf)
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    writing, go = threading.Event(), threading.Event()
    real_pwrite = local._pwrite_all

    def paused(fd: int, data: Any, offset: int) -> None:
        writing.set()
        assert go.wait(60)
        real_pwrite(fd, data, offset)

    monkeypatch.setattr(local, "_pwrite_all", paused)
    errors: list[BaseException] = []

    def write() -> None:
        try:
            LocalStore(tmp_path / "real").put("k", b"v")
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        assert writing.wait(60)
        assert LocalStore(tmp_path / "link").remove_stale_temporaries(min_age_seconds=3600) == []
    finally:
        go.set()
        writer.join(60)
    assert not errors, errors
    assert (tmp_path / "real" / "k").read_bytes() == b"v"


def test_a_child_forked_while_a_thread_holds_the_temporaries_lock_writes(tmp_path: Path) -> None:
    """A child forked while a thread of its parent held the process-wide lock of held temporaries can write."""
    from shardkv.storage import files

    with files._WRITING_LOCK:  # what a sweeper thread of the parent may hold at the moment of the fork
        pid = os.fork()
        if pid == 0:  # the child never returns into pytest
            code = 1
            try:
                LocalStore(tmp_path).put("k", b"v")
                code = 0
            finally:
                os._exit(code)
    deadline = time.monotonic() + 60
    status = None
    while status is None and time.monotonic() < deadline:
        done, st = os.waitpid(pid, os.WNOHANG)
        status = st if done else None
        time.sleep(0.01)
    if status is None:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert status is not None and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, "the child's write hung"
    assert (tmp_path / "k").read_bytes() == b"v"


def test_prune_empty_dirs(tmp_path: Path) -> None:
    kv = LocalStore(tmp_path)
    kv.put("a/b/c/k", b"v")
    kv.put("a/x", b"v")
    assert kv.delete("a/b/c/k")
    kv.prune_empty_dirs("a")
    assert sorted(os.listdir(tmp_path / "a")) == ["x"]


def test_pickle_and_location(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "link")
    kv = LocalStore(tmp_path / "link", fsync=False)
    assert kv.location == LocalStore(str(tmp_path / "real") + "/").location
    assert kv.location.local_dir == str((tmp_path / "real").resolve())
    copy = pickle.loads(pickle.dumps(kv))
    assert isinstance(copy, LocalStore) and copy.root == kv.root and copy.fsync is False


def test_reads_of_many_keys_side_by_side(tmp_path: Path) -> None:
    kv = LocalStore(tmp_path)
    for i in range(20):
        kv.put(f"c/{i}", bytes([i]) * 10)
    results = kv.get_many(
        [
            (f"c/{i}", [ByteRange(i % 10, i % 10 + 1)], NO_VALUE if i == 3 else kv.get(f"c/{i}").generation)
            for i in range(20)
        ]
    )
    assert results[3].state == "stale"
    assert [bytes(r.values[0]) for i, r in enumerate(results) if i != 3 and r.values] == [
        bytes([i]) for i in range(20) if i != 3
    ]


@pytest.mark.parametrize("nbytes", [1024, 256 * 1024])
def test_small_reads_are_read_in_turn_large_ones_side_by_side(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nbytes: int
) -> None:
    """A batch of small files (chunk files, index ranges) is read in the calling thread: threads would
    trade the GIL at every system call; a batch of large reads goes to the read pool."""
    kv = LocalStore(tmp_path)
    for i in range(20):
        kv.put(f"c/{i}", bytes([i]) * nbytes)
    pooled: list[int] = []
    real_pool = local.read_pool

    def counting_pool() -> Any:
        pooled.append(1)
        return real_pool()

    monkeypatch.setattr(local, "read_pool", counting_pool)
    whole = kv.get_many([(f"c/{i}", None, NO_VALUE if i == 7 else kv.get(f"c/{i}").generation) for i in range(20)])
    ranged = kv.get_many([(f"c/{i}", [ByteRange(1, nbytes)], kv.get(f"c/{i}").generation) for i in range(20)])
    assert whole[7].state == "stale" and all(r.state == "value" for i, r in enumerate(whole) if i != 7)
    assert [bytes(r.values[0]) for i, r in enumerate(whole) if i != 7 and r.values] == [
        bytes([i]) * nbytes for i in range(20) if i != 7
    ]
    assert [bytes(r.values[0]) for r in ranged if r.values] == [bytes([i]) * (nbytes - 1) for i in range(20)]
    assert len(pooled) == (0 if nbytes < local._POOLED_READ_NBYTES else 2)


def _keys(it: Iterator[str]) -> list[str]:
    return sorted(it)


def test_list_prefix_inside_a_name(tmp_path: Path) -> None:
    kv = LocalStore(tmp_path)
    for key in ("ab", "abc/d", "a/b"):
        kv.put(key, b"v")
    assert _keys(kv.list_prefix("ab")) == ["ab", "abc/d"]
    assert _keys(kv.list_prefix("a")) == ["a/b", "ab", "abc/d"]
    assert _keys(kv.list_prefix("abc/")) == ["abc/d"]


def _create_in_child(root: str, name: str, queue: Any) -> None:
    kv = LocalStore(root)
    queue.put((name, kv.put("k", name.encode(), if_generation=NO_VALUE) is not None))


def test_create_only_is_atomic_between_processes(tmp_path: Path) -> None:
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_create_in_child, args=(str(tmp_path), f"p{i}", queue)) for i in range(4)]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    winners = [name for name, won in results.items() if won]
    assert len(winners) == 1
    assert (tmp_path / "k").read_bytes() == winners[0].encode()
    assert sorted(os.listdir(tmp_path)) == ["k"]


def test_the_clone_probe_of_a_directory_is_asked_once_per_process(tmp_path: Path, monkeypatch) -> None:
    """Whether a shard's directory clones files is fixed for the process: a partial write of another store over
    the same directory (a store opened again) neither probes nor ``stat``s it again."""
    from shardkv.storage import files

    LocalStore(tmp_path).put("a/0", b"shard")
    first = LocalStore(tmp_path).tail_method("a/0", in_place=True)
    stats: list[str] = []
    real_stat = os.stat

    def counting_stat(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        stats.append(os.fspath(path))
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(files.os, "stat", counting_stat)
    for _ in range(3):
        assert LocalStore(tmp_path).tail_method("a/0", in_place=True) == first
    assert stats == []
