"""ShardingCodec and the inner codecs, pure (no zarr): configuration, refusals, fill-value
chunks, partial decode request counts, corrupt input, and decode(encode(x)) == x."""

from __future__ import annotations

import gzip
import json
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardkv import ChecksumError, ConfigurationError, CorruptShardError, ShardingCodec, UnsupportedError
from shardkv.codecs.inner import CodecPipeline, codec_from_config
from shardkv.format.ranges import ByteRange

LE = {"name": "bytes", "configuration": {"endian": "little"}}
BE = {"name": "bytes", "configuration": {"endian": "big"}}
CRC = {"name": "crc32c"}
GZIP = {"name": "gzip", "configuration": {"level": 1}}

# the spec's "Configuration parameters" example, trailing commas removed
SPEC_EXAMPLE = {
    "name": "sharding_indexed",
    "configuration": {
        "chunk_shape": [32, 32],
        "codecs": [LE, GZIP],
        "index_codecs": [LE, CRC],
        "index_location": "end",
    },
}


class CountingReader:
    """A ``read_range`` callable over one shard's bytes that logs every range requested."""

    def __init__(self, blob: bytes | None) -> None:
        self.blob = blob
        self.ranges: list[ByteRange] = []

    def __call__(self, r: ByteRange) -> bytes | None:
        self.ranges.append(r)
        if self.blob is None:
            return None
        if r.is_suffix:
            return self.blob[r.start :]
        return self.blob[r.start : r.stop]


# -- configuration -------------------------------------------------------------


def test_spec_example_round_trips_exactly() -> None:
    codec = ShardingCodec.from_config(json.loads(json.dumps(SPEC_EXAMPLE)))
    assert codec.get_config() == SPEC_EXAMPLE
    assert ShardingCodec.from_config(codec.get_config()) == codec


@pytest.mark.parametrize(
    "codec",
    [
        {"name": "bytes"},
        BE,
        {"name": "transpose", "configuration": {"order": [2, 0, 1]}},
        {"name": "gzip", "configuration": {"level": 9}},
        {"name": "zstd", "configuration": {"level": -3, "checksum": True}},
        {
            "name": "blosc",
            "configuration": {"cname": "lz4", "clevel": 1, "shuffle": "bitshuffle", "typesize": 2, "blocksize": 0},
        },
        CRC,
        {"name": "numcodecs.zlib", "configuration": {"level": 4}},
        {
            "name": "sharding_indexed",
            "configuration": {"chunk_shape": [2], "codecs": [LE], "index_codecs": [BE], "index_location": "start"},
        },
    ],
    ids=lambda c: c["name"],
)
def test_codec_configs_round_trip(codec: dict) -> None:
    assert codec_from_config(codec).get_config() == codec


def test_missing_index_location_defaults_to_end() -> None:
    config = {"chunk_shape": [4], "codecs": [LE], "index_codecs": [LE]}
    assert ShardingCodec.from_config({"name": "sharding_indexed", "configuration": config}).index_location == "end"


@pytest.mark.parametrize(
    "index_codecs",
    [[LE, GZIP], [LE, {"name": "zstd", "configuration": {"level": 1}}], [LE, CRC, GZIP]],
    ids=["gzip", "zstd", "crc-gzip"],
)
def test_variable_size_index_codec_refused(index_codecs: list) -> None:
    with pytest.raises(ConfigurationError, match="variable-sized"):
        ShardingCodec((4,), index_codecs=index_codecs)


def test_fixed_size_index_codecs_other_than_bytes_crc_unsupported() -> None:
    with pytest.raises(UnsupportedError):
        ShardingCodec((4,), index_codecs=[{"name": "transpose", "configuration": {"order": [1, 0]}}, LE])


@pytest.mark.parametrize(
    "codecs,what",
    [([], "exactly one"), ([GZIP], "exactly one"), ([LE, BE], "exactly one"), ([GZIP, LE], "array -> array codecs")],
    ids=["empty", "no-array-bytes", "two-array-bytes", "bytes-before-array"],
)
def test_codecs_need_exactly_one_array_to_bytes(codecs: list, what: str) -> None:
    with pytest.raises(ConfigurationError, match=what):
        ShardingCodec((4,), codecs=codecs)
    with pytest.raises(ConfigurationError, match=what):
        ShardingCodec((4,), index_codecs=codecs)


@pytest.mark.parametrize("shard_shape", [(10, 8), (8, 9), (8,), (8, 8, 8)])
def test_inner_chunk_shape_must_divide_shard_shape(shard_shape) -> None:
    codec = ShardingCodec((4, 4))
    with pytest.raises(ConfigurationError, match="does not evenly divide"):
        codec.encode(np.zeros(shard_shape, "u1"))
    with pytest.raises(ConfigurationError, match="does not evenly divide"):
        codec.decode(b"", shard_shape, "u1")


@pytest.mark.parametrize(
    "obj",
    [
        {"name": "nope"},
        {"name": "gzip", "configuration": {"level": 1, "extra": 2}},
        {"name": "gzip"},
        {"name": "bytes", "configuration": {"endian": "middle"}},
        {"name": "transpose", "configuration": {"order": [0, 0]}},
        {"name": "blosc", "configuration": {"cname": "nope"}},
        {"name": "sharding_indexed", "configuration": {"chunk_shape": [2], "codecs": [LE]}},
        {"name": "sharding_indexed", "configuration": {"chunk_shape": [0], "codecs": [LE], "index_codecs": [LE]}},
        {
            "name": "sharding_indexed",
            "configuration": {"chunk_shape": [2], "codecs": [LE], "index_codecs": [LE], "index_location": "middle"},
        },
    ],
)
def test_invalid_configs_raise_configuration_error(obj: dict) -> None:
    with pytest.raises(ConfigurationError):
        codec_from_config(obj)


def test_multibyte_dtype_needs_endian() -> None:
    codec = ShardingCodec((2,), codecs=[{"name": "bytes"}])
    codec.encode(np.arange(4, dtype="u1"))
    with pytest.raises(ConfigurationError, match="endian"):
        codec.encode(np.arange(4, dtype="<i2"))


# -- the bytes written ---------------------------------------------------------


def test_layout_bytes_independently_parsed() -> None:
    """Chunks in row-major order, gzip inner chunks, index + LE crc32c at the end."""
    codec = ShardingCodec((2, 2), codecs=[BE, GZIP])
    x = np.arange(16, dtype="<u2").reshape(4, 4)
    blob = codec.encode(x)
    n = 4
    raw_index = blob[-(16 * n + 4) : -4]
    entries = struct.unpack("<8Q", raw_index)
    import crc32c

    assert struct.unpack("<I", blob[-4:])[0] == crc32c.crc32c(raw_index)
    expected_offset = 0
    for i, local in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
        offset, nbytes = entries[2 * i], entries[2 * i + 1]
        assert offset == expected_offset
        expected_offset += nbytes
        chunk = x[local[0] * 2 : local[0] * 2 + 2, local[1] * 2 : local[1] * 2 + 2]
        assert gzip.decompress(blob[offset : offset + nbytes]) == chunk.astype(">u2").tobytes()
    assert expected_offset == len(blob) - (16 * n + 4)


def test_index_at_start_offsets_count_from_shard_start() -> None:
    codec = ShardingCodec((2,), codecs=[LE], index_codecs=[BE], index_location="start")
    blob = codec.encode(np.array([1, 2, 3, 4], "<i4"))
    entries = struct.unpack(">4Q", blob[:32])
    assert entries == (32, 8, 40, 8)
    assert blob[32:] == np.array([1, 2, 3, 4], "<i4").tobytes()


def test_fill_value_chunks_are_empty_entries() -> None:
    codec = ShardingCodec((2, 2))
    x = np.full((4, 6), 5, dtype="<i8")
    x[0, 3] = 1
    x[3, 0] = 2
    blob = codec.encode(x, fill_value=5)
    index = codec.layout(x.shape).index_of_shard(blob, "s")
    assert set(index.present()) == {(0, 1), (1, 0)}
    np.testing.assert_array_equal(codec.decode(blob, x.shape, x.dtype, 5), x)
    # an all-fill shard is the index alone; fill_value=None stores every chunk
    assert len(codec.encode(np.full((4, 6), 5, "<i8"), fill_value=5)) == codec.index_nbytes((4, 6))
    assert codec.layout(x.shape).index_of_shard(codec.encode(x), "s").count_present() == 6


def test_fill_comparison_is_bitwise() -> None:
    """-0.0 is not the fill value 0.0, and NaN chunks match a NaN fill value."""
    codec = ShardingCodec((2,))
    x = np.array([-0.0, 0.0, np.nan, np.nan], dtype="<f4")
    index = codec.layout((4,)).index_of_shard(codec.encode(x, fill_value=0.0), "s")
    assert set(index.present()) == {(0,), (1,)}
    out = codec.decode(codec.encode(x, fill_value=0.0), (4,), "<f4", 0.0)
    assert np.signbit(out[0]) and not np.signbit(out[1])
    index = codec.layout((4,)).index_of_shard(codec.encode(x, fill_value=np.nan), "s")
    assert set(index.present()) == {(0,)}


def test_decode_returns_requested_dtype_whatever_the_stored_endian() -> None:
    x = np.arange(12, dtype=">f8").reshape(3, 4)
    for endian in (LE, BE):
        codec = ShardingCodec((3, 2), codecs=[endian])
        for out_dtype in (">f8", "<f8"):
            got = codec.decode(codec.encode(x), x.shape, out_dtype)
            assert got.dtype == np.dtype(out_dtype)
            np.testing.assert_array_equal(got, x)


def test_transpose_stores_f_order() -> None:
    codec = ShardingCodec(
        (2, 3), codecs=[{"name": "transpose", "configuration": {"order": [1, 0]}}, LE], index_codecs=[LE]
    )
    x = np.arange(6, dtype="u1").reshape(2, 3)
    blob = codec.encode(x)
    assert blob[:6] == x.tobytes(order="F")


# -- partial decode -----------------------------------------------------------


def test_partial_decode_reads_index_and_touched_chunks_only() -> None:
    codec = ShardingCodec((4, 4), codecs=[LE, GZIP])
    x = np.arange(16 * 16, dtype="<i4").reshape(16, 16)
    x[:4, 4:8] = 0  # inner chunk (0, 1) stays empty
    blob = codec.encode(x, fill_value=0)
    index = codec.layout(x.shape).index_of_shard(blob, "s")
    reader = CountingReader(blob)
    got = codec.decode_partial(reader, (slice(2, 6), slice(3, 9)), x.shape, x.dtype, 0)
    np.testing.assert_array_equal(got, x[2:6, 3:9])
    touched = [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    want = [codec.layout(x.shape).index_range()]
    for local in touched:
        entry = index.get(local)
        if entry is not None:
            want.append(ByteRange(entry[0], entry[0] + entry[1]))
    assert reader.ranges == want
    assert len(reader.ranges) == 1 + 5  # the index, then 5 stored chunks (one touched chunk is empty)


@pytest.mark.parametrize(
    "selection",
    [(slice(None),), (3,), (slice(1, 15, 5), slice(None, None, 3)), (-1, slice(2, 3)), (slice(20, 30),)],
    ids=["all", "int", "steps", "negative-int", "empty"],
)
def test_partial_decode_matches_numpy_indexing(selection) -> None:
    codec = ShardingCodec((4, 4), index_location="start")
    x = np.random.default_rng(0).standard_normal((16, 16)).astype("<f8")
    blob = codec.encode(x)
    np.testing.assert_array_equal(codec.decode_partial(CountingReader(blob), selection, x.shape, x.dtype), x[selection])


def test_partial_decode_of_missing_shard_is_fill() -> None:
    codec = ShardingCodec((2, 2))
    reader = CountingReader(None)
    got = codec.decode_partial(reader, (slice(0, 3), 1), (4, 4), "<u2", 9)
    np.testing.assert_array_equal(got, np.full(3, 9, "<u2"))
    assert len(reader.ranges) == 1


def test_nested_partial_decode_reads_inside_the_inner_shard() -> None:
    inner = ShardingCodec((2,), codecs=[LE], index_location="start")
    codec = ShardingCodec((8,), codecs=[inner])
    x = np.arange(32, dtype="<i2")
    blob = codec.encode(x)
    np.testing.assert_array_equal(codec.decode(blob, (32,), "<i2"), x)
    reader = CountingReader(blob)
    np.testing.assert_array_equal(codec.decode_partial(reader, (slice(9, 11),), (32,), "<i2"), x[9:11])
    # outer index, inner shard (1,)'s index, its inner chunks (0,) and (1,): 4 small reads
    assert len(reader.ranges) == 4
    assert all(r.nbytes is not None and r.nbytes <= 16 * 4 + 4 for r in reader.ranges)


# -- corrupt input ------------------------------------------------------------


def _shard() -> tuple[ShardingCodec, np.ndarray, bytes]:
    codec = ShardingCodec((2, 2), codecs=[LE, CRC])
    x = np.arange(16, dtype="<i4").reshape(4, 4)
    return codec, x, codec.encode(x)


@pytest.mark.parametrize("bit", [0, 7, 8 * 30 + 3, 8 * 67 + 7])
def test_flipped_bit_in_index_raises_checksum_error(bit: int) -> None:
    codec, x, blob = _shard()
    start = len(blob) - codec.index_nbytes(x.shape)
    corrupt = bytearray(blob)
    corrupt[start + bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(ChecksumError) as info:
        codec.decode(bytes(corrupt), x.shape, x.dtype, shard_key="a/c/0/0")
    assert info.value.shard_key == "a/c/0/0" and info.value.stored != info.value.computed
    with pytest.raises(ChecksumError):
        codec.decode_partial(CountingReader(bytes(corrupt)), (0,), x.shape, x.dtype)


def test_flipped_bit_in_inner_chunk_with_crc32c_raises_checksum_error() -> None:
    codec, x, blob = _shard()
    corrupt = bytearray(blob)
    corrupt[1] ^= 0x10
    with pytest.raises(ChecksumError, match="inner chunk"):
        codec.decode(bytes(corrupt), x.shape, x.dtype)


@pytest.mark.parametrize("keep", [0, 10, 67])
def test_truncated_shard_raises_corrupt_shard_error(keep: int) -> None:
    codec, x, blob = _shard()
    with pytest.raises(CorruptShardError, match="shorter than its|outside the chunk data"):
        codec.decode(blob[:keep] if keep < 68 else blob[-keep:], x.shape, x.dtype)


def test_truncated_chunk_data_is_caught_by_the_index() -> None:
    codec, x, blob = _shard()
    index_nbytes = codec.index_nbytes(x.shape)
    cut = blob[: len(blob) - index_nbytes - 5] + blob[-index_nbytes:]  # last chunk 5 bytes short
    with pytest.raises(CorruptShardError, match=r"outside the chunk data region"):
        codec.decode(cut, x.shape, x.dtype)
    # a partial read of the last chunk gets index bytes instead (the shard size is unknown to a
    # suffix read): the inner crc32c catches it
    with pytest.raises(ChecksumError):
        codec.decode_partial(CountingReader(cut), (3, 3), x.shape, x.dtype)
    # with the index at the start, the short read itself is the evidence
    codec = ShardingCodec((2, 2), codecs=[LE], index_location="start")
    blob = codec.encode(x)
    with pytest.raises(CorruptShardError, match="truncated shard or offset past the end"):
        codec.decode_partial(CountingReader(blob[:-5]), (3, 3), x.shape, x.dtype)
    with pytest.raises(CorruptShardError, match="outside the chunk data region"):
        codec.decode(blob[:-5], x.shape, x.dtype)


def test_offset_past_the_end_raises() -> None:
    codec = ShardingCodec((2,), index_codecs=[LE])
    blob = bytearray(codec.encode(np.arange(4, dtype="u1")))
    struct.pack_into("<Q", blob, len(blob) - 16, 1000)  # chunk (1,) offset
    with pytest.raises(CorruptShardError, match="outside the chunk data region"):
        codec.decode(bytes(blob), (4,), "u1")
    with pytest.raises(CorruptShardError, match="offset past the end"):
        codec.decode_partial(CountingReader(bytes(blob)), (3,), (4,), "u1")


@pytest.mark.parametrize("name", ["gzip", "zstd", "numcodecs.zlib", "numcodecs.bz2"])
def test_undecodable_bytes_raise_corrupt_shard_error_naming_the_codec(name: str) -> None:
    codec = codec_from_config({"name": name, "configuration": {"level": 1}})
    with pytest.raises(CorruptShardError, match=name) as info:
        codec.decode(b"not compressed at all", "a/c/0")
    assert info.value.shard_key == "a/c/0"


def test_undecodable_compressed_chunk_raises_corrupt_shard_error() -> None:
    codec = ShardingCodec((4,), codecs=[LE, GZIP], index_codecs=[LE])
    blob = bytearray(codec.encode(np.arange(8, dtype="<i4")))
    blob[0:4] = b"\0\0\0\0"
    with pytest.raises(CorruptShardError, match="gzip"):
        codec.decode(bytes(blob), (8,), "<i4")


# -- property -------------------------------------------------------------------

INNER = [
    [LE],
    [BE, GZIP],
    [LE, {"name": "zstd", "configuration": {"level": 1, "checksum": False}}],
    [
        LE,
        {
            "name": "blosc",
            "configuration": {"cname": "lz4", "clevel": 5, "shuffle": "shuffle", "typesize": 4, "blocksize": 0},
        },
    ],
    [LE, CRC],
    [LE, {"name": "numcodecs.bz2", "configuration": {"level": 1}}],
]


@st.composite
def shards(draw):
    ndim = draw(st.integers(1, 3))
    chunk = tuple(draw(st.integers(1, 3)) for _ in range(ndim))
    cps = tuple(draw(st.integers(1, 3)) for _ in range(ndim))
    shape = tuple(c * n for c, n in zip(chunk, cps, strict=True))
    dtype = np.dtype(draw(st.sampled_from(["u1", "<i2", ">i2", "<f4", ">f8", "b1", "<c8"])))
    raw = draw(st.binary(min_size=int(np.prod(shape)) * dtype.itemsize, max_size=int(np.prod(shape)) * dtype.itemsize))
    x = np.frombuffer(raw, dtype=dtype.newbyteorder("=") if dtype.kind != "b" else "u1").reshape(shape)
    x = (x % 2).astype(bool) if dtype.kind == "b" else x.astype(dtype)
    inner = list(draw(st.sampled_from(INNER)))
    if draw(st.booleans()) and ndim > 1:
        inner = [{"name": "transpose", "configuration": {"order": list(range(ndim))[::-1]}}, *inner]
    if draw(st.booleans()):
        inner = [ShardingCodec(chunk, codecs=inner, index_location=draw(st.sampled_from(["start", "end"])))]
        chunk = tuple(
            c * draw(st.sampled_from([n for n in (1, 2, 3) if cp % n == 0])) for c, cp in zip(chunk, cps, strict=True)
        )
    codec = ShardingCodec(
        chunk,
        inner,
        index_codecs=draw(st.sampled_from([[LE], [BE], [LE, CRC], [BE, CRC]])),
        index_location=draw(st.sampled_from(["start", "end"])),
    )
    fill = draw(st.sampled_from([None, x.flat[0]]))
    return codec, x, fill


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shards(), st.data())
def test_decode_encode_round_trip(case, data) -> None:
    codec, x, fill = case
    blob = codec.encode(x, fill)
    got = codec.decode(blob, x.shape, x.dtype, fill)
    assert got.dtype == x.dtype
    assert got.tobytes() == x.tobytes()  # bitwise: NaN payloads and -0.0 survive
    sel = tuple(slice(data.draw(st.integers(0, n - 1)), None, data.draw(st.integers(1, 3))) for n in x.shape)
    part = codec.decode_partial(CountingReader(blob), sel, x.shape, x.dtype, fill)
    assert part.tobytes() == x[sel].tobytes()


def test_pipeline_refuses_codecs_out_of_order() -> None:
    with pytest.raises(ConfigurationError):
        CodecPipeline([LE, {"name": "transpose", "configuration": {"order": [0]}}])


# -- spec clauses not covered above -------------------------------------------------


def test_name_must_be_sharding_indexed() -> None:
    with pytest.raises(ConfigurationError, match="sharding_indexed"):
        ShardingCodec.from_config({**SPEC_EXAMPLE, "name": "sharding"})
    with pytest.raises(ConfigurationError, match="codecs is required"):
        ShardingCodec.from_config(
            {"name": "sharding_indexed", "configuration": {"chunk_shape": [2], "index_codecs": [LE]}}
        )


def test_default_index_codecs_are_the_recommended_ones() -> None:
    config = ShardingCodec((4,)).get_config()["configuration"]
    assert config["index_codecs"] == [LE, CRC] and config["index_location"] == "end"


def test_any_chunk_order_and_unused_bytes_between_chunks_decode() -> None:
    """Spec: unused space between inner chunks is allowed and the order of chunk content is not fixed."""
    codec = ShardingCodec((2,), codecs=[LE], index_codecs=[LE, CRC])
    x = np.array([1, 2, 3, 4, 5, 6], dtype="<u2")
    layout = codec.layout(x.shape)
    chunks = [x[i : i + 2].tobytes() for i in (0, 2, 4)]
    # chunk 2 first, then 7 junk bytes, chunk 0, then chunk 1; index at the end
    body = chunks[2] + b"JUNKJUN" + chunks[0] + chunks[1]
    from shardkv import ShardIndex

    index = ShardIndex.empty((3,))
    index.set((2,), 0, 4)
    index.set((0,), 11, 4)
    index.set((1,), 15, 4)
    blob = body + layout.encode_index(index)
    np.testing.assert_array_equal(codec.decode(blob, x.shape, x.dtype), x)
    np.testing.assert_array_equal(codec.decode_partial(CountingReader(blob), (slice(1, 5),), x.shape, x.dtype), x[1:5])


def test_half_empty_index_entry_is_corrupt() -> None:
    codec = ShardingCodec((2,), index_codecs=[LE])
    blob = bytearray(codec.encode(np.arange(4, dtype="u1")))
    struct.pack_into("<Q", blob, len(blob) - 32, 2**64 - 1)  # chunk (0,) offset only
    with pytest.raises(CorruptShardError, match="only one of offset/nbytes"):
        codec.decode(bytes(blob), (4,), "u1")
