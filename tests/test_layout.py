"""Binary shard layouts, checked against an independent reader written here with ``struct``.

The reader follows the specs directly (draft 2022 "Binary shard format"; v1.0
``sharding_indexed`` "Binary shard format" with the ``bytes`` and ``crc32c`` index
codecs), so a mistake shared by shardkv's encoder and decoder cannot hide.
"""

from __future__ import annotations

import functools
import itertools
import struct
from math import prod

import crc32c
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardkv import ChecksumError, ConfigurationError, CorruptShardError, ShardIndex, ShardLayout
from shardkv.format.ranges import ByteRange

EMPTY = 2**64 - 1

LAYOUTS = [
    pytest.param(lambda cps: ShardLayout.draft_2022(cps), id="draft2022"),
    *[
        pytest.param(
            functools.partial(ShardLayout.v3, index_location=loc, index_endian=end, index_checksum=crc),
            id=f"v3-{loc}-{end}-{'crc32c' if crc else 'nocrc'}",
        )
        for loc in ("end", "start")
        for end in ("little", "big")
        for crc in (True, False)
    ],
]


def reference_read(shard: bytes, cps: tuple[int, ...], location: str, endian: str, checksum: bool) -> dict:
    """Independent reader: local coords -> chunk bytes, straight from the spec."""
    n = prod(cps)
    index_nbytes = 16 * n + (4 if checksum else 0)
    raw = shard[:index_nbytes] if location == "start" else shard[len(shard) - index_nbytes :]
    body = raw[: 16 * n]
    if checksum:
        (stored,) = struct.unpack("<I", raw[16 * n :])
        assert stored == crc32c.crc32c(body), "reference reader: bad crc32c"
    words = struct.unpack(("<" if endian == "little" else ">") + "Q" * (2 * n), body)
    out = {}
    for i, local in enumerate(itertools.product(*(range(c) for c in cps))):  # C order
        offset, nbytes = words[2 * i], words[2 * i + 1]
        if offset == EMPTY and nbytes == EMPTY:
            continue
        out[local] = shard[offset : offset + nbytes]
    return out


def reference_entries(shard: bytes, layout: ShardLayout) -> list[tuple[int, int]]:
    n = layout.n_chunks
    raw = shard[: 16 * n] if layout.index_location == "start" else shard[len(shard) - layout.index_nbytes :][: 16 * n]
    words = struct.unpack(("<" if layout.index_endian == "little" else ">") + "Q" * (2 * n), raw)
    return list(zip(words[::2], words[1::2], strict=True))


def _params(layout: ShardLayout) -> tuple:
    return layout.chunks_per_shard, layout.index_location, layout.index_endian, layout.index_checksum


@st.composite
def shard_contents(draw: st.DrawFn) -> tuple[tuple[int, ...], dict[tuple[int, ...], bytes]]:
    cps = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=3)))
    all_locals = list(itertools.product(*(range(c) for c in cps)))
    present = draw(st.lists(st.sampled_from(all_locals), unique=True))
    chunks = {local: draw(st.binary(max_size=40)) for local in present}
    return cps, chunks


# -- constructors and sizes --------------------------------------------------------


def test_draft_2022_is_end_little_endian_no_checksum() -> None:
    layout = ShardLayout.draft_2022((2, 2))
    assert _params(layout) == ((2, 2), "end", "little", False)


def test_v3_default_is_end_little_endian_crc32c() -> None:
    assert _params(ShardLayout.v3([3])) == ((3,), "end", "little", True)


@pytest.mark.parametrize("make", LAYOUTS)
@pytest.mark.parametrize(
    "cps", [pytest.param((1,), id="1"), pytest.param((4,), id="4"), pytest.param((2, 3, 5), id="2x3x5")]
)
def test_index_nbytes_is_16n_plus_checksum(make, cps: tuple[int, ...]) -> None:
    layout = make(cps)
    n = prod(cps)
    assert layout.n_chunks == n
    assert layout.index_nbytes == 16 * n + (4 if layout.index_checksum else 0)
    assert len(layout.encode_index(ShardIndex.empty(cps))) == layout.index_nbytes


@pytest.mark.parametrize("make", LAYOUTS)
def test_index_range_and_data_region(make) -> None:
    layout = make((2, 2))
    n = layout.index_nbytes
    if layout.index_location == "start":
        assert layout.index_range() == ByteRange(0, n)
        assert layout.data_region(1000) == (n, 1000)
        assert layout.data_region(None) == (n, None)
    else:
        assert layout.index_range() == ByteRange.suffix(n)
        assert layout.data_region(1000) == (0, 1000 - n)
        assert layout.data_region(None) == (0, None)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        pytest.param({"chunks_per_shard": (2, 0)}, ">= 1", id="zero-cps"),
        pytest.param({"chunks_per_shard": (2,), "index_location": "middle"}, "'middle'", id="bad-location"),
        pytest.param({"chunks_per_shard": (2,), "index_endian": "pdp"}, "'pdp'", id="bad-endian"),
    ],
)
def test_layout_rejects_bad_options(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        ShardLayout(**kwargs)


# -- byte-exact layout ------------------------------------------------------------


@pytest.mark.parametrize("make", LAYOUTS)
def test_encode_shard_byte_exact(make) -> None:
    layout = make((2, 3))
    chunks = {(1, 2): b"LAST", (0, 0): b"first", (0, 2): b"", (1, 0): b"x" * 9}  # given out of order
    shard = layout.encode_shard(chunks)
    n_index = layout.index_nbytes
    base = n_index if layout.index_location == "start" else 0
    # chunks back to back in row-major order of local coords
    expected_data = b"first" + b"" + b"x" * 9 + b"LAST"
    assert len(shard) == len(expected_data) + n_index
    if layout.index_location == "start":
        assert shard[n_index:] == expected_data
    else:
        assert shard[: len(expected_data)] == expected_data
    entries = reference_entries(shard, layout)
    assert entries == [
        (base + 0, 5),  # (0, 0)
        (EMPTY, EMPTY),  # (0, 1)
        (base + 5, 0),  # (0, 2): zero-length but present
        (base + 5, 9),  # (1, 0)
        (EMPTY, EMPTY),  # (1, 1)
        (base + 14, 4),  # (1, 2)
    ]
    if layout.index_checksum:
        index_bytes = shard[:n_index] if layout.index_location == "start" else shard[-n_index:]
        assert struct.unpack("<I", index_bytes[-4:])[0] == crc32c.crc32c(index_bytes[:-4])
    assert reference_read(shard, *_params(layout)) == chunks


@pytest.mark.parametrize("cps", [(3,), (65, 65)], ids=["small", "over-memoised-positions"])
@pytest.mark.parametrize("make", LAYOUTS)
def test_empty_shard_is_just_the_index(make, cps: tuple[int, ...]) -> None:
    layout = make(cps)
    shard = layout.encode_shard({})
    assert len(shard) == layout.index_nbytes
    assert reference_entries(shard, layout) == [(EMPTY, EMPTY)] * prod(cps)
    assert layout.index_of_shard(shard, "k").is_empty()


@pytest.mark.parametrize("make", LAYOUTS)
@settings(max_examples=60, deadline=None)
@given(content=shard_contents())
def test_shard_round_trip(make, content) -> None:
    cps, chunks = content
    layout = make(cps)
    shard = layout.encode_shard(chunks)
    # the independent reader agrees ...
    assert reference_read(shard, *_params(layout)) == chunks
    # ... and so does shardkv's own
    index = layout.index_of_shard(shard, "arr/0")
    assert set(index.present()) == set(chunks)
    decoded = layout.chunks_of_shard(shard, "arr/0")
    assert {k: bytes(v) for k, v in decoded.items()} == chunks
    assert all(isinstance(v, memoryview) for v in decoded.values())
    # index alone, as a ranged read would fetch it
    rng = layout.index_range()
    raw = shard[rng.start :] if rng.is_suffix else shard[rng.start : rng.stop]
    assert layout.decode_index(raw, "arr/0") == index
    assert layout.decode_index(layout.encode_index(index), "arr/0", len(shard)) == index


@pytest.mark.parametrize("make", LAYOUTS)
def test_chunks_of_shard_with_given_index(make) -> None:
    layout = make((2,))
    shard = layout.encode_shard({(1,): b"abc"})
    index = layout.index_of_shard(shard, "s")
    assert {k: bytes(v) for k, v in layout.chunks_of_shard(shard, "s", index).items()} == {(1,): b"abc"}


def test_decoding_accepts_foreign_layouts_with_gaps_and_any_order() -> None:
    """A shard written by another tool: chunks out of order with unused bytes between them."""
    layout = ShardLayout.v3((3,), "end", "big", True)
    data = b"GAP" + b"third" + b"--" + b"first"
    entries = [(10, 5), (EMPTY, EMPTY), (3, 5)]
    body = struct.pack(">" + "Q" * 6, *[w for e in entries for w in e])
    shard = data + body + struct.pack("<I", crc32c.crc32c(body))
    chunks = layout.chunks_of_shard(shard, "x")
    assert {k: bytes(v) for k, v in chunks.items()} == {(0,): b"first", (2,): b"third"}


def test_encoding_many_chunks_is_one_buffer() -> None:
    """10k chunks: the result holds every chunk once, back to back (one join, no re-copying)."""
    cps = (100, 100)
    layout = ShardLayout.v3(cps)
    chunks = {(i, j): bytes([i % 256, j % 256]) * ((i + j) % 5) for i in range(100) for j in range(100)}
    shard = layout.encode_shard(chunks)
    assert len(shard) == sum(len(v) for v in chunks.values()) + 16 * 10_000 + 4
    assert reference_read(shard, *_params(layout)) == chunks


def test_encode_shard_accepts_memoryviews_and_arrays() -> None:
    layout = ShardLayout.v3((2,))
    arr = np.arange(4, dtype="<u2")
    shard = layout.encode_shard({(0,): memoryview(b"ab"), (1,): arr})
    assert reference_read(shard, *_params(layout)) == {(0,): b"ab", (1,): arr.tobytes()}


@pytest.mark.parametrize(
    "local",
    [pytest.param((2, 0), id="past-end"), pytest.param((0,), id="wrong-ndim"), pytest.param((0, -1), id="negative")],
)
def test_encode_shard_rejects_local_coords_outside_the_shard(local: tuple[int, ...]) -> None:
    with pytest.raises(ConfigurationError, match="outside chunks_per_shard"):
        ShardLayout.v3((2, 2)).encode_shard({local: b"x"})


def test_encode_index_rejects_wrong_shape() -> None:
    with pytest.raises(ConfigurationError, match=r"\(3,\)"):
        ShardLayout.v3((2,)).encode_index(ShardIndex.empty((3,)))


# -- corrupt input ----------------------------------------------------------------


def _index_span(layout: ShardLayout, shard_nbytes: int) -> range:
    if layout.index_location == "start":
        return range(0, layout.index_nbytes)
    return range(shard_nbytes - layout.index_nbytes, shard_nbytes)


@pytest.mark.parametrize("make", [p for p in LAYOUTS if "crc32c" in p.id])
@pytest.mark.parametrize("where", ["first-entry", "last-entry", "checksum"])
def test_flipped_bit_in_checksummed_index_raises_checksum_error(make, where: str) -> None:
    layout = make((2, 2))
    shard = bytearray(layout.encode_shard({(0, 0): b"hello", (1, 1): b"world"}))
    span = _index_span(layout, len(shard))
    pos = {"first-entry": span[0], "last-entry": span[16 * 4 - 1], "checksum": span[-1]}[where]
    stored_before = struct.unpack("<I", bytes(shard[span[-4] : span[-1] + 1]))[0]
    shard[pos] ^= 0x10
    with pytest.raises(ChecksumError) as info:
        layout.index_of_shard(bytes(shard), "grp/arr/0.1")
    exc = info.value
    assert exc.shard_key == "grp/arr/0.1"
    raw = bytes(shard[span[0] : span[-1] + 1])
    assert exc.stored == struct.unpack("<I", raw[-4:])[0]
    assert exc.computed == crc32c.crc32c(raw[:-4])
    assert exc.stored != exc.computed
    if where != "checksum":
        assert exc.stored == stored_before
    assert f"0x{exc.stored:08x}" in str(exc) and f"0x{exc.computed:08x}" in str(exc)
    assert "'grp/arr/0.1'" in str(exc)


@pytest.mark.parametrize("make", LAYOUTS)
def test_shard_shorter_than_its_index(make) -> None:
    layout = make((4,))
    shard = layout.encode_shard({(0,): b"abc"})
    with pytest.raises(CorruptShardError, match="shorter than its") as info:
        layout.index_of_shard(shard[: layout.index_nbytes - 1], "arr/2")
    assert info.value.shard_key == "arr/2"
    assert "'arr/2'" in str(info.value)


@pytest.mark.parametrize("make", LAYOUTS)
def test_truncated_shard_points_past_its_end(make) -> None:
    layout = make((2,))
    shard = layout.encode_shard({(0,): b"a" * 10, (1,): b"b" * 10})
    n = layout.index_nbytes
    if layout.index_location == "start":
        truncated = shard[:-3]  # lose the tail of the last chunk
    else:
        truncated = shard[: 20 - 3] + shard[20:]  # lose chunk bytes before the index
    with pytest.raises(CorruptShardError) as info:
        layout.chunks_of_shard(truncated, "a/b/1.0")
    assert not isinstance(info.value, ChecksumError)
    assert info.value.shard_key == "a/b/1.0"
    assert "outside the chunk data region" in str(info.value)
    assert len(truncated) == 20 - 3 + n


@pytest.mark.parametrize("make", [p for p in LAYOUTS if "nocrc" in p.id or p.id == "draft2022"])
def test_offset_past_end_without_checksum(make) -> None:
    layout = make((2,))
    shard = bytearray(layout.encode_shard({(0,): b"abcd"}))
    span = _index_span(layout, len(shard))
    fmt = "<Q" if layout.index_endian == "little" else ">Q"
    struct.pack_into(fmt, shard, span[0], 1000)  # offset of (0,) far past the end
    with pytest.raises(CorruptShardError, match="1000") as info:
        layout.index_of_shard(bytes(shard), "arr/0")
    assert info.value.shard_key == "arr/0"


@pytest.mark.parametrize("make", LAYOUTS)
def test_decode_index_rejects_wrong_length(make) -> None:
    layout = make((2,))
    raw = layout.encode_index(ShardIndex.empty((2,)))
    with pytest.raises(CorruptShardError, match=f"expected an index of {layout.index_nbytes} bytes") as info:
        layout.decode_index(raw[1:], "k/0")
    assert info.value.shard_key == "k/0"
    with pytest.raises(CorruptShardError):
        layout.decode_index(raw + b"\0", "k/0")


@pytest.mark.parametrize(
    "cps", [pytest.param((64, 64), id="positions-memo"), pytest.param((64, 65), id="numpy-positions")]
)
def test_encode_shard_places_chunks_the_same_with_or_without_the_positions_memo(cps: tuple[int, int]) -> None:
    """Small shards take index positions from a memo, larger ones from numpy: both match the spec's reader."""
    layout = ShardLayout.v3(cps)
    rng = np.random.default_rng(0)
    picked = sorted(
        {(int(i), int(j)) for i, j in zip(rng.integers(0, cps[0], 300), rng.integers(0, cps[1], 300), strict=True)}
    )
    chunks = {(np.int64(i), np.int64(j)): bytes([i % 256, j % 256]) * (1 + (i + j) % 3) for i, j in picked}
    shard = layout.encode_shard(chunks)
    assert reference_read(shard, *_params(layout)) == {(int(i), int(j)): v for (i, j), v in chunks.items()}
    with pytest.raises(ConfigurationError, match="outside chunks_per_shard"):
        layout.encode_shard({**chunks, (cps[0], 0): b"x"})


@settings(max_examples=50, deadline=None)
@given(data=st.binary(max_size=4096), start=st.integers(0, 2**32 - 1), kind=st.sampled_from(["bytes", "view", "array"]))
def test_crc32c_of_agrees_with_the_crc32c_package_on_every_buffer(data: bytes, start: int, kind: str) -> None:
    from shardkv.format.layout import crc32c_of

    buffer = {"bytes": data, "view": memoryview(bytearray(data)), "array": np.frombuffer(data, dtype="u1")}[kind]
    assert crc32c_of(buffer) == crc32c.crc32c(data)
    assert crc32c_of(buffer, start) == crc32c.crc32c(data, start)  # continuing a checksum, as parts are checksummed
