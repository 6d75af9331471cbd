"""P21 listing: a sharded array of many tiny chunks listed through ShardedStore vs DirectoryStore.

The fixture (made once per process, with plain file writes, see ``_fixtures.py``)
is one uint8 array of 4 x 4 chunks (16 bytes each, holding their own grid
coordinates) twice in a temp dir: unsharded, one file per chunk in one flat
directory (what zarr 2's ``DirectoryStore`` lists), and sharded the way
``shardkv convert --chunks-per-shard 32`` stores it (1,024 chunks per shard).
Chunk grids: tiny 100 x 100 (10,000 chunks), small 250 x 400 (100,000), full
1,000 x 1,000 (1,000,000); smoke (the test suite's check that it runs) 40 x 3.

Timed, each on a newly made store object (cold index cache, warm page cache;
making the store and opening the array are inside the timing), both sides
alternating which goes first: ``list(store)``, ``len(store)``,
``list(store.keys())`` and zarr 2's ``zarr.open_array(store, mode="r")
.nchunks_initialized``. Before timing, both listings are checked to hold every
chunk key and a few chunks are read through zarr and compared. Goal:
each <= 0.5 x DirectoryStore. With ``SHARDKV_BENCH_LIST_FIXTURE=DIR`` the fixture
is written once under ``DIR`` and kept, so that several runs (two commits, one
after the other) list the same files without writing a million of them again.
"""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import struct
import time
from collections.abc import Callable
from typing import Any

from _common import TempDir, emit, parse_args
from _fixtures import write_plain, write_sharded

KEEP_FIXTURE = "SHARDKV_BENCH_LIST_FIXTURE"
"""Environment variable: a directory where the fixture is written once and kept (reused by later runs)."""
# smoke (the test suite's check that the workload runs): 120 chunks, two shards, the second partial
GRIDS = {"smoke": (40, 3), "tiny": (100, 100), "small": (250, 400), "full": (1000, 1000)}
CHUNK = (4, 4)
PER_SHARD = (32, 32)
OPS: dict[str, Callable[[Any], int]] = {
    "list": lambda store: len(list(store)),
    "len": len,
    "keys": lambda store: len(list(store.keys())),
    "nchunks": lambda store: int(__import__("zarr").open_array(store=store, mode="r").nchunks_initialized),
}


def content(coords: tuple[int, ...]) -> bytes:
    """A chunk holds its grid coordinates (two little-endian uint64: 16 bytes, one 4 x 4 uint8 chunk)."""
    return struct.pack("<QQ", *coords)


def check(sharded: Any, plain: Any, n_chunks: int) -> None:
    """Both listings hold the same keys, every chunk's included; a few chunks read the same through zarr."""
    import numpy as np
    import zarr

    keys_s, keys_p = set(sharded), set(plain)
    chunk_keys = {k for k in keys_p if not k.startswith(".")}
    if len(chunk_keys) != n_chunks or not chunk_keys <= keys_s:
        raise RuntimeError(f"listings differ: {len(keys_s)} sharded keys, {len(keys_p)} plain, {n_chunks} chunks")
    zs, zp = zarr.open_array(store=sharded, mode="r"), zarr.open_array(store=plain, mode="r")
    for i, j in ((0, 0), (zs.shape[0] - 4, zs.shape[1] - 4), (zs.shape[0] // 2, 4)):
        if not np.array_equal(zs[i : i + 4, j : j + 4], zp[i : i + 4, j : j + 4]):
            raise RuntimeError(f"chunk at ({i}, {j}) differs between the sharded and the plain array")


def main() -> None:
    import zarr

    from shardkv import ShardedStore

    args = parse_args(__doc__.splitlines()[0], ("shardkv",))
    grid = GRIDS[args.size]
    n_chunks = grid[0] * grid[1]
    samples: dict[str, list[float]] = {f"{side}_{op}_s": [] for op in OPS for side in ("sharded", "plain")}
    kept = os.environ.get(KEEP_FIXTURE)
    with contextlib.nullcontext(kept) if kept else TempDir() as tmp:
        where = os.path.join(tmp, f"{args.size}-seed{args.seed}")
        sharded_root, plain_root = os.path.join(where, "sharded.zarr"), os.path.join(where, "plain.zarr")
        t0 = time.perf_counter()
        if not os.path.isfile(os.path.join(where, "complete")):
            shutil.rmtree(where, ignore_errors=True)
            write_plain(plain_root, grid, CHUNK, args.seed, content)
            write_sharded(sharded_root, grid, CHUNK, PER_SHARD, args.seed, content)
            open(os.path.join(where, "complete"), "w").close()
        shards = len([name for name in os.listdir(sharded_root) if name != "zarr.json"])
        fixture_s = time.perf_counter() - t0
        makers = {"sharded": lambda: ShardedStore(sharded_root), "plain": lambda: zarr.DirectoryStore(plain_root)}
        check(makers["sharded"](), makers["plain"](), n_chunks)
        for rep in range(args.repeat):
            for op, fn in OPS.items():
                order = ["sharded", "plain"] if (rep + len(op)) % 2 == 0 else ["plain", "sharded"]
                counts = {}
                for side in order:
                    gc.collect()
                    t0 = time.perf_counter()
                    counts[side] = fn(makers[side]())
                    samples[f"{side}_{op}_s"].append(time.perf_counter() - t0)
                if counts["sharded"] != counts["plain"]:
                    raise RuntimeError(f"{op}: {counts['sharded']} through ShardedStore, {counts['plain']} plain")
    emit(
        args,
        "list_scale",
        {
            "chunks": n_chunks,
            "shards": shards,
            "chunk_shape": CHUNK,
            "chunks_per_shard": PER_SHARD[0] * PER_SHARD[1],
            "fixture_s": fixture_s,
            "load_avg_1m": os.getloadavg()[0],
            "samples": samples,
        },
    )


if __name__ == "__main__":
    main()
