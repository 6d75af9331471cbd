"""`shardkv convert` streams its source: memory bounded by shards in flight, not by chunks;
and never drops a node: object dtypes, reserved names, the output checked against the source."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numcodecs
import numpy as np
import pytest
import zarr

from shardkv import ShardedStore
from shardkv.cli.convert import convert
from shardkv.cli.errors import ConversionIncompleteError, ReservedNameError

_PEAK = textwrap.dedent(
    """
    import json, os, sys, tracemalloc
    rows, cols, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    src = os.path.join(out, "src")
    os.makedirs(os.path.join(src, "a"))
    with open(os.path.join(src, ".zgroup"), "w") as f:
        json.dump({"zarr_format": 2}, f)
    zarray = {"zarr_format": 2, "shape": [rows, cols], "chunks": [1, 1], "dtype": "|u1", "compressor": None,
              "fill_value": 0, "filters": None, "order": "C"}
    with open(os.path.join(src, "a", ".zarray"), "w") as f:
        json.dump(zarray, f)
    for i in range(rows):
        for j in range(cols):
            fd = os.open(os.path.join(src, "a", f"{i}.{j}"), os.O_WRONLY | os.O_CREAT, 0o644)
            os.write(fd, bytes([(i * 7 + j) % 256]))
            os.close(fd)
    from shardkv.cli.convert import convert
    import tqdm  # imported before tracing: only the conversion's own allocations count
    tracemalloc.start()
    report = convert(src, os.path.join(out, "dst"), (50, 50))
    peak = tracemalloc.get_traced_memory()[1]
    print(json.dumps({"peak": peak, "chunks": report.chunks, "shards": report.shards}))
    """
)


def _peak(rows: int, cols: int, out: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", _PEAK, str(rows), str(cols), str(out)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_peak_memory_does_not_grow_with_the_number_of_chunks(tmp_path):
    small = _peak(100, 200, tmp_path / "small")  # 20,000 chunks of one byte
    large = _peak(400, 500, tmp_path / "large")  # 200,000
    assert (small["chunks"], large["chunks"]) == (20_000, 200_000)
    assert (small["shards"], large["shards"]) == (8, 80)
    assert large["peak"] <= 1.25 * small["peak"], (small, large)
    stored = zarr.open_array(ShardedStore(str(tmp_path / "large" / "dst")), path="a", mode="r")[...]
    rows, cols = np.indices((400, 500))
    np.testing.assert_array_equal(stored, ((rows * 7 + cols) % 256).astype("u1"))


# -- nothing dropped ---------------------------------------------------------------


def _hierarchy(root: Path) -> zarr.Group:
    g = zarr.open_group(str(root), mode="w")
    g.create_dataset("numbers", data=np.arange(16).reshape(4, 4), chunks=(2, 2))
    words = g.create_dataset("words", shape=(4,), chunks=(2,), dtype=object, object_codec=numcodecs.VLenUTF8())
    words[:] = np.array(["a", "bb", "ccc", "d"], dtype=object)
    g.create_group("empty")
    return g


def test_an_object_dtype_array_is_kept(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    _hierarchy(src)
    report = convert(str(src), str(dst), 2)
    by_path = {a.path: a for a in report.arrays}
    # an object (string) array has a v3 description now, so it is sharded like the others
    assert by_path["numbers"].sharded and by_path["words"].sharded
    group = zarr.open_group(ShardedStore(str(dst)), mode="r")
    assert sorted(group.array_keys()) == ["numbers", "words"] and "empty" in group
    assert list(group["words"][:]) == ["a", "bb", "ccc", "d"]
    np.testing.assert_array_equal(group["numbers"][:], np.arange(16).reshape(4, 4))
    assert "checked: the output holds every array (2) and group (2) of the source" in report.summary()


@pytest.mark.parametrize("name", ["x.shardkv-tmp-1", ".shardkv-locks"])
@pytest.mark.parametrize("kind", ["array", "group"])
def test_a_node_with_a_reserved_name_is_refused(tmp_path, name, kind):
    src, dst = tmp_path / "src", tmp_path / "dst"
    g = _hierarchy(src)
    if kind == "array":
        g.create_dataset(name, data=np.arange(4), chunks=(2,))
    else:
        g.create_group(name)
    with pytest.raises(ReservedNameError, match=name.replace(".", r"\.")):
        convert(str(src), str(dst), 2)
    proc = subprocess.run(
        [sys.executable, "-m", "shardkv", "convert", str(src), str(tmp_path / "cli"), "--chunks-per-shard", "2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert name in proc.stderr and "rename" in proc.stderr


def test_temporaries_and_lock_files_in_the_source_are_not_nodes(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    _hierarchy(src)
    (src / "numbers" / "0.0.shardkv-tmp-abc").write_bytes(b"torn")
    (src / ".shardkv-locks").mkdir()
    (src / ".shardkv-locks" / "numbers.lock").write_bytes(b"")
    report = convert(str(src), str(dst), 2)
    assert len(report.arrays) == 2
    assert not list(dst.rglob("*shardkv-tmp*"))


def test_an_output_missing_a_node_fails_naming_it(tmp_path, monkeypatch):
    import shardkv.cli.convert.run as module

    src, dst = tmp_path / "src", tmp_path / "dst"
    _hierarchy(src)
    real = module.store_as_v3

    def lose_words(meta_out: dict, all_v3: bool = False) -> None:  # a conversion step that drops a node
        real(meta_out, all_v3)
        for key in [k for k in meta_out if k.startswith("words/")]:
            del meta_out[key]

    monkeypatch.setattr(module, "store_as_v3", lose_words)
    with pytest.raises(ConversionIncompleteError, match="words"):
        convert(str(src), str(dst), 2)


def test_a_reserved_name_is_refused_on_an_fsspec_store_too(tmp_path):
    import fsspec

    mapper = fsspec.get_mapper("memory://reserved-src")
    g = zarr.open_group(mapper, mode="w")
    g.create_dataset("fine", data=np.arange(4), chunks=(2,))
    g.create_dataset("x.shardkv-tmp-9", data=np.arange(4), chunks=(2,))
    try:
        with pytest.raises(ReservedNameError, match=r"x\.shardkv-tmp-9"):
            convert("memory://reserved-src", str(tmp_path / "dst"), 2)
    finally:
        mapper.fs.rm("/reserved-src", recursive=True)


def test_unshard_keeps_an_object_dtype_array(tmp_path):
    """``unshard`` of what ``convert`` made loses no array either (the strings array included)."""
    from shardkv.cli.unshard import unshard

    src, dst, back = tmp_path / "src", tmp_path / "dst", tmp_path / "back"
    _hierarchy(src)
    convert(str(src), str(dst), 2)
    unshard(str(dst), str(back))
    group = zarr.open_group(str(back), mode="r")  # plain zarr 2, no shardkv
    assert sorted(group.array_keys()) == ["numbers", "words"] and "empty" in group
    assert list(group["words"][:]) == ["a", "bb", "ccc", "d"]
    np.testing.assert_array_equal(group["numbers"][:], np.arange(16).reshape(4, 4))
