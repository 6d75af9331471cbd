"""Interrupted commands: `unshard` resumes like `convert`; killing `convert`'s main
process ends its worker processes; the interrupt message says how to resume."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import numpy as np
import pytest
import zarr

from shardkv.cli.manifest import MANIFEST_KEY, UNSHARD_MANIFEST_KEY


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "shardkv", *args]


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _recorded(manifest: Path) -> int:
    try:
        return sum(a["shards"] for a in msgpack.unpackb(manifest.read_bytes(), raw=False)["arrays"].values())
    except (OSError, ValueError, KeyError, TypeError, msgpack.UnpackException):
        return 0  # not written yet, or being replaced


def _source(root: Path, n_chunks: int) -> Path:
    g = zarr.open_group(str(root), mode="w")
    a = g.create_dataset("a", shape=(n_chunks * 4,), chunks=(4,), dtype="i4", compressor=None)
    a[:] = np.arange(n_chunks * 4, dtype="i4")
    g.create_dataset("b", data=np.arange(64).reshape(8, 8), chunks=(2, 2))
    return root


def _wait_until_recorded(proc: subprocess.Popen, manifest: Path, n: int) -> None:
    deadline = time.monotonic() + 240
    while _recorded(manifest) < n and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)


UNSHARD_CHUNKS = 12000  # 6,000 shards: unshard takes seconds, so the manifest (flushed every 0.5 s) records some


def test_unshard_killed_half_way_resumes(tmp_path):
    src = _source(tmp_path / "src", UNSHARD_CHUNKS)
    sharded, one_shot, resumed = tmp_path / "sharded", tmp_path / "one-shot", tmp_path / "resumed"
    assert (
        subprocess.run(_cli("convert", str(src), str(sharded), "--chunks-per-shard", "2"), timeout=300).returncode == 0
    )
    assert subprocess.run(_cli("unshard", str(sharded), str(one_shot)), timeout=300).returncode == 0

    proc = subprocess.Popen(
        _cli("unshard", str(sharded), str(resumed)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    manifest = resumed / UNSHARD_MANIFEST_KEY
    try:
        _wait_until_recorded(proc, manifest, 20)
    finally:
        with contextlib.suppress(ProcessLookupError):  # ended by itself: the assertion below says so
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "unshard finished before it could be interrupted"
    recorded = _recorded(manifest)
    assert recorded >= 20
    assert not (resumed / ".zgroup").exists()  # metadata comes last

    again = subprocess.run(
        _cli("unshard", str(sharded), str(resumed), "--json"), capture_output=True, text=True, timeout=300
    )
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    assert report["shards_skipped"] >= recorded
    assert report["shards"] == UNSHARD_CHUNKS // 2 + 4  # the whole job; this run did shards - shards_skipped
    assert not manifest.exists()
    assert _files(resumed) == _files(one_shot)


def _children(pid: int) -> set[int]:
    """The processes whose parent is ``pid`` (Linux /proc)."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.add(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc to find the worker processes")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_killing_convert_ends_its_workers(tmp_path, sig):
    src = _source(tmp_path / "src", 3000)
    dst = tmp_path / "dst"
    proc = subprocess.Popen(
        _cli("convert", str(src), str(dst), "--chunks-per-shard", "2", "--workers", "2", "--task-chunks", "2"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    workers: set[int] = set()
    try:
        _wait_until_recorded(proc, dst / MANIFEST_KEY, 20)
        workers = {p for p in _children(proc.pid) if _alive(p)}
        assert proc.poll() is None, "the conversion finished before it could be interrupted"
        assert len(workers) >= 2, workers
        os.kill(proc.pid, sig)  # the main process only
        proc.wait(timeout=60)
        deadline = time.monotonic() + 30
        while any(_alive(p) for p in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(p) for p in workers), "worker processes outlived the killed convert"
    finally:
        for p in workers | {proc.pid}:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
