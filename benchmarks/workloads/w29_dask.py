"""Row W29-2: xarray ``to_zarr`` from a LocalCluster of worker processes, dask chunks 1/64 of a shard.

The zarr 3 environment (newest xarray, dask, distributed) for every
implementation, so that only the store differs. The workload of ``_w29.py``
(3-D uint16, 64³ chunks, 256³ shards, zstd 0) as one variable ``v`` of dims
``(t, y, x)``, written in three steps, each timed from the call of
``Dataset.to_zarr`` to its return:

1. ``write``: ``t`` in ``[0, T/2)``, ``mode="w"``;
2. ``append``: ``t`` in ``[T/2, T)``, ``append_dim="t"``;
3. ``region``: new data (version 1) for ``t`` in ``[T/2 - 64, T/2 + 64)``,
   ``region={"t": ...}``: 64-aligned, across a shard boundary at full size.

The data is made on the workers (``dask.array.map_blocks`` of
``_w29.values``), never shipped from this process. Cluster: 2 worker
processes of 1 thread (``LocalCluster(processes=True)``; at size ``smoke``
one worker thread in this process), started before and outside the timings,
with an untimed warm-up of the three steps on the smoke array.

``--impl``:

* ``shardkv``: ``shardkv.zarr3.ShardedStore(dir, chunks_per_shard=4)`` (default
  options plus ``--shardkv-option``), dask chunks 64³ (the inner chunks);
* ``shardkv-shards``: the same store, dask chunks cut at the shard boundaries
  (one task per shard, or per part of a shard the step writes);
* ``native-align``: zarr 3's own shards (``encoding`` ``shards``, ``LocalStore``),
  dask chunks 64³, ``align_chunks=True`` (xarray rechunks to the shards);
* ``native-unsafe``: the same with ``safe_chunks=False`` and no rechunking:
  writers of one shard race, and chunks are lost.

After each step (not timed) the step's box is read back with zarr and
compared, inner chunk by inner chunk, with what it wrote: ``lost_chunks`` sums
the chunks that differ over the three steps (``chunks_written`` of them), and
``{step}_s`` / ``total_s`` are the times. A shardkv run given an option the
installed shardkv does not know reports ``unavailable: option unknown``.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
from _common import TempDir, emit, parse_args
from _w29 import (
    CHUNKS,
    DTYPE,
    SHAPES,
    SHARD_SHAPE,
    ZSTD_LEVEL,
    Box,
    box_elements,
    chunks_differing,
    peer_versions,
    selection,
    shardkv_store,
    unavailable,
    values,
)

IMPLS = ("shardkv", "shardkv-shards", "native-align", "native-unsafe")
STEPS = ("write", "append", "region")
NAME = "v"


def steps(shape: tuple[int, ...]) -> list[tuple[str, Box, int]]:
    """The three steps: (name, box written, data version)."""
    half = shape[0] // 2
    rest = tuple(shape[1:])
    return [
        ("write", ((0, 0, 0), (half, *rest)), 0),
        ("append", ((half, 0, 0), (shape[0], *rest)), 0),
        ("region", ((half - CHUNKS[0], 0, 0), (half + CHUNKS[0], *rest)), 1),
    ]


def _block(seed: int, version: int, offset: tuple[int, ...], block_info: Any = None) -> np.ndarray:
    """One dask block: the data of its box, ``offset`` being where the step's box starts in the array."""
    location = block_info[None]["array-location"]
    start = tuple(a + o for (a, _), o in zip(location, offset, strict=True))
    stop = tuple(b + o for (_, b), o in zip(location, offset, strict=True))
    return values(start, stop, seed, version)


def _dask_chunks(impl: str, box: Box) -> tuple[tuple[int, ...], ...]:
    """The dask chunks of a step's box: 64³, or cut at the shard boundaries for ``shardkv-shards``."""
    out = []
    for a, b, c, s in zip(*box, CHUNKS, SHARD_SHAPE, strict=True):
        step = s if impl == "shardkv-shards" else c
        cuts = [a, *range((a // step + 1) * step, b, step), b]
        out.append(tuple(y - x for x, y in zip(cuts, cuts[1:], strict=False)))
    return tuple(out)


def _store(impl: str, root: str, options: dict[str, Any], read_only: bool = False) -> Any:
    from zarr.storage import LocalStore

    if impl.startswith("shardkv"):
        return shardkv_store(root, options, read_only)
    return LocalStore(root, read_only=read_only)


def _write_steps(impl: str, root: str, shape: tuple[int, ...], seed: int, options: dict[str, Any]) -> dict[str, Any]:
    import dask.array as da
    import xarray as xr
    import zarr
    from zarr.codecs import ZstdCodec

    flags = {"native-align": {"align_chunks": True}, "native-unsafe": {"safe_chunks": False}}.get(impl, {})
    encoding: dict[str, Any] = {"chunks": CHUNKS, "compressors": (ZstdCodec(level=ZSTD_LEVEL),)}
    if impl.startswith("native"):
        encoding["shards"] = SHARD_SHAPE
    out: dict[str, Any] = {"lost_chunks": 0, "chunks_written": 0}
    for name, box, version in steps(shape):
        darr = da.map_blocks(
            _block,
            seed,
            version,
            box[0],
            dtype=DTYPE,
            chunks=_dask_chunks(impl, box),
            meta=np.empty((0, 0, 0), DTYPE),
        )
        ds = xr.Dataset({NAME: (("t", "y", "x"), darr)})
        where: dict[str, Any] = {
            "write": {"mode": "w", "encoding": {NAME: encoding}},
            "append": {"append_dim": "t"},
            "region": {"region": {"t": slice(box[0][0], box[1][0])}},
        }[name]
        store = _store(impl, root, options)
        t0 = time.perf_counter()
        ds.to_zarr(store, zarr_format=3, consolidated=False, **where, **flags)
        out[f"{name}_s"] = time.perf_counter() - t0
        got = zarr.open_array(_store(impl, root, {}, read_only=True), path=NAME, mode="r")[selection(box)]
        out[f"{name}_lost"] = chunks_differing(np.asarray(got), values(*box, seed, version))
        out["lost_chunks"] += out[f"{name}_lost"]
        out["chunks_written"] += box_elements(box) // int(np.prod(CHUNKS))
    out["total_s"] = sum(out[f"{name}_s"] for name in STEPS)
    return out


@contextlib.contextmanager
def _cluster(size: str) -> Iterator[None]:
    from distributed import Client, LocalCluster

    # size smoke (the test suite's check that the workload runs): one worker in this process, no process start-up
    workers, processes = (1, False) if size == "smoke" else (2, True)
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=processes, dashboard_address=None) as cluster:
        with Client(cluster):
            yield


def _available() -> str | None:
    for name in ("dask.array", "distributed", "xarray"):
        try:
            __import__(name)
        except ImportError:
            return f"{name.split('.')[0]} not installed"
    return None


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], IMPLS, shardkv_options=True)
    shape = SHAPES[args.size]
    problem = unavailable(args.impl, args.shardkv_options) or _available()
    if problem is not None:
        emit(args, "w29_dask", {"shape": shape, "unavailable": problem, "options": args.shardkv_options})
        return
    import warnings

    from shardkv import PartialShardWriteWarning

    warnings.simplefilter("ignore", PartialShardWriteWarning)  # the unaligned writes are measured on purpose
    samples: dict[str, list[Any]] = {}
    load = [os.getloadavg()[0]]
    with _cluster(args.size):
        with TempDir(args.dir) as tmp:  # warm-up (imports on the workers, codec set-up), not recorded
            _write_steps(args.impl, os.path.join(tmp, "warmup.zarr"), SHAPES["smoke"], args.seed, args.shardkv_options)
        for _ in range(args.repeat):
            with TempDir(args.dir) as tmp:
                result = _write_steps(args.impl, os.path.join(tmp, "data.zarr"), shape, args.seed, args.shardkv_options)
                for key, value in result.items():
                    samples.setdefault(key, []).append(value)
    load.append(os.getloadavg()[0])
    emit(
        args,
        "w29_dask",
        {
            "shape": shape,
            "array_bytes": int(np.prod(shape)) * DTYPE.itemsize,
            "options": args.shardkv_options,
            "samples": samples,
            "peer_versions": peer_versions(),
            "load_avg_1m": load,
        },
    )


if __name__ == "__main__":
    main()
