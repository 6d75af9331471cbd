"""The read planning the object-store clients (:mod:`~shardkv.storage.s3`, :mod:`~shardkv.storage.obstore`) share:
one request per byte range (:func:`plan_requests`), then each read's result from its requests (:func:`assemble`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
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


def plan_requests(reads: Sequence[ReadRequest]) -> list[tuple[int, ByteRange | None]]:
    """The requests of a batch of reads: ``(index of the read, byte range)``, ``None`` for no range."""
    plan: list[tuple[int, ByteRange | None]] = []
    for i, request in enumerate(reads):
        ranges = request[1]
        if ranges is None or metadata_only(request):
            plan.append((i, None))
        else:
            plan.extend((i, byte_range) for byte_range in ranges)
    return plan


def assemble(
    reads: Sequence[ReadRequest], plan: Sequence[tuple[int, ByteRange | None]], outcomes: Sequence[Outcome]
) -> list[ReadResult | None]:
    """The result of every read from the outcomes of its requests (in the order of :func:`plan_requests`).

    ``None`` for a read whose unconditioned ranges came from different stored
    values (replaced between its requests): the caller reads it whole once
    and cuts it (:func:`sliced`). The first error a request returned is raised.
    """
    per_read: list[list[Fetched]] = [[] for _ in reads]
    answers: list[ReadResult | None] = [None] * len(reads)
    for (i, _), outcome in zip(plan, outcomes, strict=True):
        if isinstance(outcome, BaseException):
            raise outcome
        if outcome == "missing":
            answers[i] = MISSING_RESULT
        elif outcome == "stale":
            answers[i] = answers[i] or ReadResult("stale", None, ANY)
        elif not isinstance(outcome, str):
            per_read[i].append(outcome)
    results: list[ReadResult | None] = []
    for request, answer, got in zip(reads, answers, per_read, strict=True):
        generations = {generation for _, generation, _ in got}
        if answer is not None or len(generations) > 1:
            results.append(answer)
            continue
        _, ranges, cond = request
        generation = generations.pop()
        size = next((s for _, _, s in got if s is not None), None)
        if cond.is_missing:
            results.append(ReadResult("stale", None, generation, size))
        else:
            results.append(ReadResult("value", [] if ranges == [] else [data for data, _, _ in got], generation, size))
    return results


def sliced(whole: Fetched, ranges: Sequence[ByteRange]) -> ReadResult:
    """The read of ``ranges`` cut from one read of the whole value (read-only views, no copy)."""
    data, generation, size = whole
    view = memoryview(data)
    values: list[BytesLike] = [view[slice(*r.resolve(view.nbytes))].toreadonly() for r in ranges]
    return ReadResult("value", values, generation, size)


def child_names(paths: Iterable[str]) -> list[str]:
    """The sorted last segments of the keys or prefixes a delimited listing returned, hidden ones left out."""
    names = {path.rstrip("/").rsplit("/", 1)[-1] for path in paths}
    return sorted(name for name in names if name and not hidden(name))
