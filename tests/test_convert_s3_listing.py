"""`shardkv convert` lists an S3 source lazily: one ``ListObjectsV2`` page at a time.

The S3 server (moto) runs in a child process bound to 127.0.0.1, so that
``tracemalloc`` in this process sees only the client's allocations. The
listing's page size is forced small (``MaxKeys``) by wrapping s3fs's request
call on the filesystem instance, which also counts the list requests: the
first key comes out after one page, and the memory a listing of 10N keys holds
while it runs (traced peak less what stays) is within 1.25x that of N keys.
"""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys
import tracemalloc
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

from shardkv.cli.convert import convert  # noqa: E402
from shardkv.cli.convert import listing as convert_listing  # noqa: E402
from shardkv.cli.convert.listing import iter_array_keys, list_array  # noqa: E402
from shardkv.cli.stores import open_store  # noqa: E402
from shardkv.cli.view import HierarchyView  # noqa: E402

BUCKET = "shardkv-listing"
PAGE = 10  # MaxKeys forced on every list request of these tests

_SERVER = """
import logging, sys
sys.path.insert(0, sys.argv[2])  # tests/, for moto_strict
import moto_strict
logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one log line per request otherwise
server, _ = moto_strict.start_server(int(sys.argv[1]))
print("ready", flush=True)
sys.stdin.read()  # until the test closes stdin
server.stop()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3() -> Iterator[dict[str, Any]]:
    """Storage options of a moto S3 server in a child process, with one bucket."""
    boto3 = pytest.importorskip("boto3")

    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVER, str(port), str(Path(__file__).parent)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        endpoint = f"http://127.0.0.1:{port}"
        options = {
            "key": "testing",
            "secret": "testing",
            "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        }
        client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )
        client.create_bucket(Bucket=BUCKET)  # the server listens once it printed "ready"
        yield options
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=20)


def _put_array(options: dict[str, Any], n_chunks: int, extra: dict[str, bytes] | None = None) -> str:
    """A v2 group with one 1-d array ``a`` of ``n_chunks`` one-byte chunks on S3; returns its URL."""
    import s3fs

    root = f"{BUCKET}/src-{uuid.uuid4().hex[:8]}.zarr"
    zarray = {
        "zarr_format": 2,
        "shape": [n_chunks],
        "chunks": [1],
        "dtype": "|u1",
        "compressor": None,
        "fill_value": 0,
        "filters": None,
        "order": "C",
    }
    objects = {f"{root}/.zgroup": b'{"zarr_format": 2}', f"{root}/a/.zarray": json.dumps(zarray).encode()}
    objects.update({f"{root}/a/{i}": bytes([i % 251]) for i in range(n_chunks)})
    objects.update({f"{root}/{k}": v for k, v in (extra or {}).items()})
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
    fs.pipe(objects)
    return f"s3://{root}"


class _ListCounter:
    """Wraps ``fs._call_s3`` on one filesystem instance: list requests get ``MaxKeys=PAGE`` and are counted."""

    def __init__(self, fs: Any) -> None:
        self.calls = 0
        self._inner = fs._call_s3

    async def __call__(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if method == "list_objects_v2":
            self.calls += 1
            kwargs["MaxKeys"] = PAGE
        return await self._inner(method, *args, **kwargs)


def _adapter(url: str, options: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> tuple[Any, _ListCounter]:
    adapter = HierarchyView(open_store(url, options, role="source"))
    counter = _ListCounter(adapter.kv.fs)
    monkeypatch.setattr(adapter.kv.fs, "_call_s3", counter)
    monkeypatch.setattr(convert_listing, "PAGE_KEYS", PAGE)  # names taken per step: one forced page
    return adapter, counter


def test_the_listing_is_taken_a_page_at_a_time(s3, monkeypatch):
    n = 95
    url = _put_array(s3, n, {"a/0.shardkv-tmp-x": b"junk", "a/.shardkv-locks/0": b""})
    adapter, counter = _adapter(url, s3, monkeypatch)
    keys = iter_array_keys(adapter, "a")
    first = next(keys)
    assert counter.calls == 1  # one page fetched before the first key is handed out
    seen = [first]
    for key in keys:
        seen.append(key)
        assert counter.calls <= (len(seen) + 2) // PAGE + 1  # never more than one page ahead (2 names hidden)
    stored = n + 1 + 2  # chunks, .zarray and the two names shardkv keeps for itself
    assert counter.calls == math.ceil(stored / PAGE)
    assert sorted(seen) == sorted(["a/.zarray", *(f"a/{i}" for i in range(n))])  # shardkv's own files left out


def test_list_array_sets_a_bit_per_chunk_from_the_pages(s3, monkeypatch):
    url = _put_array(s3, 57, {"a/57": b"\x00", "a/notes.txt": b"x"})  # one chunk outside the grid, one other key
    adapter, counter = _adapter(url, s3, monkeypatch)
    zarray = json.loads(bytes(adapter.values(["a/.zarray"])["a/.zarray"]))
    listing = list_array(adapter, "a", zarray, ["a/.zarray"])
    assert (listing.n_chunks, listing.stale_keys, listing.other_keys) == (57, ["a/57"], ["a/notes.txt"])
    assert counter.calls == math.ceil(60 / PAGE)


def _listing_peak(url: str, options: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> tuple[int, int]:
    adapter, counter = _adapter(url, options, monkeypatch)
    zarray = json.loads(bytes(adapter.values(["a/.zarray"])["a/.zarray"]))
    tracemalloc.start()
    try:
        listing = list_array(adapter, "a", zarray, [])
        retained, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # what the listing held while it ran and let go of: a ``find`` holds every key's info here.
    # (What stays is the bitmap and bounded caches of yarl, urllib and the key decoder.)
    return listing.n_chunks, peak - retained


def test_listing_memory_does_not_grow_with_the_number_of_keys(s3, monkeypatch):
    small_url, large_url = _put_array(s3, 300), _put_array(s3, 3000)
    # warm: botocore loads its service model on the first list, and the URL caches of yarl and
    # urllib (128-256 entries, one per request: each page has its own continuation token) fill up
    _listing_peak(large_url, s3, monkeypatch)
    n_small, small = _listing_peak(small_url, s3, monkeypatch)
    n_large, large = _listing_peak(large_url, s3, monkeypatch)
    assert (n_small, n_large) == (300, 3000)
    assert large <= 1.25 * small, (small, large)


def test_a_nested_s3_source_converts_like_its_local_copy(s3, tmp_path):
    import s3fs

    local = tmp_path / "src"
    g = zarr.open_group(zarr.NestedDirectoryStore(str(local)), mode="w")
    g.create_dataset("x", data=np.arange(15 * 14, dtype="i4").reshape(15, 14), chunks=(2, 3))
    root = f"{BUCKET}/nested-{uuid.uuid4().hex[:8]}.zarr"
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **s3)
    fs.put(str(local), root, recursive=True)
    fs.pipe({f"{root}/x/0/0.shardkv-tmp-1": b"left by a killed writer"})
    from_s3, from_disk = tmp_path / "from-s3", tmp_path / "from-disk"
    report = convert(f"s3://{root}", str(from_s3), (3, 2), src_storage_options=s3)
    convert(str(local), str(from_disk), (3, 2))
    assert report.arrays[0].separator == "/" and report.chunks == 8 * 5

    def files(d: Path) -> dict[str, bytes]:
        return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}

    assert files(from_s3) == files(from_disk)
