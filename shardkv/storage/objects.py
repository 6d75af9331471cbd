"""The reads the object-store clients (:mod:`~shardkv.storage.s3`, :mod:`~shardkv.storage.obstore`) share:
one request per byte range, then each read's result from its requests (:func:`read_objects`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Literal

from shardkv._types import BytesLike
from shardkv.format.ranges import ByteRange
from shardkv.storage.kv import ANY, MISSING_RESULT, Generation, ReadRequest, ReadResult, hidden

Fetched = tuple[BytesLike, Generation, "int | None"]  # what one request read: bytes, generation, the value's size
Outcome = Fetched | Literal["missing", "stale"] | BaseException  # "stale": its condition failed


def metadata_only(request: ReadRequest) -> bool:
    """True when a read needs only the value's metadata: a zero-range read, or one conditioned on ``NO_VALUE``."""
    _, ranges, cond = request
    return cond.is_missing or ranges == []


Leaf = tuple[ReadRequest, "ByteRange | None"]  # one request: its read and byte range (None: none)


def read_objects(reads: Sequence[ReadRequest], fetch: Callable[[list[Leaf]], list[Outcome]]) -> list[ReadResult]:
    """``get_many`` of an object store: ``fetch`` makes every request at once (one per byte range, one without
    a range for a whole or metadata-only read), then each read's result comes from its requests' outcomes.

    A read whose unconditioned ranges came from different stored values
    (replaced between its requests) is read whole once more and cut. The
    first error a request returned is raised.
    """
    plan: list[tuple[int, ByteRange | None]] = []
    for i, request in enumerate(reads):
        ranges = request[1]
        if ranges is None or metadata_only(request):
            plan.append((i, None))
        else:
            plan.extend((i, byte_range) for byte_range in ranges)
    per_read: list[list[Fetched]] = [[] for _ in reads]
    results: list[ReadResult | None] = [None] * len(reads)
    for (i, _), outcome in zip(plan, fetch([(reads[i], r) for i, r in plan]), strict=True):
        if isinstance(outcome, BaseException):
            raise outcome
        if outcome == "missing":
            results[i] = MISSING_RESULT
        elif outcome == "stale":
            results[i] = results[i] or ReadResult("stale", None, ANY)
        elif not isinstance(outcome, str):
            per_read[i].append(outcome)
    torn = [i for i, got in enumerate(per_read) if results[i] is None and len({g for _, g, _ in got}) > 1]
    for i, whole in zip(torn, fetch([((reads[i][0], None, ANY), None) for i in torn]), strict=True):
        if isinstance(whole, BaseException):
            raise whole
        results[i] = MISSING_RESULT if isinstance(whole, str) else _sliced(whole, reads[i][1] or [])
    for i, ((_, ranges, cond), got) in enumerate(zip(reads, per_read, strict=True)):
        if results[i] is None:  # every request of the read answered, all from one stored value
            generation, size = got[0][1], next((s for _, _, s in got if s is not None), None)
            values = None if cond.is_missing else [] if ranges == [] else [data for data, _, _ in got]
            results[i] = ReadResult("stale" if cond.is_missing else "value", values, generation, size)
    return [result for result in results if result is not None]


def _sliced(whole: Fetched, ranges: Sequence[ByteRange]) -> ReadResult:
    """The read of ``ranges`` cut from one read of the whole value (read-only views, no copy)."""
    data, generation, size = whole
    view = memoryview(data)
    values: list[BytesLike] = [view[slice(*r.resolve(view.nbytes))].toreadonly() for r in ranges]
    return ReadResult("value", values, generation, size)


def child_names(paths: Iterable[str]) -> list[str]:
    """The sorted last segments of the keys or prefixes a delimited listing returned, hidden ones left out."""
    names = {path.rstrip("/").rsplit("/", 1)[-1] for path in paths}
    return sorted(name for name in names if name and not hidden(name))
