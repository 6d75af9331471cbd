"""Byte ranges (half-open, as slices; a negative ``start`` counts from the end) and read planning. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ByteRange:
    """A half-open byte range ``[start, stop)`` of one stored object.

    Parameters
    ----------
    start : int
        First byte, or, negative with ``stop=None``, ``-start`` bytes from the end.
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
        """The absolute ``(start, stop)`` in an object of ``size`` bytes, clipped to ``[0, size]`` if ``clamp``."""
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
    """One request that serves several wanted ranges of one object."""

    range: ByteRange
    members: tuple[tuple[int, int, int], ...]  # (input position, relative start, nbytes)


def coalesce(
    ranges: Sequence[ByteRange],
    *,
    max_gap: int = 64 * 1024,
    max_size: int = 16 * 1024 * 1024,
) -> list[CoalescedRead]:
    """Merge nearby explicit byte ranges of one object into fewer requests.

    Parameters
    ----------
    ranges : sequence of ByteRange
        Explicit ranges (``start >= 0``, ``stop`` not None) of one object.
    max_gap : int
        Most unwanted bytes read to join two ranges.
    max_size : int
        Largest merged request (bytes); a larger single range is still read whole.

    Returns
    -------
    list of CoalescedRead
        In ascending order of start; each input position in exactly one request's ``members``.

    Raises
    ------
    ValueError
        If a range is a suffix range or open-ended, or a limit is negative.
    """
    if max_gap < 0 or max_size < 0:
        raise ValueError(f"max_gap and max_size must be >= 0, got {max_gap} and {max_size}")
    requests: list[tuple[int, int, list[tuple[int, int, int]]]] = []  # start, stop, (position, start, stop)
    for i in sorted(range(len(ranges)), key=lambda j: (ranges[j].start, ranges[j].stop)):
        r = ranges[i]
        if r.is_suffix or r.stop is None:
            raise ValueError(f"coalesce takes explicit ranges only, got {r}")
        start, stop, members = requests[-1] if requests else (0, 0, [])
        if members and r.start - stop <= max_gap and max(stop, r.stop) - start <= max_size:
            requests[-1] = (start, max(stop, r.stop), members)
        else:
            members = []
            requests.append((r.start, r.stop, members))
        members.append((i, r.start, r.stop))
    return [
        CoalescedRead(ByteRange(start, stop), tuple((i, a - start, b - a) for i, a, b in members))
        for start, stop, members in requests
    ]


def total_nbytes(ranges: Iterable[ByteRange]) -> int:
    """Sum of the lengths (bytes) of explicit ranges."""
    return sum(r.nbytes or 0 for r in ranges)


@dataclass(frozen=True, slots=True)
class ReadPolicy:
    """How the proxy turns wanted chunk ranges of one shard into requests.

    Parameters
    ----------
    max_gap : int
        Most unwanted bytes read to merge two neighbouring ranges.
    max_request : int
        Largest merged request (bytes).
    whole_shard_fraction : float
        Read the whole shard when the wanted bytes reach this fraction of its
        present chunks' bytes (> 0; above 1: never).

    Raises
    ------
    ValueError
        If a value is out of range.
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
    """Requests serving explicit ``wanted`` ranges of one shard whose present chunks hold ``stored_nbytes`` bytes.

    One ``ByteRange(0, None)`` for the whole shard when the wanted bytes reach
    ``policy.whole_shard_fraction * stored_nbytes``, else :func:`coalesce`'s.
    """
    want = total_nbytes(wanted)
    if stored_nbytes > 0 and want >= policy.whole_shard_fraction * stored_nbytes and len(wanted) > 1:
        members = tuple((i, r.start, r.nbytes or 0) for i, r in enumerate(wanted))
        return [CoalescedRead(ByteRange(0, None), members)]
    return coalesce(wanted, max_gap=policy.max_gap, max_size=policy.max_request)
