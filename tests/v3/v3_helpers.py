"""Helpers for the zarr-python 3 / tensorstore interop tests: write and read v3 arrays on disk."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from shardkv import ShardingCodec

V3_NAMES = {
    "b1": "bool", "i1": "int8", "i2": "int16", "i4": "int32", "i8": "int64",
    "u1": "uint8", "u2": "uint16", "u4": "uint32", "u8": "uint64",
    "f2": "float16", "f4": "float32", "f8": "float64",
}  # a table: its rows read better aligned # fmt: skip


def v3_data_type(dtype: np.dtype) -> str:
    dtype = np.dtype(dtype)
    return V3_NAMES[f"{dtype.kind}{dtype.itemsize}"]


def json_fill(fill: Any, dtype: np.dtype) -> Any:
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        if math.isnan(fill):
            return "NaN"
        if math.isinf(fill):
            return "Infinity" if fill > 0 else "-Infinity"
        return float(fill)
    if dtype.kind == "b":
        return bool(fill)
    return int(fill)


def array_metadata(
    shape: tuple[int, ...], shard_shape: tuple[int, ...], dtype: np.dtype, fill: Any, codec: ShardingCodec
) -> dict[str, Any]:
    """A v3 zarr.json whose only codec is ``codec``, default chunk key encoding."""
    return {
        "zarr_format": 3,
        "node_type": "array",
        "shape": list(shape),
        "data_type": v3_data_type(dtype),
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(shard_shape)}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": json_fill(fill, dtype),
        "codecs": [codec.get_config()],
        "attributes": {},
    }


def shard_grid(shape: tuple[int, ...], shard_shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    return list(itertools.product(*(range(-(-s // c)) for s, c in zip(shape, shard_shape, strict=True))))


def padded_shard(data: np.ndarray, coords: tuple[int, ...], shard_shape: tuple[int, ...], fill: Any) -> np.ndarray:
    """The shard at ``coords`` of ``data``, padded to the full shard shape with ``fill``."""
    out = np.full(shard_shape, fill, dtype=data.dtype)
    region = tuple(slice(c * s, min((c + 1) * s, n)) for c, s, n in zip(coords, shard_shape, data.shape, strict=True))
    part = data[region]
    out[tuple(slice(0, n) for n in part.shape)] = part
    return out


def write_with_shardkv(
    root: Path,
    data: np.ndarray,
    shard_shape: tuple[int, ...],
    fill: Any,
    codec: ShardingCodec,
    skip_all_fill: bool = True,
) -> dict[str, Any]:
    """Write a v3 array with ShardingCodec alone (no zarr): zarr.json + one file per shard."""
    root.mkdir(parents=True, exist_ok=True)
    meta = array_metadata(data.shape, shard_shape, data.dtype, fill, codec)
    (root / "zarr.json").write_text(json.dumps(meta))
    fill_bytes = np.full(1, fill, dtype=data.dtype).tobytes()
    for coords in shard_grid(data.shape, shard_shape):
        shard = padded_shard(data, coords, shard_shape, fill)
        if skip_all_fill and shard.tobytes() == fill_bytes * shard.size:
            continue
        path = root.joinpath("c", *map(str, coords))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(codec.encode(shard, fill))
    return meta


def shard_files(root: Path, ndim: int) -> dict[tuple[int, ...], bytes]:
    """Stored shards of a v3 array with default '/' keys, by shard coords."""
    out = {}
    for path in (root / "c").rglob("*"):
        if path.is_file():
            rel = path.relative_to(root / "c").parts
            if len(rel) == ndim:
                out[tuple(int(p) for p in rel)] = path.read_bytes()
    return out


def read_zarr3(root: Path) -> np.ndarray:
    import zarr

    return zarr.open_array(str(root), mode="r")[...]


def read_tensorstore(root: Path) -> np.ndarray:
    import tensorstore as ts

    arr = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": str(root)}}, open=True).result()
    return arr.read().result()


def sample(shape: tuple[int, ...], dtype: np.dtype, fill: Any, seed: int = 0) -> np.ndarray:
    """Data with fill-valued holes (so some inner chunks and shards stay empty)."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        data = rng.standard_normal(shape).astype(dtype)
    elif dtype.kind == "b":
        data = rng.integers(0, 2, shape).astype(bool)
    else:
        info = np.iinfo(dtype)
        data = rng.integers(max(info.min, -1000), min(info.max, 1000), shape, endpoint=True).astype(dtype)
    # a fill-valued block at the origin (whole inner chunks, maybe a whole shard)
    data[tuple(slice(0, max(1, n // 2)) for n in shape)] = fill
    return data
