"""P2: write amplification of chunk-by-chunk writes (zarr-python 2.18 environment).

The array is written one inner chunk per call (``z[i:i+64, j:j+64] = block``,
row-major order) onto a counting ``dict`` store; the measurement is the bytes
the base store received (every value stored, metadata included, from array
creation to the end) divided by the array's bytes.

``--impl``:

* ``shardkv``: zarr 2.18 on ``ShardedStore(counting dict, chunks_per_shard=8)``;
* ``shardkv-writeback``: the same with ``buffer_bytes`` = half the array's
  bytes, then ``flush()``; reports ``unavailable`` when ``ShardedStore`` has no
  write-back mode;
* ``zarr2-transformer``: zarr 2.18's own draft sharding storage transformer
  (``ZARR_V3_EXPERIMENTAL_API=1 ZARR_V3_SHARDING=1``,
  ``ShardingStorageTransformer("indexed", chunks_per_shard=(8, 8))`` on a
  ``KVStoreV3`` over the counting dict).

Every repetition checks that the array reads back equal to the data (through
a new store object over the same base dict).
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
from _common import (
    CHUNKS,
    CHUNKS_PER_SHARD,
    DTYPE,
    SIZES,
    CountingMapping,
    chunk_blocks,
    emit,
    make_data,
    numcodecs_blosc,
    parse_args,
    shardkv_features,
    zarr2_array,
)


def _shardkv(data: np.ndarray, buffer_bytes: int | None) -> tuple[CountingMapping, float]:
    import zarr

    from shardkv import ShardedStore

    base = CountingMapping()
    extra = {} if buffer_bytes is None else {"buffer_bytes": buffer_bytes}
    # the counting mapping lives in this process: say so (under "auto" only dicts are taken as such)
    store = ShardedStore(base, chunks_per_shard=CHUNKS_PER_SHARD, concurrency="process", **extra)
    z = zarr2_array(store, data.shape)
    t0 = time.perf_counter()
    for sel in chunk_blocks(data.shape):
        z[sel] = data[sel]
    if buffer_bytes is not None:
        store.flush()
    elapsed = time.perf_counter() - t0
    _check(zarr.open_array(store=ShardedStore(base.data), path="arr", mode="r")[...], data)
    return base, elapsed


def _transformer(data: np.ndarray) -> tuple[CountingMapping, float]:
    os.environ["ZARR_V3_EXPERIMENTAL_API"] = "1"
    os.environ["ZARR_V3_SHARDING"] = "1"
    import zarr
    from zarr._storage.v3 import KVStoreV3
    from zarr._storage.v3_storage_transformers import ShardingStorageTransformer

    base = CountingMapping()
    transformer = ShardingStorageTransformer("indexed", chunks_per_shard=(CHUNKS_PER_SHARD,) * 2)
    z = zarr.create(
        shape=data.shape,
        chunks=CHUNKS,
        dtype=DTYPE,
        compressor=numcodecs_blosc(),
        store=KVStoreV3(base),
        path="arr",
        zarr_version=3,
        storage_transformers=[transformer],
    )
    t0 = time.perf_counter()
    for sel in chunk_blocks(data.shape):
        z[sel] = data[sel]
    elapsed = time.perf_counter() - t0
    _check(zarr.open_array(store=KVStoreV3(base.data), path="arr", mode="r", zarr_version=3)[...], data)
    return base, elapsed


def _check(out: np.ndarray, data: np.ndarray) -> None:
    if out.shape != data.shape or not np.array_equal(out, data):
        raise RuntimeError("the array read back differs from the array written")


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], ("shardkv", "shardkv-writeback", "zarr2-transformer"))
    shape = SIZES[args.size]["p2_shape"]
    data = make_data(shape, args.seed)
    result: dict[str, Any] = {"shape": shape, "array_bytes": data.nbytes}
    buffer_bytes = None
    if args.impl.startswith("shardkv"):
        features = shardkv_features()
        result["shardkv_params"] = features["params"]
        if args.impl == "shardkv-writeback":
            if not features["write_back"]:
                result["unavailable"] = "ShardedStore has no write-back mode (buffer_bytes + flush)"
                emit(args, "chunkwise_write", result)
                return
            buffer_bytes = data.nbytes // 2
            result["buffer_bytes"] = buffer_bytes
    samples: dict[str, list[Any]] = {"bytes_written": [], "writes": [], "stored_bytes": [], "write_s": []}
    for _ in range(args.repeat):
        if args.impl == "zarr2-transformer":
            base, elapsed = _transformer(data)
        else:
            base, elapsed = _shardkv(data, buffer_bytes)
        samples["bytes_written"].append(base.bytes_written)
        samples["writes"].append(base.writes)
        samples["stored_bytes"].append(base.stored_bytes())
        samples["write_s"].append(elapsed)
    result["samples"] = samples
    emit(args, "chunkwise_write", result)


if __name__ == "__main__":
    main()
