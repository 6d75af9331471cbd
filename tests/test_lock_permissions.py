"""Locks nobody else can hold hostage (shardkv.engine.locks).

``flock`` works through a descriptor opened for reading, so a lock file that
an account can read is a lock that account can hold. Lock files are made with
the array directory's writability (``0600``/``0660``/``0666``, never a read
bit without its write bit), the writer locks through an ``O_RDWR`` descriptor,
and readers create no lock file at all. The tests run as root here: modes and
open flags are checked directly; one test drops to an unprivileged account in
a subprocess to show the kernel refusing it.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

import shardkv.engine.locks as lock_module
from shardkv.engine.locks import LOCK_DIR, ShardLocks
from shardkv.storage.local import LocalStore


def _locks(root: Path, **options: object) -> ShardLocks:
    return ShardLocks(LocalStore(str(root)).location, **options)


@pytest.fixture(autouse=True)
def _one_lock_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lock_module, "FILE_STRIPES", 1)  # every shard's lock file is 0.lock


@contextmanager
def _umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def _open_flags_of(path: Path) -> list[int]:
    """Access modes (``O_RDONLY``/``O_WRONLY``/``O_RDWR``) of this process's descriptors open on ``path``."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # the listing's own descriptor, gone already
        if target == str(path):
            found.append(fcntl.fcntl(int(name), fcntl.F_GETFL) & os.O_ACCMODE)
    return found


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
@pytest.mark.parametrize(
    ("dir_mode", "file_mode", "lock_dir_mode"),
    [(0o755, 0o600, 0o700), (0o2775, 0o660, 0o2770), (0o777, 0o666, 0o777), (0o700, 0o600, 0o700)],
    ids=["dir-0755", "dir-2775", "dir-0777", "dir-0700"],
)
def test_lock_files_are_made_for_the_array_writers_and_held_read_write(
    tmp_path, dir_mode, file_mode, lock_dir_mode
) -> None:
    array_dir = tmp_path / "arr"
    array_dir.mkdir()
    if os.geteuid() == 0:
        os.chown(array_dir, -1, 4321)  # a shared project's group
    os.chmod(array_dir, dir_mode)
    locks = _locks(tmp_path)
    lock_file = array_dir / LOCK_DIR / "0.lock"
    with _umask(0o022):  # the usual umask: it would leave 0644 / 0640 (read without write) by itself
        with locks.hold(["arr/c/0"], {"arr/c/0": "arr/"}):
            assert _open_flags_of(lock_file) == [os.O_RDWR]
    assert _mode(lock_file) == file_mode
    assert _mode(array_dir / LOCK_DIR) == lock_dir_mode
    if dir_mode & stat.S_ISGID:  # the group's writers can open the lock files too
        assert lock_file.stat().st_gid == array_dir.stat().st_gid
    assert _open_flags_of(lock_file) == []  # closed on release


_READ_ONLY_LOCKER = textwrap.dedent(
    """
    import fcntl, os, sys
    array_fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)  # as root: the way in
    os.setgroups([])
    os.setresgid(65534, 65534, 65534)
    os.setresuid(65534, 65534, 65534)  # now an account that may read the array, not write it
    try:
        fd = os.open(sys.argv[2], os.O_RDONLY, dir_fd=array_fd)
        fcntl.flock(fd, fcntl.LOCK_EX)
    except PermissionError as exc:
        print("refused", exc.errno, flush=True)
    else:
        print("holding", flush=True)
    sys.stdin.read()  # keep whatever it holds until the test lets go
    """
)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to become another account")
def test_an_account_that_can_only_read_cannot_block_a_writer(tmp_path) -> None:
    array_dir = tmp_path / "arr"
    array_dir.mkdir()
    os.chmod(array_dir, 0o755)  # others may read the data
    locks = _locks(tmp_path, timeout=10.0)
    with locks.hold(["arr/c/0"], {"arr/c/0": "arr/"}):  # the lock file exists, as after any write
        pass
    reader = subprocess.Popen(
        [sys.executable, "-c", _READ_ONLY_LOCKER, str(array_dir), f"{LOCK_DIR}/0.lock"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert reader.stdout is not None
        said = reader.stdout.readline().split()
        assert said[:1] == ["refused"], said
        with locks.hold(["arr/c/0"], {"arr/c/0": "arr/"}):  # the writer proceeds
            pass
    finally:
        reader.communicate(input="", timeout=30)


def test_readers_create_no_lock_files(tmp_path) -> None:
    zarr = pytest.importorskip("zarr")
    from shardkv import ShardedStore

    src = tmp_path / "data"
    z = zarr.open_array(
        store=ShardedStore(str(src), chunks_per_shard=2),
        mode="w",
        shape=(8, 8),
        chunks=(2, 2),
        dtype="i4",
        path="g/arr",
    )
    z[:] = np.arange(64, dtype="i4").reshape(8, 8)
    for found in list(src.rglob(LOCK_DIR)):
        shutil.rmtree(found)  # as a fresh copy of the data would be

    store = ShardedStore(str(src))
    read = zarr.open_array(store=store, mode="r", path="g/arr")
    np.testing.assert_array_equal(read[:], np.arange(64, dtype="i4").reshape(8, 8))
    keys = list(store)
    assert keys and all(store[k] is not None for k in keys if not k.endswith((".zarray", ".zgroup", ".zattrs")))
    zarr.open_group(store=store, mode="r").tree()
    assert list(src.rglob(LOCK_DIR)) == []
