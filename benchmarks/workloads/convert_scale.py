"""P21: ``shardkv convert`` of many small chunks vs tensorstore doing the same copy (time, peak RSS).

The source is a Zarr v2 array of uint8 chunks of 32 x 32 = 1 KiB, uncompressed, one file per
chunk, written by this script (not measured): 2,000 chunks (tiny), 100,000 (small) or
1,000,000 (full, 1 GiB); 120 at size smoke, the test suite's check that it runs. Each
implementation copies it into a sharded array of 32 x 32 chunks per shard (1,024 chunks,
1 MiB per shard), index at the end with a CRC32C:

* ``shardkv``: ``python -m shardkv convert SRC DST --chunks-per-shard 32 --no-progress``
  (chunks moved as stored);
* ``tensorstore``: opens the source with its ``zarr`` driver and writes a ``zarr3`` array with
  the ``sharding_indexed`` codec (decodes and re-encodes every chunk).

Each copy runs in a fresh child process: ``copy_s`` is its wall time, ``peak_rss_bytes`` its
peak resident set size (``ru_maxrss`` from ``wait4``). The result is then checked: the
destination holds one object per shard (plus metadata). Reports ``unavailable`` when the
implementation's package is missing from this environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
from _common import TempDir, emit, parse_args

CHUNK = (32, 32)
CHUNKS_PER_SHARD = 32
# smoke (the test suite's check that the workload runs): 120 chunks, two shards, the second partial
GRIDS = {"smoke": (40, 3), "tiny": (50, 40), "small": (250, 400), "full": (1000, 1000)}

_TENSORSTORE = textwrap.dedent(
    """
    import sys, tensorstore as ts
    src, dst, rows, cols, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    source = ts.open({"driver": "zarr", "kvstore": {"driver": "file", "path": src}}, open=True).result()
    sharding = {"name": "sharding_indexed", "configuration": {
        "chunk_shape": [32, 32], "codecs": [{"name": "bytes"}], "index_location": "end",
        "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]}}
    metadata = {"shape": [rows, cols], "data_type": "uint8", "fill_value": 0, "codecs": [sharding],
                "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [32 * n, 32 * n]}},
                "chunk_key_encoding": {"name": "v2", "configuration": {"separator": "."}}}
    target = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": dst}, "metadata": metadata,
                      "create": True}).result()
    target.write(source).result()
    """
)


def write_source(root: str, grid: tuple[int, int], seed: int) -> None:
    """A Zarr v2 array at ``root`` of uint8 1 KiB chunks, one file each (seeded bytes)."""
    os.makedirs(root)
    shape = [grid[0] * CHUNK[0], grid[1] * CHUNK[1]]
    zarray = {
        "zarr_format": 2,
        "shape": shape,
        "chunks": list(CHUNK),
        "dtype": "|u1",
        "compressor": None,
        "fill_value": 0,
        "filters": None,
        "order": "C",
        "dimension_separator": ".",
    }
    with open(os.path.join(root, ".zarray"), "w") as f:
        json.dump(zarray, f)
    rng = np.random.default_rng(seed)
    for i in range(grid[0]):
        row = rng.integers(0, 256, size=(grid[1], CHUNK[0] * CHUNK[1]), dtype=np.uint8)
        for j in range(grid[1]):
            fd = os.open(os.path.join(root, f"{i}.{j}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, row[j].tobytes())
            finally:
                os.close(fd)


def run_child(cmd: list[str]) -> tuple[float, int]:
    """Run ``cmd``; its wall time (s) and peak RSS (bytes)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[:4]} failed ({proc.returncode}): {err.strip()[-500:]}")
    return elapsed, usage.ru_maxrss * 1024


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], ("shardkv", "tensorstore"))
    grid = GRIDS[args.size]
    n_chunks = grid[0] * grid[1]
    shards = -(-grid[0] // CHUNKS_PER_SHARD) * -(-grid[1] // CHUNKS_PER_SHARD)
    result = {
        "chunks": n_chunks,
        "chunk_bytes": CHUNK[0] * CHUNK[1],
        "chunks_per_shard": CHUNKS_PER_SHARD**2,
        "shards": shards,
        "cpu_count": os.cpu_count(),
        "load_before": os.getloadavg(),
    }
    try:
        __import__("shardkv" if args.impl == "shardkv" else "tensorstore")
    except ImportError as exc:
        result["unavailable"] = f"{exc.name} is not installed here"
        emit(args, "convert_scale", result)
        return
    samples: dict[str, list[float]] = {"copy_s": [], "peak_rss_bytes": []}
    with TempDir() as tmp:
        src = os.path.join(tmp, "src.zarr")
        write_source(src, grid, args.seed)
        for rep in range(args.repeat):
            dst = os.path.join(tmp, f"dst-{rep}.zarr")
            if args.impl == "shardkv":
                cmd = [
                    sys.executable,
                    "-m",
                    "shardkv",
                    "convert",
                    src,
                    dst,
                    "--chunks-per-shard",
                    str(CHUNKS_PER_SHARD),
                    "--no-progress",
                ]
            else:
                cmd = [
                    sys.executable,
                    "-c",
                    _TENSORSTORE,
                    src,
                    dst,
                    str(grid[0] * CHUNK[0]),
                    str(grid[1] * CHUNK[1]),
                    str(CHUNKS_PER_SHARD),
                ]
            elapsed, peak = run_child(cmd)
            stored = [n for n in os.listdir(dst) if not n.startswith((".", "zarr.json"))]
            if len(stored) != shards:
                raise RuntimeError(f"{args.impl}: {len(stored)} objects in {dst}, expected {shards} shards")
            samples["copy_s"].append(elapsed)
            samples["peak_rss_bytes"].append(peak)
    result["samples"] = samples
    emit(args, "convert_scale", result)


if __name__ == "__main__":
    main()
