"""O(chunk) updates of S3 objects: a multipart upload whose first parts are server-side copies of the kept bytes.

The I/O of :meth:`S3Store.update_tail <shardkv.storage.s3.S3Store.update_tail>`
(what is written where is planned by :func:`shardkv.format.tail.plan_tail_update`,
``how="clone"``)::

    stored (ETag E):  | kept bytes [0, keep)                  | old index |
    upload:           | UploadPartCopy ... (If-Match E, <=5 GiB each) | UploadPart: new chunks + new index |
    complete:         CompleteMultipartUpload If-Match: E  -> the new object, ETag E'

Every copied part is pinned to ``E`` by ``x-amz-copy-source-if-match`` and
the complete by ``If-Match: E``, so the object is replaced only if it is
still the one whose index was read; readers see the old object or the new
one (S3 makes a completed upload visible at once). A condition that fails
(``412``, ``409 ConditionalRequestConflict``, ``404`` for an object deleted
since, ``NoSuchUpload`` for an upload reclaimed meanwhile) is a lost race:
the upload is aborted and the caller plans again. Every part but the last
must hold at least :data:`MIN_PART_NBYTES` (S3's rule), so the kept bytes
must too. Leading dead bytes (a shard's reserve) are left out by copying
from after them (``drop``). A writer killed between the parts leaves the old object as it was
and an incomplete upload, which :func:`incomplete_uploads` lists and
``shardkv compact`` aborts (:meth:`S3Store.abort_incomplete_writes
<shardkv.storage.s3.S3Store.abort_incomplete_writes>`).

The requests go the way every request of the store goes (``S3Store._api``:
through s3fs, with its extra arguments such as server-side encryption).
"""

from __future__ import annotations

import datetime
from collections.abc import Awaitable, Callable
from typing import Any

MIN_PART_NBYTES = 5 * 1024 * 1024
"""S3's smallest part of a multipart upload but the last (bytes)."""

MAX_PART_NBYTES = 5 * 1024 * 1024 * 1024
"""S3's largest part (and largest ``UploadPartCopy`` range), bytes."""

_MAX_PAGES = 100_000  # ListMultipartUploads pages (1,000 uploads each), at most

LOST_CODES = frozenset({"PreconditionFailed", "ConditionalRequestConflict", "NoSuchKey", "NoSuchUpload"})
"""Error codes of an update that lost its race (the object changed, vanished, or the upload was reclaimed)."""

Call = Callable[..., Awaitable[Any]]  # one request of the client (``call("upload_part", **kwargs)``)


def copy_ranges(keep: int) -> list[tuple[int, int]]:
    """Half-open byte ranges of equal size, each ``MIN_PART_NBYTES <= size <= MAX_PART_NBYTES``, covering ``[0, keep)``.

    Raises
    ------
    ValueError
        If ``keep`` is below :data:`MIN_PART_NBYTES`.
    """
    if keep < MIN_PART_NBYTES:
        raise ValueError(f"{keep} bytes cannot be copied as a part: S3's parts but the last hold >= {MIN_PART_NBYTES}")
    n = -(-keep // MAX_PART_NBYTES)
    bounds = [keep * i // n for i in range(n + 1)]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


async def copy_update(call: Call, bucket: str, key: str, etag: str, keep: int, body: bytes, drop: int = 0) -> str:
    """Replace ``bucket/key`` (ETag ``etag``) by its bytes ``[drop, drop + keep)`` (copied on the server) and ``body``.

    Returns
    -------
    str
        The new object's ETag.

    Raises
    ------
    Exception
        The client's error; a lost race (:data:`LOST_CODES`) among them. The
        upload is aborted before any error is raised.
    """
    upload = await call("create_multipart_upload", Bucket=bucket, Key=key)
    upload_id = upload["UploadId"]
    try:
        parts = []
        for number, (start, stop) in enumerate(copy_ranges(keep), 1):
            copied = await call(
                "upload_part_copy",
                Bucket=bucket,
                Key=key,
                UploadId=upload_id,
                PartNumber=number,
                CopySource={"Bucket": bucket, "Key": key},
                CopySourceRange=f"bytes={drop + start}-{drop + stop - 1}",
                CopySourceIfMatch=etag,
            )
            parts.append({"PartNumber": number, "ETag": copied["CopyPartResult"]["ETag"]})
        last = len(parts) + 1
        sent = await call("upload_part", Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=last, Body=body)
        parts.append({"PartNumber": last, "ETag": sent["ETag"]})
        done = await call(
            "complete_multipart_upload",
            Bucket=bucket,
            Key=key,
            UploadId=upload_id,
            MultipartUpload={"Parts": parts},
            IfMatch=etag,
        )
    except BaseException as exc:
        try:
            await call("abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id)
        except Exception as abort_error:  # the upload stays for compact; the first error is the one to tell
            exc.add_note(f"aborting the upload {upload_id} of {bucket}/{key} failed too: {abort_error!r}")
        raise
    return str(done["ETag"])


async def incomplete_uploads(call: Call, bucket: str, prefix: str, min_age_seconds: float) -> list[tuple[str, str]]:
    """``(key, upload id)`` of the multipart uploads under ``bucket/prefix`` begun ``min_age_seconds`` ago or more."""
    now = datetime.datetime.now(datetime.UTC)
    kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
    found: list[tuple[str, str]] = []
    for _ in range(_MAX_PAGES):
        page = await call("list_multipart_uploads", **kwargs)
        for upload in page.get("Uploads", []):
            begun = upload.get("Initiated")
            if begun is None or (now - begun).total_seconds() >= min_age_seconds:
                found.append((upload["Key"], upload["UploadId"]))
        if not page.get("IsTruncated"):
            break
        kwargs["KeyMarker"], kwargs["UploadIdMarker"] = page.get("NextKeyMarker"), page.get("NextUploadIdMarker")
    return found
