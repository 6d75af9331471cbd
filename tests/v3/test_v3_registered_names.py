"""The v3 names shardkv writes for v2 features are the ones zarr-python 3 registers, read from its registry."""

from __future__ import annotations

import warnings

import pytest
import zarr.registry
from zarr.abc.codec import ArrayArrayCodec, ArrayBytesCodec, BytesBytesCodec
from zarr.core.dtype import get_data_type_from_json

from shardkv.codecs.numcodecs_v3 import ARRAY_TO_ARRAY_IDS, BYTES_TO_BYTES_IDS, V2_CHUNK_CODEC, VLEN_IDS
from shardkv.metadata.v2_codecs import OPAQUE_DATA_TYPE


def _kind(name: str) -> type:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cls = zarr.registry.get_codec_class(name)
    return next(k for k in (ArrayArrayCodec, ArrayBytesCodec, BytesBytesCodec) if issubclass(cls, k))


@pytest.mark.parametrize("codec_id", sorted(ARRAY_TO_ARRAY_IDS))
def test_array_to_array_filters(codec_id: str) -> None:
    assert _kind(f"numcodecs.{codec_id}") is ArrayArrayCodec


@pytest.mark.parametrize("codec_id", sorted(BYTES_TO_BYTES_IDS))
def test_bytes_to_bytes_filters_and_compressors(codec_id: str) -> None:
    assert _kind(f"numcodecs.{codec_id}") is BytesBytesCodec


@pytest.mark.parametrize("codec_id, data_type", sorted(VLEN_IDS.items()))
def test_vlen_codecs_and_their_data_types(codec_id: str, data_type: str) -> None:
    assert _kind(codec_id) is ArrayBytesCodec
    get_data_type_from_json(data_type, zarr_format=3)


def test_structured_data_type() -> None:
    get_data_type_from_json({"name": "structured", "configuration": {"fields": [["a", "int32"]]}}, zarr_format=3)


# zarr 3.1 answers an unknown codec name with KeyError, later zarr 3 with zarr.errors.UnknownCodecError
_UNKNOWN_CODEC = (KeyError, *([zarr.errors.UnknownCodecError] if hasattr(zarr.errors, "UnknownCodecError") else []))


def test_the_opaque_names_are_unknown() -> None:
    with pytest.raises(_UNKNOWN_CODEC):
        zarr.registry.get_codec_class(V2_CHUNK_CODEC)
    with pytest.raises(ValueError, match="No Zarr data type"):
        get_data_type_from_json({"name": OPAQUE_DATA_TYPE, "configuration": {"dtype": "|O"}}, zarr_format=3)
