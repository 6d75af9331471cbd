"""Values written from their parts (no join), local writes by ``os.writev``, local reads by ``pread``,
and the object-store path of the fsspec/S3 store (s3fs on a loopback server): one GET per read."""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest

from shardkv.format.ranges import ByteRange
from shardkv.storage import files
from shardkv.storage.files import byte_parts, join_parts
from shardkv.storage.kv import ANY, TEMP_MARKER, KVStore
from shardkv.storage.open import kv_of_fs, open_kv

pytestmark = pytest.mark.zarr2

PARTS = [b"head-", memoryview(b"xxbodyxx")[2:6], np.arange(2, dtype="<u2"), b"", bytearray(b"!")]
JOINED = b"head-body\x00\x00\x01\x00!"


@pytest.fixture(params=["dict", "memory", "local"])
def kv(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[KVStore]:
    if request.param == "dict":
        yield open_kv({})
    elif request.param == "memory":
        root = f"memory://shardkv-parts-{uuid.uuid4().hex}"
        yield open_kv(root)
        fsspec.filesystem("memory").rm(root, recursive=True)
    else:
        yield open_kv(str(tmp_path / "store"))


def whole(kv: KVStore, key: str) -> bytes:
    return bytes(kv.get(key).whole())


def test_parts_helpers() -> None:
    assert b"".join(bytes(v) for v in byte_parts(PARTS)) == JOINED
    assert all(v.format == "B" and v.ndim == 1 and v.nbytes for v in byte_parts(PARTS))
    assert join_parts(PARTS) == JOINED
    same = b"abc"
    assert join_parts(same) is same and join_parts([same]) is same  # nothing to copy
    assert join_parts(np.arange(3, dtype="<u1")) == b"\x00\x01\x02"


@pytest.mark.parametrize("value", [pytest.param(PARTS, id="list"), pytest.param(tuple(PARTS), id="tuple")])
def test_put_many_takes_parts(kv: KVStore, value: Any) -> None:
    kv.put_many({"a/0": (value, ANY), "a/1": (b"plain", ANY)})
    kv.put("a/2", [])
    assert whole(kv, "a/0") == JOINED
    assert whole(kv, "a/1") == b"plain"
    assert whole(kv, "a/2") == b""


def test_local_write_survives_short_writev(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.writev
    calls = []

    def short_writev(fd: int, buffers: Any) -> int:  # the kernel may write less than asked
        buffers = list(buffers)
        calls.append(len(buffers))
        return real(fd, [bytes(memoryview(buffers[0])[:3])])

    monkeypatch.setattr(files.os, "writev", short_writev)
    open_kv(str(tmp_path)).put("k", PARTS)
    assert (tmp_path / "k").read_bytes() == JOINED
    assert len(calls) >= len(JOINED) // 3  # every short write was resumed where it stopped


def test_local_write_batches_more_parts_than_iov_max(tmp_path: Path) -> None:
    parts = [bytes([i % 251]) for i in range(files.IOV_MAX * 2 + 5)]
    open_kv(str(tmp_path)).put("many", parts)
    assert (tmp_path / "many").read_bytes() == b"".join(parts)


def test_failed_local_write_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kv = open_kv(str(tmp_path))
    kv.put("d/k", b"old")

    def broken(fd: int, buffers: Any) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, "writev", broken)
    with pytest.raises(OSError):
        kv.put("d/k", [b"new", b"er"])
    assert (tmp_path / "d" / "k").read_bytes() == b"old"
    assert not [p for p in (tmp_path / "d").iterdir() if TEMP_MARKER in p.name]


def test_local_write_makes_missing_directories(tmp_path: Path) -> None:
    open_kv(str(tmp_path / "root")).put("x/y/z", [b"1", b"2"])
    assert (tmp_path / "root" / "x" / "y" / "z").read_bytes() == b"12"


@pytest.mark.parametrize(
    "byte_range, expected",
    [
        pytest.param(ByteRange(2, 5), b"234", id="middle"),
        pytest.param(ByteRange.suffix(3), b"789", id="suffix"),
        pytest.param(ByteRange.suffix(30), b"0123456789", id="suffix-longer-than-file"),
        pytest.param(ByteRange(6), b"6789", id="open-ended"),
        pytest.param(ByteRange(8, 30), b"89", id="past-end"),
        pytest.param(ByteRange(30, 40), b"", id="after-end"),
    ],
)
def test_local_pread_ranges(tmp_path: Path, byte_range: ByteRange, expected: bytes) -> None:
    kv = open_kv(str(tmp_path))
    kv.put("f", b"0123456789")
    assert [bytes(v) for v in kv.get("f", [byte_range]).values or []] == [expected]
    both = kv.get_many([("f", [byte_range], ANY), ("nope", [byte_range], ANY)])  # the concurrent path
    assert [bytes(v) for v in both[0].values or []] == [expected] and both[1].state == "missing"


def test_local_reads_of_directories_are_damage_not_values(tmp_path: Path) -> None:
    kv = open_kv(str(tmp_path))
    kv.put("d/k", b"v")
    assert {k: bytes(v) for k, v in kv.values(["d/k"]).items()} == {"d/k": b"v"}
    with pytest.raises(IsADirectoryError, match="'d' is a directory"):  # never read as an empty value
        kv.get("d")


def test_mapping_ranges_of_bytes_are_views(kv: KVStore) -> None:
    kv.put("s", b"0123456789")
    (value,) = kv.get("s", [ByteRange(2, 4)]).values or []
    assert bytes(value) == b"23"


# -- s3fs on a loopback S3 server -----------------------------------------------------


@pytest.fixture(scope="module")
def s3() -> Iterator[tuple[Any, list[str]]]:
    """An s3fs filesystem on moto (127.0.0.1) and the list of requests the server saw."""
    import logging

    import moto_strict
    import s3fs

    seen: list[str] = []

    class Record(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if isinstance(record.args, tuple) and record.args:
                seen.append(re.sub(r"\x1b\[[0-9;]*m", "", str(record.args[0])).split(" ")[0])  # uncoloured

    handler = Record()
    logging.getLogger("werkzeug").addHandler(handler)
    logging.getLogger("werkzeug").setLevel(logging.INFO)
    server, endpoint = moto_strict.start_server()  # conditional writes decided as S3 decides them
    fs = s3fs.S3FileSystem(
        key="k",
        secret="s",
        skip_instance_cache=True,
        client_kwargs={"endpoint_url": endpoint, "region_name": "us-east-1"},
    )
    yield fs, seen
    server.stop()
    logging.getLogger("werkzeug").removeHandler(handler)


def test_object_store_reads_are_one_get_each(s3: tuple[Any, list[str]]) -> None:
    fs, seen = s3
    bucket = f"shardkv-{uuid.uuid4().hex[:10]}"
    import boto3

    boto3.client(
        "s3",
        endpoint_url=fs.client_kwargs["endpoint_url"],
        aws_access_key_id="k",
        aws_secret_access_key="s",
        region_name="us-east-1",
    ).create_bucket(Bucket=bucket)
    kv = kv_of_fs(fs, bucket)
    kv.put_many({"a/0": ([b"01", b"23"], ANY), "a/empty": (b"", ANY)})
    fs.invalidate_cache()
    seen.clear()
    assert {k: bytes(v) for k, v in kv.values(["a/0", "a/missing"]).items()} == {"a/0": b"0123"}
    assert kv.contains("a/0") and not kv.contains("a/missing")
    assert whole(kv, "a/0") == b"0123"
    assert seen == ["GET", "GET", "HEAD", "HEAD", "GET"]  # one request per read or probe: no HEAD or LIST before a read
    assert whole(kv, "a/empty") == b"" and kv.contains("a/empty")  # an empty object, read plainly
    assert kv.get("a/missing").state == "missing"
