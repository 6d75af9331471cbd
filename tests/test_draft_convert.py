"""``convert_draft`` and ``shardkv convert`` on zarrita.zr3 (a 2022 draft hierarchy).

The converted copy is read by zarr-python 2.18's own sharding transformer (in
a subprocess with ``ZARR_V3_SHARDING=1``) and compared with the same astronaut
image read by zarr 2.18 from zarr.zr (Zarr v2, written by zarr-python).
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
from math import prod
from pathlib import Path

import numpy as np
import pytest

from shardkv.cli.convert.draft import convert_draft
from shardkv.cli.errors import DestinationNotEmptyError
from shardkv.errors import ConfigurationError
from shardkv.proxy.draft import DraftShardedStore

SHARDING = "https://purl.org/zarr/spec/storage_transformers/sharding/1.0"
ZR3_ARRAYS = ["raw", "gzip", "zlib", "blosc/lz4"]
ZR_ARRAYS = ["raw", "zlib", "gzip", "blosc"]

READ_BOTH = textwrap.dedent(
    """
    import json, sys, warnings
    import numpy as np, zarr
    from zarr._storage.v3 import DirectoryStoreV3
    warnings.simplefilter("ignore")
    cfg = json.loads(sys.stdin.read())
    out = {}
    for name in cfg["zr_arrays"]:
        a = zarr.open_array(cfg["zr"] + "/" + name, mode="r")  # Zarr v2
        np.save(f"{cfg['out']}/zr-{name}.npy", a[...])
    for name in cfg["zr3_arrays"]:
        a = zarr.open_array(DirectoryStoreV3(cfg["converted"]), path=name, mode="r", zarr_version=3)
        out[name] = type(a.chunk_store).__name__
        np.save(f"{cfg['out']}/conv-{name.replace('/', '_')}.npy", a[...])
    print(json.dumps(out))
    """
)


def zarr_reads(zr: Path, converted: Path, out: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZARR_V3")}
    env.update(ZARR_V3_EXPERIMENTAL_API="1", ZARR_V3_SHARDING="1")
    cfg = {
        "zr": str(zr),
        "converted": str(converted),
        "out": str(out),
        "zr_arrays": ZR_ARRAYS,
        "zr3_arrays": ZR3_ARRAYS,
    }
    proc = subprocess.run(
        [sys.executable, "-c", READ_BOTH], input=json.dumps(cfg), env=env, capture_output=True, text=True, timeout=600
    )
    if proc.returncode != 0:
        pytest.fail(proc.stderr[-4000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture
def examples(shared_data: Path) -> Path:
    path = shared_data / "zarr_implementations" / "examples"
    if not (path / "zarrita.zr3" / "zarr.json").is_file():
        pytest.fail(f"zarrita.zr3 missing under {path}")
    return path


def check_converted(examples: Path, dst: Path, tmp_path: Path, cps: list[int]) -> None:
    out = tmp_path / "npy"
    out.mkdir()
    chunk_stores = zarr_reads(examples / "zarr.zr", dst, out)
    assert set(chunk_stores.values()) == {"ShardingStorageTransformer"}  # zarr's own transformer read it
    reference = np.load(out / "zr-raw.npy")
    assert reference.shape == (512, 512, 3) and reference.dtype == np.uint8 and reference.any()
    for name in ZR_ARRAYS:
        np.testing.assert_array_equal(np.load(out / f"zr-{name}.npy"), reference)
    for name in ZR3_ARRAYS:
        np.testing.assert_array_equal(np.load(out / f"conv-{name.replace('/', '_')}.npy"), reference, err_msg=name)
        meta = json.loads((dst / "meta" / "root" / f"{name}.array.json").read_text())
        assert meta["storage_transformers"] == [
            {"extension": SHARDING, "type": "indexed", "configuration": {"chunks_per_shard": cps}}
        ]


def test_convert_draft_zarrita(examples, tmp_path):
    src = examples / "zarrita.zr3"
    dst = tmp_path / "sharded.zr3"
    report = convert_draft(str(src), str(dst), (2, 2, 3))
    assert (report.arrays, report.sharded_arrays, report.chunks) == (4, 4, 4 * 6 * 6 * 3)
    assert report.shards == 4 * 3 * 3 * 1 and report.stale_chunks == 0
    check_converted(examples, dst, tmp_path, [2, 2, 3])
    # chunks copied, not re-encoded: every chunk of the source is in a shard, byte for byte
    n = 2 * 2 * 3
    for name in ZR3_ARRAYS:
        for chunk_file in (src / "data" / "root" / name).rglob("c*/*/*"):
            i, j, k = (int(p.lstrip("c")) for p in chunk_file.relative_to(src / "data" / "root" / name).parts)
            shard = dst / "data" / "root" / name / f"c{i // 2}" / str(j // 2) / str(k // 3)
            blob = shard.read_bytes()
            local = ((i % 2) * 2 + j % 2) * 3 + k % 3
            offset, nbytes = struct.unpack_from("<QQ", blob, len(blob) - 16 * n + 16 * local)
            assert blob[offset : offset + nbytes] == chunk_file.read_bytes()


def test_shardkv_convert_command_on_a_draft_hierarchy(examples, tmp_path):
    dst = tmp_path / "cli.zr3"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "shardkv",
            "convert",
            str(examples / "zarrita.zr3"),
            str(dst),
            "--chunks-per-shard",
            "3",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["sharded_arrays"] == 4 and report["chunks"] == 432
    check_converted(examples, dst, tmp_path, [3, 3, 3])


def test_converted_copy_reads_through_the_proxy(examples, tmp_path):
    dst = tmp_path / "p.zr3"
    convert_draft(str(examples / "zarrita.zr3"), str(dst), {"raw": [4, 1, 3], "gzip": 2})
    source = DraftShardedStore(str(examples / "zarrita.zr3"))
    proxy = DraftShardedStore(str(dst))
    assert proxy.storage_transformers("zlib") == []  # not in the mapping: copied unsharded
    assert proxy.storage_transformers("raw")[0]["configuration"] == {"chunks_per_shard": [4, 1, 3]}
    keys = sorted(source.list())
    assert sorted(proxy.list()) == keys
    got, expected = proxy.getitems(keys), source.getitems(keys)
    data = [k for k in keys if k.startswith("data/")]
    assert len(data) == 432 and {k: got[k] for k in data} == {k: expected[k] for k in data}
    for k in set(keys) - set(data):  # metadata: the same documents (sharded ones re-serialised)
        assert json.loads(got[k]) == json.loads(expected[k]), k


def test_convert_draft_refuses_a_non_empty_destination_and_a_v2_source(examples, tmp_path):
    dst = {"zarr.json": b"{}"}
    with pytest.raises(DestinationNotEmptyError):
        convert_draft(str(examples / "zarrita.zr3"), dst, 2)
    with pytest.raises(ConfigurationError, match="not a 2022 draft hierarchy"):
        convert_draft(str(examples / "zarr.zr"), {}, 2)


def test_indexes_are_full_size_for_edge_shards(examples, tmp_path):
    """The index always has the full shape of all possible chunks, even outside the array."""
    dst = tmp_path / "edge.zr3"
    convert_draft(str(examples / "zarrita.zr3"), str(dst), (4, 4, 2))  # 6x6x3 grid: edge shards
    n = prod((4, 4, 2))
    edge = (dst / "data/root/raw/c1/1/1").read_bytes()  # holds chunks (4..5, 4..5, 2) only
    entries = [struct.unpack_from("<QQ", edge, len(edge) - 16 * n + 16 * i) for i in range(n)]
    assert sum(e != (2**64 - 1, 2**64 - 1) for e in entries) == 2 * 2 * 1


def test_verify_and_compact_take_zarrita_and_its_converted_copy(examples, tmp_path, capsys):
    """The zarrita draft hierarchy (unsharded draft arrays) and convert's sharded copy of it: checked, compacted."""
    import shutil

    from shardkv.cli.main import main

    src = tmp_path / "zarrita.zr3"
    shutil.copytree(examples / "zarrita.zr3", src)
    convert_draft(str(src), str(tmp_path / "sharded.zr3"), (2, 2, 3))
    for store, shards in ((src, 0), (tmp_path / "sharded.zr3", 4 * 3 * 3 * 1)):
        capsys.readouterr()
        assert main(["verify", str(store), "--decode"]) == 0
        out = capsys.readouterr().out
        assert f"verified {store}: {shards} shards, 0 damaged" in out and out.rstrip().endswith("ok"), out
        assert main(["compact", str(store)]) == 0
        assert capsys.readouterr().out.strip() == f"compacted {store}: 0 bytes reclaimed"  # convert packs tightly
    check_converted(examples, tmp_path / "sharded.zr3", tmp_path, [2, 2, 3])
