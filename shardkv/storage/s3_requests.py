"""Pure pieces of S3 requests: the HTTP ``Range`` header of a byte range, and a bounded concurrent gather.

Used by :class:`shardkv.storage.conditional.S3Conditional`, which runs its
batched reads as coroutines on the s3fs event loop: one ``GetObject`` per
request, at most :data:`IN_FLIGHT` of them at once.
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, Sequence, TypeVar

from shardkv.format.ranges import ByteRange

__all__ = ["IN_FLIGHT", "range_header", "gather_bounded"]

T = TypeVar("T")

IN_FLIGHT = 32
"""Requests of one batch in flight at once, at most."""


def range_header(byte_range: ByteRange | None) -> str | None:
    """The HTTP ``Range`` header of a byte range (HTTP ranges include their last byte); ``None``: the whole object.

    Parameters
    ----------
    byte_range : ByteRange or None
        Half-open ``[start, stop)`` in bytes; a negative start is a suffix
        (the last ``-start`` bytes); ``stop=None`` runs to the end.
    """
    if byte_range is None:
        return None
    if byte_range.is_suffix:
        return f"bytes={byte_range.start}"  # start is negative: "bytes=-N"
    if byte_range.stop is None:
        return f"bytes={byte_range.start}-"
    return f"bytes={byte_range.start}-{byte_range.stop - 1}"


async def gather_bounded(calls: Sequence[Callable[[], Awaitable[T]]], limit: int = IN_FLIGHT) -> list[T]:
    """Await every call's coroutine, at most ``limit`` at once; the results in order.

    Every call runs to its end before an error is raised (the first one, in
    call order), so no request is left running behind the caller's back.

    Raises
    ------
    Exception
        The first error of the calls.
    """
    semaphore = asyncio.Semaphore(max(1, limit))

    async def one(call: Callable[[], Awaitable[T]]) -> T:
        async with semaphore:
            return await call()

    results = await asyncio.gather(*(one(call) for call in calls), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return list(results)  # type: ignore[arg-type]
