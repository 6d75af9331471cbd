"""Repair (of shards, and of metadata) never destroys what it cannot understand.

Rows of the issue's table proven here (each fails on the code before the fix):

* ``shardkv verify --repair`` on a hierarchy where one array's ``zarr.json``
  is damaged (truncated, hostile nesting) or missing: its shards stay, the
  exit status is 1; removing them takes ``--remove-orphans``;
* ``shardkv unshard`` / ``info`` / ``compact`` on a hierarchy where one
  array's ``zarr.json`` is truncated or nested 100,000 levels deep: exit 1
  with one line naming it (no traceback), never a silent skip.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr

from shardkv import ShardedStore
from shardkv.cli.main import main


def make_hierarchy(root: Path) -> None:
    g = zarr.open_group(ShardedStore(str(root), chunks_per_shard=4), mode="w")
    for name in ("a", "b"):
        g.create_dataset(name, shape=(64,), chunks=(8,), dtype="i4")[:] = np.arange(64) + (name == "b")


def damage(root: Path, how: str) -> None:
    doc = root / "b" / "zarr.json"
    if how == "truncated":
        doc.write_bytes(doc.read_bytes()[:30])
    elif how == "deep":
        doc.write_bytes(b"[" * 100_000 + b"]" * 100_000)
    else:
        doc.unlink()


def shards_of_b(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "b").iterdir() if p.name.isdigit())


@pytest.mark.parametrize("how", ["truncated", "deep", "missing"])
def test_verify_repair_keeps_the_shards_of_an_array_it_cannot_read(
    tmp_path: Path, how: str, capsys: pytest.CaptureFixture
) -> None:
    make_hierarchy(tmp_path)
    damage(tmp_path, how)
    assert main(["verify", str(tmp_path), "--repair"]) == 1
    out = capsys.readouterr().out
    assert shards_of_b(tmp_path) == ["0", "1"], "repair deleted shards of an array it could not read"
    assert "REMOVED" not in out
    if how == "missing":
        assert "ORPHAN b/0" in out and "ORPHAN b/1" in out
        assert main(["verify", str(tmp_path), "--remove-orphans"]) == 0  # listed, then removed: nothing left
        assert "REMOVED b/0" in capsys.readouterr().out and shards_of_b(tmp_path) == []
        assert main(["verify", str(tmp_path)]) == 0
    else:
        assert "UNREADABLE b/zarr.json" in out and "KEPT 2 keys" in out
        assert main(["verify", str(tmp_path), "--remove-orphans"]) == 1
        assert shards_of_b(tmp_path) == ["0", "1"]  # never, even with the flag


@pytest.mark.parametrize("how", ["truncated", "deep"])
@pytest.mark.parametrize("command", ["info", "unshard", "compact"])
def test_commands_fail_naming_an_unreadable_zarr_json(tmp_path: Path, how: str, command: str) -> None:
    root = tmp_path / "src.zarr"
    make_hierarchy(root)
    damage(root, how)
    argv = [command, str(root)] + ([str(tmp_path / "out.zarr")] if command == "unshard" else [])
    done = subprocess.run([sys.executable, "-m", "shardkv", *argv], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "b/zarr.json" in lines[0] and "src.zarr" in lines[0]
    assert shards_of_b(root) == ["0", "1"]


def test_compact_keeps_the_shards_of_an_array_whose_zarr_json_is_missing(tmp_path: Path) -> None:
    """The same rule for compact: what it cannot understand is left as it is."""
    root = tmp_path / "src.zarr"
    make_hierarchy(root)
    damage(root, "missing")
    done = subprocess.run(
        [sys.executable, "-m", "shardkv", "compact", str(root)], capture_output=True, text=True, timeout=120
    )
    assert "Traceback" not in done.stderr, done.stderr
    assert shards_of_b(root) == ["0", "1"]
