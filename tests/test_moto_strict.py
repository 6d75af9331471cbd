"""The S3 server the tests start decides conditional writes as S3 does (``tests/moto_strict.py``).

Of writers conditioned on one ETag at most one wins, the others get 412:
for ``PutObject`` (``If-Match``, ``If-None-Match: *``), for
``CompleteMultipartUpload`` (``If-Match``: moto alone ignores it, so a stale
complete replaced another writer's object) and for ``UploadPartCopy``'s
``x-amz-copy-source-if-match`` (ignored by moto alone). Without these every
S3 concurrency test could pass over a lost update unseen.
"""

from __future__ import annotations

import functools
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

boto3 = pytest.importorskip("boto3")
pytest.importorskip("moto.server")
botocore_exceptions = pytest.importorskip("botocore.exceptions")

import moto_strict  # noqa: E402

MIB = 1024 * 1024


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    server, endpoint = moto_strict.start_server()
    try:
        yield endpoint
    finally:
        server.stop()


def _client(endpoint: str) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )


@pytest.fixture
def bucket(server: str) -> str:
    name = f"strict-{uuid.uuid4().hex[:10]}"
    _client(server).create_bucket(Bucket=name)
    return name


def _status(exc: BaseException) -> int:
    return int(exc.response["ResponseMetadata"]["HTTPStatusCode"])  # type: ignore[attr-defined]


@pytest.fixture
def slow_store() -> Iterator[None]:
    with moto_strict.widened_races():
        yield


def _race(n: int, attempt: Any) -> list[int]:
    """``attempt(i)`` in ``n`` threads started together; the indices that won (returned True)."""
    barrier = threading.Barrier(n, timeout=30)
    won: list[int] = []
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait()
            if attempt(i):
                won.append(i)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads) and errors == []
    return won


def _lost(call: Any) -> bool:
    """True when ``call()`` succeeded; False when S3 refused it with 412 (or 409); other errors propagate."""
    try:
        call()
    except botocore_exceptions.ClientError as exc:
        if _status(exc) in (409, 412):
            return False
        raise
    return True


def _put(clients: list[Any], bucket: str, key: str, etag: str, i: int) -> bool:
    return _lost(lambda: clients[i].put_object(Bucket=bucket, Key=key, Body=b"%d" % i, IfMatch=etag))


@pytest.mark.usefixtures("slow_store")
def test_concurrent_conditional_puts_on_one_etag_have_one_winner(server: str, bucket: str) -> None:
    clients = [_client(server) for _ in range(6)]
    rounds = []
    for r in range(6):
        key = f"k{r}"
        etag = clients[0].put_object(Bucket=bucket, Key=key, Body=b"base")["ETag"]
        won = _race(6, functools.partial(_put, clients, bucket, key, etag))
        stored = clients[0].get_object(Bucket=bucket, Key=key)["Body"].read()
        rounds.append((len(won), stored == b"%d" % won[0] if won else False))
    assert rounds == [(1, True)] * 6


def _upload(client: Any, bucket: str, key: str, body: bytes) -> tuple[str, list[dict[str, Any]]]:
    upload_id = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    etag = client.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=1, Body=body)["ETag"]
    return upload_id, [{"PartNumber": 1, "ETag": etag}]


def test_a_stale_complete_multipart_upload_is_refused(server: str, bucket: str) -> None:
    client = _client(server)
    old = client.put_object(Bucket=bucket, Key="k", Body=b"old")["ETag"]
    upload_id, parts = _upload(client, bucket, "k", b"from the upload")
    new = client.put_object(Bucket=bucket, Key="k", Body=b"another writer's")["ETag"]
    with pytest.raises(botocore_exceptions.ClientError) as refused:
        client.complete_multipart_upload(
            Bucket=bucket, Key="k", UploadId=upload_id, MultipartUpload={"Parts": parts}, IfMatch=old
        )
    assert _status(refused.value) == 412
    assert client.get_object(Bucket=bucket, Key="k")["Body"].read() == b"another writer's"
    done = client.complete_multipart_upload(
        Bucket=bucket, Key="k", UploadId=upload_id, MultipartUpload={"Parts": parts}, IfMatch=new
    )
    assert client.get_object(Bucket=bucket, Key="k")["Body"].read() == b"from the upload"
    assert done["ETag"] != new


@pytest.mark.usefixtures("slow_store")
def test_concurrent_completes_on_one_etag_have_one_winner(server: str, bucket: str) -> None:
    clients = [_client(server) for _ in range(4)]
    etag = clients[0].put_object(Bucket=bucket, Key="k", Body=b"base")["ETag"]
    uploads = [_upload(clients[i], bucket, "k", b"upload %d" % i) for i in range(4)]

    def complete(i: int) -> bool:
        upload_id, parts = uploads[i]
        return _lost(
            lambda: clients[i].complete_multipart_upload(
                Bucket=bucket, Key="k", UploadId=upload_id, MultipartUpload={"Parts": parts}, IfMatch=etag
            )
        )

    won = _race(4, complete)
    assert len(won) == 1
    assert clients[0].get_object(Bucket=bucket, Key="k")["Body"].read() == b"upload %d" % won[0]


def test_a_stale_copy_source_if_match_is_refused(server: str, bucket: str) -> None:
    client = _client(server)
    old = client.put_object(Bucket=bucket, Key="src", Body=bytes(5 * MIB))["ETag"]
    client.put_object(Bucket=bucket, Key="src", Body=b"\1" * (5 * MIB))
    upload_id = client.create_multipart_upload(Bucket=bucket, Key="dst")["UploadId"]
    copy = {"Bucket": bucket, "Key": "dst", "UploadId": upload_id, "PartNumber": 1}
    source = {"CopySource": {"Bucket": bucket, "Key": "src"}, "CopySourceRange": f"bytes=0-{5 * MIB - 1}"}
    with pytest.raises(botocore_exceptions.ClientError) as refused:
        client.upload_part_copy(**copy, **source, CopySourceIfMatch=old)
    assert _status(refused.value) == 412
    new = client.head_object(Bucket=bucket, Key="src")["ETag"]
    part = client.upload_part_copy(**copy, **source, CopySourceIfMatch=new)["CopyPartResult"]["ETag"]
    client.complete_multipart_upload(
        Bucket=bucket, Key="dst", UploadId=upload_id, MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part}]}
    )
    assert client.get_object(Bucket=bucket, Key="dst")["Body"].read() == b"\1" * (5 * MIB)
