"""How ``shardkv unshard`` writes: each chunk as durably as every local write, the writes overlapping; its bar."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest
import tqdm

import shardkv.storage.local as local_mod
from shardkv.cli.convert import convert
from shardkv.cli.unshard import unshard


def _plain_source(root: Path, grid: tuple[int, int] = (8, 8)) -> dict[str, bytes]:
    """A Zarr v2 group with one uncompressed 2-d array of ``grid`` 4 x 4 chunks, written by hand; its chunks."""
    (root / "a").mkdir(parents=True)
    (root / ".zgroup").write_text(json.dumps({"zarr_format": 2}))
    meta = {"zarr_format": 2, "shape": [4 * grid[0], 4 * grid[1]], "chunks": [4, 4], "dtype": "<u2",
            "compressor": None, "fill_value": 0, "order": "C", "filters": None}  # fmt: skip
    (root / "a" / ".zarray").write_text(json.dumps(meta))
    chunks = {}
    for i in range(grid[0]):
        for j in range(grid[1]):
            chunks[f"a/{i}.{j}"] = (np.arange(16, dtype="<u2") + 100 * i + j).tobytes()
            (root / "a" / f"{i}.{j}").write_bytes(chunks[f"a/{i}.{j}"])
    return chunks


def test_chunk_writes_overlap_and_each_is_fsynced_before_its_directory(tmp_path, monkeypatch):
    chunks = _plain_source(tmp_path / "src")
    convert(str(tmp_path / "src"), str(tmp_path / "sharded"), 4)
    real_fsync, real_dirs = os.fsync, local_mod.fsync_dirs
    lock = threading.Condition()
    state = {"in_flight": 0, "most": 0, "waited": False}
    synced_files: set[str] = set()
    synced_dirs: list[str] = []

    def fsync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        with lock:
            state["in_flight"] += 1
            state["most"] = max(state["most"], state["in_flight"])
            lock.notify_all()
            if not state["waited"] and os.path.dirname(path) == str(tmp_path / "plain" / "a"):
                state["waited"] = True  # the first chunk's fsync waits (bounded) for another writer's to begin
                lock.wait_for(lambda: state["in_flight"] > 1, timeout=10)
        try:
            real_fsync(fd)
            if os.path.isdir(path):
                synced_dirs.append(path)
        finally:
            with lock:
                state["in_flight"] -= 1

    def atomic_write(path: str, *args, **kwargs):
        generation = real_atomic(path, *args, **kwargs)
        synced_files.add(path)
        return generation

    def fsync_dirs(paths):
        paths = list(paths)
        assert all(p in synced_files for p in paths), "a directory synced before its file was written and fsynced"
        real_dirs(paths)

    real_atomic = local_mod.atomic_write
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(local_mod, "atomic_write", atomic_write)
    monkeypatch.setattr(local_mod, "fsync_dirs", fsync_dirs)
    report = unshard(str(tmp_path / "sharded"), str(tmp_path / "plain"))
    assert report.chunks == len(chunks) == 64
    assert state["most"] > 1, "no two chunk writes were ever in flight together"
    for key, value in chunks.items():
        path = str(tmp_path / "plain" / key)
        assert Path(path).read_bytes() == value
        assert path in synced_files  # written through the one durable write (fsync'd, renamed)
    assert str(tmp_path / "plain" / "a") in synced_dirs  # and its directory fsync'd


def test_the_finished_bar_is_shown_once(tmp_path, monkeypatch, capsys):
    _plain_source(tmp_path / "src", grid=(4, 4))
    convert(str(tmp_path / "src"), str(tmp_path / "sharded"), 2)

    # every update printed (no interval): the last step must not print 100 % before the bar's close does
    class EveryUpdate(tqdm.tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **{**kwargs, "mininterval": 0, "miniters": 1})

    monkeypatch.setattr(tqdm, "tqdm", EveryUpdate)
    capsys.readouterr()
    unshard(str(tmp_path / "sharded"), str(tmp_path / "plain"), progress=True)
    shown = capsys.readouterr().err
    lines = [line for line in shown.replace("\r", "\n").splitlines() if "shardkv unshard" in line]
    assert len(lines) > 2 and sum("100%" in line for line in lines) == 1, lines
    assert "100%" in lines[-1]


@pytest.mark.parametrize("writers", [1, 3])
def test_a_failed_write_fails_the_run_and_leaves_it_resumable(tmp_path, monkeypatch, writers):
    chunks = _plain_source(tmp_path / "src")
    convert(str(tmp_path / "src"), str(tmp_path / "sharded"), 4)
    monkeypatch.setattr("shardkv.cli.unshard._WRITERS", writers)
    real_atomic = local_mod.atomic_write
    calls = {"n": 0}

    def failing(path: str, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 20:
            raise OSError(28, "No space left on device", path)
        return real_atomic(path, *args, **kwargs)

    monkeypatch.setattr(local_mod, "atomic_write", failing)
    with pytest.raises(OSError, match="No space left"):
        unshard(str(tmp_path / "sharded"), str(tmp_path / "plain"))
    monkeypatch.setattr(local_mod, "atomic_write", real_atomic)
    report = unshard(str(tmp_path / "sharded"), str(tmp_path / "plain"))  # the same command again
    assert report.chunks == len(chunks)
    for key, value in chunks.items():
        assert (tmp_path / "plain" / key).read_bytes() == value
