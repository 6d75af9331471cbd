"""P8: warm random single-chunk reads through zarr 2.18, ShardedStore(dir) vs DirectoryStore(dir).

The same array (P1's chunks and compressor, 8 x 8 chunks per shard for the
sharded copy) is written to two local directories: through
``ShardedStore(path)`` and to a plain ``zarr.DirectoryStore`` (one file per
chunk, what a zarr 2 user has without sharding). Each repetition opens both
arrays once, reads a seeded set of distinct random chunks once to warm the
index cache and the page cache, then times the same reads again, one
``z[i:i+64, j:j+64]`` each; the two stores alternate which goes first. Wall
and CPU seconds per read are reported; the ratio sharded / plain is the
figure with the goal <= 1.0 (a proxy read costs no more than a plain one).
"""

from __future__ import annotations

import os
import resource
import time
from typing import Any

import numpy as np
from _common import CHUNKS, CHUNKS_PER_SHARD, SIZES, TempDir, emit, make_data, parse_args, zarr2_array


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _timed_reads(z: Any, corners: list[tuple[int, int]]) -> tuple[float, float]:
    for i, j in corners:  # warm: index cache, page cache
        z[i : i + CHUNKS[0], j : j + CHUNKS[1]]
    t0, c0 = time.perf_counter(), _cpu_s()
    for i, j in corners:
        z[i : i + CHUNKS[0], j : j + CHUNKS[1]]
    return (time.perf_counter() - t0) / len(corners), (_cpu_s() - c0) / len(corners)


def main() -> None:
    import zarr

    from shardkv import ShardedStore

    args = parse_args(__doc__.splitlines()[0], ("shardkv",))
    shape = SIZES[args.size]["p1_shape"]
    nreads = SIZES[args.size]["p3_reads"]
    data = make_data(shape, args.seed)
    grid = (shape[0] // CHUNKS[0], shape[1] // CHUNKS[1])
    samples: dict[str, list[float]] = {
        k: [] for k in ("sharded_s", "plain_s", "sharded_cpu_s", "plain_cpu_s", "ratio_wall", "ratio_cpu")
    }
    with TempDir() as tmp:
        sharded_root, plain_root = os.path.join(tmp, "sharded"), os.path.join(tmp, "plain")
        store = ShardedStore(sharded_root, chunks_per_shard=CHUNKS_PER_SHARD)
        zarr2_array(store, shape)[...] = data
        store.close()
        zarr2_array(zarr.DirectoryStore(plain_root), shape)[...] = data
        rng = np.random.default_rng(args.seed)
        for rep in range(args.repeat):
            picks = rng.choice(grid[0] * grid[1], size=min(nreads, grid[0] * grid[1]), replace=False)
            corners = [(int(p) // grid[1] * CHUNKS[0], int(p) % grid[1] * CHUNKS[1]) for p in picks]
            zs = zarr.open_array(store=ShardedStore(sharded_root), path="arr", mode="r")
            zp = zarr.open_array(store=zarr.DirectoryStore(plain_root), path="arr", mode="r")
            order = [("sharded", zs), ("plain", zp)]
            if rep % 2:
                order.reverse()
            got = {}
            for name, z in order:
                got[name] = _timed_reads(z, corners)
            samples["sharded_s"].append(got["sharded"][0])
            samples["plain_s"].append(got["plain"][0])
            samples["sharded_cpu_s"].append(got["sharded"][1])
            samples["plain_cpu_s"].append(got["plain"][1])
            samples["ratio_wall"].append(got["sharded"][0] / got["plain"][0])
            samples["ratio_cpu"].append(got["sharded"][1] / max(got["plain"][1], 1e-9))
    emit(args, "warm_reads_local", {"shape": shape, "reads": nreads, "samples": samples})


if __name__ == "__main__":
    main()
