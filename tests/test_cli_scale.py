"""`shardkv convert --workers`, interrupted and resumed; `unshard`; the CLI's error cases."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import msgpack
import numpy as np
import pytest
import zarr
from held_cli import start_held

from shardkv import ShardedStore
from shardkv.cli.manifest import MANIFEST_KEY

FIXTURE = "zarr-python-fixture"
ASTRONAUT = "zarr_implementations/examples/zarr.zr"


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "shardkv", *args], capture_output=True, text=True, timeout=300, cwd=cwd
    )


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def assert_one_line_error(proc: subprocess.CompletedProcess, *words: str) -> None:
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for w in words:
        assert w in lines[0], lines[0]


def _recorded(manifest: Path) -> int:
    try:
        return sum(a["shards"] for a in msgpack.unpackb(manifest.read_bytes(), raw=False)["arrays"].values())
    except (OSError, ValueError, KeyError, msgpack.UnpackException):
        return 0  # not written yet, or being replaced


def test_convert_with_workers_killed_half_way_resumes(shared_data, tmp_path):
    src = shared_data / FIXTURE
    one_shot, dst = tmp_path / "one-shot", tmp_path / "resumed"
    first = run("convert", str(src), str(one_shot), "--chunks-per-shard", "2", "--json")
    assert first.returncode == 0, first.stderr
    total = json.loads(first.stdout)["shards"]

    proc = start_held(
        10,
        "convert",
        str(src),
        str(dst),
        "--chunks-per-shard",
        "2",
        "--workers",
        "2",
        "--task-chunks",
        "4",
        start_new_session=True,
    )
    manifest = dst / MANIFEST_KEY
    os.killpg(proc.pid, signal.SIGKILL)  # the command and its worker processes, at once; held after 10 shards
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    recorded = _recorded(manifest)
    assert recorded == 10 < total
    assert not (dst / ".zgroup").exists()  # metadata comes last: nothing looks complete

    again = run("convert", str(src), str(dst), "--chunks-per-shard", "2", "--workers", "2", "--json")
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    assert report["shards"] == total
    assert recorded - report["shards_verified"] <= report["shards_skipped"] <= recorded
    assert report["shards_skipped"] >= recorded - 8 and report["shards_verified"] == 8  # last 4 x 2 workers
    assert not manifest.exists()
    assert _files(dst) == _files(one_shot)


def test_workers_give_the_same_result_as_one_process(shared_data, tmp_path):
    src = shared_data / ASTRONAUT
    a, b = tmp_path / "a", tmp_path / "b"
    assert run("convert", str(src), str(a), "--chunks-per-shard", "2,2,1").returncode == 0
    proc = run(
        "convert", str(src), str(b), "--chunks-per-shard", "2,2,1", "--workers", "2", "--task-chunks", "8", "--json"
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["workers"] == 2
    assert _files(a) == _files(b)


def test_a_manifest_of_another_conversion_is_refused(shared_data, tmp_path):
    src, dst = shared_data / ASTRONAUT, tmp_path / "out"
    dst.mkdir()
    doc = {"version": 2, "src": "elsewhere", "options": {}, "arrays": {}, "last": []}
    (dst / MANIFEST_KEY).write_bytes(msgpack.packb(doc))
    assert_one_line_error(
        run("convert", str(src), str(dst), "--chunks-per-shard", "2"), "unfinished conversion", "elsewhere"
    )


def test_unshard_gives_plain_zarr_equal_to_the_sharded(shared_data, tmp_path):
    src, sharded, plain = shared_data / ASTRONAUT, tmp_path / "sharded", tmp_path / "plain"
    assert run("convert", str(src), str(sharded), "--chunks-per-shard", "3").returncode == 0
    proc = run("unshard", str(sharded), str(plain))
    assert proc.returncode == 0, proc.stderr
    assert "4 of them were sharded" in proc.stdout
    assert not list(plain.rglob("zarr.json"))
    for name in ("raw", "gzip", "zlib", "blosc"):
        expected = zarr.open_array(ShardedStore(str(sharded)), path=name, mode="r")[...]
        np.testing.assert_array_equal(
            zarr.open_array(zarr.DirectoryStore(str(plain)), path=name, mode="r")[...], expected
        )
    chunks = {k: v for k, v in _files(plain).items() if ".z" not in k}
    assert chunks == {k: v for k, v in _files(src).items() if ".z" not in k}  # bytes as stored, never decoded
    assert_one_line_error(run("unshard", str(sharded), str(plain)), "not empty")


# -- errors and correctness ------------------------------------------------------------


def test_compact_and_info_on_missing_store_or_array_fail(tmp_path, shared_data):
    assert_one_line_error(run("compact", str(tmp_path / "nonexistent")), "does not exist")
    assert_one_line_error(run("info", str(tmp_path / "nonexistent")), "does not exist")
    out = tmp_path / "out"
    assert run("convert", str(shared_data / ASTRONAUT), str(out), "--chunks-per-shard", "2").returncode == 0
    assert_one_line_error(run("compact", str(out), "--array", "nope"), "nope", "no sharded array")


def test_chunks_per_shard_that_fits_no_array(shared_data, tmp_path):
    src, dst = shared_data / ASTRONAUT, tmp_path / "out"  # every array is 3-d
    assert_one_line_error(
        run("convert", str(src), str(dst), "--chunks-per-shard", "2,2"),
        "fits no array",
        "raw (3-d",
        "--skip-mismatched",
    )
    assert not dst.exists() or not any(dst.iterdir())
    proc = run("convert", str(src), str(dst), "--chunks-per-shard", "2,2", "--skip-mismatched")
    assert proc.returncode == 0, proc.stderr
    assert "0 sharded, 4 copied unsharded" in proc.stdout


def test_overwrite_never_deletes_a_regular_file(shared_data, tmp_path):
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    for command in ("convert", "unshard"):
        extra = ["--chunks-per-shard", "2"] if command == "convert" else []
        proc = run(command, str(shared_data / ASTRONAUT), str(target), *extra, "--overwrite")
        assert_one_line_error(proc, "precious.txt", "regular file")
        assert target.read_text() == "keep me"


def test_info_reads_convert_output_of_a_draft_hierarchy(shared_data, tmp_path):
    src, dst = shared_data / "zarr_implementations/examples/zarrita.zr3", tmp_path / "draft"
    assert run("convert", str(src), str(dst), "--chunks-per-shard", "2,2,1").returncode == 0
    proc = run("info", str(dst), "--json")
    assert proc.returncode == 0, proc.stderr
    arrays = {a["path"]: a for a in json.loads(proc.stdout)["arrays"]}
    assert set(arrays) == {"raw", "gzip", "zlib", "blosc/lz4"}
    for a in arrays.values():
        assert a["chunks_per_shard"] == [2, 2, 1] and a["chunks_present"] == 108 and a["shards"] == 27
        assert a["bytes_unused"] == 0 and a["v3_readable"] is False


def test_demo_leaves_nothing_in_the_current_directory(tmp_path):
    proc = run("demo", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "equal to the input" in proc.stdout and "now removed" in proc.stdout
    assert list(tmp_path.iterdir()) == []
    assert proc.stderr == ""  # no warning text from dependencies


def test_normal_runs_print_nothing_on_stderr(shared_data, tmp_path):
    out = tmp_path / "out"
    for args in (
        ["convert", str(shared_data / ASTRONAUT), str(out), "--chunks-per-shard", "2"],
        ["info", str(out)],
        ["compact", str(out)],
        ["unshard", str(out), str(tmp_path / "plain")],
    ):
        proc = run(*args)
        assert proc.returncode == 0 and proc.stderr == "", (args, proc.stderr)


@pytest.mark.parametrize("workers", ["0", "x"])
def test_bad_workers_is_a_usage_error(tmp_path, workers):
    proc = run("convert", "a", str(tmp_path / "b"), "--chunks-per-shard", "2", "--workers", workers)
    assert proc.returncode == 2 and "--workers" in proc.stderr


def test_scheduler_runs_the_tasks_on_a_dask_cluster(shared_data, tmp_path):
    distributed = pytest.importorskip("distributed")
    from shardkv.cli.convert import convert

    src = shared_data / ASTRONAUT
    local, on_cluster = tmp_path / "local", tmp_path / "cluster"
    convert(str(src), str(local), (2, 2, 1))
    with distributed.LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=False,
        protocol="tcp",
        host="127.0.0.1",
        scheduler_port=0,
        dashboard_address=":0",  # a free port: None still serves the scheduler's HTTP routes on 8787
        worker_dashboard_address=None,  # a worker's dashboard warns when 8787 is taken
    ) as cluster:  # listens on 127.0.0.1 only, on a free port
        report = convert(str(src), str(on_cluster), (2, 2, 1), scheduler=cluster.scheduler_address, task_chunks=16)
    assert report.workers == 0 and report.shards == 4 * 27
    assert _files(on_cluster) == _files(local)
