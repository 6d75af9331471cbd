"""P3: base-store requests per random single-chunk read, cold and warm.

The array (P1's shape and layout) is written once to a local directory. Each
repetition draws distinct random inner chunks (seeded), opens the array
through a new store object and reads each chunk with one
``z[i:i+64, j:j+64]`` (cold pass), then reads the same chunks again through
the same objects (warm pass). Requests are counted below the sharding layer
from the moment the array is open, so the cold pass includes any metadata the
store reads lazily.

``--impl shardkv`` (zarr-python 2.18 environment): zarr 2.18 on
``ShardedStore(<counting adapter over the local directory>)`` with its default
options; a request is one key or one byte range asked of the base store
adapter. ``--impl zarr3`` (zarr-python 3 environment): zarr 3's sharding codec
on a ``zarr.storage.WrapperStore`` subclass over ``LocalStore`` that counts
``get`` (one request each, ranged or not), ``get_partial_values`` (one per
range) and ``exists`` calls.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
from _common import (
    CHUNKS,
    CHUNKS_PER_SHARD,
    SIZES,
    TempDir,
    emit,
    make_data,
    parse_args,
    zarr2_array,
    zarr3_array,
)


class _Shardkv:
    def write(self, root: str, data: np.ndarray) -> None:

        from shardkv import ShardedStore

        store = ShardedStore(root, chunks_per_shard=CHUNKS_PER_SHARD)
        z = zarr2_array(store, data.shape)
        z[...] = data
        store.close()

    def open(self, root: str) -> tuple[Any, dict[str, Any]]:
        import zarr

        from shardkv import ShardedStore

        store = ShardedStore(root)
        counter: dict[str, Any] = {"requests": 0, "calls": 0, "stats": 0, "uncounted": set()}
        kv = store.engine.kv  # every shard request goes through the engine's store
        get_many = kv.get_many

        def counting(reads: Any) -> Any:
            counter["requests"] += len(reads)
            counter["calls"] += 1
            return get_many(reads)

        kv.get_many = counting  # type: ignore[method-assign]
        return zarr.open_array(store=store, path="arr", mode="r"), counter


class _Zarr3:
    def write(self, root: str, data: np.ndarray) -> None:
        z = zarr3_array(root, data.shape)
        z[...] = data

    def open(self, root: str) -> tuple[Any, dict[str, Any]]:
        import zarr
        from zarr.storage import LocalStore, WrapperStore

        counter: dict[str, Any] = {"requests": 0, "calls": 0, "stats": 0, "uncounted": set()}

        class CountingStore(WrapperStore):
            async def get(self, key: str, prototype: Any = None, byte_range: Any = None) -> Any:
                counter["requests"] += 1
                counter["calls"] += 1
                return await self._store.get(key, prototype, byte_range)

            async def get_partial_values(self, prototype: Any, key_ranges: Any) -> Any:
                key_ranges = list(key_ranges)
                counter["requests"] += len(key_ranges)
                counter["calls"] += 1
                return await self._store.get_partial_values(prototype, key_ranges)

            async def exists(self, key: str) -> bool:
                counter["requests"] += 1
                counter["calls"] += 1
                return await self._store.exists(key)

        store = CountingStore(LocalStore(root, read_only=True))
        return zarr.open_array(store=store, path="arr", mode="r"), counter


def _reset(counter: dict[str, Any]) -> None:
    counter["requests"] = counter["calls"] = counter["stats"] = 0


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], ("shardkv", "zarr3"))
    shape = SIZES[args.size]["p1_shape"]
    data = make_data(shape, args.seed)
    impl = _Shardkv() if args.impl == "shardkv" else _Zarr3()
    grid = (shape[0] // CHUNKS[0], shape[1] // CHUNKS[1])
    n_reads = min(SIZES[args.size]["p3_reads"], grid[0] * grid[1])
    samples: dict[str, list[Any]] = {
        "cold_requests_per_chunk": [],
        "warm_requests_per_chunk": [],
        "cold_s_per_chunk": [],
        "warm_s_per_chunk": [],
    }
    uncounted: set[str] = set()
    stats = 0
    with TempDir() as tmp:
        root = os.path.join(tmp, "data.zarr")
        impl.write(root, data)
        for rep in range(args.repeat):
            rng = np.random.default_rng(args.seed + 1 + rep)
            picks = rng.choice(grid[0] * grid[1], size=n_reads, replace=False)
            sels = [
                (slice(i * CHUNKS[0], (i + 1) * CHUNKS[0]), slice(j * CHUNKS[1], (j + 1) * CHUNKS[1]))
                for i, j in (divmod(int(p), grid[1]) for p in picks)
            ]
            z, counter = impl.open(root)
            for name in ("cold", "warm"):
                _reset(counter)
                t0 = time.perf_counter()
                blocks = [z[sel] for sel in sels]
                elapsed = time.perf_counter() - t0
                samples[f"{name}_requests_per_chunk"].append(counter["requests"] / n_reads)
                samples[f"{name}_s_per_chunk"].append(elapsed / n_reads)
                stats += counter["stats"]
                uncounted |= counter["uncounted"]
                for sel, block in zip(sels, blocks, strict=True):
                    if not np.array_equal(block, data[sel]):
                        raise RuntimeError(f"chunk {sel} read back differs from the data written")
    emit(
        args,
        "random_reads",
        {
            "shape": shape,
            "reads_per_pass": n_reads,
            "samples": samples,
            "uncounted_methods": uncounted,
            "stat_calls": stats,
        },
    )


if __name__ == "__main__":
    main()
