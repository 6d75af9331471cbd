"""P7: writing a dask-backed array, and an xarray Dataset, through ShardedStore vs plain zarr 2 (zarr 2.18 env).

The same seeded array (``p7_shape`` float32, zarr chunks 64 x 64, 8 x 8
chunks per shard, blosc) is held as a dask array of 64 x 64 blocks (one
zarr chunk per task) and stored into a local directory. Time from the start
of the store to the end of ``flush``/``close``; array creation and the
LocalCluster start-up are outside it. Every repetition reads the array back
and compares.

``--impl``:

* ``shardkv``: ``da.store`` onto ``ShardedStore(dir)`` (write-through, the
  default), dask's threaded scheduler: each task rewrites its whole shard;
* ``shardkv-buffer``: the same with ``buffer_bytes`` = the array's bytes,
  threaded scheduler (one process), then ``close()``: each shard written once;
* ``zarr2-threads``: plain zarr 2 ``DirectoryStore``, threaded scheduler;
* ``shardkv-rechunk``: ``rechunk_to_shards`` first, then ``da.store`` on a
  LocalCluster of 2 worker processes (1 thread each; at size ``smoke``, one worker
  thread in this process): each task writes whole shards;
* ``zarr2-cluster``: plain zarr 2 ``DirectoryStore`` on the same cluster;
* ``xarray-shardkv`` / ``xarray-shardkv-buffer`` / ``xarray-zarr2``:
  ``Dataset.to_zarr`` of one variable backed by the same dask array
  (threaded scheduler), on ``ShardedStore`` (default), ``ShardedStore`` with
  ``buffer_bytes`` (closed afterwards), and a plain ``DirectoryStore``.

Reports ``unavailable`` when dask, distributed or xarray is not installed.
Each result carries the 1-minute load average before and after.
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
from _common import (
    CHUNKS,
    CHUNKS_PER_SHARD,
    TempDir,
    emit,
    make_data,
    numcodecs_blosc,
    parse_args,
    warmup_shape,
    zarr2_array,
)

IMPLS = (
    "shardkv",
    "shardkv-buffer",
    "zarr2-threads",
    "shardkv-rechunk",
    "zarr2-cluster",
    "xarray-shardkv",
    "xarray-shardkv-buffer",
    "xarray-zarr2",
)
P7_SHAPES = {"smoke": (256, 576), "tiny": (512, 512), "small": (1024, 1024), "full": (2048, 2048)}


def _store(impl: str, root: str, nbytes: int) -> Any:
    import zarr

    from shardkv import ShardedStore

    if "zarr2" in impl:
        return zarr.DirectoryStore(root)
    extra = {"buffer_bytes": nbytes} if impl.endswith("buffer") else {}
    return ShardedStore(root, chunks_per_shard=CHUNKS_PER_SHARD, **extra)


@contextlib.contextmanager
def _scheduler(impl: str, size: str) -> Iterator[None]:
    import dask

    if not impl.endswith(("rechunk", "cluster")):
        with dask.config.set(scheduler="threads"):
            yield
        return
    from distributed import Client, LocalCluster

    # size smoke (the test suite's check that the workload runs): one worker in this process, no process start-up
    workers, processes = (1, False) if size == "smoke" else (2, True)
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=processes, dashboard_address=None) as cluster:
        with Client(cluster):
            yield


def _write(impl: str, root: str, data: np.ndarray) -> float:
    import dask.array as da

    store = _store(impl, root, data.nbytes)
    darr = da.from_array(data, chunks=CHUNKS)
    if impl.startswith("xarray"):
        import xarray as xr

        ds = xr.Dataset({"arr": (("y", "x"), darr)})
        t0 = time.perf_counter()
        ds.to_zarr(store, mode="w", encoding={"arr": {"compressor": numcodecs_blosc()}})
    else:
        z = zarr2_array(store, data.shape)
        if impl == "shardkv-rechunk":
            from shardkv import rechunk_to_shards

            darr = rechunk_to_shards(darr, z)
        t0 = time.perf_counter()
        da.store(darr, z, lock=False)
    close = getattr(store, "close", None)
    if close is not None:
        close()
    return time.perf_counter() - t0


def _check(impl: str, root: str, data: np.ndarray) -> None:
    import zarr

    from shardkv import ShardedStore

    store = zarr.DirectoryStore(root) if "zarr2" in impl else ShardedStore(root)
    out = zarr.open_array(store=store, path="arr", mode="r")[...]
    if out.shape != data.shape or not np.array_equal(out, data):
        raise RuntimeError(f"{impl}: the array read back differs from the array written")


def _available(impl: str) -> str | None:
    needed = ["dask", "xarray" if impl.startswith("xarray") else "dask.array"]
    if impl.endswith(("rechunk", "cluster")):
        needed.append("distributed")
    for name in needed:
        try:
            __import__(name)
        except ImportError:
            return f"{name} not installed"
    return None


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], IMPLS)
    shape = P7_SHAPES[args.size]
    missing = _available(args.impl)
    if missing is not None:
        emit(args, "dask_writes", {"shape": shape, "unavailable": missing})
        return
    from shardkv import PartialShardWriteWarning

    warnings.simplefilter("ignore", PartialShardWriteWarning)  # the default mode is measured on purpose
    data = make_data(shape, args.seed)
    load_before = os.getloadavg()[0]
    samples: dict[str, list[Any]] = {"write_s": []}
    with _scheduler(args.impl, args.size):
        with TempDir() as tmp:  # warm-up (imports, worker start), not recorded
            _write(args.impl, os.path.join(tmp, "warmup.zarr"), make_data(warmup_shape(args.size), args.seed))
        for _ in range(args.repeat):
            with TempDir() as tmp:
                root = os.path.join(tmp, "data.zarr")
                samples["write_s"].append(_write(args.impl, root, data))
                _check(args.impl, root, data)
    result = {
        "shape": shape,
        "array_bytes": data.nbytes,
        "chunks_per_shard": CHUNKS_PER_SHARD,
        "samples": samples,
        "load_avg_1m": [load_before, os.getloadavg()[0]],
    }
    emit(args, "dask_writes", result)


if __name__ == "__main__":
    main()
