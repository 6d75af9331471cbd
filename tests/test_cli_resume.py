"""Interrupted commands: `unshard` resumes like `convert`; killing `convert`'s main
process ends its worker processes; the interrupt message says how to resume."""

from __future__ import annotations

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
from held_cli import start_held

from shardkv.cli.manifest import UNSHARD_MANIFEST_KEY


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


UNSHARD_CHUNKS = 400  # 200 shards of array a (and 4 of b): held after 20 of them


def test_unshard_killed_half_way_resumes(tmp_path):
    src = _source(tmp_path / "src", UNSHARD_CHUNKS)
    sharded, one_shot, resumed = tmp_path / "sharded", tmp_path / "one-shot", tmp_path / "resumed"
    assert (
        subprocess.run(_cli("convert", str(src), str(sharded), "--chunks-per-shard", "2"), timeout=300).returncode == 0
    )
    assert subprocess.run(_cli("unshard", str(sharded), str(one_shot)), timeout=300).returncode == 0

    proc = start_held(20, "unshard", str(sharded), str(resumed), start_new_session=True)
    manifest = resumed / UNSHARD_MANIFEST_KEY
    os.killpg(proc.pid, signal.SIGKILL)  # held after its 20th shard: it cannot have finished
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    recorded = _recorded(manifest)
    assert recorded == 20
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
    src = _source(tmp_path / "src", 400)
    dst = tmp_path / "dst"
    proc = start_held(
        20,
        "convert",
        str(src),
        str(dst),
        "--chunks-per-shard",
        "2",
        "--workers",
        "2",
        "--task-chunks",
        "2",
        start_new_session=True,
    )
    workers: set[int] = set()
    try:
        workers = {p for p in _children(proc.pid) if _alive(p)}
        assert len(workers) >= 2, workers
        os.kill(proc.pid, sig)  # the main process only, held after its 20th shard
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
        proc.communicate(timeout=60)
