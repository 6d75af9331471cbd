"""Rough edges of the command line a new user hit."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr
from held_cli import start_held

from shardkv import ShardedStore
from shardkv.cli.manifest import MANIFEST_KEY


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "shardkv", *args]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(_cli(*args), capture_output=True, text=True, timeout=300)


@pytest.fixture
def source(tmp_path: Path) -> Path:
    g = zarr.open_group(str(tmp_path / "src"), mode="w")
    g.create_dataset("a", data=np.arange(64).reshape(8, 8), chunks=(2, 2))
    return tmp_path / "src"


@pytest.mark.parametrize("command", ["convert", "unshard"])
def test_progress_is_shown_on_request_without_a_terminal(source, tmp_path, command):
    if command == "unshard":
        assert run("convert", str(source), str(tmp_path / "sharded"), "--chunks-per-shard", "2").returncode == 0
        source = tmp_path / "sharded"
    extra = ["--chunks-per-shard", "2"] if command == "convert" else []
    shown = run(command, str(source), str(tmp_path / "shown"), *extra, "--progress")
    assert shown.returncode == 0, shown.stderr
    assert f"shardkv {command}" in shown.stderr and "100%" in shown.stderr
    hidden = run(command, str(source), str(tmp_path / "hidden"), *extra, "--no-progress")
    assert hidden.returncode == 0 and hidden.stderr == ""
    default = run(command, str(source), str(tmp_path / "default"), *extra)  # stderr is a pipe, not a terminal
    assert default.returncode == 0 and default.stderr == ""


def test_compact_shows_progress_on_request_and_reclaims_the_same(source, tmp_path):
    for name in ("shown", "hidden", "default"):
        assert run("convert", str(source), str(tmp_path / name), "--chunks-per-shard", "2").returncode == 0
    shown = run("compact", str(tmp_path / "shown"), "--progress")
    assert shown.returncode == 0, shown.stderr
    assert "shardkv compact" in shown.stderr and "100%" in shown.stderr and "1/1" in shown.stderr
    hidden = run("compact", str(tmp_path / "hidden"), "--no-progress")
    assert hidden.returncode == 0 and hidden.stderr == ""
    default = run("compact", str(tmp_path / "default"))  # stderr is a pipe, not a terminal
    assert default.returncode == 0 and default.stderr == ""
    assert shown.stdout.split(":")[1] == hidden.stdout.split(":")[1] == default.stdout.split(":")[1]
    one = run("compact", str(tmp_path / "shown"), "--array", "a", "--progress")
    assert one.returncode == 0 and "1/1" in one.stderr


@pytest.mark.parametrize(("command", "summary"), [("verify", "4 shards, 0 damaged"), ("info", "chunks")])
def test_progress_on_request_leaves_the_report_as_it_is(source, tmp_path, command, summary):
    sharded = tmp_path / "sharded"
    assert run("convert", str(source), str(sharded), "--chunks-per-shard", "2").returncode == 0
    shown = run(command, str(sharded), "--progress")
    assert shown.returncode == 0, shown.stderr
    assert f"shardkv {command}" in shown.stderr and "100%" in shown.stderr
    hidden = run(command, str(sharded), "--no-progress")
    assert hidden.returncode == 0 and hidden.stderr == ""
    default = run(command, str(sharded))  # stderr is a pipe, not a terminal
    assert default.returncode == 0 and default.stderr == ""
    assert shown.stdout == hidden.stdout == default.stdout and summary in shown.stdout


def test_one_chunk_per_shard_warns_that_nothing_is_gained(source, tmp_path):
    proc = run("convert", str(source), str(tmp_path / "out"), "--chunks-per-shard", "1")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("shardkv convert: warning:") and "nothing is gained" in lines[0]
    quiet = run("convert", str(source), str(tmp_path / "out2"), "--chunks-per-shard", "1,2")
    assert quiet.returncode == 0 and "warning" not in quiet.stderr


def test_convert_help_describes_what_is_written(source):
    text = run("convert", "--help").stdout
    assert ".zarray, .zmetadata) is copied" not in text
    assert "replaces its .zarray" in " ".join(text.split())
    assert "--progress" in text


def test_an_interrupted_convert_says_how_to_resume(tmp_path):
    g = zarr.open_group(str(tmp_path / "src"), mode="w")
    a = g.create_dataset("a", shape=(40,), chunks=(2,), dtype="i2", compressor=None)
    a[:] = np.arange(40, dtype="i2")
    dst = tmp_path / "dst"
    proc = start_held(1, "convert", str(tmp_path / "src"), str(dst), "--chunks-per-shard", "2")  # 1 of 10 shards
    proc.send_signal(signal.SIGINT)  # while it waits, held: the work cannot finish first
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert (dst / MANIFEST_KEY).exists()
    assert err.strip().splitlines()[-1] == (
        "shardkv convert: interrupted; run the same command again to resume (the shards already written are skipped)"
    )


def test_convert_with_workers_needs_no_dask_distributed(source, tmp_path):
    # the README and the user guide say so: --workers runs local processes of the standard library,
    # only --scheduler needs dask.distributed (here made unimportable in the command's process)
    code = (
        "import sys; sys.modules['distributed'] = None; from shardkv.cli.main import main; sys.exit(main(sys.argv[1:]))"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "convert",
            str(source),
            str(tmp_path / "out"),
            "--chunks-per-shard",
            "2",
            "--workers",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    stored = zarr.open_group(ShardedStore(str(tmp_path / "out")), mode="r")["a"][:]
    np.testing.assert_array_equal(stored, np.arange(64).reshape(8, 8))
    refused = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "convert",
            str(source),
            str(tmp_path / "out2"),
            "--chunks-per-shard",
            "2",
            "--scheduler",
            "tcp://127.0.0.1:1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert refused.returncode == 1 and "distributed" in refused.stderr, refused.stderr
