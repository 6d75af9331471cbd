"""ShardIndex: the (offset, nbytes) table of one shard, its empty marker and its validation.

The entries are a flat ``array('Q')``; ``entries`` is a numpy view of the same
memory: a write through either is seen through the other.
"""

from __future__ import annotations

import numpy as np
import pytest

from shardkv import EMPTY, CorruptShardError, ShardIndex

FULL = 2**64 - 1


@pytest.mark.parametrize(
    "cps", [pytest.param((4,), id="1d"), pytest.param((2, 3), id="2d"), pytest.param((1, 2, 3), id="3d")]
)
def test_empty_index(cps: tuple[int, ...]) -> None:
    index = ShardIndex.empty(cps)
    assert index.chunks_per_shard == cps
    assert index.entries.shape == (*cps, 2)
    assert index.entries.dtype == np.uint64
    assert (index.entries == FULL).all()
    assert index.is_empty() and index.count_present() == 0 and index.used_nbytes() == 0
    assert list(index.present()) == []
    assert index.get((0,) * len(cps)) is None


def test_set_get_clear_and_present_order() -> None:
    index = ShardIndex.empty((2, 3))
    index.set((1, 2), 100, 7)
    index.set((0, 1), 0, 0)  # a zero-length chunk is present, not empty
    index.set((1, 0), 7, 93)
    assert index.get((1, 2)) == (100, 7)
    assert index.get((0, 1)) == (0, 0)
    assert index.get((0, 0)) is None
    assert list(index.present()) == [(0, 1), (1, 0), (1, 2)]  # row-major
    assert index.count_present() == 3
    assert index.used_nbytes() == 100
    assert index.present_mask().tolist() == [[False, True, False], [True, False, True]]
    index.clear((1, 0))
    assert index.get((1, 0)) is None
    assert list(index.present()) == [(0, 1), (1, 2)]
    assert not index.is_empty()


def test_get_returns_python_ints() -> None:
    index = ShardIndex.empty((1,))
    index.set((0,), 2**40, 3)
    offset, nbytes = index.get((0,))  # type: ignore[misc]
    assert type(offset) is int and type(nbytes) is int


def test_copy_is_independent_and_equality() -> None:
    a = ShardIndex.empty((2,))
    a.set((0,), 0, 5)
    b = a.copy()
    assert a == b
    b.set((1,), 5, 5)
    assert a != b
    assert a.get((1,)) is None
    assert a != "not an index"


@pytest.mark.parametrize("shape", [pytest.param((3, 3), id="last-dim-3"), pytest.param((), id="scalar")])
def test_entries_must_end_in_pairs(shape: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="shape"):
        ShardIndex(np.zeros(shape, dtype=np.uint64))


def test_single_pair_is_a_0d_index() -> None:
    assert ShardIndex(np.zeros((2,), dtype=np.uint64)).chunks_per_shard == ()


def test_empty_marker_value() -> None:
    assert EMPTY == np.uint64(FULL)


def test_entries_is_a_writable_view_of_the_same_memory() -> None:
    index = ShardIndex.empty((2, 3))
    index.entries[1, 2] = (100, 7)  # numpy writes, get reads
    assert index.get((1, 2)) == (100, 7)
    index.set((0, 1), 2**63, 1)  # set writes, numpy reads
    assert index.entries[0, 1].tolist() == [2**63, 1]
    assert index.nbytes == index.entries.nbytes == 2 * 3 * 16


def test_an_index_from_entries_is_a_copy() -> None:
    entries = np.full((2, 2), FULL, dtype=np.uint64)
    index = ShardIndex(entries)
    entries[0] = (0, 4)
    assert index.get((0,)) is None


@pytest.mark.parametrize(
    "cps", [pytest.param((2, 3), id="positions-memoised"), pytest.param((128, 64), id="positions-computed")]
)
@pytest.mark.parametrize("local", [(-1, 0), (0, -1), (0,), (0, 0, 0), (0.5, 0), "past-the-end"])
def test_get_and_set_refuse_coords_outside_the_shard(cps: tuple[int, int], local: object) -> None:
    coords = (cps[0], 0) if local == "past-the-end" else local
    index = ShardIndex.empty(cps)
    with pytest.raises(IndexError, match="outside chunks_per_shard"):
        index.get(coords)  # type: ignore[arg-type]
    with pytest.raises(IndexError, match="outside chunks_per_shard"):
        index.set(coords, 0, 1)  # type: ignore[arg-type]
    assert index.is_empty()


# -- validate -------------------------------------------------------------------


def _index(**entries: tuple[int, int]) -> ShardIndex:
    index = ShardIndex.empty((2, 2))
    for name, (offset, nbytes) in entries.items():
        local = tuple(int(c) for c in name[1:])
        index.entries[local] = (offset, nbytes)
    return index


def test_validate_accepts_entries_inside_the_region() -> None:
    index = _index(c00=(0, 10), c11=(10, 5), c10=(15, 0))
    index.validate("arr/0", 0, 15)  # no error
    index.validate("arr/0", 0, None)
    ShardIndex.empty((2, 2)).validate("arr/0", 36, 36)


@pytest.mark.parametrize(
    "entry, where",
    [
        pytest.param((FULL, 4), "(0, 1)", id="offset-empty-only"),
        pytest.param((4, FULL), "(0, 1)", id="nbytes-empty-only"),
    ],
)
def test_validate_rejects_half_empty_entries(entry: tuple[int, int], where: str) -> None:
    index = _index(c00=(0, 4), c01=entry)
    with pytest.raises(CorruptShardError, match="only one of offset/nbytes") as info:
        index.validate("grp/arr/1.0", 0, 100)
    assert info.value.shard_key == "grp/arr/1.0"
    assert where in str(info.value)
    with pytest.raises(CorruptShardError):
        index.validate("grp/arr/1.0", 0, None)  # even when the size is unknown


@pytest.mark.parametrize(
    "entry, data_start, data_stop",
    [
        pytest.param((90, 11), 0, 100, id="end-past-stop"),
        pytest.param((100, 1), 0, 100, id="offset-at-stop"),
        pytest.param((10, 5), 36, 100, id="offset-inside-start-index"),
        pytest.param((2**64 - 8, 16), 0, None, id="uint64-wraparound"),
        pytest.param((2**63, 1), 0, 100, id="huge-offset"),
    ],
)
def test_validate_rejects_entries_outside_the_region(
    entry: tuple[int, int], data_start: int, data_stop: int | None
) -> None:
    index = _index(c10=entry)
    with pytest.raises(CorruptShardError, match="outside the chunk data region") as info:
        index.validate("arr/3", data_start, data_stop)
    assert info.value.shard_key == "arr/3"
    assert "(1, 0)" in str(info.value)
    assert str(entry[0]) in str(info.value)


def test_validate_with_unknown_size_checks_lower_bound_only() -> None:
    index = _index(c00=(2**40, 10))
    index.validate("arr/0", 0, None)
    with pytest.raises(CorruptShardError):
        index.validate("arr/0", 2**41, None)
