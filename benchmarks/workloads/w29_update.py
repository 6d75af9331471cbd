"""Row W29-3: update one 64³ inner chunk in each shard of a stored array; bytes written and read.

The workload of ``_w29.py`` (3-D uint16, 64³ chunks, 256³ shards, zstd 0).
``--impl``: ``shardkv`` (``shardkv.zarr3.ShardedStore(dir)``, default options
plus ``--shardkv-option``), ``zarr3``, ``zarr3-zarrs``, ``tensorstore`` (the
peers, ``.venv-bench``).

Per repetition, in a fresh directory (under ``--dir`` when given), not
counted: the whole array written (shardkv through a store with
``buffer_bytes`` = the array's bytes, flushed) and opened again through a new
store object (tensorstore: a new context) with the options measured. Counted:
one write per shard of the new data (version 1) of the inner chunk at local
coordinates (1, 1, 1) (``_w29.update_boxes``: 8 writes of 512 KiB at full
size), one after the other, then ``flush()`` for shardkv: the time
(``update_s``) and the bytes this process passed to ``read(2)`` and
``write(2)`` meanwhile (``read_bytes``, ``written_bytes``: ``rchar`` and
``wchar`` of ``/proc/self/io``; page-cache hits count, as the bytes moved).
Then, not counted: the bytes the directory holds (``stored_bytes``), the
shard puts (shardkv) and a read back of the whole array through a new store
object, compared with what was written. One untimed warm-up on the smoke
array comes first. A shardkv run given an option the installed shardkv does
not know reports ``unavailable: option unknown``.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
from _common import TempDir, dir_bytes, emit, io_bytes, parse_args
from _w29 import SHAPES, Writer, box_elements, peer_versions, selection, unavailable, update_boxes, values

IMPLS = ("shardkv", "zarr3", "zarr3-zarrs", "tensorstore")


def _run(impl: str, root: str, data: np.ndarray, seed: int, options: dict[str, Any]) -> dict[str, Any]:
    first = Writer(impl, root, {**options, "buffer_bytes": data.nbytes} if impl == "shardkv" else options)
    first.create(data.shape)
    first.write(((0, 0, 0), data.shape), data)
    first.flush()
    boxes = update_boxes(data.shape)
    blocks = [values(*box, seed, version=1) for box in boxes]
    writer = Writer(impl, root, options)
    writer.open()
    stats = writer.engine_stats()
    attempts = stats.write_attempts if stats is not None else 0
    read0, written0 = io_bytes()
    t0 = time.perf_counter()
    for box, block in zip(boxes, blocks, strict=True):
        writer.write(box, block)
    writer.flush()
    update_s = time.perf_counter() - t0
    read1, written1 = io_bytes()
    out: dict[str, Any] = {"update_s": update_s, "read_bytes": read1 - read0, "written_bytes": written1 - written0}
    if stats is not None:
        out["shard_puts"] = writer.shard_puts()
        out["write_attempts"] = stats.write_attempts - attempts
    out["stored_bytes"] = dir_bytes(root)
    want = data.copy()
    for box, block in zip(boxes, blocks, strict=True):
        want[selection(box)] = block
    if not np.array_equal(writer.read_back(), want):
        raise RuntimeError(f"{impl}: the array read back differs from the array written and updated")
    return out


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], IMPLS, shardkv_options=True)
    shape = SHAPES[args.size]
    problem = unavailable(args.impl, args.shardkv_options)
    if problem is not None:
        emit(args, "w29_update", {"shape": shape, "unavailable": problem, "options": args.shardkv_options})
        return
    data = values((0, 0, 0), shape, args.seed)
    smoke = SHAPES["smoke"]
    with TempDir(args.dir) as tmp:  # warm-up (imports, codec set-up), not recorded
        _run(
            args.impl,
            os.path.join(tmp, "warmup.zarr"),
            values((0, 0, 0), smoke, args.seed),
            args.seed,
            args.shardkv_options,
        )
    samples: dict[str, list[Any]] = {}
    for _ in range(args.repeat):
        with TempDir(args.dir) as tmp:
            for key, value in _run(
                args.impl, os.path.join(tmp, "data.zarr"), data, args.seed, args.shardkv_options
            ).items():
                samples.setdefault(key, []).append(value)
    result = {
        "shape": shape,
        "array_bytes": data.nbytes,
        "updates": len(update_boxes(shape)),
        "update_bytes": sum(box_elements(box) for box in update_boxes(shape)) * data.itemsize,
        "options": args.shardkv_options,
        "samples": samples,
        "peer_versions": peer_versions(),
        "load_avg_1m": os.getloadavg()[0],
    }
    emit(args, "w29_update", result)


if __name__ == "__main__":
    main()
