"""Byte ranges: a small frozen value type and the pure logic that merges them.

One rule for every byte range in shardkv, the one Python slices follow:
``start`` is the first byte, ``stop`` is one past the last (half-open), and a
negative ``start`` with ``stop=None`` counts from the end of the object (a
suffix read, used for an index at the end of a shard).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ByteRange:
    """A half-open byte range ``[start, stop)`` of one stored object.

    Parameters
    ----------
    start : int
        First byte (bytes from the start of the object), or, when negative with
        ``stop=None``, the number of bytes to read from the end (``-start``).
    stop : int or None
        One past the last byte; ``None`` reads to the end of the object.

    Raises
    ------
    ValueError
        If ``stop < start``, or a negative ``start`` is combined with a ``stop``.
    """

    start: int
    stop: int | None = None

    def __post_init__(self) -> None:
        if self.start < 0 and self.stop is not None:
            raise ValueError(f"a suffix range (start={self.start}) takes no stop, got stop={self.stop}")
        if self.stop is not None and self.stop < self.start:
            raise ValueError(f"byte range stop {self.stop} lies before start {self.start}")

    @classmethod
    def suffix(cls, nbytes: int) -> ByteRange:
        """The last ``nbytes`` bytes of an object (``nbytes`` > 0)."""
        if nbytes <= 0:
            raise ValueError(f"a suffix range needs nbytes > 0, got {nbytes}")
        return cls(-nbytes, None)

    @property
    def is_suffix(self) -> bool:
        """True for a range counted from the end of the object."""
        return self.start < 0

    def resolve(self, size: int, *, clamp: bool = True) -> tuple[int, int]:
        """The absolute half-open ``(start, stop)`` of this range in an object of ``size`` bytes.

        Parameters
        ----------
        size : int
            Length of the object (bytes).
        clamp : bool
            Clip both ends to ``[0, size]``, as slicing does (default). With
            ``False`` the ends are returned as the range states them, so a
            caller can refuse a range that does not fit (``start < 0`` or
            ``stop > size``).

        Returns
        -------
        tuple of int
            ``(start, stop)``, with ``start <= stop`` when clamped.
        """
        if self.is_suffix:
            start, stop = size + self.start, size
        else:
            start, stop = self.start, size if self.stop is None else self.stop
        if clamp:
            start = min(max(0, start), size)
            stop = max(start, min(stop, size))
        return start, stop

    @property
    def nbytes(self) -> int | None:
        """The length in bytes, or ``None`` when it depends on the object's size."""
        if self.is_suffix:
            return -self.start
        if self.stop is None:
            return None
        return self.stop - self.start


@dataclass(frozen=True, slots=True)
class CoalescedRead:
    """One request that serves several wanted ranges of the same object.

    ``members`` holds, for each wanted range served, its position in the input
    sequence and its start relative to ``range.start``.
    """

    range: ByteRange
    members: tuple[tuple[int, int, int], ...]  # (input position, relative start, nbytes)


def coalesce(
    ranges: Sequence[ByteRange],
    *,
    max_gap: int = 64 * 1024,
    max_size: int = 16 * 1024 * 1024,
) -> list[CoalescedRead]:
    """Merge nearby explicit byte ranges of one object into fewer requests.

    Ranges are sorted by start; a range joins the current request when the gap
    to it is at most ``max_gap`` bytes and the merged request stays within
    ``max_size`` bytes (a single range larger than ``max_size`` is still read
    whole). Overlapping and duplicate ranges are served from one request.

    Parameters
    ----------
    ranges : sequence of ByteRange
        Explicit ranges (``start >= 0``, ``stop`` not None) of one object.
    max_gap : int
        Largest number of unwanted bytes (bytes) read to join two ranges.
    max_size : int
        Largest merged request (bytes).

    Returns
    -------
    list of CoalescedRead
        Requests in ascending order of start; every input position appears in
        exactly one request's ``members``.

    Raises
    ------
    ValueError
        If a range is a suffix range or open-ended, or a limit is negative.
    """
    if max_gap < 0 or max_size < 0:
        raise ValueError(f"max_gap and max_size must be >= 0, got {max_gap} and {max_size}")
    order = sorted(range(len(ranges)), key=lambda i: (ranges[i].start, ranges[i].stop))
    out: list[CoalescedRead] = []
    cur_start = cur_stop = 0
    cur_members: list[tuple[int, int, int]] = []  # (position, start, stop) of the ranges in the current request

    def flush() -> None:
        if cur_members:
            members = tuple((i, start - cur_start, stop - start) for i, start, stop in cur_members)
            out.append(CoalescedRead(ByteRange(cur_start, cur_stop), members))

    for i in order:
        r = ranges[i]
        if r.is_suffix or r.stop is None:
            raise ValueError(f"coalesce takes explicit ranges only, got {r}")
        if cur_members and r.start - cur_stop <= max_gap and max(cur_stop, r.stop) - cur_start <= max_size:
            cur_stop = max(cur_stop, r.stop)
            cur_members.append((i, r.start, r.stop))
            continue
        flush()
        cur_start, cur_stop, cur_members = r.start, r.stop, [(i, r.start, r.stop)]
    flush()
    return out


def total_nbytes(ranges: Iterable[ByteRange]) -> int:
    """Sum of the lengths (bytes) of explicit ranges."""
    return sum(r.nbytes or 0 for r in ranges)


@dataclass(frozen=True, slots=True)
class ReadPolicy:
    """How the proxy turns wanted chunk ranges of one shard into requests.

    Parameters
    ----------
    max_gap : int
        Unwanted bytes (bytes) read at most to merge two neighbouring ranges.
    max_request : int
        Largest merged request (bytes).
    whole_shard_fraction : float
        Read the whole shard in one request when the wanted bytes are at least
        this fraction of the bytes its present chunks occupy (0 < f <= 1;
        values above 1 never read whole shards).
    """

    max_gap: int = 64 * 1024
    max_request: int = 16 * 1024 * 1024
    whole_shard_fraction: float = 0.5

    def __post_init__(self) -> None:
        if self.max_gap < 0 or self.max_request < 1 or self.whole_shard_fraction <= 0:
            raise ValueError(
                f"invalid read policy: max_gap={self.max_gap} (>= 0), max_request={self.max_request} (>= 1), "
                f"whole_shard_fraction={self.whole_shard_fraction} (> 0)"
            )


def plan_reads(wanted: Sequence[ByteRange], stored_nbytes: int, policy: ReadPolicy) -> list[CoalescedRead]:
    """Requests that serve ``wanted`` ranges of one shard.

    Parameters
    ----------
    wanted : sequence of ByteRange
        Explicit ranges of inner chunks to read.
    stored_nbytes : int
        Bytes referenced by all present chunks of the shard (from its index).
    policy : ReadPolicy
        Merge limits and the whole-shard threshold.

    Returns
    -------
    list of CoalescedRead
        One request ``ByteRange(0, None)`` for the whole shard when the wanted
        bytes reach ``policy.whole_shard_fraction * stored_nbytes``; otherwise
        the result of :func:`coalesce`.
    """
    if not wanted:
        return []
    want = total_nbytes(wanted)
    if stored_nbytes > 0 and want >= policy.whole_shard_fraction * stored_nbytes and len(wanted) > 1:
        members = tuple((i, r.start, r.nbytes or 0) for i, r in enumerate(wanted))
        return [CoalescedRead(ByteRange(0, None), members)]
    return coalesce(wanted, max_gap=policy.max_gap, max_size=policy.max_request)
