"""``shardkv verify`` and :mod:`shardkv.proxy.verify`: each kind of injected damage is found, clean stores pass.

Damage is made on the shard files with an independent writer (numpy/crc32c on
raw bytes), then the store is verified through the command line (in process,
``main([...])``; one test runs ``python -m shardkv`` as users do).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import crc32c
import numcodecs
import numpy as np
import pytest
import zarr

from shardkv import ShardedStore
from shardkv.cli.main import main
from shardkv.proxy.verify import find_stale_temporaries, remove_stale_temporaries, verify_store
from shardkv.storage.kv import TEMP_MARKER

CPS = 4
EMPTY = 2**64 - 1


def make_store(root: Path, index_location: str = "end") -> np.ndarray:
    store = ShardedStore(str(root), chunks_per_shard=CPS, index_location=index_location)
    z = zarr.open_array(
        store,
        mode="w",
        path="a",
        shape=(64,),
        chunks=(8,),
        dtype="i4",
        compressor=numcodecs.Zlib(level=1),
        fill_value=0,
    )
    data = np.arange(64, dtype="i4") * 7
    z[:] = data
    return data


def read_index(blob: bytes, location: str) -> tuple[np.ndarray, int]:
    """(CPS, 2) entries and the byte offset of the index in the shard."""
    n = 16 * CPS + 4
    start = len(blob) - n if location == "end" else 0
    return np.frombuffer(blob[start : start + 16 * CPS], dtype="<u8").reshape(CPS, 2).copy(), start


def write_index(path: Path, entries: np.ndarray, location: str) -> None:
    blob = bytearray(path.read_bytes())
    _, start = read_index(bytes(blob), location)
    raw = entries.astype("<u8").tobytes()
    blob[start : start + len(raw) + 4] = raw + crc32c.crc32c(raw).to_bytes(4, "little")
    path.write_bytes(bytes(blob))


def flip_index_byte(path: Path, location: str) -> None:
    blob = bytearray(path.read_bytes())
    _, start = read_index(bytes(blob), location)
    blob[start + 3] ^= 0x40
    path.write_bytes(bytes(blob))


def truncate(path: Path, location: str) -> None:
    blob = path.read_bytes()
    path.write_bytes(blob[:-5])


def entry_into_index(path: Path, location: str) -> None:
    entries, start = read_index(path.read_bytes(), location)
    entries[1] = (start + 8, 8)  # bytes of the index itself
    write_index(path, entries, location)


def overlapping_entries(path: Path, location: str) -> None:
    entries, _ = read_index(path.read_bytes(), location)
    entries[2] = (int(entries[1][0]) + 1, int(entries[1][1]))
    write_index(path, entries, location)


def undecodable_chunk(path: Path, location: str) -> None:
    blob = bytearray(path.read_bytes())
    entries, _ = read_index(bytes(blob), location)
    offset, nbytes = (int(v) for v in entries[3])
    blob[offset : offset + nbytes] = bytes(range(nbytes % 256)) + bytes(nbytes - nbytes % 256)
    path.write_bytes(bytes(blob))


DAMAGE: dict[str, tuple[Callable[[Path, str], None], str, bool]] = {
    "flipped-index-byte": (flip_index_byte, "crc32c mismatch", False),
    "truncated": (truncate, "", False),
    "entry-overlaps-index": (entry_into_index, "outside the chunk data region", False),
    "overlapping-entries": (overlapping_entries, "share bytes", False),
    "undecodable-chunk": (undecodable_chunk, "does not decode", True),
}


@pytest.mark.parametrize("index_location", ["end", "start"])
def test_clean_store_passes(tmp_path: Path, index_location: str, capsys: pytest.CaptureFixture) -> None:
    make_store(tmp_path, index_location)
    assert main(["verify", str(tmp_path), "--decode"]) == 0
    out = capsys.readouterr().out
    assert "2 shards, 0 damaged" in out and out.strip().endswith("ok")


@pytest.mark.parametrize("index_location", ["end", "start"])
@pytest.mark.parametrize("kind", list(DAMAGE))
def test_each_kind_of_damage_is_found(
    tmp_path: Path, kind: str, index_location: str, capsys: pytest.CaptureFixture
) -> None:
    make_store(tmp_path, index_location)
    damage, words, needs_decode = DAMAGE[kind]
    damage(tmp_path / "a" / "1", index_location)
    if needs_decode:  # the index is sound: only decoding finds it
        assert main(["verify", str(tmp_path)]) == 0
        capsys.readouterr()
    assert main(["verify", str(tmp_path), "--decode", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and report["shards"] == 2
    assert [d["shard_key"] for d in report["damaged"]] == ["a/1"]  # the other shard is sound
    assert words in " ".join(report["damaged"][0]["problems"])


def test_stray_and_orphan_keys_and_repair(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    make_store(tmp_path)
    (tmp_path / "a" / "7").write_bytes(b"left over chunk")  # outside the 2-shard grid
    (tmp_path / "gone").mkdir()
    (tmp_path / "gone" / "0").write_bytes(b"shard of a deleted array")
    (tmp_path / "gone" / "notes.txt").write_bytes(b"not chunk-like: kept")
    assert main(["verify", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "STRAY a/7" in out and "ORPHAN gone/0" in out
    assert main(["verify", str(tmp_path), "--repair"]) == 1  # the stray key is only reported
    out = capsys.readouterr().out  # an orphan is not proven garbage: --repair keeps it
    assert "ORPHAN gone/0" in out and "REMOVED" not in out and (tmp_path / "gone" / "0").exists()
    assert main(["verify", str(tmp_path), "--remove-orphans"]) == 1  # the stray key is only reported
    out = capsys.readouterr().out
    assert "REMOVED gone/0" in out and not (tmp_path / "gone" / "0").exists()
    assert (tmp_path / "gone" / "notes.txt").exists() and (tmp_path / "a" / "7").exists()
    (tmp_path / "a" / "7").unlink()
    assert main(["verify", str(tmp_path)]) == 0


def test_stale_temporaries_are_removed_only_past_the_age_guard(tmp_path: Path) -> None:
    make_store(tmp_path)
    old = tmp_path / "a" / f"{TEMP_MARKER}killed"
    live = tmp_path / "a" / f"{TEMP_MARKER}writing"
    old.write_bytes(b"x" * 100)
    live.write_bytes(b"y" * 100)
    past = time.time() - 7200
    os.utime(old, (past, past))
    store = ShardedStore(str(tmp_path))
    assert find_stale_temporaries(store.base, 3600) == [str(old)]
    report = verify_store(store, min_temp_age=3600)
    assert report.stale_temporaries == [str(old)] and not report.ok
    assert verify_store(store, repair=True, min_temp_age=3600).removed == [str(old)]
    assert not old.exists() and live.exists()
    assert remove_stale_temporaries(store.base, 0) == [str(live)]
    assert verify_store(store).ok
    assert remove_stale_temporaries(ShardedStore({}).base, 0) == []  # no files, nothing to do


def test_command_line_exit_status_and_bad_options(tmp_path: Path) -> None:
    make_store(tmp_path)
    flip_index_byte(tmp_path / "a" / "0", "end")
    proc = subprocess.run(
        [sys.executable, "-m", "shardkv", "verify", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1
    assert "DAMAGED a/0: crc32c mismatch" in proc.stdout and "damage found" in proc.stdout
    with pytest.raises(SystemExit) as exc:  # bad JSON is a usage error, as on every command
        main(["verify", str(tmp_path), "--storage-options", "[1]"])
    assert exc.value.code == 2


def test_memory_store_with_storage_options(capsys: pytest.CaptureFixture) -> None:
    url = f"memory://verify-{os.getpid()}-{time.monotonic_ns()}"
    make_store_url = ShardedStore(url, chunks_per_shard=CPS)
    z = zarr.open_array(make_store_url, mode="w", path="a", shape=(64,), chunks=(8,), dtype="i4")
    z[:] = 3
    assert main(["verify", url, "--decode", "--storage-options", "{}"]) == 0
    assert "2 shards, 0 damaged" in capsys.readouterr().out
