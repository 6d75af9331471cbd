"""P6: peak memory of a write-back write, chunk-row by chunk-row (zarr-python 2.18 environment).

zarr 2.18 writes a 2-D float32 array (1 GiB at full size) onto
``ShardedStore(<local dir>, chunks_per_shard=8, buffer_bytes=B)`` one chunk
row (64 array rows) per call, then calls ``flush()``. The caller's row buffer
is allocated once and refilled with seeded noise for each row.

Measured once per process (the runner starts one process per repetition):
``peak_rss_bytes - baseline_rss_bytes``, where the peak is ``ru_maxrss`` at
the end and the baseline is the resident set size (``/proc/self/statm``) after
imports, array creation and allocating the caller's row buffer, just before
the first write. Goal: at most ``B`` + 2 uncompressed shards. Afterwards three
chunk rows are read back and compared with the data (not measured).
Reports ``unavailable`` when ``ShardedStore`` has no write-back mode.
"""

from __future__ import annotations

import os
import time

import numpy as np
from _common import (
    CHUNKS,
    CHUNKS_PER_SHARD,
    DTYPE,
    SHARD_SHAPE,
    SIZES,
    TempDir,
    emit,
    p6_buffer_bytes,
    parse_args,
    peak_rss_bytes,
    rss_now_bytes,
    shardkv_features,
    zarr2_array,
)


def _fill(block: np.ndarray, seed: int, row: int) -> None:
    np.random.default_rng((seed, row)).standard_normal(out=block, dtype=np.float32)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], ("shardkv",))
    import zarr

    from shardkv import ShardedStore

    shape = SIZES[args.size]["p6_shape"]
    buffer_bytes = p6_buffer_bytes(shape)
    shard_bytes = int(np.prod(SHARD_SHAPE)) * np.dtype(DTYPE).itemsize
    features = shardkv_features()
    result = {
        "shape": shape,
        "array_bytes": int(np.prod(shape)) * np.dtype(DTYPE).itemsize,
        "buffer_bytes": buffer_bytes,
        "shard_bytes": shard_bytes,
        "limit_bytes": buffer_bytes + 2 * shard_bytes,
        "shardkv_params": features["params"],
    }
    if not features["write_back"]:
        result["unavailable"] = "ShardedStore has no write-back mode (buffer_bytes + flush)"
        emit(args, "peak_memory", result)
        return
    samples: dict[str, list[float]] = {"peak_above_baseline_bytes": [], "write_s": []}
    with TempDir() as tmp:
        root = os.path.join(tmp, "data.zarr")
        store = ShardedStore(root, chunks_per_shard=CHUNKS_PER_SHARD, buffer_bytes=buffer_bytes)
        z = zarr2_array(store, shape)
        block = np.empty((CHUNKS[0], shape[1]), dtype=DTYPE)
        _fill(block, args.seed, 0)
        baseline = rss_now_bytes()
        t0 = time.perf_counter()
        for row in range(0, shape[0], CHUNKS[0]):
            _fill(block, args.seed, row)
            z[row : row + CHUNKS[0], :] = block
        store.flush()
        samples["write_s"].append(time.perf_counter() - t0)
        samples["peak_above_baseline_bytes"].append(peak_rss_bytes() - baseline)
        result["baseline_rss_bytes"] = baseline
        check = zarr.open_array(store=ShardedStore(root), path="arr", mode="r")
        for row in (0, (shape[0] // 2) // CHUNKS[0] * CHUNKS[0], shape[0] - CHUNKS[0]):
            _fill(block, args.seed, row)
            if not np.array_equal(check[row : row + CHUNKS[0], :], block):
                raise RuntimeError(f"chunk row at array row {row} read back differs from the data written")
    result["samples"] = samples
    emit(args, "peak_memory", result)


if __name__ == "__main__":
    main()
