"""Row W29-1: a whole write, zarr 3 ``z[...] = data`` (tensorstore: ``ts[...].write(data)``), per implementation.

The workload of ``_w29.py`` (3-D uint16, 64³ chunks, 256³ shards, zstd 0).
``--impl``: ``shardkv`` (``shardkv.zarr3.ShardedStore(dir)``, default options
plus ``--shardkv-option``), ``shardkv-buffer`` (the same with ``buffer_bytes``
= the array's bytes, ``flush()`` timed), ``zarr3``, ``zarr3-zarrs``,
``tensorstore`` (the peers, ``.venv-bench``).

Per repetition, in a fresh directory (under ``--dir`` when given): create the
array (not timed), then time the write and its flush (``write_s``) and count
the bytes this process handed to ``write(2)`` meanwhile (``written_bytes``:
``wchar`` of ``/proc/self/io``: shards, their temporary files, lock files);
for shardkv also the shards its engine put (``shard_puts``, at its store's
``put_many``), its write rounds (``write_attempts``) and the shard changes
that joined a running commit's next round (``writes_queued``). Then, not
counted: the bytes the directory holds (``stored_bytes``) and a read back
through a new store object, compared with the data. One untimed warm-up on
the smoke array comes first. A shardkv run given an option the installed
shardkv does not know reports ``unavailable: option unknown``.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
from _common import TempDir, dir_bytes, emit, io_bytes, parse_args
from _w29 import SHAPES, Writer, peer_versions, unavailable, values

IMPLS = ("shardkv", "shardkv-buffer", "zarr3", "zarr3-zarrs", "tensorstore")


def _run(impl: str, root: str, data: np.ndarray, options: dict[str, Any]) -> dict[str, Any]:
    if impl == "shardkv-buffer":
        options = {**options, "buffer_bytes": data.nbytes}
    writer = Writer(impl, root, options)
    writer.create(data.shape)
    stats = writer.engine_stats()
    attempts, queued = (stats.write_attempts, stats.writes_queued) if stats is not None else (0, 0)
    whole = ((0, 0, 0), data.shape)
    _, written = io_bytes()
    t0 = time.perf_counter()
    writer.write(whole, data)
    writer.flush()
    write_s = time.perf_counter() - t0
    out: dict[str, Any] = {"write_s": write_s, "written_bytes": io_bytes()[1] - written}
    if stats is not None:
        out["shard_puts"] = writer.shard_puts()
        out["write_attempts"] = stats.write_attempts - attempts
        out["writes_queued"] = stats.writes_queued - queued
    out["stored_bytes"] = dir_bytes(root)
    if not np.array_equal(writer.read_back(), data):
        raise RuntimeError(f"{impl}: the array read back differs from the array written")
    return out


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], IMPLS, shardkv_options=True)
    shape = SHAPES[args.size]
    problem = unavailable(args.impl, args.shardkv_options)
    if problem is not None:
        emit(args, "w29_write", {"shape": shape, "unavailable": problem, "options": args.shardkv_options})
        return
    data = values((0, 0, 0), shape, args.seed)
    with TempDir(args.dir) as tmp:  # warm-up (imports, codec set-up), not recorded
        _run(
            args.impl,
            os.path.join(tmp, "warmup.zarr"),
            values((0, 0, 0), SHAPES["smoke"], args.seed),
            args.shardkv_options,
        )
    samples: dict[str, list[Any]] = {}
    for _ in range(args.repeat):
        with TempDir(args.dir) as tmp:
            for key, value in _run(args.impl, os.path.join(tmp, "data.zarr"), data, args.shardkv_options).items():
                samples.setdefault(key, []).append(value)
    result = {
        "shape": shape,
        "array_bytes": data.nbytes,
        "options": args.shardkv_options,
        "samples": samples,
        "peer_versions": peer_versions(),
        "load_avg_1m": os.getloadavg()[0],
    }
    emit(args, "w29_write", result)


if __name__ == "__main__":
    main()
