"""The peer matrix: one sample of full write, full read and random chunk reads of one implementation.

    python benchmarks/workloads/peers.py --impl zarr3-zarrs --layout 256 --codec zstd --backend local

One process makes one sample (``benchmarks/run.py`` starts a fresh process
per sample). Layout: 2-D float32 (seeded standard normal), square chunks of
``--layout`` (256 or 64) elements a side, shards of 4 x 4 chunks, index at
the end with CRC32C; inner codec none or zstd level 1. Implementations:

========================  ===========  ===================================================
``--impl``                environment  what
========================  ===========  ===================================================
``shardkv``               zarr2        zarr 2.18 on ``ShardedStore`` (local dir / s3fs URL)
``shardkv-obstore``       zarr2        the same over an obstore ``S3Store`` (S3 only)
``zarr2-unsharded``       zarr2        zarr 2.18, one object per chunk (``DirectoryStore``
                                       / ``FSStore``): what a zarr 2 user has today
``zarr2-dict``            zarr2        zarr 2.18 on a plain ``dict``, unsharded (local only)
``zarr3``                 bench        zarr 3 ``create_array(shards=...)``, default pipeline
                                       (``LocalStore`` / ``FsspecStore`` on s3fs)
``zarr3-zarrs``           bench        the same with ``zarrs.ZarrsCodecPipeline``
``tensorstore``           bench        tensorstore ``zarr3`` driver, ``sharding_indexed``
========================  ===========  ===================================================

Timed: ``z[...] = data`` (``write_s``); ``z[...]`` through a newly opened
array and store (``read_s``, checked against the data); then, through that
same store object, ``reads`` single-chunk reads of seeded random chunks twice:
the first pass ``cold_s``, the second (same chunks) ``warm_s``. With
``--backend s3`` every phase's requests to the loopback S3 server
(``s3_server.py``, started by the runner) are counted from its request log,
by method; the array lives in a new bucket per sample. One untimed warm-up
(imports, codec set-up) on a tiny array comes first.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from typing import Any

import numpy as np
from _common import TempDir, emit, make_data
from s3_server import ACCESS_KEY, REGION, SECRET_KEY, count_requests

IMPLS = ("shardkv", "shardkv-obstore", "zarr2-unsharded", "zarr2-dict", "zarr3", "zarr3-zarrs", "tensorstore")
CHUNKS_PER_SHARD = 4
# array side per size and backend/layout: (local 256, local 64, s3 256)
SIDES = {
    "smoke": {("local", 256): 512, ("local", 64): 128, ("s3", 256): 512, ("s3", 64): 128},
    "tiny": {("local", 256): 1024, ("local", 64): 256, ("s3", 256): 1024, ("s3", 64): 256},
    "small": {("local", 256): 2048, ("local", 64): 1024, ("s3", 256): 2048, ("s3", 64): 512},
    "full": {("local", 256): 8192, ("local", 64): 4096, ("s3", 256): 4096, ("s3", 64): 1024},
}
RANDOM_READS = {"smoke": 4, "tiny": 20, "small": 200, "full": 200}


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--size", choices=sorted(SIDES), default="small")
    parser.add_argument("--repeat", type=int, default=1, help="ignored: one sample per process")
    parser.add_argument("--impl", choices=IMPLS, default="shardkv")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layout", type=int, choices=(256, 64), default=256, help="chunk side, elements")
    parser.add_argument("--codec", choices=("none", "zstd"), default="none")
    parser.add_argument("--backend", choices=("local", "s3"), default="local")
    parser.add_argument("--s3-endpoint", help="http://127.0.0.1:PORT of s3_server.py (s3 backend)")
    parser.add_argument("--s3-log", help="request log of that server")
    return parser.parse_args()


# -- one class per implementation: create(), write(data), open(), read(), read_chunk(i, j) ------


class Impl:
    def __init__(self, args: argparse.Namespace, location: str, shape: tuple[int, int]) -> None:
        self.args = args
        self.location = location  # a local directory, or s3://bucket/data.zarr
        self.shape = shape
        self.c = args.layout
        self.s3 = args.backend == "s3"

    def s3_options(self) -> dict[str, Any]:
        return {
            "key": ACCESS_KEY,
            "secret": SECRET_KEY,
            "client_kwargs": {"endpoint_url": self.args.s3_endpoint, "region_name": REGION},
        }

    def read_chunk(self, i: int, j: int) -> Any:
        c = self.c
        return self.arr[i * c : (i + 1) * c, j * c : (j + 1) * c]


class Zarr2(Impl):
    """zarr 2.18 on ShardedStore, on one object per chunk, or on a dict."""

    def store(self, create: bool) -> Any:
        impl = self.args.impl
        if impl == "zarr2-dict":
            if create:
                self.dict: dict[str, Any] = {}
            return self.dict
        if impl == "zarr2-unsharded":
            import zarr

            if self.s3:
                return zarr.storage.FSStore(self.location, **self.s3_options())
            return zarr.DirectoryStore(self.location)
        from shardkv import ShardedStore

        cps = CHUNKS_PER_SHARD if create else None
        kwargs: dict[str, Any] = {} if cps is None else {"chunks_per_shard": cps}
        if impl == "shardkv-obstore":
            from obstore.store import S3Store

            bucket, prefix = self.location[len("s3://") :].split("/", 1)
            base = S3Store(
                bucket,
                prefix=prefix,
                endpoint=self.args.s3_endpoint,
                region=REGION,
                access_key_id=ACCESS_KEY,
                secret_access_key=SECRET_KEY,
                client_options={"allow_http": True},
            )
            # one writer per benchmark; obstore stores offer no shardkv locks or CAS yet
            return ShardedStore(base, concurrency="process", **kwargs)
        if self.s3:
            return ShardedStore(self.location, storage_options=self.s3_options(), **kwargs)
        return ShardedStore(self.location, **kwargs)

    def create(self) -> None:
        import zarr
        from numcodecs import Zstd

        compressor = Zstd(level=1) if self.args.codec == "zstd" else None
        self.arr = zarr.create(
            shape=self.shape,
            chunks=(self.c, self.c),
            dtype="float32",
            fill_value=0,
            compressor=compressor,
            store=self.store(True),
            path="arr",
        )

    def write(self, data: np.ndarray) -> None:
        self.arr[...] = data

    def open(self) -> None:
        import zarr

        self.arr = zarr.open_array(store=self.store(False), path="arr", mode="r")

    def read(self) -> np.ndarray:
        return self.arr[...]


class Zarr3(Impl):
    """zarr 3 with its own sharding codec (default pipeline, or zarrs')."""

    def store(self, read_only: bool) -> Any:
        from zarr.storage import FsspecStore, LocalStore

        if self.s3:
            return FsspecStore.from_url(self.location, storage_options=self.s3_options(), read_only=read_only)
        return LocalStore(self.location, read_only=read_only)

    def create(self) -> None:
        import zarr
        from zarr.codecs import ZstdCodec

        if self.args.impl == "zarr3-zarrs":
            import zarrs  # noqa: F401 (registers the pipeline)

            zarr.config.set({"codec_pipeline.path": "zarrs.ZarrsCodecPipeline"})
        compressors = ZstdCodec(level=1) if self.args.codec == "zstd" else None
        side = self.c * CHUNKS_PER_SHARD
        self.arr = zarr.create_array(
            store=self.store(False),
            name="arr",
            shape=self.shape,
            chunks=(self.c, self.c),
            shards=(side, side),
            dtype="float32",
            compressors=compressors,
            fill_value=0,
        )

    def write(self, data: np.ndarray) -> None:
        self.arr[...] = data

    def open(self) -> None:
        import zarr

        self.arr = zarr.open_array(store=self.store(True), path="arr", mode="r")

    def read(self) -> np.ndarray:
        return self.arr[...]


class TensorStore(Impl):
    """tensorstore's zarr3 driver with the sharding_indexed codec."""

    def spec(self, create: bool) -> dict[str, Any]:
        if self.s3:
            bucket, prefix = self.location[len("s3://") :].split("/", 1)
            kvstore: dict[str, Any] = {
                "driver": "s3",
                "bucket": bucket,
                "path": f"{prefix}/arr/",
                "endpoint": self.args.s3_endpoint,
                "aws_region": REGION,
                "aws_credentials": {"type": "environment"},
            }
        else:
            kvstore = {"driver": "file", "path": os.path.join(self.location, "arr") + "/"}
        spec: dict[str, Any] = {"driver": "zarr3", "kvstore": kvstore}
        if create:
            inner: list[dict[str, Any]] = [{"name": "bytes", "configuration": {"endian": "little"}}]
            if self.args.codec == "zstd":
                inner.append({"name": "zstd", "configuration": {"level": 1, "checksum": False}})
            side = self.c * CHUNKS_PER_SHARD
            spec["metadata"] = {
                "shape": list(self.shape),
                "data_type": "float32",
                "fill_value": 0,
                "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [side, side]}},
                "codecs": [
                    {
                        "name": "sharding_indexed",
                        "configuration": {
                            "chunk_shape": [self.c, self.c],
                            "codecs": inner,
                            "index_location": "end",
                            "index_codecs": [
                                {"name": "bytes", "configuration": {"endian": "little"}},
                                {"name": "crc32c"},
                            ],
                        },
                    }
                ],
            }
        return spec

    def create(self) -> None:
        import tensorstore as ts

        os.environ.setdefault("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        self.arr = ts.open(self.spec(True), create=True, delete_existing=True).result()

    def write(self, data: np.ndarray) -> None:
        self.arr[...].write(data).result()

    def open(self) -> None:
        import tensorstore as ts

        # a new context: no cache or connection shared with the writer
        self.arr = ts.open(self.spec(False), open=True, context=ts.Context()).result()

    def read(self) -> np.ndarray:
        return self.arr[...].read().result()

    def read_chunk(self, i: int, j: int) -> Any:
        c = self.c
        return self.arr[i * c : (i + 1) * c, j * c : (j + 1) * c].read().result()


def make_impl(args: argparse.Namespace, location: str, shape: tuple[int, int]) -> Impl:
    if args.impl.startswith(("shardkv", "zarr2")):
        return Zarr2(args, location, shape)
    if args.impl.startswith("zarr3"):
        return Zarr3(args, location, shape)
    return TensorStore(args, location, shape)


# -- the sample -----------------------------------------------------------------------------


def unavailable(args: argparse.Namespace) -> str | None:
    if args.backend == "s3" and args.impl == "zarr2-dict":
        return "a dict is not on S3"
    if args.backend == "local" and args.impl == "shardkv-obstore":
        return "S3 only"
    if args.backend == "s3" and not (args.s3_endpoint and args.s3_log):
        return "no S3 server"
    return None


def new_bucket(endpoint: str) -> str:
    import boto3

    name = f"bench-{uuid.uuid4().hex[:16]}"
    client = boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY, region_name=REGION
    )
    client.create_bucket(Bucket=name)
    return name


def run_sample(args: argparse.Namespace, location: str, shape: tuple[int, int], reads: int) -> dict[str, Any]:
    data = make_data(shape, args.seed)
    out: dict[str, Any] = {}
    phase = Phase(args)
    impl = make_impl(args, location, shape)
    impl.create()
    phase.start()
    t0 = time.perf_counter()
    impl.write(data)
    out["write_s"] = time.perf_counter() - t0
    out.update(phase.stop("write"))
    phase.start()
    t0 = time.perf_counter()
    impl.open()
    got = impl.read()
    out["read_s"] = time.perf_counter() - t0
    out.update(phase.stop("read"))
    if not np.array_equal(np.asarray(got), data):
        raise RuntimeError(f"{args.impl}: the array read back differs from the array written")
    rng = np.random.default_rng(args.seed + 1)
    grid = shape[0] // args.layout
    picks = [(int(i), int(j)) for i, j in rng.integers(0, grid, size=(reads, 2))]
    for name in ("cold", "warm"):
        phase.start()
        t0 = time.perf_counter()
        for i, j in picks:
            impl.read_chunk(i, j)
        out[f"{name}_s"] = time.perf_counter() - t0
        out.update(phase.stop(name))
    return out


class Phase:
    """Counts the S3 requests of one phase from the server's request log (nothing for local)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.log = args.s3_log if args.backend == "s3" else None
        self.offset = os.path.getsize(self.log) if self.log else 0

    def start(self) -> None:
        if self.log:
            self.offset = os.path.getsize(self.log)

    def stop(self, name: str) -> dict[str, Any]:
        if not self.log:
            return {}
        time.sleep(0.05)  # the log line of the last response is written before it is sent; margin for the OS
        counts, self.offset = count_requests(self.log, self.offset)
        out: dict[str, Any] = {f"{name}_requests": sum(counts.values())}
        out.update({f"{name}_{method.lower()}": n for method, n in counts.items()})
        return out


def main() -> None:
    args = parse()
    why = unavailable(args)
    if why is not None:
        emit(args, "peers", {"unavailable": why})
        return
    side = SIDES[args.size][(args.backend, args.layout)]
    shape = (side, side)
    reads = RANDOM_READS[args.size]

    def location_in(tmp: str) -> str:
        if args.backend == "s3":
            return f"s3://{new_bucket(args.s3_endpoint)}/data.zarr"
        return os.path.join(tmp, "data.zarr")

    # the S3-only client warms up as plain shardkv, on local disk
    warm_impl = "shardkv" if args.impl == "shardkv-obstore" else args.impl
    warm_args = argparse.Namespace(**{**vars(args), "backend": "local", "impl": warm_impl})
    with TempDir() as tmp:  # warm-up: imports, codec set-up (local, tiny), not recorded
        warm_side = min(args.layout * 4, side)  # smoke's array is smaller than the other sizes' warm-up
        run_sample(warm_args, os.path.join(tmp, "warm.zarr"), (warm_side, warm_side), 2)
    with TempDir() as tmp:
        sample = run_sample(args, location_in(tmp), shape, reads)
    result = {
        "shape": shape,
        "array_bytes": int(np.prod(shape)) * 4,
        "reads": reads,
        "layout": args.layout,
        "codec": args.codec,
        "backend": args.backend,
        "samples": {k: [v] for k, v in sample.items()},
        "peer_versions": peer_versions(),
    }
    emit(args, "peers", result)


def peer_versions() -> dict[str, str]:
    out = {}
    for name in ("zarr", "zarrs", "tensorstore", "obstore", "s3fs", "shardkv"):
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "__version__"):
            out[name] = str(module.__version__)
    return out


if __name__ == "__main__":
    main()
