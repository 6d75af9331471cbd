"""The ``shardkv`` command line, run as users run it (``python -m shardkv`` in a subprocess),
and the data behind ``shardkv info`` (:mod:`shardkv.cli.info`)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr

from shardkv import ShardedStore, ShardIndex, ShardLayout
from shardkv.cli.info import inspect_store

ASTRONAUT = "zarr_implementations/examples/zarr.zr"


def run(*args: str, cwd: Path | None = None, code: str | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", code, *args] if code else [sys.executable, "-m", "shardkv", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=300)


def assert_one_line_error(proc: subprocess.CompletedProcess, status: int, *words: str) -> None:
    assert proc.returncode == status, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for w in words:
        assert w in lines[0], lines[0]


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def small(tmp_path) -> tuple[Path, dict[str, np.ndarray]]:
    """A hierarchy with a float array, a '<U4' array (no v3 data type) and a 0-d array."""
    src = tmp_path / "in.zarr"
    root = zarr.open_group(zarr.DirectoryStore(str(src)), mode="w")
    values = {
        "grid/temp": np.linspace(0, 1, 30 * 40, dtype="<f8").reshape(30, 40),
        "names": np.array(["ab", "cde", "f", "ghij"] * 5, dtype="<U4"),
        "scalar": np.array(3, dtype="<i4"),
    }
    chunks = {"grid/temp": (4, 5), "names": (3,), "scalar": ()}
    for name, data in values.items():
        z = root.create_dataset(name, shape=data.shape, chunks=chunks[name] or True, dtype=data.dtype)
        z[...] = data
    return src, values


# -- help and usage errors -----------------------------------------------------------


def test_help_lists_commands_and_examples():
    proc = run("--help")
    assert proc.returncode == 0
    for word in ("convert", "info", "demo", "examples:", "--chunks-per-shard"):
        assert word in proc.stdout


def test_convert_help_mentions_every_option():
    proc = run("convert", "--help")
    assert proc.returncode == 0
    for word in (
        "SRC",
        "DST",
        "--chunks-per-shard",
        "--index-location",
        "--no-checksum",
        "--overwrite",
        "2,2,1",
        "examples:",
    ):
        assert word in proc.stdout


# behaviour retired before any release (README, "Retired"): no help text may offer it
_RETIRED = ("append-only", "in-place", "inplace", "write_strategy", "slack", "validate_index_cache")


@pytest.mark.parametrize("command", [None, "convert", "unshard", "info", "verify", "compact", "demo"])
def test_no_help_text_names_retired_behaviour(command):
    proc = run(*([command] if command else []), "--help")
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split()).lower()
    assert not [word for word in _RETIRED if word in text], text


def test_info_and_demo_help():
    assert "--json" in run("info", "--help").stdout
    assert "DIR" in run("demo", "--help").stdout


@pytest.mark.parametrize("value", ["0", "a,b", "2,,1", "-1", ""])
def test_bad_chunks_per_shard_is_a_one_line_usage_error(tmp_path, small, value):
    src, _ = small
    proc = run("convert", str(src), str(tmp_path / "out"), "--chunks-per-shard", value)
    assert_one_line_error(proc, 2, "--chunks-per-shard")
    assert not (tmp_path / "out").exists()


def test_missing_arguments_are_one_line_usage_errors(small):
    src, _ = small
    assert_one_line_error(run(), 2, "COMMAND")
    assert_one_line_error(run("convert", str(src)), 2, "DST")
    assert_one_line_error(run("convert", str(src), "out"), 2, "--chunks-per-shard")
    assert_one_line_error(run("convert", str(src), "out", "--chunks-per-shard", "2", "--index-location", "middle"), 2)


def test_missing_source(tmp_path):
    proc = run("convert", str(tmp_path / "nothing.zarr"), str(tmp_path / "out"), "--chunks-per-shard", "2")
    assert_one_line_error(proc, 1, "nothing.zarr", "does not exist")
    assert_one_line_error(run("info", str(tmp_path / "nothing.zarr")), 1, "does not exist")


def test_source_that_is_not_a_zarr_v2_hierarchy(tmp_path):
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "data.csv").write_text("a,b\n")
    proc = run("convert", str(tmp_path / "plain"), str(tmp_path / "out"), "--chunks-per-shard", "2")
    assert_one_line_error(proc, 1, "not a Zarr v2 hierarchy")
    assert not (tmp_path / "out").exists()
    (tmp_path / "v3").mkdir()
    (tmp_path / "v3" / "zarr.json").write_text('{"zarr_format": 2, "node_type": "group"}')  # not v3 either
    proc = run("convert", str(tmp_path / "v3"), str(tmp_path / "out"), "--chunks-per-shard", "2")
    assert_one_line_error(proc, 1, "not a Zarr v2 hierarchy", "zarr.json")
    assert not (tmp_path / "out").exists()


def test_non_empty_destination_then_overwrite_is_idempotent(tmp_path, shared_data):
    src, dst = shared_data / ASTRONAUT, tmp_path / "out.zarr"
    first = run("convert", str(src), str(dst), "--chunks-per-shard", "2")
    assert first.returncode == 0, first.stderr
    files = _files(dst)
    again = run("convert", str(src), str(dst), "--chunks-per-shard", "2")
    assert_one_line_error(again, 1, "not empty", "--overwrite")
    assert _files(dst) == files
    (dst / "leftover").write_bytes(b"x")
    over = run("convert", str(src), str(dst), "--chunks-per-shard", "2", "--overwrite")
    assert over.returncode == 0, over.stderr
    assert _files(dst) == files  # the same bytes, and nothing left from before


# -- convert -------------------------------------------------------------------------


def test_convert_summary(tmp_path, small):
    src, _ = small
    proc = run("convert", str(src), str(tmp_path / "out"), "--chunks-per-shard", "2,2")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "1 sharded, 2 copied unsharded" in out
    assert "names (1-d; chunks_per_shard 2,2 is for 2-d arrays)" in out
    assert "scalar (0-d)" in out
    n_before = sum(1 for p in src.rglob("*") if p.is_file())
    n_after = sum(1 for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert f"objects: {n_before} -> {n_after}" in out


def test_convert_json_report(tmp_path, small):
    src, _ = small
    proc = run("convert", str(src), str(tmp_path / "out"), "--chunks-per-shard", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    by_path = {a["path"]: a for a in report["arrays"]}
    assert by_path["grid/temp"]["sharded"] and by_path["grid/temp"]["chunks_per_shard"] == [2, 2]
    assert by_path["names"]["sharded"] and not by_path["scalar"]["sharded"]
    assert report["objects_after"] == sum(1 for p in (tmp_path / "out").rglob("*") if p.is_file())


@pytest.mark.parametrize(
    "options", [["--index-location", "start"], ["--no-checksum"], ["--index-location", "start", "--no-checksum"]]
)
def test_index_options_give_shards_sharded_store_reads(tmp_path, small, options):
    src, values = small
    dst = tmp_path / "out"
    proc = run("convert", str(src), str(dst), "--chunks-per-shard", "3", *options)
    assert proc.returncode == 0, proc.stderr
    store = ShardedStore(str(dst))
    for name, data in values.items():
        np.testing.assert_array_equal(zarr.open_array(store, path=name, mode="r")[...], data)
    config = json.loads((dst / "grid/temp/zarr.json").read_text())["codecs"][0]["configuration"]
    assert config["index_location"] == ("start" if "start" in options else "end")
    assert [c["name"] for c in config["index_codecs"]] == (
        ["bytes"] if "--no-checksum" in options else ["bytes", "crc32c"]
    )
    layout = ShardLayout((3, 3), config["index_location"], "little", "--no-checksum" not in options)
    blob = (dst / "grid/temp/0.0").read_bytes()
    assert layout.index_of_shard(blob, "grid/temp/0.0").count_present() == 9


# -- info ----------------------------------------------------------------------------


def test_info_table(tmp_path, small):
    src, _ = small
    dst = tmp_path / "out"
    assert run("convert", str(src), str(dst), "--chunks-per-shard", "2").returncode == 0
    proc = run("info", str(dst))
    assert proc.returncode == 0, proc.stderr
    lines = {line.split()[0]: line for line in proc.stdout.splitlines()[1:-1]}
    assert set(lines) == {"grid/temp", "names", "scalar"}
    temp = lines["grid/temp"]
    n_chunks = sum(1 for p in (src / "grid/temp").iterdir() if not p.name.startswith("."))
    n_shards = sum(1 for p in (dst / "grid/temp").iterdir() if not p.name.startswith(".") and p.name != "zarr.json")
    assert "(30, 40)" in temp and "(4, 5)" in temp and "(8, 10) = 2x2 chunks" in temp
    assert f" {n_chunks} " in temp and f" {n_shards} " in temp and temp.endswith("yes")
    # zarr-python 3 reads '<U4' (its fixed_length_utf32 extension); tensorstore does not
    assert "yes; other v3 readers: dtype '<U4' has no Zarr v3 core data type" in lines["names"]
    assert "unsharded" in lines["scalar"]
    assert "3 arrays (2 sharded, 1 unsharded)" in proc.stdout.splitlines()[-1]


def test_info_json_matches_the_stored_files(tmp_path, small):
    src, _ = small
    dst = tmp_path / "out"
    assert run("convert", str(src), str(dst), "--chunks-per-shard", "2", "--index-location", "start").returncode == 0
    proc = run("info", str(dst), "--json")
    assert proc.returncode == 0, proc.stderr
    arrays = {a["path"]: a for a in json.loads(proc.stdout)["arrays"]}
    temp = arrays["grid/temp"]
    shard_files = [p for p in (dst / "grid/temp").iterdir() if not p.name.startswith(".") and p.name != "zarr.json"]
    assert temp["shards"] == temp["objects"] == len(shard_files)
    assert temp["bytes_stored"] == sum(p.stat().st_size for p in shard_files)
    chunk_files = [p for p in (src / "grid/temp").iterdir() if not p.name.startswith(".")]
    assert (
        temp["chunks_present"]
        == len(chunk_files)
        == math.prod(math.ceil(s / c) for s, c in zip((30, 40), (4, 5), strict=True))
    )
    # a fresh conversion leaves no unused bytes: shards = indexes + chunk bytes
    assert temp["bytes_unused"] == 0
    assert temp["bytes_stored"] == len(shard_files) * (16 * 4 + 4) + sum(p.stat().st_size for p in chunk_files)
    assert temp["shard_shape"] == [8, 10] and temp["index_location"] == "start" and temp["v3_readable"] is True
    # zarr-python 3 reads it (fixed_length_utf32); tensorstore does not
    assert arrays["names"]["v3_readable"] is True and "<U4" in arrays["names"]["v3_problems"][0]
    assert arrays["scalar"]["shard_shape"] is None and arrays["scalar"]["chunks_present"] == 1


def test_info_counts_unused_bytes_inside_shards(tmp_path):
    """A shard with a gap between its chunks (allowed by the format) reports the gap as unused."""
    store: dict = {}
    z = zarr.create(shape=(4,), chunks=(2,), dtype="u1", store=ShardedStore(store, 2), compressor=None)
    z[...] = np.arange(4, dtype="u1")
    layout = ShardLayout((2,))
    a, b, gap = bytes([0, 1]), bytes([2, 3]), b"\xff" * 10
    index = ShardIndex.empty((2,))
    index.set((0,), 0, 2)
    index.set((1,), 2 + len(gap), 2)
    store["0"] = a + gap + b + layout.encode_index(index)
    np.testing.assert_array_equal(zarr.open_array(ShardedStore(store), mode="r")[...], np.arange(4))
    (info,) = inspect_store(store)
    assert info.bytes_unused == len(gap)
    assert info.bytes_stored == len(store["0"]) and info.chunks_present == 2 and info.shards == 1


def test_info_on_an_unsharded_store(shared_data):
    infos = {i.path: i for i in inspect_store(str(shared_data / ASTRONAUT))}
    assert set(infos) == {"raw", "gzip", "zlib", "blosc"}
    for name, info in infos.items():
        files = [p for p in (shared_data / ASTRONAUT / name).iterdir() if not p.name.startswith(".")]
        assert info.shard_shape is None and info.shards == 0
        assert info.chunks_present == len(files)
        assert info.bytes_stored == sum(p.stat().st_size for p in files)


# -- demo ----------------------------------------------------------------------------

_WITHOUT_ZARR = (
    "import sys; sys.modules['zarr'] = None; from shardkv.cli.main import main; sys.exit(main(sys.argv[1:]))"
)


@pytest.mark.parametrize("code", [None, _WITHOUT_ZARR], ids=["with-zarr", "without-zarr"])
def test_demo_runs_end_to_end_and_again(tmp_path, code):
    for _ in range(2):  # a second run replaces what the first one made
        proc = run("demo", "--out", "shardkv-demo", cwd=tmp_path, code=code)  # files kept only with --out
        assert proc.returncode == 0, proc.stderr
        assert "equal to the input" in proc.stdout and "DIFFERENT" not in proc.stdout
        assert ("zarr-python 2" in proc.stdout.splitlines()[0]) == (code is None)
    out = tmp_path / "shardkv-demo" / "sharded"
    store = ShardedStore(str(out))
    assert all(store.sharded_array(a) is not None for a in ("temperature", "labels", "counts"))
    assert "3 sharded, 0 copied unsharded" in proc.stdout


def test_demo_refuses_to_replace_what_it_did_not_make(tmp_path):
    (tmp_path / "input").mkdir()
    (tmp_path / "input" / "precious.txt").write_text("keep me")
    assert_one_line_error(run("demo", str(tmp_path / "input")), 1, "not made by 'shardkv demo'")
    assert (tmp_path / "input" / "precious.txt").read_text() == "keep me"
