"""The v2 -> v3 mapping of dtypes, order, filters, compressors and fill values, and its inverse. Pure."""

from __future__ import annotations

import json
from typing import Any

import numcodecs
import numpy as np
import pytest
import zarr

from shardkv.codecs.inner import CodecPipeline
from shardkv.format.layout import ShardLayout
from shardkv.metadata.hierarchy import array_document, is_opaque, present, with_consolidated_metadata
from shardkv.metadata.v2_codecs import OPAQUE_DATA_TYPE, v3_encoding_of_v2
from shardkv.metadata.v3_view import V2_COMPRESSOR_FIELD, V2_FILL_FIELD, v3_view_of_v2


def _zarray(shape: tuple[int, ...] = (6,), chunks: tuple[int, ...] = (2,), **kwargs: Any) -> dict[str, Any]:
    """The .zarray zarr-python 2.18 itself writes for these arguments."""
    store: dict[str, Any] = {}
    zarr.create(shape, chunks=chunks, store=store, **kwargs)
    return json.loads(store[".zarray"])


def _inner(zarray: dict[str, Any]) -> list[dict[str, Any]]:
    meta = v3_view_of_v2(zarray, None, ShardLayout.v3((1,) * len(zarray["shape"]))).metadata
    return meta["codecs"][0]["configuration"]["codecs"]


def _names(zarray: dict[str, Any]) -> list[str]:
    return [c["name"] for c in _inner(zarray)]


ROUND_TRIPS = {
    "delta": dict(dtype="<i4", filters=[numcodecs.Delta(dtype="<i4")]),
    "fixedscaleoffset+zlib": dict(
        dtype="<f8",
        filters=[numcodecs.FixedScaleOffset(1, 10, dtype="<f8", astype="<i4")],
        compressor=numcodecs.Zlib(3),
    ),
    "quantize+astype": dict(dtype="<f8", filters=[numcodecs.Quantize(2, dtype="<f8"), numcodecs.AsType("<f4", "<f8")]),
    "packbits": dict(dtype=bool, filters=[numcodecs.PackBits()]),
    "crc32-filter-only": dict(dtype="<i2", filters=[numcodecs.CRC32()], compressor=None),
    "delta+crc32+lz4": dict(
        dtype="<u2", filters=[numcodecs.Delta(dtype="<u2"), numcodecs.CRC32()], compressor=numcodecs.LZ4()
    ),
    "str": dict(dtype=str),
    "str-fill": dict(dtype=str, fill_value="x"),
    "bytes": dict(dtype=bytes),
    "object-utf8-zstd": dict(dtype=object, object_codec=numcodecs.VLenUTF8(), compressor=numcodecs.Zstd(3)),
    "msgpack": dict(dtype=object, object_codec=numcodecs.MsgPack()),
    "json": dict(dtype=object, object_codec=numcodecs.JSON()),
    "vlen-array": dict(dtype=object, object_codec=numcodecs.VLenArray("<i4")),
    "categorize": dict(dtype=object, filters=[numcodecs.Categorize(["a", "b"], dtype=object)]),
    "struct": dict(dtype=[("a", "<i4"), ("b", "<f8")], fill_value=None),
    "struct-fill": dict(dtype=[("a", "<i4"), ("b", "<f8")], fill_value=(1, 2.5)),
    "nested-struct": dict(dtype=[("a", "<i2"), ("b", [("c", "<f4"), ("d", "|S3")])]),
    "subarray-struct": dict(dtype=[("a", "<i4", (2,))]),
    "big-endian-struct": dict(dtype=[("a", ">i4")]),
    "datetime": dict(dtype="<M8[ns]", fill_value=None),
    "timedelta": dict(dtype="<m8[ms]", fill_value=3),
    "U": dict(dtype=">U3", fill_value="ab"),
    "S": dict(dtype="|S4", fill_value=b"ab"),
    "V": dict(dtype="|V3"),
    "F-1d": dict(dtype="<f4", order="F"),
    "F-2d": dict(dtype="<f4", order="F", shape=(4, 6), chunks=(2, 3)),
    "F-3d-filters": dict(
        dtype="<i8", order="F", shape=(4, 4, 2), chunks=(2, 2, 1), filters=[numcodecs.Delta(dtype="<i8")]
    ),
    "blosc-autoshuffle": dict(dtype="<f8", compressor=numcodecs.Blosc(shuffle=numcodecs.Blosc.AUTOSHUFFLE)),
    "big-endian-delta": dict(dtype=">i4", filters=[numcodecs.Delta(dtype=">i4")]),
    "nan": dict(dtype="<f4", fill_value=np.nan),
    "-inf": dict(dtype="<f8", fill_value=-np.inf),
    "null": dict(dtype="<c16", fill_value=None),
}


@pytest.mark.parametrize("kwargs", list(ROUND_TRIPS.values()), ids=list(ROUND_TRIPS))
def test_presented_zarray_is_the_one_zarr2_wrote(kwargs: dict[str, Any]) -> None:
    kwargs = dict(kwargs)
    shape, chunks = kwargs.pop("shape", (6,)), kwargs.pop("chunks", (2,))
    zarray = _zarray(shape, chunks, **kwargs)
    doc = array_document(zarray, {"a": 1}, ShardLayout.v3((2,) * len(shape)))  # as the proxy stores it
    CodecPipeline(doc["codecs"][0]["configuration"]["codecs"])  # a valid v3 codec list
    docs = present(doc, "x")
    assert docs[".zarray"] == zarray
    assert docs[".zattrs"] == {"a": 1}


@pytest.mark.parametrize(
    "kwargs, names",
    [
        (
            dict(dtype="<i4", filters=[numcodecs.Delta(dtype="<i4")], compressor=numcodecs.Zlib(1)),
            ["numcodecs.delta", "bytes", "numcodecs.zlib"],
        ),
        (
            dict(dtype="<i4", filters=[numcodecs.Shuffle(4)], compressor=numcodecs.GZip(1)),
            ["bytes", "numcodecs.shuffle", "gzip"],
        ),
        (dict(dtype=str, compressor=None), ["vlen-utf8"]),
        (dict(dtype=bytes, compressor=numcodecs.Zstd(1)), ["vlen-bytes", "zstd"]),
        (dict(dtype="<f4", order="F", compressor=None), ["transpose", "bytes"]),
    ],
    ids=["aa-filter-before-bytes", "bb-filter-after-bytes", "vlen-utf8", "vlen-bytes", "1d-F"],
)
def test_v2_features_take_their_registered_v3_names(kwargs: dict[str, Any], names: list[str]) -> None:
    assert _names(_zarray(**kwargs)) == names


def test_vlen_data_types() -> None:
    assert v3_encoding_of_v2(_zarray(dtype=str)).data_type == "string"
    assert v3_encoding_of_v2(_zarray(dtype=bytes)).data_type == "variable_length_bytes"


def test_nested_structured_is_zarr3_structured() -> None:
    encoding = v3_encoding_of_v2(_zarray(dtype=[("a", "<i2"), ("b", [("c", "<f4"), ("d", "|S3")])]))
    assert encoding.data_type == {
        "name": "structured",
        "configuration": {
            "fields": [
                ["a", "int16"],
                [
                    "b",
                    {
                        "name": "structured",
                        "configuration": {
                            "fields": [
                                ["c", "float32"],
                                ["d", {"name": "null_terminated_bytes", "configuration": {"length_bytes": 3}}],
                            ]
                        },
                    },
                ],
            ]
        },
    }


@pytest.mark.parametrize(
    "kwargs, why",
    [
        (dict(dtype=object, object_codec=numcodecs.MsgPack()), "object codec 'msgpack2'"),
        (dict(dtype=object, filters=[numcodecs.Categorize(["a"], dtype=object)]), "object codec 'categorize'"),
        (dict(dtype=[("a", "<i4", (2,))]), "dtype"),
        (dict(dtype=">i4", filters=[numcodecs.Delta(dtype=">i4")]), "big-endian"),
        (dict(dtype="<i4", filters=[numcodecs.CRC32(), numcodecs.Delta(dtype="<i4")]), "after a bytes -> bytes filter"),
        (dict(dtype="<i4", filters=[numcodecs.Base64()]), "filter 'base64'"),
    ],
    ids=["msgpack", "categorize", "subarray", "big-endian-filter", "aa-after-bb", "unknown-filter"],
)
def test_what_no_v3_reader_has_is_opaque(kwargs: dict[str, Any], why: str) -> None:
    zarray = _zarray(**kwargs)
    view = v3_view_of_v2(zarray, None, ShardLayout.v3((1,)))
    assert is_opaque(view.metadata) and not view.translatable
    assert view.metadata["data_type"]["name"] == OPAQUE_DATA_TYPE
    assert _names(zarray) == ["shardkv.v2_chunk"]
    assert any(why in p for p in view.problems), view.problems


def test_opaque_chunks_decode_as_zarr2_wrote_them() -> None:
    store: dict[str, Any] = {}
    z = zarr.create(
        (5,), chunks=(3,), dtype=object, object_codec=numcodecs.MsgPack(), compressor=numcodecs.Zlib(1), store=store
    )
    z[:] = np.array([[1, "a"], {"k": 2}, "s", 3.5, None], dtype=object)
    pipeline = CodecPipeline(_inner(json.loads(store[".zarray"])))
    decoded = pipeline.decode(store["0"], (3,), np.dtype(object))
    assert decoded.tolist() == [[1, "a"], {"k": 2}, "s"]
    assert bytes(pipeline.encode(decoded)) == bytes(store["0"])


def test_numcodecs_filters_decode_as_zarr2_wrote_them() -> None:
    store: dict[str, Any] = {}
    filters = [numcodecs.FixedScaleOffset(0, 10, dtype="<f8", astype="<i2"), numcodecs.Delta(dtype="<i2")]
    z = zarr.create(
        (4, 3), chunks=(2, 3), dtype="<f8", order="F", filters=filters, compressor=numcodecs.LZ4(), store=store
    )
    z[:] = np.arange(12.0).reshape(4, 3) / 10
    pipeline = CodecPipeline(_inner(json.loads(store[".zarray"])))
    np.testing.assert_array_equal(pipeline.decode(store["1.0"], (2, 3), np.dtype("<f8")), z[2:4])


def test_stale_records_give_way_to_the_v3_document() -> None:
    zarray = _zarray(dtype="<f8", fill_value=None, compressor=numcodecs.Blosc(shuffle=numcodecs.Blosc.AUTOSHUFFLE))
    meta = v3_view_of_v2(zarray, None, ShardLayout.v3((1,))).metadata
    assert meta[V2_FILL_FIELD]["fill_value"] is None and meta[V2_COMPRESSOR_FIELD]["compressor"]["shuffle"] == -1
    meta["fill_value"] = 2.5  # a v3 writer changed both and kept the records
    meta["codecs"][0]["configuration"]["codecs"][-1]["configuration"]["cname"] = "zstd"
    zarray_back = present(meta)[".zarray"]
    assert zarray_back["compressor"]["cname"] == "zstd" and zarray_back["compressor"]["shuffle"] == 1
    assert zarray_back["fill_value"] is None  # null is kept: v3 cannot say it, any fill stands for it


def test_consolidated_metadata_leaves_out_opaque_arrays() -> None:
    layout = ShardLayout.v3((1,))
    good = v3_view_of_v2(_zarray(dtype="<i4"), None, layout).metadata
    opaque = v3_view_of_v2(_zarray(dtype=object, object_codec=numcodecs.JSON()), None, layout).metadata
    root = with_consolidated_metadata(
        {"zarr_format": 3, "node_type": "group", "attributes": {}}, {"good": good, "bad": opaque}
    )
    assert sorted(root["consolidated_metadata"]["metadata"]) == ["good"]
