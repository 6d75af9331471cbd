"""ByteRange rules and the properties of ``coalesce``: every wanted range is served exactly
once, from bytes that really hold it, and merged requests respect the gap and size limits."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardkv.format.ranges import ByteRange, coalesce, total_nbytes

# -- ByteRange ---------------------------------------------------------------


@pytest.mark.parametrize(
    "start, stop, nbytes, is_suffix",
    [
        pytest.param(0, 10, 10, False, id="prefix"),
        pytest.param(5, 5, 0, False, id="empty"),
        pytest.param(3, None, None, False, id="open-ended"),
        pytest.param(-8, None, 8, True, id="suffix"),
    ],
)
def test_byte_range_nbytes(start: int, stop: int | None, nbytes: int | None, is_suffix: bool) -> None:
    r = ByteRange(start, stop)
    assert r.nbytes == nbytes
    assert r.is_suffix is is_suffix


@pytest.mark.parametrize(
    "start, stop",
    [pytest.param(5, 4, id="stop-before-start"), pytest.param(-4, 10, id="suffix-with-stop")],
)
def test_byte_range_rejects(start: int, stop: int) -> None:
    with pytest.raises(ValueError, match=str(stop)):
        ByteRange(start, stop)


def test_suffix_constructor() -> None:
    assert ByteRange.suffix(16) == ByteRange(-16, None)
    with pytest.raises(ValueError, match="nbytes > 0"):
        ByteRange.suffix(0)


def test_byte_range_is_frozen() -> None:
    r = ByteRange(0, 1)
    with pytest.raises(AttributeError):
        r.start = 3  # type: ignore[misc]


def test_total_nbytes() -> None:
    assert total_nbytes([ByteRange(0, 10), ByteRange(20, 25)]) == 15


# -- coalesce ------------------------------------------------------------------

_ranges = st.lists(
    st.tuples(st.integers(0, 400), st.integers(0, 60)).map(lambda t: ByteRange(t[0], t[0] + t[1])),
    max_size=25,
)


@settings(max_examples=300, deadline=None)
@given(
    ranges=_ranges, max_gap=st.integers(0, 80), max_size=st.integers(0, 200), data=st.binary(min_size=460, max_size=460)
)
def test_coalesce_serves_each_range_exactly_once_within_limits(
    ranges: list[ByteRange], max_gap: int, max_size: int, data: bytes
) -> None:
    reads = coalesce(ranges, max_gap=max_gap, max_size=max_size)

    served = [pos for read in reads for pos, _, _ in read.members]
    assert sorted(served) == list(range(len(ranges)))  # every input exactly once

    starts = [read.range.start for read in reads]
    assert starts == sorted(starts)

    for read in reads:
        r = read.range
        assert r.stop is not None and not r.is_suffix
        fetched = data[r.start : r.stop]  # what one request would return
        for pos, rel, nbytes in read.members:
            want = ranges[pos]
            assert nbytes == want.nbytes
            assert fetched[rel : rel + nbytes] == data[want.start : want.stop]
        # the request covers exactly the union extent of its members
        assert r.start == min(ranges[p].start for p, _, _ in read.members)
        assert r.stop == max(ranges[p].stop for p, _, _ in read.members)  # type: ignore[type-var]
        if len(read.members) > 1:
            assert r.nbytes <= max_size
            # members in start order never leave a hole wider than max_gap
            ordered = sorted((ranges[p] for p, _, _ in read.members), key=lambda b: b.start)
            reach = ordered[0].stop
            for b in ordered[1:]:
                assert b.start - reach <= max_gap  # type: ignore[operator]
                reach = max(reach, b.stop)  # type: ignore[type-var]


@given(ranges=_ranges.filter(bool))
def test_coalesce_without_limits_makes_one_request(ranges: list[ByteRange]) -> None:
    reads = coalesce(ranges, max_gap=10**9, max_size=10**9)
    assert len(reads) == 1


@given(ranges=_ranges)
def test_coalesce_with_zero_gap_never_reads_unwanted_bytes(ranges: list[ByteRange]) -> None:
    reads = coalesce(ranges, max_gap=0, max_size=10**9)
    for read in reads:
        covered = set()
        for pos, _, _ in read.members:
            covered.update(range(ranges[pos].start, ranges[pos].stop))  # type: ignore[arg-type]
        assert covered == set(range(read.range.start, read.range.stop))  # type: ignore[arg-type]


def test_coalesce_keeps_a_single_oversized_range_whole() -> None:
    reads = coalesce([ByteRange(0, 100), ByteRange(100, 110)], max_gap=0, max_size=50)
    assert [r.range for r in reads] == [ByteRange(0, 100), ByteRange(100, 110)]


def test_coalesce_serves_duplicates_from_one_request() -> None:
    reads = coalesce([ByteRange(10, 20), ByteRange(10, 20), ByteRange(12, 15)])
    assert len(reads) == 1
    assert reads[0].range == ByteRange(10, 20)
    assert sorted(reads[0].members) == [(0, 0, 10), (1, 0, 10), (2, 2, 3)]


def test_coalesce_empty() -> None:
    assert coalesce([]) == []


@pytest.mark.parametrize(
    "bad",
    [pytest.param(ByteRange.suffix(4), id="suffix"), pytest.param(ByteRange(3, None), id="open-ended")],
)
def test_coalesce_rejects_implicit_ranges(bad: ByteRange) -> None:
    with pytest.raises(ValueError, match="explicit ranges"):
        coalesce([ByteRange(0, 1), bad])


@pytest.mark.parametrize("kw", [pytest.param({"max_gap": -1}, id="gap"), pytest.param({"max_size": -1}, id="size")])
def test_coalesce_rejects_negative_limits(kw: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="-1"):
        coalesce([ByteRange(0, 1)], **kw)
