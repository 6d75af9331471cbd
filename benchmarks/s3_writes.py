"""W37: writes on S3 counted on the wire (moto on 127.0.0.1), shardkv default options vs zarr 3 native sharding.

    python benchmarks/s3_writes.py --size field|small [--impl shardkv|shardkv-dask|zarr3] [--out FILE]

``field``: the field workload, W29's array (512³ uint16, 64³ inner
chunks, shards of 4³ chunks = 256³, zstd level 0, index at the end with
CRC32C; smooth data plus seeded noise 0..15 as W29's): shards well over S3's
5 MiB part minimum.
``small``: 256³ uint16, 32³ chunks, 4³ chunks per shard (shards of 3.4 MiB
uncompressed, below it: the whole rewrite stays). Both run in the zarr3
environment, each in a bucket of its own, phases:

* ``write``: ``z[...] = data`` in one call (zarr 3 hands the store a few
  chunks at a time; shardkv: the first round creates a shard, later rounds
  are O(chunk) updates where a shard keeps 5 MiB); ``--impl shardkv-dask``:
  ``da.store`` of one-chunk blocks from a ``LocalCluster`` of 2 worker
  processes (1 thread each) instead, with the chunks lost counted;
* ``update``: the inner chunk at local coordinates (1, 1, 1) of each shard,
  from a fresh store (indexes not cached).

Per phase: bytes of request bodies (up) and of response bodies (down) the
server saw, requests by S3 operation, seconds (context only: 2 shared
cores), and the ratios to the bytes stored (write) or to the chunks' stored
bytes (update). Every phase reads back exact with zarr 3 alone. The server
decides conditional writes as S3 does (``tests/moto_strict.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # moto_strict
import moto_strict  # noqa: E402

SIZES = {  # shape, inner chunk, chunks per shard
    "field": ((512, 512, 512), (64, 64, 64), 4),
    "small": ((256, 256, 256), (32, 32, 32), 4),
}


def _values(shape: tuple[int, ...], chunks: tuple[int, ...], version: int) -> np.ndarray:
    axes = [np.arange(n, dtype=np.uint16) for n in shape]
    smooth = axes[0][:, None, None] + axes[1][None, :, None] + axes[2][None, None, :]
    out = (smooth * np.uint16(5) + np.uint16(1000 * version)) % np.uint16(4096)
    noise = np.random.default_rng(version).integers(0, 16, shape, dtype=np.uint16)
    return out + noise


def _summary(exchanges: list[moto_strict.Exchange], seconds: float) -> dict[str, Any]:
    return {
        "up": sum(e.up for e in exchanges),
        "down": sum(e.down for e in exchanges),
        "requests": dict(sorted(Counter(e.operation for e in exchanges).items())),
        "refused_412": sum(e.status == 412 for e in exchanges),
        "seconds": round(seconds, 2),
    }


def run(size: str, impl: str) -> dict[str, Any]:
    import boto3
    import s3fs
    import zarr
    from zarr.codecs import ZstdCodec
    from zarr.storage import FsspecStore

    from shardkv.zarr3 import ShardedStore

    shape, chunks, per_shard = SIZES[size]
    server, endpoint = moto_strict.start_server()
    wire = moto_strict.Wire(server)
    bucket = f"w37-{uuid.uuid4().hex[:8]}"
    boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id="k", aws_secret_access_key="s", region_name="us-east-1"
    ).create_bucket(Bucket=bucket)

    def fs() -> Any:
        options = {"endpoint_url": endpoint, "region_name": "us-east-1"}
        return s3fs.S3FileSystem(
            key="k", secret="s", client_kwargs=options, asynchronous=True, skip_instance_cache=True
        )

    def array(mode: str) -> Any:
        base = FsspecStore(fs(), path=f"{bucket}/a")
        if impl == "zarr3":  # shardkv and shardkv-dask: shardkv.zarr3
            store: Any = base
            extra: dict[str, Any] = {"shards": tuple(c * per_shard for c in chunks)}
        else:
            store, extra = ShardedStore(base, chunks_per_shard=per_shard), {}
        if mode == "w":
            return zarr.create_array(
                store, shape=shape, chunks=chunks, dtype="u2", compressors=ZstdCodec(level=0), fill_value=0, **extra
            )
        return zarr.open_array(store, mode=mode)

    def check(want: np.ndarray) -> None:
        got = zarr.open_array(FsspecStore(fs(), path=f"{bucket}/a", read_only=True), mode="r")[...]
        if not np.array_equal(got, want):
            raise RuntimeError(f"{size}/{impl}: the array read back by zarr 3 alone differs")

    data = _values(shape, chunks, 0)
    out: dict[str, Any] = {"size": size, "impl": impl, "shape": shape, "chunks": chunks, "per_shard": per_shard}
    try:
        z = array("w")
        wire.take()
        t0 = time.perf_counter()
        if impl == "shardkv-dask":
            _dask_store(data, chunks, z)
        else:
            z[...] = data
        out["write"] = _summary(wire.take(), time.perf_counter() - t0)
        check(data)
        stored = sum(
            o["Size"]
            for o in boto3.client(
                "s3", endpoint_url=endpoint, aws_access_key_id="k", aws_secret_access_key="s", region_name="us-east-1"
            ).list_objects_v2(Bucket=bucket, Prefix="a/c/")["Contents"]
        )
        out["stored"] = stored
        out["write"]["up_x"] = round(out["write"]["up"] / stored, 3)
        out["write"]["down_x"] = round(out["write"]["down"] / stored, 3)
        grid = [n // (c * per_shard) for n, c in zip(shape, chunks, strict=True)]
        update = _values(shape, chunks, 1)
        boxes = [
            tuple(slice(i * c * per_shard + c, i * c * per_shard + 2 * c) for i, c in zip(idx, chunks, strict=True))
            for idx in np.ndindex(*grid)
        ]
        z = array("r+")
        wire.take()
        t0 = time.perf_counter()
        for box in boxes:
            z[box] = update[box]
            data[box] = update[box]
        out["update"] = _summary(wire.take(), time.perf_counter() - t0)
        check(data)
        chunk_stored = stored / (np.prod(grid) * per_shard**3)  # mean stored bytes of a chunk
        out["update"]["chunks"] = len(boxes)
        out["update"]["up_per_chunk_x"] = round(out["update"]["up"] / len(boxes) / chunk_stored, 3)
        out["update"]["down_per_chunk"] = out["update"]["down"] // len(boxes)
    finally:
        server.stop()
    return out


def _dask_store(data: np.ndarray, chunks: tuple[int, ...], z: Any) -> None:
    """``da.store`` of ``data`` in one-chunk blocks onto ``z`` from a LocalCluster of 2 worker processes."""
    import dask.array as da
    from distributed import Client, LocalCluster

    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=":0") as c,
        Client(c),
    ):
        da.store(da.from_array(data, chunks=chunks), z, lock=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--impl", choices=("shardkv", "shardkv-dask", "zarr3"), default="shardkv")
    parser.add_argument("--out", default=None, help="file that gets the JSON result (default: stdout)")
    args = parser.parse_args()
    result = json.dumps(run(args.size, args.impl), indent=1)
    if args.out:
        Path(args.out).write_text(result + "\n")
    else:
        print(result)


if __name__ == "__main__":
    main()
