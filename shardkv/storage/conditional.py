"""Generation-conditional reads and writes (compare-and-swap) over a base store (issue 9).

Object stores cannot hold a lock across processes, but they can refuse a
write when the stored object changed since it was read. A shard update then
becomes an optimistic loop: read the shard *and its generation*, merge the
new chunks into it, write it back *only if the generation is unchanged*, and
start over when the store says it changed (:func:`shardkv.engine.retry.update_with_retry`).

A *generation* is an opaque token that changes whenever the stored value
changes; ``None`` stands for "not stored". :class:`ConditionalStore` is the
interface; implementations:

* :class:`S3Conditional` — S3 and S3-protocol servers through s3fs: the
  generation is the ETag returned by the same ``GetObject`` that reads the
  bytes; writes send ``If-Match: <etag>`` (or ``If-None-Match: *`` for "must
  not exist yet"); a ``412 Precondition Failed`` (or ``409
  ConditionalRequestConflict``, S3's answer to two conditional writes in
  flight at once) is a lost race, every other error propagates.
* :class:`InProcessConditional` — fsspec ``memory://`` (one store for the
  whole process) and plain mappings (``dict``, zarr-python 2 stores):
  compare-and-swap emulated under a lock striped by key, shared by every
  user of the same location in the process. The generation is a BLAKE2b
  digest of the stored bytes, not a counter: a counter would only see
  writes made through this class, the digest sees every write (a direct
  ``d[key] = value`` included). Two equal values have one generation; for a
  merge that is exactly right (what was merged is what is stored). Only
  writers in this process are covered.

:func:`shardkv.storage.choose_conditional.conditional_store_for` picks the
implementation for an adapter (obstore stores: :mod:`shardkv.storage.obstore_conditional`;
``None`` for local and network file systems, which use lock files instead, see
:mod:`shardkv.engine.locks`).
"""

from __future__ import annotations

import hashlib
import os
import threading
from abc import ABC, abstractmethod
from functools import partial
from typing import Any, Callable, Hashable, Mapping, MutableMapping, Sequence

from shardkv.format.ranges import ByteRange
from shardkv.storage.location import StoreLocation, fs_location
from shardkv.storage.s3_requests import gather_bounded, range_header

__all__ = [
    "Generation",
    "ConditionalStore",
    "S3Conditional",
    "InProcessConditional",
    "is_precondition_failure",
]

Generation = Hashable
"""An opaque token that changes whenever a stored value changes; ``None`` = not stored."""

_PRECONDITION_CODES = frozenset({"PreconditionFailed", "ConditionalRequestConflict"})
_PRECONDITION_STATUS = frozenset({409, 412})
_MISSING_CODES = frozenset({"NoSuchKey", "404", "NotFound"})


def _client_errors(exc: BaseException) -> list[Any]:
    """The botocore ``ClientError``-like errors in ``exc``'s chain (``__cause__`` / ``__context__``)."""
    found = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < 32:
        seen.add(id(current))
        if isinstance(getattr(current, "response", None), Mapping):
            found.append(current)
        current = current.__cause__ or current.__context__
    return found


def _error_code(client_error: Any) -> tuple[str, int | None]:
    response = client_error.response
    code = str((response.get("Error") or {}).get("Code", ""))
    status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
    return code, None if status is None else int(status)


def is_precondition_failure(exc: BaseException) -> bool:
    """True when an S3 error says a conditional write lost a race (412, or 409 ConditionalRequestConflict).

    Looks at the botocore error in the exception chain (s3fs re-raises it as
    ``OSError`` / ``FileExistsError``), never at message text.
    """
    for error in _client_errors(exc):
        code, status = _error_code(error)
        if code in _PRECONDITION_CODES or (status in _PRECONDITION_STATUS and code in ("", "412", "409")):
            return True
    return False


def _is_missing(exc: BaseException) -> bool:
    if isinstance(exc, FileNotFoundError):
        return True
    return any(_error_code(e)[0] in _MISSING_CODES for e in _client_errors(exc))


class ConditionalStore(ABC):
    """Reads that return a generation, and writes that happen only if the generation still holds.

    Keys are those of the adapter the store was made for (relative to its root).
    """

    location: StoreLocation | None = None
    remote: bool = False
    """True when processes other than this one can change the data (object stores): readers
    must then check generations (``read_many_if_generation``) between an index read and
    its chunk reads. False for the in-process emulation."""

    @property
    def pins_reads(self) -> bool:
        """True when readers must pin their chunk reads to the generation of the index they use.

        :func:`shardkv.engine.generation_reads.pinned_store_for` reads it. By
        default :attr:`remote`; a store that other *objects* of this process
        can change unseen, and that has no validator (an obstore
        ``MemoryStore`` shared by two ``ShardedStore`` objects), says True too.
        """
        return self.remote
    supports_conditional_delete: bool = True
    """False when the store cannot delete only-if-unchanged: the engine then stores an
    empty shard (an index with every entry missing) by :meth:`swap` instead of deleting."""

    def read_many_with_generation(
        self, requests: Sequence[tuple[str, ByteRange | None]]
    ) -> list[tuple[bytes | None, Generation]]:
        """:meth:`read_with_generation` of every ``(key, byte_range)``, in order (concurrent where the store can).

        Raises
        ------
        OSError
            Errors of the store other than "not found".
        """
        return [self.read_with_generation(key, byte_range) for key, byte_range in requests]

    def read_many_if_generation(
        self, requests: Sequence[tuple[str, ByteRange | None, Generation]]
    ) -> list[tuple[bool, bytes | None]]:
        """:meth:`read_if_generation` of every ``(key, byte_range, expected)``, in order.

        Raises
        ------
        OSError
            Errors of the store other than a changed or missing value.
        """
        return [self.read_if_generation(key, byte_range, expected) for key, byte_range, expected in requests]

    @abstractmethod
    def read_with_generation(self, key: str, byte_range: ByteRange | None = None) -> tuple[bytes | None, Generation]:
        """The value (or a byte range of it) and its generation; ``(None, None)`` when not stored.

        The bytes and the generation come from one consistent read: the bytes
        are those of that generation.

        Raises
        ------
        OSError
            Errors of the store other than "not found" (permissions, network).
        """

    @abstractmethod
    def swap(self, key: str, value: bytes, expected: Generation) -> tuple[bool, Generation]:
        """Store ``value`` only if the stored generation is ``expected`` (``None``: only if not stored).

        Returns ``(True, new generation)``, or ``(False, None)`` when the
        stored value changed (a precondition failure; nothing was written).

        Raises
        ------
        OSError
            Errors of the store other than a precondition failure.
        """

    def write_if_generation(self, key: str, value: bytes, expected: Generation) -> bool:
        """:meth:`swap` without the new generation: False on a precondition failure."""
        return self.swap(key, value, expected)[0]

    @abstractmethod
    def read_if_generation(
        self, key: str, byte_range: ByteRange | None, expected: Generation
    ) -> tuple[bool, bytes | None]:
        """A byte range of the value only if its generation is still ``expected`` (not ``None``).

        Returns ``(True, bytes)``, or ``(False, None)`` when the value changed or
        is gone: a reader that took offsets from an index of generation
        ``expected`` reads chunk bytes of that same generation, or learns that
        it must read the index again (never a mix of an old index and new data).

        Raises
        ------
        OSError
            Errors of the store other than a changed or missing value.
        """

    @abstractmethod
    def delete_if_generation(self, key: str, expected: Generation) -> bool:
        """Delete the value only if its generation is ``expected``; False when it changed.

        True as well when the value is already gone and ``expected`` is ``None``.
        """


# -- in-process emulation --------------------------------------------------------

_STRIPES = 256
_POOL: list[threading.Lock] = [threading.Lock() for _ in range(_STRIPES)]
"""Compare-and-swap locks of the emulation: one bounded pool for the process, by (namespace, path)."""


def _reset_pool_after_fork() -> None:
    # a lock held by a parent thread at the fork would stay held forever in the child
    global _POOL
    _POOL = [threading.Lock() for _ in range(_STRIPES)]


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_pool_after_fork)


def _digest(value: bytes | memoryview) -> bytes:
    return hashlib.blake2b(value, digest_size=16).digest()


def _cut(value: bytes, byte_range: ByteRange | None) -> bytes:
    if byte_range is None:
        return bytes(value)
    view = memoryview(value)
    if byte_range.is_suffix:
        return bytes(view[max(0, len(view) + byte_range.start) :])
    return bytes(view[byte_range.start : byte_range.stop])


class InProcessConditional(ConditionalStore):
    """Compare-and-swap emulated in this process for ``memory://`` and plain mappings.

    Parameters
    ----------
    get : callable
        ``get(key) -> bytes``; raises ``KeyError`` / ``FileNotFoundError`` when not stored.
    put : callable
        ``put(key, value)``.
    delete : callable
        ``delete(key)``; may raise ``KeyError`` / ``FileNotFoundError`` when not stored.
    location : StoreLocation
        The data's location: the lock stripe of a key is chosen by its full path in the namespace.
    """

    def __init__(
        self,
        get: Callable[[str], bytes],
        put: Callable[[str, bytes], None],
        delete: Callable[[str], None],
        location: StoreLocation,
    ) -> None:
        self._get = get
        self._put = put
        self._delete = delete
        self.location = location

    @classmethod
    def for_mapping(
        cls, mapping: MutableMapping[str, Any], location: StoreLocation | None = None
    ) -> InProcessConditional:
        """The emulation over a mapping (location: that mapping object)."""

        def delete(key: str) -> None:
            del mapping[key]

        return cls(
            mapping.__getitem__, mapping.__setitem__, delete, location or StoreLocation(("mapping", id(mapping)), "")
        )

    @classmethod
    def for_fs(cls, fs: Any, root: str, location: StoreLocation) -> InProcessConditional:
        """The emulation over an fsspec filesystem held in this process (``memory://``)."""
        root = root.rstrip("/")

        def path(key: str) -> str:
            return f"{root}/{key}" if root else key

        return cls(
            lambda k: fs.cat_file(path(k)),
            lambda k, v: fs.pipe_file(path(k), v),
            lambda k: fs.rm_file(path(k)),
            location,
        )

    def _lock(self, key: str) -> threading.Lock:
        location = self.location
        return _POOL[hash((location.namespace, location.full_path(key))) % _STRIPES]

    def _current(self, key: str) -> bytes | None:
        try:
            return self._get(key)
        except (KeyError, FileNotFoundError):
            return None

    def read_with_generation(self, key: str, byte_range: ByteRange | None = None) -> tuple[bytes | None, Generation]:
        with self._lock(key):
            value = self._current(key)
        if value is None:
            return None, None
        return _cut(value, byte_range), _digest(value)

    def read_if_generation(
        self, key: str, byte_range: ByteRange | None, expected: Generation
    ) -> tuple[bool, bytes | None]:
        with self._lock(key):
            current = self._current(key)
        if current is None or _digest(current) != expected:
            return False, None
        return True, _cut(current, byte_range)

    def swap(self, key: str, value: bytes, expected: Generation) -> tuple[bool, Generation]:
        with self._lock(key):
            current = self._current(key)
            if (None if current is None else _digest(current)) != expected:
                return False, None
            self._put(key, value)
        return True, _digest(value)

    def delete_if_generation(self, key: str, expected: Generation) -> bool:
        with self._lock(key):
            current = self._current(key)
            if (None if current is None else _digest(current)) != expected:
                return False
            if current is not None:
                try:
                    self._delete(key)
                except (KeyError, FileNotFoundError):
                    pass  # gone meanwhile: a writer outside this class; the goal (not stored) holds
        return True


# -- S3 ---------------------------------------------------------------------------


class S3Conditional(ConditionalStore):
    """Conditional reads and writes on S3 (or an S3-protocol server) through s3fs.

    Parameters
    ----------
    fs : s3fs.S3FileSystem
        The filesystem (its client, credentials and endpoint are used).
    root : str
        ``bucket/prefix`` of the store, without protocol or trailing ``/``.

    Notes
    -----
    One request per value (batched reads concurrent): ``GetObject`` (with a ``Range`` header for a byte
    range) returns the bytes and the ETag together, ``PutObject`` with
    ``IfMatch`` / ``IfNoneMatch`` returns the new ETag. Whole-object writes
    only (no multipart upload): S3 allows up to 5 GiB per ``PutObject``.
    """

    remote = True

    def __init__(self, fs: Any, root: str) -> None:
        from fsspec.asyn import sync  # fsspec is a core dependency; s3fs is not

        self.fs = fs
        self.root = fs._strip_protocol(root).rstrip("/")
        self._sync = sync
        self.location = fs_location(fs, self.root)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.fs, self.root))

    def _bucket_key(self, key: str) -> tuple[str, str]:
        path = f"{self.root}/{key}" if self.root else key
        bucket, _, object_key = path.partition("/")
        return bucket, object_key

    def _call(self, method: str, **kwargs: Any) -> Any:
        return self._sync(self.fs.loop, self.fs._call_s3, method, **kwargs)

    async def _get(self, key: str, byte_range: ByteRange | None, **conditions: Any) -> tuple[bytes, Generation]:
        """``GetObject`` on the filesystem's loop: the bytes and the ETag of one consistent read (errors propagate)."""
        bucket, object_key = self._bucket_key(key)
        kwargs: dict[str, Any] = {"Bucket": bucket, "Key": object_key, **conditions}
        call = self.fs._call_s3
        if byte_range is not None and byte_range.stop == byte_range.start:
            return b"", (await call("head_object", **kwargs))["ETag"]  # an empty range: HTTP cannot ask for one
        header = range_header(byte_range)
        if header is not None:
            kwargs["Range"] = header
        try:
            response = await call("get_object", **kwargs)
        except Exception as exc:
            if byte_range is not None and any(_error_code(e)[1] == 416 for e in _client_errors(exc)):
                # a range past the end of the object: nothing of it, but the object exists
                return b"", (await call("head_object", Bucket=bucket, Key=object_key, **conditions))["ETag"]
            raise
        body = response["Body"]
        async with body:
            return await body.read(), response["ETag"]

    async def _read(self, key: str, byte_range: ByteRange | None, *if_match: Generation) -> tuple[Any, Generation]:
        """:meth:`_get` (only if the ETag is ``if_match[0]``, when given); ``(None, None)``: not stored, or changed."""
        if if_match and if_match[0] is None:
            return None, None
        try:
            return await self._get(key, byte_range, **({"IfMatch": str(if_match[0])} if if_match else {}))
        except Exception as exc:  # "not stored" and "changed" (412) are answers; anything else propagates
            if _is_missing(exc) or (if_match and is_precondition_failure(exc)):
                return None, None
            raise

    def read_with_generation(self, key: str, byte_range: ByteRange | None = None) -> tuple[bytes | None, Generation]:
        return self.read_many_with_generation([(key, byte_range)])[0]

    def read_if_generation(
        self, key: str, byte_range: ByteRange | None, expected: Generation
    ) -> tuple[bool, bytes | None]:
        return self.read_many_if_generation([(key, byte_range, expected)])[0]

    def read_many_with_generation(
        self, requests: Sequence[tuple[str, ByteRange | None]]
    ) -> list[tuple[bytes | None, Generation]]:
        """One ``GetObject`` per request, concurrent (32 in flight at most); errors as :meth:`read_with_generation`."""
        calls = [partial(self._read, key, byte_range) for key, byte_range in requests]
        return self._sync(self.fs.loop, gather_bounded, calls) if calls else []

    def read_many_if_generation(
        self, requests: Sequence[tuple[str, ByteRange | None, Generation]]
    ) -> list[tuple[bool, bytes | None]]:
        """One ``GetObject`` with ``If-Match`` per request, run concurrently (32 in flight at most)."""
        calls = [partial(self._read, key, byte_range, expected) for key, byte_range, expected in requests]
        found = self._sync(self.fs.loop, gather_bounded, calls) if calls else []
        return [(data is not None, data) for data, _ in found]

    def _head_generation(self, bucket: str, object_key: str) -> Generation:
        try:
            return self._call("head_object", Bucket=bucket, Key=object_key)["ETag"]
        except Exception as exc:
            if _is_missing(exc):
                return None
            raise

    def swap(self, key: str, value: bytes, expected: Generation) -> tuple[bool, Generation]:
        bucket, object_key = self._bucket_key(key)
        condition = {"IfNoneMatch": "*"} if expected is None else {"IfMatch": str(expected)}
        try:
            response = self._call("put_object", Bucket=bucket, Key=object_key, Body=bytes(value), **condition)
        except Exception as exc:  # a lost race is an answer (False); anything else propagates
            if is_precondition_failure(exc):
                return False, None
            raise
        finally:
            self.fs.invalidate_cache(f"{bucket}/{object_key}")
        return True, response["ETag"]

    def delete_if_generation(self, key: str, expected: Generation) -> bool:
        bucket, object_key = self._bucket_key(key)
        if expected is None:
            return self._head_generation(bucket, object_key) is None
        try:
            self._call("delete_object", Bucket=bucket, Key=object_key, IfMatch=str(expected))
        except Exception as exc:
            if is_precondition_failure(exc):
                return False
            if _is_missing(exc):
                return False  # deleted by another writer: its generation was not ours
            raise
        finally:
            self.fs.invalidate_cache(f"{bucket}/{object_key}")
        return True
