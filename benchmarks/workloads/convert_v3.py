"""P9: sharding a Zarr v3 array that zarr-python 3 wrote: ``shardkv convert`` vs tensorstore and ``from_array``.

The source is what zarr-python 3 writes by default (written by this script, not measured): a
float32 array with chunks of 32 x 32 x 32 (128 KiB), ``zstd`` level 3, one object per chunk at
``c/i/j/k``; 256 x 256 x 256 (512 chunks, 64 MiB) at sizes small and full, 128^3 (64 chunks) at
tiny, 64^3 (8 chunks) at smoke. Data: smooth values plus noise (zstd keeps about 85 % of it).
Each implementation writes the same sharded layout: shards of 4 x 4 x 4 chunks, inner codecs
``bytes`` + ``zstd`` level 3, index at the end with a CRC32C:

* ``shardkv``: the command line, ``shardkv convert SRC DST --chunks-per-shard 4`` (its ``main``
  called in the child, its convert modules imported first with the one BLAS thread ``main``
  asks for before the console script imports numpy; chunks moved as stored);
* ``tensorstore``: opens the source with its ``zarr3`` driver and writes a ``zarr3`` array with
  the ``sharding_indexed`` codec (decodes and re-encodes every chunk);
* ``zarr3``: ``zarr.from_array(DST, data=SOURCE, shards=..., compressors=zstd)`` (decodes and
  re-encodes every chunk).

With ``--impl paired``, shardkv and tensorstore run in turn, one fresh process each per
repetition (the order alternating), so that both meet the same moment of a machine whose speed
drifts: ``process_ratio`` and ``copy_ratio`` are each pair's shardkv / tensorstore ratios of
``copy_s`` and ``work_s`` (tensorstore's own samples as ``peer_copy_s``, ``peer_work_s``).

Each copy runs in a fresh child process: ``copy_s`` is its wall time (interpreter start and
imports included), ``work_s`` the copy alone as the child times it (after the imports of
``import tensorstore`` / ``zarr`` / shardkv's command line and convert modules),
``peak_rss_bytes`` its peak resident set size (``ru_maxrss``). The output is checked to hold one
object per shard. shardkv's modules are byte-compiled first (``compileall``), as ``pip install``
does: under ``PYTHONDONTWRITEBYTECODE=1`` an editable install would otherwise compile every
module it imports in every child (about 0.25 s of CPU on the project's machine), which the
peers, installed with their bytecode, never do.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
import time

from _common import TempDir, emit, parse_args
from convert_scale import run_child

CHUNK = 32
CHUNKS_PER_SHARD = 4
SIDES = {"smoke": 64, "tiny": 128, "small": 256, "full": 256}
NEEDS = {  # the modules each --impl runs
    "shardkv": ("shardkv",),
    "tensorstore": ("tensorstore",),
    "zarr3": ("zarr",),
    "paired": ("shardkv", "tensorstore"),
}

_WRITE_SOURCE = textwrap.dedent(
    """
    import sys, numpy as np, zarr
    from zarr.codecs import ZstdCodec
    path, side, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = np.random.default_rng(seed)
    grid = np.linspace(0, 8, side, dtype="f4")
    data = np.sin(grid)[:, None, None] * np.cos(grid)[None, :, None] + grid[None, None, :]
    data = (data + rng.standard_normal((side, side, side)).astype("f4") * 0.01).astype("f4")
    a = zarr.create_array(path, shape=data.shape, chunks=(32, 32, 32), dtype="f4", compressors=ZstdCodec(level=3))
    a[:] = data
    """
)

_SHARDKV = textwrap.dedent(
    """
    import os, sys, time
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as main() does before the console script imports numpy
    import shardkv.cli.convert
    from shardkv.cli.main import main
    t0 = time.perf_counter()
    status = main(["convert", sys.argv[1], sys.argv[2], "--chunks-per-shard", "4"])
    print(time.perf_counter() - t0)
    sys.exit(status)
    """
)

_TENSORSTORE = textwrap.dedent(
    """
    import sys, time, tensorstore as ts
    src, dst, side = sys.argv[1], sys.argv[2], int(sys.argv[3])
    t0 = time.perf_counter()
    source = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": src}}, open=True).result()
    sharding = {"name": "sharding_indexed", "configuration": {
        "chunk_shape": [32, 32, 32], "index_location": "end",
        "codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                   {"name": "zstd", "configuration": {"level": 3, "checksum": False}}],
        "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]}}
    metadata = {"shape": [side] * 3, "data_type": "float32", "fill_value": 0.0, "codecs": [sharding],
                "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [128, 128, 128]}}}
    target = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": dst}, "metadata": metadata,
                      "create": True}).result()
    target.write(source).result()
    print(time.perf_counter() - t0)
    """
)

_ZARR3 = textwrap.dedent(
    """
    import sys, time, zarr
    from zarr.codecs import ZstdCodec
    src, dst = sys.argv[1], sys.argv[2]
    t0 = time.perf_counter()
    zarr.from_array(dst, data=zarr.open_array(src, mode="r"), chunks=(32, 32, 32), shards=(128, 128, 128),
                    compressors=ZstdCodec(level=3))
    print(time.perf_counter() - t0)
    """
)


def _run(cmd: list[str]) -> tuple[float, float, int]:
    """Run ``cmd``: its wall time (s), the work time it prints last (s), its peak RSS (bytes)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # a line of output at most
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    out, err = (p.read().decode() if p else "" for p in (proc.stdout, proc.stderr))
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[:3]} failed ({proc.returncode}): {err.strip()[-500:]}")
    return elapsed, float(out.split()[-1]), usage.ru_maxrss * 1024


def _compile_shardkv() -> None:
    """Byte-compile shardkv's modules (its package directories), as pip does when it installs a package."""
    dirs = [
        d
        for name in ("shardkv", "shardkv.transformers")
        if (spec := importlib.util.find_spec(name)) is not None
        for d in spec.submodule_search_locations or ()
    ]
    run_child([sys.executable, "-m", "compileall", "-q", *dirs])


def _shards(root: str) -> int:
    return sum(len(files) for _, _, files in os.walk(os.path.join(root, "c")))


def _copy(impl: str, src: str, dst: str, side: int, expected_shards: int) -> tuple[float, float, int]:
    """One copy by ``impl`` in a fresh process: wall time (s), the copy alone (s), peak RSS (bytes)."""
    if impl == "shardkv":
        cmd = [sys.executable, "-c", _SHARDKV, src, dst]
    elif impl == "tensorstore":
        cmd = [sys.executable, "-c", _TENSORSTORE, src, dst, str(side)]
    else:
        cmd = [sys.executable, "-c", _ZARR3, src, dst]
    measured = _run(cmd)
    if _shards(dst) != expected_shards:
        raise RuntimeError(f"{impl}: {_shards(dst)} shards in {dst}, expected {expected_shards}")
    shutil.rmtree(dst)  # each copy meets the same disk: no earlier output left to write back
    return measured


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], ("shardkv", "tensorstore", "zarr3", "paired"))
    side = SIDES[args.size]
    per_side = -(-side // (CHUNK * CHUNKS_PER_SHARD))
    result = {
        "shape": [side] * 3,
        "chunks": (side // CHUNK) ** 3,
        "shards": per_side**3,
        "cpu_count": os.cpu_count(),
        "load_before": os.getloadavg(),
    }
    # found, not imported: this process stays small (a child's ``ru_maxrss`` may count its parent's pages)
    missing = [m for m in (*NEEDS[args.impl], "zarr") if importlib.util.find_spec(m) is None]  # zarr writes the source
    if missing:
        result["unavailable"] = f"{missing[0]} is not installed here"
        emit(args, "convert_v3", result)
        return
    samples: dict[str, list[float]] = {"copy_s": [], "work_s": [], "peak_rss_bytes": []}
    with TempDir() as tmp:
        src = os.path.join(tmp, "src.zarr")
        run_child([sys.executable, "-c", _WRITE_SOURCE, src, str(side), str(args.seed)])
        result["source_bytes"] = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(src) for f in files)
        if args.impl in ("shardkv", "paired"):
            _compile_shardkv()
        if args.impl == "paired":
            samples.update(peer_copy_s=[], peer_work_s=[], process_ratio=[], copy_ratio=[])
        for rep in range(args.repeat):
            if args.impl != "paired":
                elapsed, work, peak = _copy(args.impl, src, os.path.join(tmp, f"dst-{rep}.zarr"), side, per_side**3)
            else:
                pair = {}
                for impl in ("shardkv", "tensorstore") if rep % 2 == 0 else ("tensorstore", "shardkv"):
                    pair[impl] = _copy(impl, src, os.path.join(tmp, f"dst-{rep}-{impl}.zarr"), side, per_side**3)
                elapsed, work, peak = pair["shardkv"]
                peer_elapsed, peer_work, _ = pair["tensorstore"]
                samples["peer_copy_s"].append(peer_elapsed)
                samples["peer_work_s"].append(peer_work)
                samples["process_ratio"].append(elapsed / peer_elapsed)
                samples["copy_ratio"].append(work / peer_work)
            samples["copy_s"].append(elapsed)
            samples["work_s"].append(work)
            samples["peak_rss_bytes"].append(peak)
    result["samples"] = samples
    emit(args, "convert_v3", result)


if __name__ == "__main__":
    main()
