"""ShardingCodec against its peers: shards it writes decode in zarr-python 3 and tensorstore,
and shards they write decode in shardkv (v1.0 codec "Binary shard format")."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tensorstore as ts
import zarr
from v3_helpers import (
    array_metadata,
    padded_shard,
    read_tensorstore,
    read_zarr3,
    sample,
    shard_files,
    write_with_shardkv,
)

from shardkv import ShardingCodec

pytestmark = pytest.mark.zarr3

# (shape, shard_shape, inner chunk_shape): every case has overhanging edge shards
GEOMETRIES = {
    "1d": ((50,), (16,), (4,)),
    "2d": ((10, 13), (8, 6), (4, 3)),
    "3d": ((5, 6, 7), (4, 4, 4), (2, 2, 2)),
}
DTYPES = {"u1": "u1", "i2": "<i2", "f4": "<f4", "f8": "<f8", "i2be": ">i2", "f8be": ">f8"}


def inner_codecs(kind: str, ndim: int, endian: str) -> list[dict]:
    b = {"name": "bytes", "configuration": {"endian": endian}}
    t = {"name": "transpose", "configuration": {"order": list(range(ndim))[::-1]}}
    table = {
        "none": [b],
        "gzip": [b, {"name": "gzip", "configuration": {"level": 5}}],
        "zstd": [b, {"name": "zstd", "configuration": {"level": 3, "checksum": True}}],
        "blosc": [
            b,
            {
                "name": "blosc",
                "configuration": {"cname": "lz4", "clevel": 5, "shuffle": "shuffle", "typesize": 4, "blocksize": 0},
            },
        ],
        "transpose": [t, b],
        "crc32c": [b, {"name": "crc32c"}],
        "all": [
            t,
            b,
            {
                "name": "blosc",
                "configuration": {"cname": "zstd", "clevel": 3, "shuffle": "bitshuffle", "typesize": 2, "blocksize": 0},
            },
            {"name": "crc32c"},
        ],
    }
    return table[kind]


def index_codecs(crc: bool, endian: str = "little") -> list[dict]:
    out = [{"name": "bytes", "configuration": {"endian": endian}}]
    return out + [{"name": "crc32c"}] if crc else out


def _endian(dtype: str) -> str:
    return "big" if dtype.startswith(">") else "little"


def _fill(dtype: str) -> float:
    return 7 if np.dtype(dtype).kind in "iu" else -1.5


CASES = []
for i, inner in enumerate(["none", "gzip", "zstd", "blosc", "transpose", "crc32c", "all"]):
    for j, (location, crc) in enumerate([("end", True), ("end", False), ("start", True), ("start", False)]):
        geom = list(GEOMETRIES)[(i + j) % 3]
        key = list(DTYPES)[(i + 2 * j) % len(DTYPES)]
        CASES.append(
            pytest.param(
                geom,
                DTYPES[key],
                inner,
                location,
                crc,
                id=f"{geom}-{key}-{inner}-{location}-{'crc' if crc else 'nocrc'}",
            )
        )
for geom in GEOMETRIES:
    for key, dtype in DTYPES.items():
        CASES.append(pytest.param(geom, dtype, "gzip", "end", True, id=f"{geom}-{key}-dtypes"))


def make_codec(geom: str, dtype: str, inner: str, location: str, crc: bool) -> ShardingCodec:
    _, _, chunk = GEOMETRIES[geom]
    return ShardingCodec(chunk, inner_codecs(inner, len(chunk), _endian(dtype)), index_codecs(crc), location)


@pytest.mark.parametrize("geom,dtype,inner,location,crc", CASES)
def test_shardkv_shards_read_by_zarr3_and_tensorstore(tmp_path: Path, geom, dtype, inner, location, crc) -> None:
    shape, shard_shape, _ = GEOMETRIES[geom]
    codec = make_codec(geom, dtype, inner, location, crc)
    data = sample(shape, np.dtype(dtype), _fill(dtype))
    write_with_shardkv(tmp_path / "a", data, shard_shape, _fill(dtype), codec)
    stored = shard_files(tmp_path / "a", len(shape))
    assert 0 < len(stored)
    np.testing.assert_array_equal(read_zarr3(tmp_path / "a"), data)
    np.testing.assert_array_equal(read_tensorstore(tmp_path / "a"), data)


def _check_shards_decode(root: Path, data: np.ndarray, fill) -> int:
    meta = json.loads((root / "zarr.json").read_text())
    codec = ShardingCodec.from_config(meta["codecs"][0])
    assert codec.get_config() == meta["codecs"][0] or meta["codecs"][0]["configuration"].get("index_location") is None
    shard_shape = tuple(meta["chunk_grid"]["configuration"]["chunk_shape"])
    stored = shard_files(root, data.ndim)
    for coords, blob in stored.items():
        got = codec.decode(blob, shard_shape, data.dtype, fill, f"c/{coords}")
        np.testing.assert_array_equal(got, padded_shard(data, coords, shard_shape, fill), err_msg=f"shard {coords}")
    return len(stored)


@pytest.mark.parametrize("geom,dtype,inner,location,crc", CASES)
def test_zarr3_shards_decode_in_shardkv(tmp_path: Path, geom, dtype, inner, location, crc) -> None:
    shape, shard_shape, _ = GEOMETRIES[geom]
    codec = make_codec(geom, dtype, inner, location, crc)
    fill = _fill(dtype)
    data = sample(shape, np.dtype(dtype), fill, seed=1)
    root = tmp_path / "z"
    root.mkdir()
    (root / "zarr.json").write_text(json.dumps(array_metadata(shape, shard_shape, np.dtype(dtype), fill, codec)))
    arr = zarr.open_array(str(root), mode="r+")
    arr[...] = data
    assert _check_shards_decode(root, data, fill) > 0


@pytest.mark.parametrize("geom,dtype,inner,location,crc", CASES)
def test_tensorstore_shards_decode_in_shardkv(tmp_path: Path, geom, dtype, inner, location, crc) -> None:
    shape, shard_shape, _ = GEOMETRIES[geom]
    codec = make_codec(geom, dtype, inner, location, crc)
    fill = _fill(dtype)
    data = sample(shape, np.dtype(dtype), fill, seed=2)
    meta = array_metadata(shape, shard_shape, np.dtype(dtype), fill, codec)
    del meta["zarr_format"], meta["node_type"], meta["attributes"]
    root = tmp_path / "t"
    arr = ts.open(
        {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(root)}, "metadata": meta}, create=True
    ).result()
    arr.write(data.astype(data.dtype.newbyteorder("="))).result()
    assert _check_shards_decode(root, data, fill) > 0


def test_partially_written_shards(tmp_path: Path) -> None:
    """Peers write a few inner chunks of a few shards; shardkv decodes the rest as the fill value."""
    shape, shard_shape, chunk = (20, 20), (8, 8), (2, 4)
    codec = ShardingCodec(
        chunk,
        [
            {"name": "bytes", "configuration": {"endian": "little"}},
            {"name": "zstd", "configuration": {"level": 1, "checksum": False}},
        ],
    )
    expected = np.full(shape, 9, dtype="<i4")
    for writer in ("zarr", "tensorstore"):
        root = tmp_path / writer
        meta = array_metadata(shape, shard_shape, np.dtype("<i4"), 9, codec)
        if writer == "zarr":
            root.mkdir()
            (root / "zarr.json").write_text(json.dumps(meta))
            arr = zarr.open_array(str(root), mode="r+")
            arr[1:3, 5:7] = 1
            arr[17:, 17:] = 2
        else:
            del meta["zarr_format"], meta["node_type"], meta["attributes"]
            arr = ts.open(
                {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(root)}, "metadata": meta}, create=True
            ).result()
            arr[1:3, 5:7].write(np.ones((2, 2), "i4")).result()
            arr[17:, 17:].write(np.full((3, 3), 2, "i4")).result()
        expected[1:3, 5:7] = 1
        expected[17:, 17:] = 2
        stored = shard_files(root, 2)
        assert sorted(stored) == [(0, 0), (2, 2)]
        for coords, blob in stored.items():
            index = codec.layout(shard_shape).index_of_shard(blob, str(coords))
            # only the touched inner chunks (2 x 4 elements) are stored: rows 1-2 x cols 5-6 touch
            # local (0, 1) and (1, 1); rows 17-19 x cols 17-19 touch local (0, 0) and (1, 0)
            want = {(0, 1), (1, 1)} if coords == (0, 0) else {(0, 0), (1, 0)}
            assert set(index.present()) == want
        assert _check_shards_decode(root, expected, 9) == 2


@pytest.mark.parametrize("location", ["end", "start"])
def test_nested_sharding(tmp_path: Path, location: str) -> None:
    shape, shard_shape = (30, 20), (16, 16)
    inner = ShardingCodec(
        (4, 4),
        [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "gzip", "configuration": {"level": 1}}],
        index_location="start",
    )
    codec = ShardingCodec((8, 8), [inner], index_location=location)
    data = sample(shape, np.dtype("<f4"), 0.0, seed=3)
    write_with_shardkv(tmp_path / "a", data, shard_shape, 0.0, codec)
    np.testing.assert_array_equal(read_zarr3(tmp_path / "a"), data)
    np.testing.assert_array_equal(read_tensorstore(tmp_path / "a"), data)
    root = tmp_path / "z"
    root.mkdir()
    (root / "zarr.json").write_text(json.dumps(array_metadata(shape, shard_shape, np.dtype("<f4"), 0.0, codec)))
    zarr.open_array(str(root), mode="r+")[...] = data
    assert _check_shards_decode(root, data, 0.0) > 0


def test_zarr3_create_array_api_shards_decode(tmp_path: Path) -> None:
    """Arrays made the ordinary zarr-python 3 way (create_array with shards=) decode in shardkv."""
    data = sample((37, 21), np.dtype("<i2"), 3, seed=4)
    arr = zarr.create_array(
        str(tmp_path / "a"),
        shape=data.shape,
        chunks=(5, 7),
        shards=(10, 21),
        dtype="int16",
        fill_value=3,
        compressors=[zarr.codecs.BloscCodec(cname="zstd", clevel=2, shuffle="bitshuffle")],
    )
    arr[...] = data
    assert _check_shards_decode(tmp_path / "a", data, 3) > 0
