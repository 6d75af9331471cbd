"""A :class:`~shardkv.storage.kv.KVStore` over S3 (or an S3-protocol server) through s3fs's client.

Generations are ETags, returned by the very request that reads the bytes. A
byte range is one ``GetObject`` with a ``Range`` header (and ``If-Match`` when
conditioned: a ``412`` is "stale"), so a warm chunk read is one request of the
chunk's bytes; a zero-range read is one ``HeadObject``. Puts carry ``If-Match``
or ``If-None-Match: *`` (a ``412``/``409`` is a lost race); deletes carry
``If-Match`` (S3 since 2024, moto). The requests of one call run
concurrently on s3fs's event loop, :data:`IN_FLIGHT` at most. Listings are
``ListObjectsV2`` (with their ETags). "Not found" is "missing"; permission and
network errors propagate unchanged. An update of some chunks of a stored shard
whose kept bytes hold at least 5 MiB is a multipart upload that copies them on
the server (:mod:`shardkv.storage.s3_updates`).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from typing import Any, TypeVar

from fsspec.asyn import sync  # s3fs runs on fsspec's event loop

from shardkv.errors import UnsupportedError
from shardkv.format.ranges import ByteRange
from shardkv.format.tail import TailHow
from shardkv.storage.files import join_parts
from shardkv.storage.fsspec import fs_location
from shardkv.storage.kv import (
    ANY,
    NO_VALUE,
    Capabilities,
    Generation,
    KVStore,
    ReadRequest,
    ReadResult,
    Value,
    hidden,
)
from shardkv.storage.local import DEFAULT_TEMP_AGE
from shardkv.storage.objects import Fetched, Outcome, child_names, metadata_only, read_objects
from shardkv.storage.s3_updates import LOST_CODES, MIN_PART_NBYTES, copy_update, incomplete_uploads

T = TypeVar("T")

IN_FLIGHT = 32
"""Requests of one call in flight at once, at most."""

_LOST_RACE_CODES = frozenset({"PreconditionFailed", "ConditionalRequestConflict"})
_MISSING_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
_MAX_PAGES = 1_000_000  # ListObjectsV2 pages of one listing (1,000 keys each), at most


def http_range(byte_range: ByteRange) -> str:
    """The HTTP ``Range`` header of a non-empty byte range (HTTP ranges include their last byte)."""
    if byte_range.is_suffix:
        return f"bytes={byte_range.start}"  # start is negative: "bytes=-N"
    if byte_range.stop is None:
        return f"bytes={byte_range.start}-"
    return f"bytes={byte_range.start}-{byte_range.stop - 1}"


_SLOTS: ContextVar[asyncio.Semaphore] = ContextVar("shardkv_s3_slots")
"""The request slots of the call running (every request of one call takes one: IN_FLIGHT at most)."""


async def _limited(calls: Sequence[Callable[[], Awaitable[T]]]) -> list[T]:
    """Await every call's coroutine concurrently, in slots; the results in order. Every call runs to its end
    before an error is raised (the first, in call order): no request is left running behind the caller's back."""
    token = _SLOTS.set(asyncio.Semaphore(IN_FLIGHT))
    try:
        results = await asyncio.gather(*(call() for call in calls), return_exceptions=True)
    finally:
        _SLOTS.reset(token)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return [result for result in results if not isinstance(result, BaseException)]


def _codes(exc: BaseException) -> list[tuple[str, int | None]]:
    """``(error code, HTTP status)`` of the botocore ``ClientError``-like errors in ``exc``'s chain
    (s3fs re-raises them as ``OSError``)."""
    out = []
    current: BaseException | None = exc
    for _ in range(32):  # a bounded walk (a chain may loop)
        if current is None:
            break
        response = getattr(current, "response", None)
        if isinstance(response, Mapping):
            code = str((response.get("Error") or {}).get("Code", ""))
            status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
            out.append((code, None if status is None else int(status)))
        current = current.__cause__ or current.__context__
    return out


def is_precondition_failure(exc: BaseException) -> bool:
    """True when an S3 error says a condition did not hold (412, or 409 ConditionalRequestConflict)."""
    return any(
        code in _LOST_RACE_CODES or (status in (409, 412) and code in ("", "409", "412"))
        for code, status in _codes(exc)
    )


def _is_missing(exc: BaseException) -> bool:
    return isinstance(exc, FileNotFoundError) or any(code in _MISSING_CODES for code, _ in _codes(exc))


def _unsatisfiable(exc: BaseException) -> bool:
    return any(status == 416 or code == "InvalidRange" for code, status in _codes(exc))


def _size_of(response: Mapping[str, Any]) -> int | None:
    content_range = response.get("ContentRange")
    if isinstance(content_range, str) and "/" in content_range:
        total = content_range.rsplit("/", 1)[1]
        return int(total) if total.isdigit() else None
    length = response.get("ContentLength")
    return None if length is None else int(length)


class S3Store(KVStore):
    """S3 through an s3fs filesystem's client, with ETag generations.

    Parameters
    ----------
    fs : s3fs.S3FileSystem
        The filesystem (its client, credentials, endpoint and event loop are used).
    root : str
        ``bucket/prefix`` of the store (a protocol and a trailing ``/`` are dropped).
    upload_age : float
        Age (seconds) from which :meth:`abort_incomplete_writes` takes an
        incomplete multipart upload for a killed writer's (a live one's is younger).
    """

    def __init__(self, fs: Any, root: str, upload_age: float = DEFAULT_TEMP_AGE) -> None:
        self.fs = fs
        self.root = fs._strip_protocol(root).rstrip("/")
        self.upload_age = upload_age
        self.location = fs_location(fs, self.root)
        self.caps = Capabilities(
            ranged=True,
            round_trips=True,
            stamps="native",
            conditional_put=True,
            conditional_delete=True,
            tail_updates=True,
            tail_min_kept=MIN_PART_NBYTES,
        )

    def __repr__(self) -> str:
        return f"S3Store({self.root!r})"

    def _bucket_key(self, key: str) -> tuple[str, str]:
        bucket, _, object_key = self.location.full_path(key).partition("/")
        return bucket, object_key

    def _run(self, calls: Sequence[Callable[[], Awaitable[T]]]) -> list[T]:
        """Run the calls on s3fs's loop, their requests at most :data:`IN_FLIGHT` at once."""
        return sync(self.fs.loop, _limited, calls) if calls else []

    async def _s3(self, method: str, key: str, **kwargs: Any) -> Any:
        """One request about ``key``, in one of the running call's slots."""
        bucket, object_key = self._bucket_key(key)
        return await self._api(method, Bucket=bucket, Key=object_key, **kwargs)

    async def _api(self, method: str, **kwargs: Any) -> Any:
        """One request through s3fs, which adds its ``s3_additional_kwargs`` (e.g. server-side encryption),
        picks the bucket's region and retries, in one of the running call's slots."""
        async with _SLOTS.get():
            return await self.fs._call_s3(method, **kwargs)

    # -- reads ----------------------------------------------------------------

    @staticmethod
    def _if_match(cond: Generation) -> dict[str, Any]:
        return {} if cond.is_any or cond.is_missing else {"IfMatch": str(cond.token)}

    async def _head(self, key: str, cond: Generation) -> Fetched:
        """``HeadObject`` (with ``If-Match`` for a generation): no bytes, the ETag and size (errors propagate)."""
        response = await self._s3("head_object", key, **self._if_match(cond))
        return b"", Generation(response["ETag"]), _size_of(response)

    async def _get(self, key: str, byte_range: ByteRange | None, cond: Generation) -> Fetched:
        """One ``GetObject`` (a ``Range`` header for a range, ``If-Match`` for a generation)."""
        if byte_range is not None and byte_range.nbytes == 0:
            return await self._head(key, cond)
        kwargs = self._if_match(cond)
        if byte_range is not None:
            kwargs["Range"] = http_range(byte_range)
        try:
            response = await self._s3("get_object", key, **kwargs)
        except Exception as exc:
            if byte_range is not None and _unsatisfiable(exc):  # a range past the end (or of an empty object)
                return await self._head(key, cond)
            raise
        body = response["Body"]
        async with body:
            data = await body.read()
        return data, Generation(response["ETag"]), _size_of(response)

    async def _request(self, request: ReadRequest, byte_range: ByteRange | None) -> Outcome:
        """One request of a read; "not found" and "changed" (412) are answers, other errors are returned."""
        key, _, cond = request
        try:
            return await (self._head(key, cond) if metadata_only(request) else self._get(key, byte_range, cond))
        except Exception as exc:
            if _is_missing(exc):
                return "missing"
            if not cond.is_any and is_precondition_failure(exc):
                return "stale"
            return exc

    def get_many(self, reads: Sequence[ReadRequest]) -> list[ReadResult]:
        return read_objects(reads, lambda leaves: self._run([functools.partial(self._request, *x) for x in leaves]))

    # -- writes ---------------------------------------------------------------

    async def _write(self, key: str, value: Value | None, cond: Generation) -> Generation | None:
        """One ``PutObject`` (``If-Match``/``If-None-Match: *``) or ``DeleteObject`` (``If-Match``); ``None`` when
        its condition failed (a lost race is an answer; any other error propagates)."""
        try:
            if value is None and cond.is_missing:  # "only if nothing is stored": then there is nothing to delete
                await self._head(key, ANY)
                return None
            if value is None:
                await self._s3("delete_object", key, **self._if_match(cond))
                return NO_VALUE
            kwargs: dict[str, Any] = {"IfNoneMatch": "*"} if cond.is_missing else self._if_match(cond)
            response = await self._s3("put_object", key, Body=join_parts(value), **kwargs)
            return Generation(response["ETag"])
        except Exception as exc:
            if value is None and cond.is_missing and _is_missing(exc):
                return NO_VALUE
            if cond.is_any or not (is_precondition_failure(exc) or (_is_missing(exc) and not cond.is_missing)):
                raise
            return None  # changed, or deleted since the generation was read (S3 answers 404)
        finally:
            self.fs.invalidate_cache(self.location.full_path(key))

    def put_many(self, writes: Mapping[str, tuple[Value | None, Generation]]) -> dict[str, Generation | None]:
        calls = [functools.partial(self._write, key, value, cond) for key, (value, cond) in writes.items()]
        return dict(zip(writes, self._run(calls), strict=True))

    # -- O(chunk) updates -----------------------------------------------------

    def tail_method(self, key: str, in_place: bool) -> TailHow | None:
        """``"clone"``: an update is a multipart upload that copies the kept bytes on the server."""
        return "clone"

    def update_tail(
        self,
        key: str,
        writes: Sequence[tuple[int, Value]],
        nbytes: int,
        if_generation: Generation,
        how: TailHow,
        intent_fd: int | None = None,
        intent_path: str | None = None,
        drop: int = 0,
    ) -> Generation | None:
        """The object's first bytes copied on the server, then ``writes``' one value, as one conditional upload.

        ``writes`` is one ``(keep, value)``: the object becomes its bytes
        ``[drop, drop + keep)`` followed by ``value`` (``keep >= 5 MiB``, ``nbytes ==
        keep + len(value)``), conditioned on ``if_generation`` (an ETag), as
        :mod:`shardkv.storage.s3_updates` describes; ``None`` when the object
        changed (or vanished) since. See :meth:`KVStore.update_tail`.

        Raises
        ------
        UnsupportedError
            For another ``how``, several writes, no ETag to condition on, or
            fewer than 5 MiB kept.
        """
        (keep, value), *more = writes
        body = join_parts(value)
        if how != "clone" or more or if_generation.is_any or if_generation.is_missing or keep < MIN_PART_NBYTES:
            raise UnsupportedError(
                f"S3 updates {key!r} after a kept prefix of >= {MIN_PART_NBYTES} bytes, with one write and an ETag "
                f"(got how={how!r}, {1 + len(more)} writes, keep={keep}, if_generation={if_generation!r})"
            )
        if keep + len(body) != nbytes:
            raise ValueError(f"{key!r}: {keep} kept + {len(body)} written bytes are not the planned {nbytes}")
        bucket, object_key = self._bucket_key(key)

        async def update() -> Generation | None:
            try:
                return Generation(
                    await copy_update(self._api, bucket, object_key, str(if_generation.token), keep, body, drop)
                )
            except Exception as exc:
                if is_precondition_failure(exc) or any(code in LOST_CODES for code, _ in _codes(exc)):
                    return None
                raise
            finally:
                self.fs.invalidate_cache(self.location.full_path(key))

        return self._run([update])[0]

    def abort_incomplete_writes(self, prefix: str) -> list[str]:
        """Abort the incomplete multipart uploads under ``prefix`` begun ``upload_age`` seconds ago or more.

        Killed writers leave them (the objects they were to replace stay as
        they were); S3 keeps their parts, and bills them, until they are
        aborted. Returns ``key?uploadId=...`` of each upload aborted.
        """
        bucket, object_prefix = self._bucket_key(prefix)
        skip = len(object_prefix) - len(prefix)

        async def abort_all() -> list[str]:
            found = await incomplete_uploads(self._api, bucket, object_prefix, self.upload_age)
            for object_key, upload_id in found:
                try:
                    await self._api("abort_multipart_upload", Bucket=bucket, Key=object_key, UploadId=upload_id)
                except Exception as exc:
                    if not any(code == "NoSuchUpload" for code, _ in _codes(exc)):  # completed or aborted meanwhile
                        raise
            return [f"{k[skip:]}?uploadId={u}" for k, u in found]

        return self._run([abort_all])[0]

    # -- listings -------------------------------------------------------------

    async def _list(self, prefix: str, delimiter: bool) -> tuple[list[tuple[str, str]], list[str]]:
        """``([(key, etag)], [common prefixes])`` of ``prefix`` (all pages)."""
        bucket, object_prefix = self._bucket_key(prefix)
        skip = len(object_prefix) - len(prefix)
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": object_prefix}
        if delimiter:
            kwargs["Delimiter"] = "/"
        objects: list[tuple[str, str]] = []
        prefixes: list[str] = []
        for _ in range(_MAX_PAGES):
            response = await self.fs._call_s3("list_objects_v2", **kwargs)
            objects.extend((o["Key"][skip:], o.get("ETag", "")) for o in response.get("Contents", []))
            prefixes.extend(p["Prefix"][skip:] for p in response.get("CommonPrefixes", []))
            token = response.get("NextContinuationToken")
            if not response.get("IsTruncated") or not token:
                break
            kwargs["ContinuationToken"] = token
        return objects, prefixes

    def list_generations(
        self, prefix: str, wanted: Callable[[str], bool] | None = None
    ) -> Iterator[tuple[str, Generation | None]]:
        """Every key under ``prefix`` with the ETag ``ListObjectsV2`` returns for it (no request per key)."""
        objects, _ = sync(self.fs.loop, self._list, prefix, False)
        for key, etag in objects:
            if not hidden(key):
                yield key, Generation(etag) if etag else None

    def list_prefix(self, prefix: str) -> Iterator[str]:
        return (key for key, _ in self.list_generations(prefix))

    def list_dir(self, prefix: str) -> tuple[list[str], list[str]]:
        objects, prefixes = sync(self.fs.loop, self._list, prefix, True)
        return child_names(k[len(prefix) :] for k, _ in objects), child_names(p[len(prefix) :] for p in prefixes)
