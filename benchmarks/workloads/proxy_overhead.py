"""P5: cost of the proxy: zarr 2.18 on ShardedStore(dict) vs zarr 2.18 on a plain dict.

Same array (P1's shape, chunks and compressor) in both cases; the sharded one
packs 8 x 8 inner chunks per shard (``ShardedStore(dict,
chunks_per_shard=8)``, default options), the plain one stores one key per
chunk. Per repetition and store: time ``z[...] = data`` on a new array, then
``z[...]`` through a newly opened array (a new ``ShardedStore`` over the same
dict for the sharded case), and check the data. The two cases alternate which
goes first. One untimed warm-up round on a small array comes first.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from _common import CHUNKS_PER_SHARD, SIZES, emit, make_data, parse_args, zarr2_array


def _round(data: np.ndarray, sharded: bool) -> tuple[float, float]:
    import zarr

    from shardkv import ShardedStore

    base: dict[str, Any] = {}
    store: Any = ShardedStore(base, chunks_per_shard=CHUNKS_PER_SHARD) if sharded else base
    z = zarr2_array(store, data.shape)
    t0 = time.perf_counter()
    z[...] = data
    write_s = time.perf_counter() - t0
    store = ShardedStore(base) if sharded else base
    z = zarr.open_array(store=store, path="arr", mode="r")
    t0 = time.perf_counter()
    out = z[...]
    read_s = time.perf_counter() - t0
    if not np.array_equal(out, data):
        raise RuntimeError(f"the array read back differs from the array written (sharded={sharded})")
    return write_s, read_s


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], ("shardkv",))
    shape = SIZES[args.size]["p1_shape"]
    data = make_data(shape, args.seed)
    warm = make_data(SIZES["tiny"]["p1_shape"], args.seed)
    _round(warm, True)
    _round(warm, False)
    samples: dict[str, list[float]] = {"sharded_write_s": [], "sharded_read_s": [], "plain_write_s": [], "plain_read_s": []}
    for rep in range(args.repeat):
        for sharded in ((False, True) if rep % 2 == 0 else (True, False)):
            write_s, read_s = _round(data, sharded)
            name = "sharded" if sharded else "plain"
            samples[f"{name}_write_s"].append(write_s)
            samples[f"{name}_read_s"].append(read_s)
    emit(args, "proxy_overhead", {"shape": shape, "array_bytes": data.nbytes, "samples": samples})


if __name__ == "__main__":
    main()
