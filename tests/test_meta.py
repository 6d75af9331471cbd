"""The v3 ``zarr.json`` view of a sharded v2 array, and reading a sharding spec back from it.

The v2 ``.zarray`` documents are written by zarr-python 2.18 itself (not by hand), so the
translation is tested on the documents it will really meet.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numcodecs
import numpy as np
import pytest
import zarr

from shardkv import ConfigurationError, ShardLayout, UnsupportedError
from shardkv.keys.space import V2ChunkKeyEncoding
from shardkv.metadata.chunks_per_shard import normalize_chunks_per_shard
from shardkv.metadata.v2_view import fill_value_from_v3, v2_view_of_v3
from shardkv.metadata.v3_view import (
    SHARDING_CODEC,
    V2_FILL_FIELD,
    sharding_spec_from_v3,
    v2_dimension_separator,
    v3_view_of_v2,
)


def zarray_of(**kwargs: Any) -> dict[str, Any]:
    """The .zarray zarr-python 2 writes for ``zarr.create(**kwargs)``."""
    store: dict[str, bytes] = {}
    kwargs.setdefault("shape", (8, 6))
    kwargs.setdefault("chunks", (2, 3))
    zarr.create(store=store, **kwargs)
    return json.loads(store[".zarray"])


def sharding(view: dict[str, Any]) -> dict[str, Any]:
    (codec,) = view["codecs"]
    assert codec["name"] == SHARDING_CODEC
    return codec["configuration"]


@pytest.mark.parametrize(
    "dtype, data_type, bytes_codec",
    [
        pytest.param("<i4", "int32", {"name": "bytes", "configuration": {"endian": "little"}}, id="i4-le"),
        pytest.param(">i8", "int64", {"name": "bytes", "configuration": {"endian": "big"}}, id="i8-be"),
        pytest.param("<u2", "uint16", {"name": "bytes", "configuration": {"endian": "little"}}, id="u2-le"),
        pytest.param(">f8", "float64", {"name": "bytes", "configuration": {"endian": "big"}}, id="f8-be"),
        pytest.param("<f4", "float32", {"name": "bytes", "configuration": {"endian": "little"}}, id="f4-le"),
        pytest.param("<f2", "float16", {"name": "bytes", "configuration": {"endian": "little"}}, id="f2-le"),
        pytest.param("<c16", "complex128", {"name": "bytes", "configuration": {"endian": "little"}}, id="c16-le"),
        pytest.param("|u1", "uint8", {"name": "bytes"}, id="u1"),
        pytest.param("|i1", "int8", {"name": "bytes"}, id="i1"),
        pytest.param("|b1", "bool", {"name": "bytes"}, id="bool"),
    ],
)
def test_dtypes(dtype: str, data_type: str, bytes_codec: dict) -> None:
    zarray = zarray_of(dtype=dtype, compressor=None)
    view = v3_view_of_v2(zarray, None, ShardLayout.v3((2, 2)))
    assert view.translatable and view.problems == ()
    meta = view.metadata
    assert meta["data_type"] == data_type
    assert sharding(meta)["codecs"] == [bytes_codec]


def test_whole_document() -> None:
    zarray = zarray_of(dtype="<i2", compressor=None, dimension_separator="/", fill_value=7)
    layout = ShardLayout.v3((4, 2), "start", "big", False)
    meta = v3_view_of_v2(zarray, {"units": "m"}, layout).metadata
    assert meta == {
        "zarr_format": 3,
        "node_type": "array",
        "shape": [8, 6],
        "data_type": "int16",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [8, 6]}},
        "chunk_key_encoding": {"name": "v2", "configuration": {"separator": "/"}},
        "fill_value": 7,
        "codecs": [
            {
                "name": "sharding_indexed",
                "configuration": {
                    "chunk_shape": [2, 3],
                    "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
                    "index_codecs": [{"name": "bytes", "configuration": {"endian": "big"}}],
                    "index_location": "start",
                },
            }
        ],
        "attributes": {"units": "m"},
    }
    json.dumps(meta, allow_nan=False)  # valid strict JSON


def test_index_codecs_with_checksum() -> None:
    meta = v3_view_of_v2(zarray_of(dtype="<i2"), None, ShardLayout.v3((1, 1))).metadata
    assert sharding(meta)["index_codecs"] == [
        {"name": "bytes", "configuration": {"endian": "little"}},
        {"name": "crc32c"},
    ]
    assert sharding(meta)["index_location"] == "end"
    assert meta["chunk_key_encoding"] == {"name": "v2", "configuration": {"separator": "."}}


@pytest.mark.parametrize(
    "compressor, expected, problem",
    [
        pytest.param(None, [], None, id="none"),
        pytest.param(numcodecs.GZip(level=6), [{"name": "gzip", "configuration": {"level": 6}}], None, id="gzip"),
        pytest.param(
            numcodecs.Zstd(level=3),
            [{"name": "zstd", "configuration": {"level": 3, "checksum": False}}],
            None,
            id="zstd",
        ),
        pytest.param(
            numcodecs.Blosc(cname="zstd", clevel=3, shuffle=numcodecs.Blosc.BITSHUFFLE),
            [
                {
                    "name": "blosc",
                    "configuration": {
                        "cname": "zstd",
                        "clevel": 3,
                        "shuffle": "bitshuffle",
                        "typesize": 4,
                        "blocksize": 0,
                    },
                }
            ],
            None,
            id="blosc-bitshuffle",
        ),
        pytest.param(
            numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.AUTOSHUFFLE),
            [
                {
                    "name": "blosc",
                    "configuration": {"cname": "lz4", "clevel": 5, "shuffle": "shuffle", "typesize": 4, "blocksize": 0},
                }
            ],
            None,
            id="blosc-autoshuffle",
        ),
        pytest.param(
            numcodecs.Zlib(level=2), [{"name": "numcodecs.zlib", "configuration": {"level": 2}}], "'zlib'", id="zlib"
        ),
        pytest.param(
            numcodecs.BZ2(level=1), [{"name": "numcodecs.bz2", "configuration": {"level": 1}}], "'bz2'", id="bz2"
        ),
    ],
)
def test_compressors(compressor, expected: list, problem: str | None) -> None:
    view = v3_view_of_v2(zarray_of(dtype="<f4", compressor=compressor), None, ShardLayout.v3((2, 2)))
    codecs = sharding(view.metadata)["codecs"]
    assert codecs[0] == {"name": "bytes", "configuration": {"endian": "little"}}
    assert codecs[1:] == expected
    if problem is None:
        assert view.translatable
    else:
        assert not view.translatable
        assert any(problem in p for p in view.problems)


def test_blosc_autoshuffle_on_bytes_is_bitshuffle() -> None:
    view = v3_view_of_v2(
        zarray_of(dtype="|u1", compressor=numcodecs.Blosc(shuffle=numcodecs.Blosc.AUTOSHUFFLE)),
        None,
        ShardLayout.v3((1, 1)),
    )
    assert sharding(view.metadata)["codecs"][1]["configuration"]["shuffle"] == "bitshuffle"


@pytest.mark.parametrize(
    "shape, chunks, order, transpose",
    [
        pytest.param((8, 6), (2, 3), "F", [1, 0], id="2d-F"),
        pytest.param((4, 4, 4), (2, 2, 2), "F", [2, 1, 0], id="3d-F"),
        pytest.param((8, 6), (2, 3), "C", None, id="2d-C"),
        pytest.param((8,), (2,), "F", [0], id="1d-F"),  # kept: zarr 2 reopens it as F
    ],
)
def test_order(shape, chunks, order: str, transpose) -> None:
    zarray = zarray_of(shape=shape, chunks=chunks, dtype="<i4", order=order, compressor=None)
    codecs = sharding(v3_view_of_v2(zarray, None, ShardLayout.v3((1,) * len(shape))).metadata)["codecs"]
    if transpose is None:
        assert [c["name"] for c in codecs] == ["bytes"]
    else:
        assert codecs[0] == {"name": "transpose", "configuration": {"order": transpose}}
        assert codecs[1]["name"] == "bytes"


@pytest.mark.parametrize(
    "dtype, fill_value, expected",
    [
        pytest.param("<f8", np.nan, "NaN", id="nan"),
        pytest.param("<f8", np.inf, "Infinity", id="inf"),
        pytest.param("<f4", -np.inf, "-Infinity", id="-inf"),
        pytest.param("<f8", 1.5, 1.5, id="float"),
        pytest.param("<f8", None, 0, id="float-None"),
        pytest.param("<i4", None, 0, id="int-None"),
        pytest.param("<i4", -3, -3, id="int"),
        pytest.param("|b1", None, False, id="bool-None"),
        pytest.param("|b1", True, True, id="bool"),
        pytest.param("<c16", None, [0.0, 0.0], id="complex-None"),
        pytest.param("<c16", 1 + 2j, [1.0, 2.0], id="complex"),
        pytest.param("<c8", complex(np.nan, 1), ["NaN", 1.0], id="complex-nan"),
    ],
)
def test_fill_values(dtype: str, fill_value: Any, expected: Any) -> None:
    zarray = zarray_of(dtype=dtype, fill_value=fill_value, compressor=None)
    meta = v3_view_of_v2(zarray, None, ShardLayout.v3((1, 1))).metadata
    assert meta["fill_value"] == expected
    assert type(meta["fill_value"]) is type(expected)
    json.dumps(meta, allow_nan=False)


def test_raw_float_fill_values_are_spelled_as_v3_strings() -> None:
    # the same values as Python floats (a .zarray written by other tools)
    for value, spelled in [(math.nan, "NaN"), (math.inf, "Infinity"), (-math.inf, "-Infinity")]:
        zarray = {
            "shape": [4],
            "chunks": [2],
            "dtype": "<f8",
            "fill_value": value,
            "compressor": None,
            "filters": None,
            "order": "C",
            "zarr_format": 2,
        }
        assert v3_view_of_v2(zarray, None, ShardLayout.v3((2,))).metadata["fill_value"] == spelled


@pytest.mark.parametrize(
    "dtype,data_type,endian",
    [
        ("<U4", {"name": "fixed_length_utf32", "configuration": {"length_bytes": 16}}, "little"),
        (">U4", {"name": "fixed_length_utf32", "configuration": {"length_bytes": 16}}, "big"),
        ("|S8", {"name": "null_terminated_bytes", "configuration": {"length_bytes": 8}}, None),
        ("|V2", {"name": "raw_bytes", "configuration": {"length_bytes": 2}}, None),
        ("<M8[ns]", {"name": "numpy.datetime64", "configuration": {"unit": "ns", "scale_factor": 1}}, "little"),
        (">m8[10s]", {"name": "numpy.timedelta64", "configuration": {"unit": "s", "scale_factor": 10}}, "big"),
    ],
    ids=["U4", "U4-big", "S8", "V2", "datetime-ns", "timedelta-10s"],
)
def test_v2_dtypes_without_core_type_use_zarr3_extension_names(dtype: str, data_type: dict, endian: str | None) -> None:
    """The names zarr-python 3 registers (it reads them: tests/latest); tensorstore refuses them."""
    zarray = zarray_of(dtype=dtype, compressor=None)
    view = v3_view_of_v2(zarray, None, ShardLayout.v3((1, 1)))
    assert not view.translatable
    assert any(repr(dtype) in p and data_type["name"] in p for p in view.problems)
    assert view.metadata["data_type"] == data_type
    bytes_codec = sharding(view.metadata)["codecs"][0]
    assert bytes_codec == ({"name": "bytes", "configuration": {"endian": endian}} if endian else {"name": "bytes"})
    # and back: the presented .zarray has the dtype and fill value zarr 2 wrote
    presented = v2_view_of_v3(view.metadata).documents[".zarray"]
    assert presented["dtype"] == zarray["dtype"] and presented["fill_value"] == zarray["fill_value"]


def test_structured_dtype_is_zarr3_structured() -> None:
    zarray = zarray_of(dtype=[("a", "<i4"), ("b", "<f8")], fill_value=None, compressor=None)
    meta = v3_view_of_v2(zarray, None, ShardLayout.v3((1, 1))).metadata
    assert meta["data_type"] == {"name": "structured", "configuration": {"fields": [["a", "int32"], ["b", "float64"]]}}
    assert v2_view_of_v3(meta).documents[".zarray"]["dtype"] == [["a", "<i4"], ["b", "<f8"]]


def test_subarray_structured_dtype_has_no_v3_equivalent() -> None:
    # (was test_structured_dtype_has_no_v3_equivalent: flat structured dtypes now map to zarr 3's "structured")
    zarray = zarray_of(dtype=[("a", "<i4", (2,)), ("b", "<f8")], fill_value=None, compressor=None)
    view = v3_view_of_v2(zarray, None, ShardLayout.v3((1, 1)))
    assert not view.translatable
    assert any("no Zarr v3 reader decodes it" in p for p in view.problems)
    meta = view.metadata
    assert meta["data_type"] == {"name": "shardkv.v2_dtype", "configuration": {"dtype": zarray["dtype"]}}
    # one opaque codec: no v3 reader may decode the chunks as something else
    assert [c["name"] for c in sharding(meta)["codecs"]] == ["shardkv.v2_chunk"]
    # the sharding itself is still readable by shardkv
    assert sharding_spec_from_v3(meta).chunks == (2, 3)  # type: ignore[union-attr]


@pytest.mark.parametrize("dtype", ["<i4", "<f8", "|b1", "<c16", "<U3", "|S2", "|V4", "<M8[s]"])
def test_null_fill_value_is_the_zero_of_the_type_and_comes_back_as_null(dtype: str) -> None:
    zarray = zarray_of(dtype=dtype, fill_value=None, compressor=None)
    assert zarray["fill_value"] is None
    meta = v3_view_of_v2(zarray, None, ShardLayout.v3((1, 1))).metadata
    assert meta[V2_FILL_FIELD] == {"must_understand": False, "fill_value": None}
    zero = np.zeros((), dtype=dtype)[()]
    assert fill_value_from_v3(meta["fill_value"], np.dtype(dtype)) == zero
    assert v2_view_of_v3(meta).documents[".zarray"]["fill_value"] is None
    # a writer that drops the marker (zarr 3 rewriting the document) leaves the zero
    del meta[V2_FILL_FIELD]
    assert v2_view_of_v3(meta).documents[".zarray"]["fill_value"] is not None


def test_non_string_fill_of_a_string_dtype_is_what_zarr2_fills_with() -> None:
    """The shared fixture's |S1 and <U4 arrays say fill_value 0: zarr 2 fills with b"0" and "0"."""
    for dtype, spelled, value in [("|S1", "MA==", b"0"), ("<U4", "0", "0")]:
        zarray = {**zarray_of(dtype=dtype, compressor=None), "fill_value": 0}
        meta = v3_view_of_v2(zarray, None, ShardLayout.v3((1, 1))).metadata
        assert meta["fill_value"] == spelled
        assert fill_value_from_v3(spelled, np.dtype(dtype)) == value


def test_filters_are_problems() -> None:
    zarray = zarray_of(dtype="<i4", filters=[numcodecs.Delta("<i4")], compressor=None)
    view = v3_view_of_v2(zarray, None, ShardLayout.v3((1, 1)))
    assert not view.translatable
    assert any("'delta'" in p for p in view.problems)
    codecs = sharding(view.metadata)["codecs"]
    assert codecs[0] == {"name": "numcodecs.delta", "configuration": {"dtype": "<i4", "astype": "<i4"}}


def test_cps_must_match_ndim() -> None:
    with pytest.raises(ConfigurationError, match="dimension"):
        v3_view_of_v2(zarray_of(), None, ShardLayout.v3((2,)))


# -- v3 -> sharding spec ------------------------------------------------------


LAYOUTS = [
    pytest.param(ShardLayout.v3((2, 3)), id="end-le-crc"),
    pytest.param(ShardLayout.v3((2, 3), "start", "big", False), id="start-be-nocrc"),
    pytest.param(ShardLayout.v3((1, 1), "end", "little", False), id="end-le-nocrc"),
    pytest.param(ShardLayout.v3((4, 1), "start", "little", True), id="start-le-crc"),
]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("separator", [".", "/"])
def test_sharding_spec_round_trip(layout: ShardLayout, separator: str) -> None:
    zarray = zarray_of(shape=(9, 7), chunks=(2, 3), dimension_separator=separator)
    spec = sharding_spec_from_v3(v3_view_of_v2(zarray, None, layout).metadata, "arr")
    assert spec is not None
    assert spec.shape == (9, 7)
    assert spec.chunks == (2, 3)
    assert spec.layout == layout
    assert spec.layout.chunks_per_shard == layout.chunks_per_shard
    assert spec.shard_key_encoding == V2ChunkKeyEncoding(separator)


def _sharded_doc(**config: Any) -> dict[str, Any]:
    configuration = {
        "chunk_shape": [2, 3],
        "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
        "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
        "index_location": "end",
    }
    configuration.update(config)
    return {
        "zarr_format": 3,
        "node_type": "array",
        "shape": [8, 6],
        "data_type": "int32",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4, 6]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0,
        "codecs": [{"name": "sharding_indexed", "configuration": configuration}],
    }


def test_v3_document_default_encoding() -> None:
    from shardkv.keys.space import DefaultChunkKeyEncoding

    spec = sharding_spec_from_v3(_sharded_doc())
    assert spec is not None
    assert spec.layout.chunks_per_shard == (2, 2)
    assert spec.shard_key_encoding == DefaultChunkKeyEncoding("/")


def test_unsharded_documents() -> None:
    doc = _sharded_doc()
    doc["codecs"] = [{"name": "bytes", "configuration": {"endian": "little"}}]
    assert sharding_spec_from_v3(doc) is None
    doc["codecs"] = [{"name": "transpose", "configuration": {"order": [1, 0]}}, _sharded_doc()["codecs"][0]]
    assert sharding_spec_from_v3(doc) is None
    doc["codecs"] = []
    assert sharding_spec_from_v3(doc) is None


@pytest.mark.parametrize(
    "index_codecs",
    [
        pytest.param([{"name": "gzip", "configuration": {"level": 1}}], id="gzip"),
        pytest.param([{"name": "bytes"}, {"name": "gzip"}], id="bytes-gzip"),
        pytest.param([{"name": "crc32c"}, {"name": "bytes"}], id="crc-first"),
        pytest.param([], id="none"),
    ],
)
def test_unsupported_index_codecs(index_codecs: list) -> None:
    with pytest.raises(UnsupportedError, match="index_codecs"):
        sharding_spec_from_v3(_sharded_doc(index_codecs=index_codecs))


@pytest.mark.parametrize(
    "chunk_shape",
    [
        pytest.param([3, 3], id="3-into-4"),
        pytest.param([2, 4], id="4-into-6"),
        pytest.param([2], id="wrong-ndim"),
        pytest.param([0, 3], id="zero"),
    ],
)
def test_inner_chunks_must_divide_the_shard(chunk_shape: list) -> None:
    with pytest.raises(ConfigurationError, match="does not evenly divide") as info:
        sharding_spec_from_v3(_sharded_doc(chunk_shape=chunk_shape), "g/a")
    assert info.value.path == "g/a"


def test_bad_index_location() -> None:
    with pytest.raises(ConfigurationError, match="'middle'"):
        sharding_spec_from_v3(_sharded_doc(index_location="middle"))


def test_irregular_grid_unsupported() -> None:
    doc = _sharded_doc()
    doc["chunk_grid"] = {"name": "rectilinear", "configuration": {}}
    with pytest.raises(UnsupportedError, match="rectilinear"):
        sharding_spec_from_v3(doc)


# -- small helpers ------------------------------------------------------------


@pytest.mark.parametrize(
    "value, ndim, expected",
    [
        pytest.param(3, 2, (3, 3), id="int"),
        pytest.param(np.int64(2), 3, (2, 2, 2), id="numpy-int"),
        pytest.param((1, 4), 2, (1, 4), id="tuple"),
        pytest.param([5], 1, (5,), id="list"),
    ],
)
def test_normalize_chunks_per_shard(value, ndim: int, expected: tuple) -> None:
    assert normalize_chunks_per_shard(value, ndim) == expected


@pytest.mark.parametrize(
    "value, ndim, match",
    [
        pytest.param((2, 2), 3, "2 value", id="wrong-length"),
        pytest.param(0, 2, ">= 1", id="zero"),
        pytest.param((2, -1), 2, ">= 1", id="negative"),
        pytest.param(True, 2, "int", id="bool"),
        pytest.param((2.0, 2), 2, ">= 1", id="float"),
        pytest.param("ab", 2, ">= 1", id="str"),
        pytest.param(None, 2, "int", id="None"),
    ],
)
def test_normalize_chunks_per_shard_rejects(value, ndim: int, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match) as info:
        normalize_chunks_per_shard(value, ndim, "arr")
    assert info.value.path == "arr"


@pytest.mark.parametrize(
    "zarray, sep",
    [
        pytest.param({}, ".", id="absent"),
        pytest.param({"dimension_separator": None}, ".", id="null"),
        pytest.param({"dimension_separator": "/"}, "/", id="slash"),
    ],
)
def test_v2_dimension_separator(zarray: dict, sep: str) -> None:
    assert v2_dimension_separator(zarray) == sep


def test_v2_dimension_separator_rejects() -> None:
    with pytest.raises(ConfigurationError, match="'-'"):
        v2_dimension_separator({"dimension_separator": "-"})
