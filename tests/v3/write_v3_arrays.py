"""Write sharded Zarr v3 arrays with zarr-python 3 and tensorstore, and what they hold as .npy.

Run with the zarr3 environment's python by tests/test_v3_reverse.py (zarr2 environment):

    python tests/v3/write_v3_arrays.py OUT_DIR

OUT_DIR/store is a v3 hierarchy (root group zarr.json); OUT_DIR/expected/<name>.npy holds the
values each writer was given; OUT_DIR/manifest.json lists every array with its writer and
whether it has a v2 equivalent (``translatable``). Not collected by pytest (no test_ prefix).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import tensorstore as ts
import zarr
import zarr.codecs as zc

LE = {"name": "bytes", "configuration": {"endian": "little"}}
BE = {"name": "bytes", "configuration": {"endian": "big"}}
CRC = {"name": "crc32c"}


def sharding(chunk, codecs, index_location="end", crc=True, index_endian="little") -> dict[str, Any]:
    index = [{"name": "bytes", "configuration": {"endian": index_endian}}] + ([CRC] if crc else [])
    return {
        "name": "sharding_indexed",
        "configuration": {
            "chunk_shape": list(chunk),
            "codecs": codecs,
            "index_codecs": index,
            "index_location": index_location,
        },
    }


def meta(shape, shard, data_type, fill, codecs, **extra) -> dict[str, Any]:
    doc = {
        "zarr_format": 3,
        "node_type": "array",
        "shape": list(shape),
        "data_type": data_type,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(shard)}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": fill,
        "codecs": codecs,
        "attributes": {"writer": "test"},
    }
    doc.update(extra)
    return doc


def values(shape, dtype, fill, seed) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        data = rng.integers(0, 2, shape).astype(bool)
    elif dtype.kind == "f":
        data = rng.standard_normal(shape).astype(dtype)
    else:
        data = rng.integers(0, 200, shape).astype(dtype)
    data[tuple(slice(0, max(1, n // 3)) for n in shape)] = fill  # empty inner chunks and shards
    return data


T2 = {"name": "transpose", "configuration": {"order": [1, 0]}}
T3 = {"name": "transpose", "configuration": {"order": [2, 1, 0]}}
GZ = {"name": "gzip", "configuration": {"level": 4}}
ZS = {"name": "zstd", "configuration": {"level": 2, "checksum": False}}
BL = {
    "name": "blosc",
    "configuration": {"cname": "lz4", "clevel": 5, "shuffle": "shuffle", "typesize": 4, "blocksize": 0},
}
BLB = {
    "name": "blosc",
    "configuration": {"cname": "zstd", "clevel": 3, "shuffle": "bitshuffle", "typesize": 2, "blocksize": 0},
}

# name: (writer, metadata, numpy dtype of the values, fill for the values, translatable)
CASES: dict[str, tuple[str, dict[str, Any], str, Any, bool]] = {
    "z_i2_gzip": ("zarr", meta((10, 13), (4, 6), "int16", 7, [sharding((2, 3), [LE, GZ])]), "<i2", 7, True),
    "z_f8be_zstd": ("zarr", meta((9, 7), (6, 4), "float64", "NaN", [sharding((3, 2), [BE, ZS])]), "<f8", np.nan, True),
    "z_u1_3d_blosc": (
        "zarr",
        meta((5, 6, 7), (4, 4, 4), "uint8", 0, [sharding((2, 2, 2), [{"name": "bytes"}, BLB])]),
        "u1",
        0,
        True,
    ),
    "z_f4_F_crc_start": (
        "zarr",
        meta((11, 8), (8, 8), "float32", -1.5, [sharding((4, 2), [T2, LE, CRC], "start")]),
        "<f4",
        -1.5,
        True,
    ),
    "z_i8_1d_raw_nocrc": ("zarr", meta((50,), (16,), "int64", -1, [sharding((4,), [LE], crc=False)]), "<i8", -1, True),
    "z_bool_gzip_crc": (
        "zarr",
        meta((9, 9), (6, 6), "bool", False, [sharding((3, 3), [{"name": "bytes"}, GZ, CRC])]),
        "b1",
        False,
        True,
    ),
    "z_zlib_dims": (
        "zarr",
        meta(
            (7, 5),
            (4, 4),
            "uint16",
            3,
            [sharding((2, 2), [LE, {"name": "numcodecs.zlib", "configuration": {"level": 1}}])],
            dimension_names=["y", "x"],
        ),
        "<u2",
        3,
        True,
    ),
    "z_f4_3d_F_blosc_be_index": (
        "zarr",
        meta((6, 5, 4), (4, 4, 4), "float32", 0.0, [sharding((2, 2, 2), [T3, BE, BL], index_endian="big")]),
        "<f4",
        0.0,
        True,
    ),
    "t_i4_blosc": ("tensorstore", meta((20, 17), (8, 8), "int32", 5, [sharding((4, 4), [LE, BL])]), "<i4", 5, True),
    "t_f4_F_gzip": (
        "tensorstore",
        meta((13, 9), (8, 6), "float32", "NaN", [sharding((4, 3), [T2, LE, GZ], "start")]),
        "<f4",
        np.nan,
        True,
    ),
    "t_u2_zstd_be": (
        "tensorstore",
        meta((33,), (12,), "uint16", 0, [sharding((3,), [BE, ZS], crc=False)]),
        "<u2",
        0,
        True,
    ),
    "t_f8_3d_crc": (
        "tensorstore",
        meta((5, 4, 9), (4, 4, 6), "float64", "-Infinity", [sharding((2, 2, 3), [LE, CRC])]),
        "<f8",
        -np.inf,
        True,
    ),
    # no v2 equivalent: not presented to zarr-python 2
    "z_nested": (
        "zarr",
        meta((16, 16), (8, 8), "int16", 0, [sharding((4, 4), [sharding((2, 2), [LE])])]),
        "<i2",
        0,
        False,
    ),
    "z_odd_transpose": (
        "zarr",
        meta(
            (4, 6, 8),
            (4, 6, 8),
            "uint8",
            0,
            [sharding((2, 3, 4), [{"name": "transpose", "configuration": {"order": [1, 0, 2]}}, {"name": "bytes"}])],
        ),
        "u1",
        0,
        False,
    ),
    "z_unsharded": ("zarr", meta((10,), (5,), "int32", 0, [LE]), "<i4", 0, False),
}


def main(out: Path) -> None:
    store = out / "store"
    (out / "expected").mkdir(parents=True, exist_ok=True)
    zarr.open_group(str(store), mode="w", zarr_format=3, attributes={"made_by": "write_v3_arrays"})
    manifest = {}
    for i, (name, (writer, doc, dtype, fill, translatable)) in enumerate(CASES.items()):
        data = values(doc["shape"], dtype, fill, seed=i)
        root = store / name
        if writer == "zarr":
            root.mkdir(parents=True)
            (root / "zarr.json").write_text(json.dumps(doc))
            zarr.open_array(str(root), mode="r+")[...] = data
        else:
            spec_meta = {k: v for k, v in doc.items() if k not in ("zarr_format", "node_type")}
            arr = ts.open(
                {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(root)}, "metadata": spec_meta},
                create=True,
            ).result()
            arr.write(data).result()
        np.save(out / "expected" / f"{name}.npy", data)
        manifest[name] = {"writer": writer, "translatable": translatable}
    # one array made the ordinary zarr-python 3 way
    data = values((30, 20), "<i2", 9, seed=99)
    arr = zarr.create_array(
        str(store / "z_create_array"),
        shape=data.shape,
        chunks=(5, 5),
        shards=(10, 10),
        dtype="int16",
        fill_value=9,
        compressors=[zc.BloscCodec(cname="zstd", clevel=1, shuffle="shuffle")],
    )
    arr[...] = data
    np.save(out / "expected" / "z_create_array.npy", data)
    manifest["z_create_array"] = {"writer": "zarr", "translatable": True}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
