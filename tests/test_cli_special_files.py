"""Bounded work and one-line errors through the command line: special files at shard keys, and permission errors.

* A FIFO, a directory and a socket where a shard's file should be: ``shardkv info``,
  ``verify``, ``unshard`` and ``compact`` each finish (a subprocess with a timeout:
  a FIFO opened for reading would block forever), name the key, print no
  traceback; ``verify`` exits 1 with the key in a ``DAMAGED`` line.
* A permission error (the machine runs as root, so ``chmod`` blocks nothing: the
  local store's ``os.open`` is made to refuse one path) ends ``info``, ``verify``,
  ``convert`` and ``unshard`` with exactly one line on stderr naming the key,
  and exit status 1.
"""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

from shardkv import ShardedStore
from shardkv.cli.main import main
from shardkv.storage import local as local_module

TIMEOUT = 60  # seconds; a hang on a FIFO fails the test, not the run


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shardkv", *args], capture_output=True, text=True, timeout=TIMEOUT)


def _sharded(root: Path) -> Path:
    """A sharded hierarchy: array ``a`` of 64 int32 in chunks of 8, 4 chunks per shard (shards ``a/0``, ``a/1``)."""
    z = zarr.open_array(
        ShardedStore(str(root), chunks_per_shard=4), mode="w", path="a", shape=(64,), chunks=(8,), dtype="i4"
    )
    z[:] = np.arange(64, dtype="i4")
    assert (root / "a" / "1").is_file()
    return root


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _directory(path: Path) -> None:
    path.mkdir()


def _socket(path: Path) -> None:
    here = os.getcwd()
    os.chdir(path.parent)  # a relative name: AF_UNIX paths are limited to ~108 bytes
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.bind(path.name)  # the socket file stays after close
    finally:
        os.chdir(here)


SPECIAL: dict[str, Callable[[Path], None]] = {"fifo": _fifo, "directory": _directory, "socket": _socket}


@pytest.fixture(params=sorted(SPECIAL))
def damaged(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    root = _sharded(tmp_path / "s.zarr")
    (root / "a" / "1").unlink()
    SPECIAL[request.param](root / "a" / "1")
    return root


def _assert_names_the_key(proc: subprocess.CompletedProcess) -> None:
    text = proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "'a/1'" in text or " a/1:" in text, text
    assert len(proc.stderr.strip().splitlines()) <= 1, proc.stderr  # at most one line of error


def test_verify_reports_the_special_file_as_damage(damaged: Path) -> None:
    proc = run("verify", str(damaged))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    _assert_names_the_key(proc)
    assert "DAMAGED a/1:" in proc.stdout and "damage found" in proc.stdout
    assert "DAMAGED a/0" not in proc.stdout  # the sound shard is checked and fine


@pytest.mark.parametrize("command", ["info", "unshard", "compact"])
def test_the_command_finishes_and_names_the_key(damaged: Path, tmp_path: Path, command: str) -> None:
    argv = [command, str(damaged)] + ([str(tmp_path / "out.zarr")] if command == "unshard" else [])
    proc = run(*argv)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    _assert_names_the_key(proc)
    assert proc.stderr.startswith(f"shardkv {command}: error: "), proc.stderr


# -- permission errors, injected ---------------------------------------------------------------


def _refuse(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    """Make the local store's ``os.open`` of ``path`` fail with EACCES (as a mode 000 file does for a user)."""
    real_open = os.open
    target = str(path)

    def guarded(file: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if os.fspath(file) == target:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), target)
        return real_open(file, flags, *args, **kwargs)

    monkeypatch.setattr(local_module.os, "open", guarded)


def _one_line(capsys: pytest.CaptureFixture[str], status: int, command: str, key: str) -> None:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert status == 1, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"shardkv {command}: error: ") and key in lines[0], lines[0]


@pytest.mark.parametrize(
    ("command", "key"),
    [
        ("info", "a/zarr.json"),
        ("verify", "a/zarr.json"),
        ("unshard", "a/zarr.json"),
        ("info", "a/1"),
        ("unshard", "a/1"),
    ],
)
def test_an_unreadable_key_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: str, key: str
) -> None:
    root = _sharded(tmp_path / "s.zarr")
    _refuse(monkeypatch, root / key)
    argv = [command, str(root)] + ([str(tmp_path / "out.zarr")] if command == "unshard" else [])
    _one_line(capsys, main(argv), command, key)


def test_verify_reports_an_unreadable_shard_and_checks_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _sharded(tmp_path / "s.zarr")
    _refuse(monkeypatch, root / "a" / "1")
    assert main(["verify", str(root)]) == 1
    out = capsys.readouterr().out
    assert "verified" in out and "2 shards, 1 damaged" in out
    assert "DAMAGED a/1: cannot be read: PermissionError" in out


def test_convert_names_an_unreadable_chunk_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "src.zarr"
    zarr.open_array(str(src), mode="w", shape=(64,), chunks=(8,), dtype="i4")[:] = np.arange(64, dtype="i4")
    _refuse(monkeypatch, src / "3")
    _one_line(
        capsys, main(["convert", str(src), str(tmp_path / "out.zarr"), "--chunks-per-shard", "4"]), "convert", "3"
    )


def test_compact_names_an_unreadable_shard_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _sharded(tmp_path / "s.zarr")
    _refuse(monkeypatch, root / "a" / "1")
    _one_line(capsys, main(["compact", str(root)]), "compact", "a/1")


@pytest.mark.parametrize("make", [_fifo, _socket], ids=["fifo", "socket"])
def test_convert_of_a_special_file_at_a_source_chunk_key_finishes_naming_it(tmp_path: Path, make: Any) -> None:
    src = tmp_path / "src.zarr"
    zarr.open_array(str(src), mode="w", shape=(64,), chunks=(8,), dtype="i4")[:] = np.arange(64, dtype="i4")
    (src / "3").unlink()
    make(src / "3")
    proc = run("convert", str(src), str(tmp_path / "out.zarr"), "--chunks-per-shard", "4")
    assert proc.returncode != 0, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr and "3" in lines[0], proc.stderr


def test_convert_reads_an_empty_directory_at_a_source_chunk_key_as_zarr_2_does(tmp_path: Path) -> None:
    """zarr 2's DirectoryStore reads a directory at a chunk key as a missing chunk (fill value): so does convert."""
    src = tmp_path / "src.zarr"
    zarr.open_array(str(src), mode="w", shape=(64,), chunks=(8,), dtype="i4")[:] = np.arange(64, dtype="i4")
    (src / "3").unlink()
    (src / "3").mkdir()
    proc = run("convert", str(src), str(tmp_path / "out.zarr"), "--chunks-per-shard", "4")
    assert proc.returncode == 0, proc.stderr
    expected = zarr.open_array(str(src), mode="r")[:]
    assert list(expected[24:32]) == [0] * 8
    np.testing.assert_array_equal(zarr.open_array(ShardedStore(str(tmp_path / "out.zarr")), mode="r")[:], expected)
