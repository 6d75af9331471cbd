"""`shardkv convert` with 1 and 2 local workers on the same local hierarchy; prints medians.

    .venv-zarr2/bin/python benchmarks/convert_workers.py [--repeat 3] [--dir /tmp/shardkv-bench]

The source is two 4096 x 4096 float32 arrays in 64 x 64 chunks (8192 chunks, 128 MiB,
blosc); each run converts it with --chunks-per-shard 4 (512 shards) through the command line,
so process start-up (and the workers' start-up) is included, as a user would see it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path


def _source(root: Path) -> None:
    import numpy as np
    import zarr

    if (root / ".zgroup").exists():
        return
    group = zarr.open_group(zarr.DirectoryStore(str(root)), mode="w")
    rng = np.random.default_rng(0)
    for name in ("a", "b"):
        group.create_dataset(name, shape=(4096, 4096), chunks=(64, 64), dtype="f4")[...] = rng.random(
            (4096, 4096), dtype="f4"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", default="/tmp/shardkv-bench-convert")
    args = parser.parse_args()
    work = Path(args.dir)
    work.mkdir(parents=True, exist_ok=True)
    src = work / "src.zarr"
    _source(src)
    times: dict[int, list[float]] = {1: [], 2: []}
    for _ in range(args.repeat):
        for workers in times:
            dst = work / f"out-{workers}"
            shutil.rmtree(dst, ignore_errors=True)
            start = time.perf_counter()
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "shardkv",
                    "convert",
                    str(src),
                    str(dst),
                    "--chunks-per-shard",
                    "4",
                    "--workers",
                    str(workers),
                ],
                check=True,
                capture_output=True,
                timeout=600,
            )
            times[workers].append(time.perf_counter() - start)
    one, two = statistics.median(times[1]), statistics.median(times[2])
    print(f"samples: {times}")
    print(
        f"median: 1 worker {one:.2f} s, 2 workers {two:.2f} s, speed-up {one / two:.2f}x; "
        f"load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs"
    )


if __name__ == "__main__":
    main()
