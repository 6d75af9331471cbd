"""P21 S3: bytes per warm chunk read and requests of a cold chunk read, counted at the S3 server.

This process runs its own S3 server (moto's WSGI app on 127.0.0.1, a free
port, in a thread) behind a counting layer that records, per request, the
method (a ``GET`` that lists keys counts as ``LIST``), the status, the bytes
of the response body and whether it carried ``Range`` / ``If-Match``. Two
uint8 arrays of 256-byte chunks are written with plain file writes in the
layout shardkv stores (``_fixtures.py``: ``zarr.json`` + shards, index at the
end with CRC32C) and uploaded, one object per file, with boto3:

* ``1024``: 2-D, 16 x 16 chunks, 32 x 32 = 1,024 chunks per shard (index
  16 KiB + 4 B); grid 32 x 32 chunks (tiny) or 64 x 64 (small, full).
* ``32768``: 3-D, 4 x 8 x 8 chunks, 32 x 32 x 32 = 32,768 chunks per shard
  (index 512 KiB + 4 B); grid 2 x 8 x 32 (tiny) or 32 x 32 x 32 (one full shard).

Size smoke (the test suite's check that the workload runs): two shards per layout
(the second partial), 3 reads.

Per implementation and layout, counted at the server:

* ``cold``: a new store object, ``zarr.open_array(store, mode="r")`` and one
  chunk read (tensorstore: ``ts.open`` with a new context and one chunk read).
* ``warm``: through that array, ``reads`` distinct seeded random chunks read
  once (not counted), then the same chunks again (counted): body bytes /
  (reads x 256 B) is the figure with the goal <= 1.1, with requests per
  read.

Implementations: ``shardkv`` (zarr 2.18 on ``ShardedStore("s3://...",
storage_options=...)``, s3fs), ``shardkv-obstore`` (``ShardedStore`` over an
obstore ``S3Store``) and ``tensorstore`` (its ``zarr3`` driver on its ``s3``
kvstore, default context, run by the interpreter given with
``--tensorstore-python``, an environment that has it: the zarr 3 one). Every
chunk read is checked against the bytes written.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import subprocess
import sys
import textwrap
import threading
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from _common import TempDir, emit, shardkv_features
from _fixtures import chunk_bytes, write_sharded
from s3_server import ACCESS_KEY, REGION, SECRET_KEY

LAYOUTS: dict[str, dict[str, Any]] = {
    "1024": {
        "chunk": (16, 16),
        "per_shard": (32, 32),
        "grid": {"smoke": (4, 40), "tiny": (32, 32), "small": (64, 64), "full": (64, 64)},
    },
    "32768": {
        "chunk": (4, 8, 8),
        "per_shard": (32, 32, 32),
        "grid": {"smoke": (1, 2, 40), "tiny": (2, 8, 32), "small": (32, 32, 32), "full": (32, 32, 32)},
    },
}
# smoke: the test suite's check that the workload runs (two shards per layout, the second partial)
READS = {"smoke": 3, "tiny": 10, "small": 100, "full": 200}
CHUNK_BYTES = 256
IMPLS = ("shardkv", "shardkv-obstore", "tensorstore")


class CountingApp:
    """A WSGI layer in front of moto counting every request: method, status, body bytes, Range, If-Match."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.lock = threading.Condition()
        self.records: list[dict[str, Any]] = []
        self.active = 0  # requests begun (before any byte of the response is sent) and not yet recorded

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterator[bytes]:
        method = environ["REQUEST_METHOD"]
        query = environ.get("QUERY_STRING", "")
        if method == "GET" and ("list-type" in query or "prefix=" in query or "delimiter=" in query):
            method = "LIST"
        record = {
            "method": method,
            "path": environ.get("PATH_INFO", ""),
            "range": environ.get("HTTP_RANGE"),
            "if_match": environ.get("HTTP_IF_MATCH"),
            "status": 0,
            "bytes": 0,
        }
        with self.lock:
            self.active += 1

        def counting_start(status: str, headers: Any, exc_info: Any = None) -> Any:
            record["status"] = int(status.split(" ", 1)[0])
            return start_response(status, headers, exc_info)

        body = self.app(environ, counting_start)
        try:
            for piece in body:
                record["bytes"] += len(piece)
                yield piece
        finally:
            close = getattr(body, "close", None)
            if close is not None:
                close()
            with self.lock:
                self.records.append(record)
                self.active -= 1
                self.lock.notify_all()

    def take(self) -> list[dict[str, Any]]:
        """The requests recorded since the last call, once every request begun is recorded.

        A client has its response only after the request began here, so every request it
        made is then either recorded or still counted in ``active``.
        """
        with self.lock:
            if not self.lock.wait_for(lambda: self.active == 0, timeout=30):
                raise RuntimeError(f"{self.active} S3 requests still unfinished after 30 s")
            out, self.records = self.records, []
        return out


def start_server() -> tuple[Any, CountingApp, str]:
    import logging

    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
    import moto_strict

    moto_strict.install()  # conditional writes decided as S3 decides them, as in every server of the suite
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no access log on stderr: the counting layer counts
    app = CountingApp(DomainDispatcherApplication(create_backend_app))
    server = make_server("127.0.0.1", 0, app, threaded=True)
    # a short poll interval: shutdown() returns within it (counts do not depend on it)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server, app, f"http://127.0.0.1:{server.server_port}"


def summary(records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    records = list(records)
    by_method = Counter(r["method"] for r in records)
    return {
        "requests": len(records),
        "bytes": sum(r["bytes"] for r in records),
        "conditional": sum(1 for r in records if r["if_match"]),
        "ranged": sum(1 for r in records if r["range"]),
        "status_412": sum(1 for r in records if r["status"] == 412),
        "by_method": dict(sorted(by_method.items())),
        # the first requests one by one (all of a cold read): method, object, Range, If-Match?, status, bytes
        "first_requests": [
            f"{r['method']} {r['path'].rsplit('/', 1)[-1]} {r['range'] or '-'}"
            f"{' if-match' if r['if_match'] else ''} {r['status']} {r['bytes']}B"
            for r in records[:8]
        ],
    }


def upload(endpoint: str, root: str) -> str:
    """Every file under ``root`` as one object of a new bucket, keys ``data/<relative path>``; the bucket."""
    import boto3

    client = boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY, region_name=REGION
    )
    bucket = f"bench-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    for name in sorted(os.listdir(root)):
        with open(os.path.join(root, name), "rb") as f:
            client.put_object(Bucket=bucket, Key=f"data/{name}", Body=f.read())
    return bucket


def picks(grid: tuple[int, ...], n: int, seed: int) -> list[tuple[int, ...]]:
    """``n + 1`` distinct seeded chunk coordinates: the first for the cold read, the rest for the warm reads."""
    total = int(np.prod(grid))
    flat = np.random.default_rng(seed).choice(total, size=min(n + 1, total), replace=False)
    return [tuple(int(c) for c in np.unravel_index(int(f), grid)) for f in flat]


# -- shardkv (zarr 2.18 in this process) ---------------------------------------------------------


def shardkv_store(impl: str, endpoint: str, bucket: str) -> Any:
    from shardkv import ShardedStore

    kwargs: dict[str, Any] = {}
    if "concurrency" in shardkv_features()["params"]:
        kwargs["concurrency"] = "process"  # one reader; no lock objects on the bucket
    if impl == "shardkv-obstore":
        from obstore.store import S3Store

        base = S3Store(
            bucket,
            prefix="data",
            endpoint=endpoint,
            region=REGION,
            access_key_id=ACCESS_KEY,
            secret_access_key=SECRET_KEY,
            client_options={"allow_http": True},
        )
        return ShardedStore(base, **kwargs)
    options = {
        "key": ACCESS_KEY,
        "secret": SECRET_KEY,
        "client_kwargs": {"endpoint_url": endpoint, "region_name": REGION},
    }
    return ShardedStore(f"s3://{bucket}/data", storage_options=options, **kwargs)


def measure_shardkv(
    impl: str,
    app: CountingApp,
    endpoint: str,
    bucket: str,
    layout: dict[str, Any],
    coords: list[tuple[int, ...]],
    seed: int,
) -> dict[str, Any]:
    import zarr

    chunk = layout["chunk"]

    def read(z: Any, c: tuple[int, ...]) -> None:
        got = np.asarray(z[tuple(slice(i * n, (i + 1) * n) for i, n in zip(c, chunk, strict=True))]).tobytes()
        if got != chunk_bytes(c, CHUNK_BYTES, seed):
            raise RuntimeError(f"{impl}: chunk {c} read back differs from the bytes written")

    app.take()
    z = zarr.open_array(store=shardkv_store(impl, endpoint, bucket), mode="r")
    read(z, coords[0])
    cold = summary(app.take())
    for c in coords[1:]:
        read(z, c)
    first = summary(app.take())
    for c in coords[1:]:
        read(z, c)
    return {"cold": cold, "first": first, "warm": summary(app.take())}


# -- tensorstore (a child process in the environment that has it) ---------------------------------

_TENSORSTORE = textwrap.dedent(
    """
    import json, os, sys
    import tensorstore as ts
    cfg = json.loads(sys.argv[1])
    os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"] = cfg["key"], cfg["secret"]
    spec = {"driver": "zarr3", "kvstore": {"driver": "s3", "bucket": cfg["bucket"], "path": "data/",
            "endpoint": cfg["endpoint"], "aws_region": cfg["region"], "aws_credentials": {"type": "environment"}}}
    chunk = cfg["chunk"]
    def read(arr, c):
        sel = tuple(slice(i * n, (i + 1) * n) for i, n in zip(c, chunk))
        return arr[sel].read().result().tobytes().hex()
    def phase(name, out):
        print(json.dumps({"phase": name, "chunks": out}), flush=True)
        sys.stdin.readline()
    arr = ts.open(spec, open=True, context=ts.Context()).result()
    phase("cold", [read(arr, cfg["coords"][0])])
    phase("first", [read(arr, c) for c in cfg["coords"][1:]])
    phase("warm", [read(arr, c) for c in cfg["coords"][1:]])
    """
)


def measure_tensorstore(
    python: str,
    app: CountingApp,
    endpoint: str,
    bucket: str,
    layout: dict[str, Any],
    coords: list[tuple[int, ...]],
    seed: int,
    timeout: float = 300.0,
) -> dict[str, Any]:
    cfg = {
        "key": ACCESS_KEY,
        "secret": SECRET_KEY,
        "bucket": bucket,
        "endpoint": endpoint,
        "region": REGION,
        "chunk": list(layout["chunk"]),
        "coords": [list(c) for c in coords],
    }
    app.take()
    proc = subprocess.Popen(
        [python, "-c", _TENSORSTORE, json.dumps(cfg)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out: dict[str, Any] = {}
    if proc.stdout is None or proc.stdin is None:
        raise RuntimeError("tensorstore child: no pipes")
    try:
        for name, expected in (("cold", coords[:1]), ("first", coords[1:]), ("warm", coords[1:])):
            ready, _, _ = select.select([proc.stdout], [], [], timeout)
            line = proc.stdout.readline() if ready else ""
            if not line:
                proc.kill()
                err = proc.stderr.read() if proc.stderr else ""
                raise RuntimeError(f"tensorstore child: no answer for phase {name}: {err.strip()[-400:]}")
            doc = json.loads(line)
            out[name] = summary(app.take())  # the child waits for our newline: nothing of the next phase yet
            if [bytes.fromhex(h) for h in doc["chunks"]] != [chunk_bytes(c, CHUNK_BYTES, seed) for c in expected]:
                raise RuntimeError(f"tensorstore: chunks of phase {name} differ from the bytes written")
            proc.stdin.write("\n")
            proc.stdin.flush()
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--size", choices=sorted(READS), default="small")
    parser.add_argument("--repeat", type=int, default=1, help="ignored: counts do not vary")
    parser.add_argument("--impl", choices=("all", *IMPLS), default="all", help="all: every implementation")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tensorstore-python", help="interpreter with tensorstore (the zarr 3 environment)")
    args = parser.parse_args()
    try:
        import moto  # noqa: F401
    except ImportError:
        emit(args, "s3_reads", {"unavailable": "moto is not installed here"})
        return
    impls = IMPLS if args.impl == "all" else (args.impl,)
    results: dict[str, Any] = {}
    server, app, endpoint = start_server()
    try:
        with TempDir() as tmp:
            for name, layout in LAYOUTS.items():
                grid = layout["grid"][args.size]
                root = os.path.join(tmp, f"l{name}")
                write_sharded(root, grid, layout["chunk"], layout["per_shard"], args.seed)
                bucket = upload(endpoint, root)
                coords = picks(grid, READS[args.size], args.seed)
                for impl in impls:
                    key = f"{impl}/{name}"
                    if impl == "tensorstore":
                        if not args.tensorstore_python or not os.path.exists(args.tensorstore_python):
                            results[key] = {"unavailable": "no interpreter with tensorstore"}
                            continue
                        results[key] = measure_tensorstore(
                            args.tensorstore_python, app, endpoint, bucket, layout, coords, args.seed
                        )
                    else:
                        results[key] = measure_shardkv(impl, app, endpoint, bucket, layout, coords, args.seed)
                    results[key]["reads"] = len(coords) - 1
                    results[key]["index_bytes"] = int(np.prod(layout["per_shard"])) * 16 + 4
    finally:
        server.shutdown()
    # samples: one per figure, so that run.py's medians and raw-sample lines work as for every workload
    samples = {}
    for key, r in results.items():
        if "unavailable" in r:
            continue
        samples[f"{key}/warm_bytes_per_chunk_byte"] = [r["warm"]["bytes"] / (r["reads"] * CHUNK_BYTES)]
        samples[f"{key}/warm_requests_per_read"] = [r["warm"]["requests"] / r["reads"]]
        samples[f"{key}/cold_requests"] = [r["cold"]["requests"]]
        samples[f"{key}/cold_get"] = [r["cold"]["by_method"].get("GET", 0)]
    emit(
        args,
        "s3_reads",
        {
            "chunk_bytes": CHUNK_BYTES,
            "reads": READS[args.size],
            "results": results,
            "samples": samples,
            "features": shardkv_features()["params"],
        },
    )


if __name__ == "__main__":
    main()
