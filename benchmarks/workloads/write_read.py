"""P1 and P4: write a whole 2-D array, then read it whole, on a local directory.

``--impl shardkv`` (zarr-python 2.18 environment): zarr 2.18 on
``ShardedStore(<dir>, chunks_per_shard=8)``. ``--impl zarr3`` (zarr-python 3
environment): zarr 3 with its own sharding codec of the same layout
(``create_array(chunks=(64, 64), shards=(512, 512))``).

Per repetition, in a fresh temporary directory: create the array (not timed),
time ``z[...] = data`` (``write_s``), open the array again through a new store
object (not timed), time ``z[...]`` (``read_s``), check the data read equals
the data written (not timed; a mismatch fails the workload). One untimed
warm-up round on a small array comes first. The read follows
the write, so the files are in the page cache for both implementations.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
from _common import (
    CHUNKS_PER_SHARD,
    SIZES,
    TempDir,
    dir_bytes,
    emit,
    make_data,
    parse_args,
    warmup_shape,
    zarr2_array,
    zarr3_array,
)


def _shardkv(root: str, data: np.ndarray) -> tuple[float, float]:
    import zarr

    from shardkv import ShardedStore

    z = zarr2_array(ShardedStore(root, chunks_per_shard=CHUNKS_PER_SHARD), data.shape)
    t0 = time.perf_counter()
    z[...] = data
    write_s = time.perf_counter() - t0
    z = zarr.open_array(store=ShardedStore(root), path="arr", mode="r")
    t0 = time.perf_counter()
    out = z[...]
    read_s = time.perf_counter() - t0
    _check(out, data)
    return write_s, read_s


def _zarr3(root: str, data: np.ndarray) -> tuple[float, float]:
    import zarr
    from zarr.storage import LocalStore

    z = zarr3_array(root, data.shape)
    t0 = time.perf_counter()
    z[...] = data
    write_s = time.perf_counter() - t0
    z = zarr.open_array(store=LocalStore(root, read_only=True), path="arr", mode="r")
    t0 = time.perf_counter()
    out = z[...]
    read_s = time.perf_counter() - t0
    _check(out, data)
    return write_s, read_s


def _check(out: np.ndarray, data: np.ndarray) -> None:
    if out.shape != data.shape or not np.array_equal(out, data):
        raise RuntimeError("the array read back differs from the array written")


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], ("shardkv", "zarr3"))
    shape = SIZES[args.size]["p1_shape"]
    data = make_data(shape, args.seed)
    run = _shardkv if args.impl == "shardkv" else _zarr3
    with TempDir() as tmp:  # warm-up (lazy imports, codec set-up), not recorded
        run(os.path.join(tmp, "warmup.zarr"), make_data(warmup_shape(args.size), args.seed))
    samples: dict[str, list[Any]] = {"write_s": [], "read_s": [], "stored_bytes": []}
    for _ in range(args.repeat):
        with TempDir() as tmp:
            root = os.path.join(tmp, "data.zarr")
            write_s, read_s = run(root, data)
            samples["write_s"].append(write_s)
            samples["read_s"].append(read_s)
            samples["stored_bytes"].append(dir_bytes(root))
    emit(args, "write_read", {"shape": shape, "array_bytes": data.nbytes, "samples": samples})


if __name__ == "__main__":
    main()
