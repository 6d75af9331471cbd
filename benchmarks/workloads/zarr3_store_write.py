"""Bytes written by a whole write: zarr 3 ``z[...] = data`` through ``shardkv.zarr3.ShardedStore(<dir>)``.

The zarr 3 environment. A 3-D uint16 array of 64³ inner chunks, 4 x 4 x 4
chunks per shard (256³ shards), zstd level 0, written whole by zarr 3 through
the store in a local directory with its default options (no ``buffer_bytes``:
every call is stored before it returns). Sizes (smoke / tiny / small / full):
128³ / 256³ / 512³ / 512³ (full: 8 shards, 256 MiB, the issue's row).

Per repetition, in a fresh temporary directory: create the array (not timed),
time ``z[...] = data`` (``write_s``), count the bytes this process handed to
``write(2)`` meanwhile (``written_bytes``: ``wchar`` of ``/proc/self/io``;
shards, their temporary files, metadata), the shards the engine put
(``shard_puts``, counted at its store's ``put_many``), its write rounds
(``write_attempts``: one batched read-modify-write each) and the chunk writes
that waited for a running commit of their shard and went into its next one
(``writes_queued``; 0 before group commit), then read it back through a new
store and check it (not timed). One untimed
warm-up round on the smoke array comes first.

Data: seeded, smooth plus noise (0..4095), so zstd stores about a quarter of it.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
from _common import TempDir, dir_bytes, emit, parse_args

SHAPES = {"smoke": (128, 128, 128), "tiny": (256, 256, 256), "small": (512, 512, 512), "full": (512, 512, 512)}
CHUNKS = (64, 64, 64)
CHUNKS_PER_SHARD = 4


def _data(shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    grid = np.indices(shape, dtype=np.uint16).sum(axis=0, dtype=np.uint16)
    return ((grid * 5) % 4096 + rng.integers(0, 16, shape, dtype=np.uint16)).astype(np.uint16)


def _wchar() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("wchar:"))


def _run(root: str, data: np.ndarray) -> dict[str, Any]:
    import zarr
    from zarr.codecs import ZstdCodec

    from shardkv.zarr3 import ShardedStore

    store = ShardedStore(root, chunks_per_shard=CHUNKS_PER_SHARD)
    z = zarr.create_array(
        store,
        name="arr",
        shape=data.shape,
        chunks=CHUNKS,
        dtype=data.dtype,
        compressors=ZstdCodec(level=0),
        fill_value=0,
    )
    engine = store._engine.engine  # the store keeps its engine private; its counters and store are what we count
    stats, kv, puts = engine.stats, engine.kv, []
    put_many = kv.put_many

    def counting_put_many(writes: Any) -> Any:
        puts.extend(writes)
        return put_many(writes)

    kv.put_many = counting_put_many  # type: ignore[method-assign]
    attempts, queued, written = stats.write_attempts, getattr(stats, "writes_queued", 0), _wchar()
    t0 = time.perf_counter()
    z[...] = data
    write_s = time.perf_counter() - t0
    out = {
        "write_s": write_s,
        "written_bytes": _wchar() - written,
        "shard_puts": len(puts),
        "write_attempts": stats.write_attempts - attempts,
        "writes_queued": getattr(stats, "writes_queued", 0) - queued,
    }
    back = zarr.open_array(ShardedStore(root), path="arr", mode="r")[...]
    if not np.array_equal(back, data):
        raise RuntimeError("the array read back differs from the array written")
    out["stored_bytes"] = dir_bytes(root)
    return out


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], ("shardkv-zarr3",))
    shape = SHAPES[args.size]
    data = _data(shape, args.seed)
    with TempDir() as tmp:  # warm-up (lazy imports, codec set-up), not recorded
        _run(os.path.join(tmp, "warmup.zarr"), _data(SHAPES["smoke"], args.seed))
    samples: dict[str, list[Any]] = {}
    for _ in range(args.repeat):
        with TempDir() as tmp:
            for key, value in _run(os.path.join(tmp, "data.zarr"), data).items():
                samples.setdefault(key, []).append(value)
    emit(args, "zarr3_store_write", {"shape": shape, "array_bytes": data.nbytes, "samples": samples})


if __name__ == "__main__":
    main()
