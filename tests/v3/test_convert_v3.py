"""`shardkv convert` of Zarr v3 hierarchies written by zarr-python 3 and tensorstore, resharding, and
`unshard --zarr-format 3` back: chunks move as stored, readers without shardkv see the same arrays.

Oracles: zarr-python 3 and tensorstore read the outputs (values, attributes, fill values, dimension
names); each inner chunk of each output shard, located through the shard index (parsed here with
numpy, not with shardkv), holds the bytes of the source chunk's object.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorstore as ts
import zarr
from concurrency_harness import MotoS3, local_cluster, moto_s3  # noqa: F401  (module-scoped fixtures)
from held_cli import start_held
from zarr.codecs import BytesCodec, GzipCodec, ShardingCodec, TransposeCodec, ZstdCodec

from shardkv import ConfigurationError, CorruptShardError
from shardkv.cli.convert import convert
from shardkv.cli.manifest import MANIFEST_KEY, UNSHARD_MANIFEST_KEY
from shardkv.cli.unshard import unshard

EMPTY = 2**64 - 1


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _data(shape: tuple[int, ...], dtype: str, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * 100).astype(dtype)


def _zarr3_source(root: Path) -> dict[str, np.ndarray]:
    """A hierarchy zarr-python 3 writes: key encodings, codec chains, edge and missing chunks, 0-d, groups."""
    g = zarr.open_group(str(root), mode="w", attributes={"title": "root", "n": 1})
    sub = g.create_group("g", attributes={"level": 1})
    sub.create_group("h", attributes={"level": 2, "list": [1, 2]})
    expected: dict[str, np.ndarray] = {}

    a = g.create_array(
        "a", shape=(70, 45), chunks=(16, 16), dtype="f4", fill_value=7.5, dimension_names=["y", "x"],
        compressors=ZstdCodec(level=3), attributes={"units": "m"},
    )  # fmt: skip
    data = np.full((70, 45), 7.5, "f4")
    data[:40, :] = _data((40, 45), "f4")  # chunks of rows 48.. are never written
    a[:40, :] = data[:40, :]
    expected["a"] = data

    dot = g.create_array(
        "g/dot", shape=(33, 20), chunks=(8, 8), dtype="i2", fill_value=-1, compressors=GzipCodec(level=1),
        chunk_key_encoding={"name": "default", "separator": "."},
    )  # fmt: skip
    expected["g/dot"] = _data((33, 20), "i2", 1)
    dot[:] = expected["g/dot"]

    v2keys = g.create_array(
        "g/h/v2keys", shape=(30, 30), chunks=(10, 10), dtype="u1", fill_value=3,
        chunk_key_encoding={"name": "v2", "separator": "."},
    )  # fmt: skip
    expected["g/h/v2keys"] = np.arange(900, dtype="u1").reshape(30, 30)
    v2keys[:] = expected["g/h/v2keys"]

    t = g.create_array(
        "t", shape=(12, 10, 9), chunks=(4, 5, 3), dtype=">i4", fill_value=0,
        filters=TransposeCodec(order=(2, 0, 1)), serializer=BytesCodec(endian="big"), compressors=ZstdCodec(level=1),
    )  # fmt: skip
    expected["t"] = np.arange(12 * 10 * 9, dtype=">i4").reshape(12, 10, 9)
    t[:] = expected["t"]

    scalar = g.create_array("scalar", shape=(), dtype="f8", fill_value=0.0, chunks=())
    scalar[()] = 3.25
    expected["scalar"] = np.array(3.25)
    return expected


def _tensorstore_source(root: Path) -> np.ndarray:
    data = _data((50, 23), "f4", 2)
    arr = ts.open(
        {
            "driver": "zarr3",
            "kvstore": {"driver": "file", "path": str(root / "ts")},
            "metadata": {
                "shape": [50, 23],
                "data_type": "float32",
                "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [8, 8]}},
                "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "blosc"}],
                "fill_value": 1.5,
                "dimension_names": ["row", "col"],
            },
        },
        create=True,
    ).result()
    arr[:32].write(data[:32]).result()
    expected = np.full((50, 23), 1.5, "f4")
    expected[:32] = data[:32]
    return expected


def _read_zarr3(root: Path, path: str) -> zarr.Array:
    return zarr.open_array(str(root), path=path, mode="r")


def _read_ts(root: Path, path: str) -> tuple[np.ndarray, Any]:
    arr = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": str(root / path)}}, open=True).result()
    return arr.read().result(), arr


def _index(blob: bytes, n: int, config: dict[str, Any]) -> np.ndarray:
    """The shard's (offset, nbytes) pairs: n little-endian uint64 pairs (and a CRC32C), at its end or start."""
    crc = 4 if [c["name"] for c in config["index_codecs"]] == ["bytes", "crc32c"] else 0
    size = 16 * n + crc
    raw = blob[-size:] if config.get("index_location", "end") == "end" else blob[:size]
    return np.frombuffer(raw[: 16 * n], "<u8").reshape(n, 2)


def _inner_chunks(root: Path, path: str) -> dict[tuple[int, ...], bytes]:
    """Every stored inner chunk of a sharded array by its chunk-grid coords, located through the shard indexes."""
    meta = json.loads((root / path / "zarr.json").read_text())
    (codec,) = meta["codecs"]
    assert codec["name"] == "sharding_indexed"
    config = codec["configuration"]
    inner, shard = config["chunk_shape"], meta["chunk_grid"]["configuration"]["chunk_shape"]
    cps = [s // c for s, c in zip(shard, inner, strict=True)]
    encoding = meta["chunk_key_encoding"]
    sep = (encoding.get("configuration") or {}).get("separator", "/" if encoding["name"] == "default" else ".")
    head = "c" + sep if encoding["name"] == "default" else ""
    out: dict[tuple[int, ...], bytes] = {}
    for key, blob in _files(root / path).items():
        if key == "zarr.json":
            continue
        shard_coords = [int(c) for c in key.removeprefix(head).split(sep)]
        index = _index(blob, int(np.prod(cps)), config)
        for flat, (offset, nbytes) in enumerate(index):
            if offset == EMPTY:
                continue
            local = np.unravel_index(flat, cps)
            coords = tuple(int(s * n + c) for s, n, c in zip(shard_coords, cps, local, strict=True))
            out[coords] = blob[int(offset) : int(offset + nbytes)]
    return out


def _chunk_objects(root: Path, path: str, meta: dict[str, Any]) -> dict[tuple[int, ...], bytes]:
    """The chunk objects of an unsharded v3 array by chunk coords (its chunk key encoding decoded)."""
    encoding = meta["chunk_key_encoding"]
    sep = (encoding.get("configuration") or {}).get("separator", "/" if encoding["name"] == "default" else ".")
    head = "c" + sep if encoding["name"] == "default" else ""
    return {
        tuple(int(c) for c in key.removeprefix(head).split(sep)): blob
        for key, blob in _files(root / path).items()
        if key != "zarr.json"
    }


def test_zarr3_and_tensorstore_sources_shard_as_stored(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    expected = _zarr3_source(src)
    expected["ts"] = _tensorstore_source(src)
    source_meta = {p: json.loads((src / p / "zarr.json").read_text()) for p in expected}
    source_chunks = {p: _chunk_objects(src, p, m) for p, m in source_meta.items() if m["shape"]}

    report = convert(str(src), str(dst), 2, index_location="start")

    assert {a.path for a in report.sharded} == {"a", "g/dot", "g/h/v2keys", "t", "ts"}
    assert {a.path: a.reason for a in report.unsharded} == {"scalar": "0-d"}
    assert report.chunks == sum(len(c) for c in source_chunks.values()) + 1
    for path, want in expected.items():
        arr = _read_zarr3(dst, path)
        np.testing.assert_array_equal(arr[...], want, err_msg=path)
        values, ts_arr = _read_ts(dst, path)
        np.testing.assert_array_equal(values, want, err_msg=path)
        before = source_meta[path]
        after = json.loads((dst / path / "zarr.json").read_text())
        assert dict(arr.attrs) == before.get("attributes", {}), path
        assert after["fill_value"] == before["fill_value"], path
        assert after.get("dimension_names") == before.get("dimension_names"), path
        assert after["chunk_key_encoding"] == before["chunk_key_encoding"], path
        if path == "scalar":
            assert after == before
            continue
        assert list(ts_arr.domain.labels) == (before.get("dimension_names") or [""] * len(want.shape)), path
        # the source's whole codec chain is the inner chain, the chunks the inner chunks, byte for byte
        config = after["codecs"][0]["configuration"]
        assert config["codecs"] == before["codecs"], path
        assert config["chunk_shape"] == before["chunk_grid"]["configuration"]["chunk_shape"], path
        assert _inner_chunks(dst, path) == source_chunks[path], path
    assert dict(zarr.open_group(str(dst), path="g/h", mode="r").attrs) == {"level": 2, "list": [1, 2]}
    assert dict(zarr.open_group(str(dst), mode="r").attrs) == {"title": "root", "n": 1}
    assert sorted(zarr.open_group(str(dst), mode="r").array_keys()) == ["a", "scalar", "t", "ts"]


@pytest.mark.filterwarnings("ignore:Consolidated metadata is currently not part:UserWarning")
def test_consolidated_metadata_describes_the_shards(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    g = zarr.open_group(str(src), mode="w")
    a = g.create_array("x/a", shape=(40, 40), chunks=(10, 10), dtype="i4", fill_value=0)
    a[:] = np.arange(1600, dtype="i4").reshape(40, 40)
    zarr.consolidate_metadata(str(src))

    convert(str(src), str(dst), 2)

    root = json.loads((dst / "zarr.json").read_text())
    entry = root["consolidated_metadata"]["metadata"]["x/a"]
    assert entry == json.loads((dst / "x" / "a" / "zarr.json").read_text())
    opened = zarr.open_consolidated(str(dst), mode="r")
    np.testing.assert_array_equal(opened["x/a"][...], a[...])
    assert opened["x/a"].metadata.codecs[0].__class__.__name__ == "ShardingCodec"


@pytest.mark.parametrize(
    ("location", "checksum", "keys"),
    [("end", True, {"name": "default", "separator": "/"}), ("start", False, {"name": "v2", "separator": "."})],
    ids=["end-crc32c-default", "start-nocrc-v2"],
)
def test_reshard_2x2_to_4x4_and_back(tmp_path: Path, location: str, checksum: bool, keys: dict[str, str]) -> None:
    src = tmp_path / "src"
    data = _data((100, 90), "f8", 3)
    g = zarr.open_group(str(src), mode="w")
    a = g.create_array(
        "a", shape=data.shape, chunks=(10, 10), shards=(20, 20), dtype="f8", fill_value=-2.0,
        compressors=ZstdCodec(level=1), dimension_names=["p", "q"], chunk_key_encoding=keys,
    )  # fmt: skip
    a[:60] = data[:60]
    expected = np.where(np.arange(100)[:, None] < 60, data, -2.0)
    inner_before = _inner_chunks(src, "a")

    convert(str(src), str(tmp_path / "4x4"), 4, index_location=location)
    meta = json.loads((tmp_path / "4x4" / "a" / "zarr.json").read_text())
    assert meta["chunk_grid"]["configuration"]["chunk_shape"] == [40, 40]
    assert meta["chunk_key_encoding"]["name"] == keys["name"]
    assert meta["codecs"][0]["configuration"]["index_location"] == location
    assert _inner_chunks(tmp_path / "4x4", "a") == inner_before
    np.testing.assert_array_equal(_read_zarr3(tmp_path / "4x4", "a")[...], expected)
    np.testing.assert_array_equal(_read_ts(tmp_path / "4x4", "a")[0], expected)

    convert(str(tmp_path / "4x4"), str(tmp_path / "2x2"), 2)
    meta = json.loads((tmp_path / "2x2" / "a" / "zarr.json").read_text())
    assert meta["chunk_grid"]["configuration"]["chunk_shape"] == [20, 20]
    assert _inner_chunks(tmp_path / "2x2", "a") == inner_before
    np.testing.assert_array_equal(_read_zarr3(tmp_path / "2x2", "a")[...], expected)
    np.testing.assert_array_equal(_read_ts(tmp_path / "2x2", "a")[0], expected)


def test_tensorstore_sharded_source_is_resharded(tmp_path: Path) -> None:
    src = tmp_path / "src"
    data = _data((64, 48), "i4", 4)
    arr = ts.open(
        {
            "driver": "zarr3",
            "kvstore": {"driver": "file", "path": str(src)},
            "metadata": {
                "shape": [64, 48],
                "data_type": "int32",
                "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [16, 16]}},
                "codecs": [
                    {
                        "name": "sharding_indexed",
                        "configuration": {
                            "chunk_shape": [8, 8],
                            "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "gzip"}],
                            "index_codecs": [
                                {"name": "bytes", "configuration": {"endian": "little"}},
                                {"name": "crc32c"},
                            ],
                        },
                    }
                ],
            },
        },
        create=True,
    ).result()
    arr.write(data).result()
    inner_before = _inner_chunks(src.parent, src.name)

    convert(str(src), str(tmp_path / "dst"), (4, 2))

    assert _inner_chunks(tmp_path, "dst") == inner_before
    np.testing.assert_array_equal(_read_ts(tmp_path, "dst")[0], data)
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "dst"), mode="r")[...], data)


@pytest.mark.filterwarnings("ignore:Combining a `sharding_indexed` codec disables partial reads:UserWarning")
def test_codecs_on_whole_shards_are_copied_and_say_why(tmp_path: Path) -> None:
    src = tmp_path / "src"
    g = zarr.open_group(str(src), mode="w")
    a = g.create_array(
        "a", shape=(16, 16), chunks=(8, 8), dtype="u2", filters=TransposeCodec(order=(1, 0)),
        serializer=ShardingCodec(chunk_shape=(4, 4)), compressors=None,
    )  # fmt: skip
    a[:] = np.arange(256, dtype="u2").reshape(16, 16)
    assert [c["name"] for c in json.loads((src / "a" / "zarr.json").read_text())["codecs"]] == [
        "transpose",
        "sharding_indexed",
    ]

    report = convert(str(src), str(tmp_path / "dst"), 2)

    (array,) = report.arrays
    assert array.chunks_per_shard is None
    assert "without re-encoding" in (array.reason or "")
    assert _files(tmp_path / "dst" / "a") == _files(src / "a")
    np.testing.assert_array_equal(_read_zarr3(tmp_path / "dst", "a")[...], a[...])


@pytest.mark.filterwarnings("ignore:Consolidated metadata is currently not part:UserWarning")
def test_unshard_to_v3_gives_back_the_same_objects(tmp_path: Path) -> None:
    src, sharded, plain = tmp_path / "src", tmp_path / "sharded", tmp_path / "plain"
    g = zarr.open_group(str(src), mode="w", attributes={"k": "v"})
    a = g.create_array(
        "grp/a", shape=(45, 31), chunks=(8, 8), dtype="f4", fill_value=2.0, compressors=ZstdCodec(level=2),
        dimension_names=["y", "x"], attributes={"a": 1},
    )  # fmt: skip
    a[:30] = _data((30, 31), "f4", 5)
    b = g.create_array("b", shape=(10,), chunks=(3,), dtype="i8", fill_value=0)
    b[:] = np.arange(10)
    zarr.consolidate_metadata(str(src))

    convert(str(src), str(sharded), 3)
    report = unshard(str(sharded), str(plain), zarr_format=3)

    assert report.unsharded_arrays == 2
    before, after = _files(src), _files(plain)
    assert sorted(after) == sorted(before)
    for key, blob in before.items():
        if key.endswith("zarr.json"):
            assert json.loads(after[key]) == json.loads(blob), key
        else:
            assert after[key] == blob, key
    np.testing.assert_array_equal(_read_zarr3(plain, "grp/a")[...], a[...])


def test_unshard_cli_writes_v3_with_zarr_format_3(tmp_path: Path) -> None:
    src, sharded, plain = tmp_path / "src", tmp_path / "sharded", tmp_path / "plain"
    a = zarr.create_array(str(src), shape=(20, 20), chunks=(5, 5), dtype="u2", fill_value=1)
    a[:12] = 9

    def shardkv(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "shardkv", *args], capture_output=True, text=True, timeout=300)

    assert "--zarr-format {2,3}" in shardkv("unshard", "--help").stdout
    assert shardkv("convert", str(src), str(sharded), "--chunks-per-shard", "2").returncode == 0
    proc = shardkv("unshard", str(sharded), str(plain), "--zarr-format", "3")

    assert proc.returncode == 0, proc.stderr
    assert _files(plain) == {k: v for k, v in _files(src).items() if k != "zarr.json"} | {
        "zarr.json": (plain / "zarr.json").read_bytes()
    }
    assert json.loads((plain / "zarr.json").read_text()) == json.loads((src / "zarr.json").read_text())
    bad = shardkv("unshard", str(sharded), str(tmp_path / "other"), "--zarr-format", "4")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


def test_interrupted_convert_of_a_v3_source_resumes(tmp_path: Path) -> None:
    src, one_shot, resumed = tmp_path / "src", tmp_path / "one-shot", tmp_path / "resumed"
    g = zarr.open_group(str(src), mode="w")
    a = g.create_array("a", shape=(800, 8), chunks=(4, 8), dtype="i4", fill_value=0, compressors=None)
    a[:] = np.arange(6400, dtype="i4").reshape(800, 8)
    args = ("convert", str(src), "--chunks-per-shard", "2,1")
    convert(str(src), str(one_shot), (2, 1))

    proc = start_held(20, args[0], args[1], str(resumed), *args[2:], start_new_session=True)
    os.killpg(proc.pid, signal.SIGKILL)  # held after its 20th shard: it cannot have finished
    proc.communicate(timeout=60)
    assert (resumed / MANIFEST_KEY).is_file()
    report = convert(str(src), str(resumed), (2, 1))

    assert report.shards_skipped >= 16  # 20 recorded, the last few read back and maybe written again
    assert report.shards == 100
    assert _files(resumed) == _files(one_shot)


def _mixed_source(root: Path) -> np.ndarray:
    """One plain array (zstd, '/' keys, a few chunks never written) and one sharded array, in nested groups."""
    g = zarr.open_group(str(root), mode="w", attributes={"a": 1})
    data = _data((96, 40), "f4", 6)
    plain = g.create_array("x/plain", shape=data.shape, chunks=(8, 8), dtype="f4", compressors=ZstdCodec(level=1))
    plain[:80] = data[:80]
    sharded = g.create_array("x/y/sharded", shape=data.shape, chunks=(8, 8), shards=(16, 16), dtype="f4")
    sharded[:] = data
    return data


def test_workers_write_the_same_output_and_verify_passes(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _mixed_source(src)
    convert(str(src), str(tmp_path / "one"), 4)
    report = convert(str(src), str(tmp_path / "two"), 4, workers=2)

    assert report.workers == 2
    assert _files(tmp_path / "two") == _files(tmp_path / "one")
    proc = subprocess.run(
        [sys.executable, "-m", "shardkv", "verify", str(tmp_path / "two")], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert "0 damaged" in proc.stdout


def test_a_dask_cluster_writes_the_same_output(tmp_path: Path, local_cluster: Any) -> None:  # noqa: F811
    src = tmp_path / "src"
    _mixed_source(src)
    convert(str(src), str(tmp_path / "here"), 4)

    report = convert(str(src), str(tmp_path / "dask"), 4, scheduler=local_cluster.scheduler.address)

    assert report.workers == 0  # the cluster's
    assert _files(tmp_path / "dask") == _files(tmp_path / "here")


def test_s3_source_and_destination(tmp_path: Path, moto_s3: MotoS3) -> None:  # noqa: F811
    src = tmp_path / "src"
    data = _mixed_source(src)
    convert(str(src), str(tmp_path / "local"), 2)
    fs = moto_s3.filesystem()
    fs.put(str(src), f"{moto_s3.bucket}/v3src", recursive=True)
    options = {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": moto_s3.endpoint_url, "region_name": "us-east-1"},
    }

    convert(f"s3://{moto_s3.bucket}/v3src", f"s3://{moto_s3.bucket}/v3dst", 2, storage_options=options)

    fs.get(f"{moto_s3.bucket}/v3dst", str(tmp_path / "fetched"), recursive=True)
    assert _files(tmp_path / "fetched") == _files(tmp_path / "local")
    np.testing.assert_array_equal(_read_zarr3(tmp_path / "fetched", "x/y/sharded")[...], data)


def test_a_bad_array_document_or_shard_is_named(tmp_path: Path) -> None:
    src = tmp_path / "src"
    g = zarr.open_group(str(src), mode="w")
    g.create_array("ok", shape=(4,), chunks=(2,), dtype="u1")[:] = 1
    s = g.create_array("s", shape=(16,), chunks=(2,), shards=(4,), dtype="u1")
    s[:] = 2
    (src / "s" / "c" / "0").write_bytes((src / "s" / "c" / "0").read_bytes()[:-3])  # a torn index
    with pytest.raises(CorruptShardError, match="'s/c/0'"):
        convert(str(src), str(tmp_path / "a"), 2)
    doc = json.loads((src / "ok" / "zarr.json").read_text())
    doc["chunk_key_encoding"] = {"name": "weird"}
    (src / "ok" / "zarr.json").write_text(json.dumps(doc))
    with pytest.raises(ConfigurationError, match="array 'ok': zarr.json: unknown chunk_key_encoding"):
        convert(str(src), str(tmp_path / "b"), 2)


def test_interrupted_unshard_to_v3_resumes(tmp_path: Path) -> None:
    src, one_shot, resumed = tmp_path / "src", tmp_path / "one-shot", tmp_path / "resumed"
    a = zarr.create_array(str(src), shape=(400, 4), chunks=(2, 4), shards=(4, 4), dtype="i2", fill_value=0)
    a[:] = np.arange(1600, dtype="i2").reshape(400, 4)  # 100 shards of 2 chunks
    unshard(str(src), str(one_shot), zarr_format=3)

    proc = start_held(20, "unshard", str(src), str(resumed), "--zarr-format", "3", start_new_session=True)
    os.killpg(proc.pid, signal.SIGKILL)  # held after its 20th shard: it cannot have finished
    proc.communicate(timeout=60)
    assert (resumed / UNSHARD_MANIFEST_KEY).is_file()
    report = unshard(str(src), str(resumed), zarr_format=3)

    assert report.shards_skipped >= 16
    assert report.shards == 100 and report.chunks == 200
    assert _files(resumed) == _files(one_shot)
    np.testing.assert_array_equal(zarr.open_array(str(resumed), mode="r")[...], a[...])
