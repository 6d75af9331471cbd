"""P5: cost of the proxy: zarr 2.18 on ShardedStore(dict) vs zarr 2.18 on a plain dict.

Same array (P1's shape, chunks and compressor) in both cases; the sharded one
packs 8 x 8 inner chunks per shard (``ShardedStore(dict,
chunks_per_shard=8)``, default options), the plain one stores one key per
chunk. Per repetition and store: time ``z[...] = data`` on a new array, then
``z[...]`` through a newly opened array (a new ``ShardedStore`` over the same
dict for the sharded case), and check the data. Wall and CPU seconds (all
threads, ``getrusage``) are both recorded: the table uses wall time, the CPU
samples are the steadier figure on a loaded machine. The two cases alternate
which goes first. One untimed warm-up round on a small array comes first.
"""

from __future__ import annotations

import resource
import time
from typing import Any

import numpy as np
from _common import CHUNKS_PER_SHARD, SIZES, emit, make_data, parse_args, warmup_shape, zarr2_array


def _cpu_s() -> float:
    """CPU seconds of this process so far, all threads (less disturbed by other load than wall time)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _round(data: np.ndarray, sharded: bool) -> dict[str, float]:
    import zarr

    from shardkv import ShardedStore

    base: dict[str, Any] = {}
    store: Any = ShardedStore(base, chunks_per_shard=CHUNKS_PER_SHARD) if sharded else base
    z = zarr2_array(store, data.shape)
    t0, c0 = time.perf_counter(), _cpu_s()
    z[...] = data
    write_s, write_cpu_s = time.perf_counter() - t0, _cpu_s() - c0
    store = ShardedStore(base) if sharded else base
    z = zarr.open_array(store=store, path="arr", mode="r")
    t0, c0 = time.perf_counter(), _cpu_s()
    out = z[...]
    read_s, read_cpu_s = time.perf_counter() - t0, _cpu_s() - c0
    if not np.array_equal(out, data):
        raise RuntimeError(f"the array read back differs from the array written (sharded={sharded})")
    return {"write_s": write_s, "read_s": read_s, "write_cpu_s": write_cpu_s, "read_cpu_s": read_cpu_s}


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], ("shardkv",))
    shape = SIZES[args.size]["p1_shape"]
    data = make_data(shape, args.seed)
    warm = make_data(warmup_shape(args.size), args.seed)
    _round(warm, True)
    _round(warm, False)
    samples: dict[str, list[float]] = {
        f"{name}_{what}": []
        for name in ("sharded", "plain")
        for what in ("write_s", "read_s", "write_cpu_s", "read_cpu_s")
    }
    for rep in range(args.repeat):
        for sharded in (False, True) if rep % 2 == 0 else (True, False):
            name = "sharded" if sharded else "plain"
            for what, value in _round(data, sharded).items():
                samples[f"{name}_{what}"].append(value)
    emit(args, "proxy_overhead", {"shape": shape, "array_bytes": data.nbytes, "samples": samples})


if __name__ == "__main__":
    main()
