"""Zarr v3 sharded arrays and groups presented as Zarr v2 documents (zarr-python 2.18 through ShardedStore). Pure.

:func:`v2_view_of_v3` derives the ``.zarray`` that reads the *inner chunks*
as v2 chunks, byte for byte (the mapping: docs/architecture.md, "Metadata
documents"), or says why there is none (:attr:`V2View.problems`).
"""

from __future__ import annotations

import base64
import binascii
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shardkv.codecs.inner import BytesCodec, CodecPipeline, TransposeCodec
from shardkv.codecs.numcodecs_v3 import V2_CHUNK_CODEC, VLEN_IDS, NumcodecsArrayCodec, V2ChunkCodec, VlenCodec
from shardkv.errors import ConfigurationError, ShardKVError
from shardkv.metadata.v2_codecs import (
    OPAQUE_DATA_TYPE,
    core_compressor_codec,
    numpy_dtype_of_v3,
    v2_dtype_json,
    v3_fill_value,
)
from shardkv.metadata.v3_view import SHARDING_CODEC, V2_COMPRESSOR_FIELD, V2_FILL_FIELD, sharding_spec_from_v3

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class V2View:
    """The v2 documents presenting one v3 node (by name), or why it is not presented."""

    documents: dict[str, dict[str, Any]] = field(default_factory=dict)
    problems: tuple[str, ...] = ()


def fill_value_from_v3(fill: Any, dtype: np.dtype) -> Any:
    """A v3 JSON ``fill_value`` (v3 core "fill_value", zarr-python 3's spellings) as a numpy scalar of ``dtype``.

    Raises
    ------
    ConfigurationError
        If the value does not fit the data type.
    """
    import numpy as np

    dtype = np.dtype(dtype)
    try:
        if dtype.hasobject:
            if not isinstance(fill, str):
                raise ValueError("expected a string")
            return fill
        if dtype.kind == "b":
            if not isinstance(fill, bool):
                raise ValueError("expected true or false")
            return np.bool_(fill)
        if dtype.kind in "iuMm":
            if isinstance(fill, bool) or not isinstance(fill, int):
                raise ValueError("expected an integer")
            info = np.iinfo(dtype) if dtype.kind in "iu" else np.iinfo(np.int64)
            if not info.min <= fill <= info.max:
                raise ValueError(f"outside [{info.min}, {info.max}]")
            if dtype.kind in "Mm":
                return np.array(fill, dtype="<i8").view(dtype.newbyteorder("<"))[()]
            return dtype.type(fill)
        if dtype.kind == "U":
            if not isinstance(fill, str) or len(fill) > dtype.itemsize // 4:
                raise ValueError(f"expected a string of at most {dtype.itemsize // 4} characters")
            return np.str_(fill)
        if dtype.kind in "SV":  # structured dtypes too
            if not isinstance(fill, str):
                raise ValueError("expected a base64 string")
            raw = base64.standard_b64decode(fill.encode("ascii"))
            if len(raw) > dtype.itemsize or (dtype.kind == "V" and len(raw) != dtype.itemsize):
                raise ValueError(f"base64 of {len(raw)} bytes for a {dtype.itemsize}-byte type")
            return np.bytes_(raw) if dtype.kind == "S" else np.frombuffer(raw, dtype=dtype)[0]
        if dtype.kind == "f":
            return dtype.type(_float_from_v3(fill, dtype.itemsize))
        if dtype.kind == "c":
            if not isinstance(fill, (list, tuple)) or len(fill) != 2:
                raise ValueError("expected [real, imag]")
            half = dtype.itemsize // 2
            return dtype.type(complex(_float_from_v3(fill[0], half), _float_from_v3(fill[1], half)))
    except (ValueError, TypeError, OverflowError, binascii.Error) as exc:
        raise ConfigurationError(f"fill_value {fill!r} is not a valid {dtype} fill value: {exc}") from None
    raise ConfigurationError(f"no fill value rule for dtype {dtype}")


def _float_from_v3(value: Any, itemsize: int) -> float:
    if isinstance(value, str):
        special = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}
        if value in special:
            return special[value]
        if value.startswith("0x"):
            fmt = {2: "<e", 4: "<f", 8: "<d"}[itemsize]
            return struct.unpack(fmt, int(value, 16).to_bytes(itemsize, "little"))[0]
        raise ValueError(f"unknown float spelling {value!r}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError("expected a number or a string")
    return float(value)


def _v2_fill(value: Any, dtype: np.dtype) -> Any:
    """A numpy fill value in zarr-python 2's ``.zarray`` JSON spelling (v3's, but for bytes and times)."""
    import numpy as np

    if dtype.hasobject:
        return value
    if dtype.kind in "SV":  # structured dtypes too
        raw = bytes(value) if dtype.kind == "S" else np.asarray(value, dtype=dtype).tobytes()
        return base64.standard_b64encode(raw).decode("ascii")
    if dtype.kind in "Mm":
        return int(np.asarray(value, dtype=dtype.newbyteorder("=")).view(np.int64))
    return v3_fill_value(value.item(), dtype)  # bool, int, str; floats with NaN and the infinities as strings


def _structure_problems(metadata: Mapping[str, Any], codecs: list[Any]) -> list[str]:
    """Why a v3 array cannot be presented at all (transformers, not sharded, codecs on whole shards, 0-d)."""
    problems: list[str] = []
    if metadata.get("storage_transformers"):
        problems.append("storage transformers have no v2 equivalent")
    if not codecs or codecs[0].get("name") != SHARDING_CODEC:
        problems.append("the array is not sharded (its first codec is not sharding_indexed)")
    elif len(codecs) > 1:
        problems.append(f"codecs after sharding_indexed ({[c.get('name') for c in codecs[1:]]}) encode whole shards")
    if not metadata.get("shape"):
        problems.append("0-d arrays are not presented")
    return problems


def _v2_order(inner: CodecPipeline, ndim: int, problems: list[str]) -> str:
    """The v2 ``order`` the inner array -> array codecs amount to (only transposes to F order have one)."""
    order = "C"
    filtered = False
    for c in inner.array_to_array:
        if isinstance(c, NumcodecsArrayCodec):
            filtered = True  # a v2 filter (see _v2_codecs); a transpose after one has no v2 order
        elif filtered:
            problems.append(f"inner codec {c.get_config()} after a numcodecs filter has no v2 equivalent")
        elif isinstance(c, TransposeCodec) and c.order == list(range(ndim))[::-1]:
            order = "F" if order == "C" else "C"
        elif isinstance(c, TransposeCodec) and c.order == list(range(ndim)):
            continue
        else:
            problems.append(f"inner codec {c.get_config()} has no v2 equivalent (only transpose to F order)")
    return order


def _v2_dtype_and_fill(metadata: Mapping[str, Any], inner: CodecPipeline, problems: list[str]) -> tuple[np.dtype, Any]:
    """The v2 ``dtype`` (with the ``bytes`` codec's endian) and ``fill_value``; ``(u1, 0)`` after a problem."""
    import numpy as np

    ab = inner.array_to_bytes
    endian = ab.endian if isinstance(ab, BytesCodec) else None
    if isinstance(ab, VlenCodec) and metadata.get("data_type") != VLEN_IDS[ab.codec_id]:
        problems.append(
            f"codec {ab.codec_id!r} needs data_type {VLEN_IDS[ab.codec_id]!r}, got {metadata.get('data_type')!r}"
        )
    elif not isinstance(ab, (BytesCodec, VlenCodec)):
        problems.append(f"inner array -> bytes codec {ab.name!r} has no v2 equivalent (nested sharding?)")
    try:
        dtype = numpy_dtype_of_v3(metadata.get("data_type"), endian)
        if dtype.hasobject != isinstance(ab, VlenCodec):
            raise ConfigurationError(
                f"data_type {metadata.get('data_type')!r} is not a Zarr v3 core type; "
                "string and variable_length_bytes need their vlen codec, the others the bytes codec"
            )
        fill = _v2_fill(fill_value_from_v3(metadata.get("fill_value"), dtype), dtype)
        marker = metadata.get(V2_FILL_FIELD)
        if isinstance(marker, Mapping) and "fill_value" in marker and _marks(marker["fill_value"], fill, dtype):
            fill = marker["fill_value"]  # the v2 fill kept by the writer of this document
        return dtype, fill
    except ConfigurationError as exc:
        problems.append(exc.reason)
        return np.dtype("u1"), 0


def _marks(v2_fill: Any, fill: Any, dtype: np.dtype) -> bool:
    """True when a recorded v2 fill value still stands for the v3 one, ``fill`` (a v3 writer may have changed it)."""
    if v2_fill is None or dtype.hasobject:
        return True
    try:
        return bool(fill == _v2_fill(fill_value_from_v3(v2_fill, dtype), dtype))
    except ConfigurationError:
        return False


def _opaque_documents(metadata: Mapping[str, Any], chunk: V2ChunkCodec, problems: list[str]) -> dict[str, Any]:
    """The ``.zarray`` of an array stored as ``shardkv.v2_chunk`` (its v2 encoding, kept whole)."""
    data_type = metadata.get("data_type")
    if not isinstance(data_type, Mapping) or data_type.get("name") != OPAQUE_DATA_TYPE:
        problems.append(f"codec {V2_CHUNK_CODEC!r} needs data_type {OPAQUE_DATA_TYPE!r}, got {data_type!r}")
    return {**chunk.get_config()["configuration"], "fill_value": metadata.get("fill_value")}


def _spelt_alike(kept: Mapping[str, Any], codec: Any, dtype: np.dtype) -> bool:
    """True when a recorded v2 compressor is what the document's last codec says (else the record is stale)."""
    try:
        return core_compressor_codec(kept, dtype) == codec.get_config()
    except (KeyError, TypeError, ValueError, ConfigurationError):
        return False


def _v2_codecs(
    metadata: Mapping[str, Any], inner: CodecPipeline, dtype: np.dtype, problems: list[str]
) -> dict[str, Any]:
    """The v2 ``filters`` and ``compressor`` of the inner codecs."""
    filters: list[dict[str, Any]] = []
    if isinstance(inner.array_to_bytes, VlenCodec):
        filters.append({"id": inner.array_to_bytes.codec_id})  # the object codec
    filters.extend(c.numcodecs_config() for c in inner.array_to_array if isinstance(c, NumcodecsArrayCodec))
    after = []
    for c in inner.bytes_to_bytes:
        conf = c.numcodecs_config()
        if conf is None:
            problems.append(f"inner codec {c.get_config()['name']!r} has no v2 equivalent")
        after.append(conf)
    marker = metadata.get(V2_COMPRESSOR_FIELD)
    kept = marker.get("compressor", 0) if isinstance(marker, Mapping) else 0  # 0: no record
    compressor = None if kept is None or not after else after.pop()
    if isinstance(kept, Mapping) and compressor is not None and _spelt_alike(kept, inner.bytes_to_bytes[-1], dtype):
        compressor = dict(kept)  # the v2 spelling (Blosc AUTOSHUFFLE) of the same codec
    filters.extend(f for f in after if f is not None)  # a None was reported in problems
    return {"compressor": compressor, "filters": filters or None}


def v2_view_of_v3(metadata: Mapping[str, Any], path: str = "") -> V2View:
    """The v2 documents that present a v3 array or group ``zarr.json`` at ``path``, or why there are none."""
    where = f"{path!r}: " if path else ""
    if metadata.get("zarr_format") != 3:
        return V2View(problems=(f"{where}zarr_format is {metadata.get('zarr_format')!r}, not 3",))
    attrs = dict(metadata.get("attributes") or {})
    if metadata.get("node_type") == "group":
        docs: dict[str, dict[str, Any]] = {".zgroup": {"zarr_format": 2}}
        if attrs:
            docs[".zattrs"] = attrs
        return V2View(docs)
    if metadata.get("node_type") != "array":
        return V2View(problems=(f"{where}node_type {metadata.get('node_type')!r} is neither array nor group",))
    codecs = list(metadata.get("codecs") or [])
    problems = _structure_problems(metadata, codecs)
    if problems:
        return V2View(problems=tuple(where + p for p in problems))
    try:
        spec = sharding_spec_from_v3(metadata, path)
        inner = CodecPipeline(codecs[0]["configuration"]["codecs"], "inner codecs")
    except (ShardKVError, KeyError, TypeError) as exc:
        return V2View(problems=(f"{where}invalid sharding configuration: {exc}",))
    if spec is None:  # pragma: no cover - excluded above
        return V2View(problems=(f"{where}not sharded",))
    if isinstance(inner.array_to_bytes, V2ChunkCodec):
        encoding = _opaque_documents(metadata, inner.array_to_bytes, problems)
    else:
        order = _v2_order(inner, len(spec.shape), problems)
        dtype, fill = _v2_dtype_and_fill(metadata, inner, problems)
        encoding = {"dtype": v2_dtype_json(dtype), "fill_value": fill, "order": order}
        encoding.update(_v2_codecs(metadata, inner, dtype, problems))
    if problems:
        return V2View(problems=tuple(where + p for p in problems))
    zarray = {
        "zarr_format": 2,
        "shape": list(spec.shape),
        "chunks": list(spec.chunks),
        **encoding,
        "dimension_separator": ".",
    }
    names = metadata.get("dimension_names")
    if names and all(isinstance(n, str) for n in names) and "_ARRAY_DIMENSIONS" not in attrs:
        attrs["_ARRAY_DIMENSIONS"] = list(names)  # xarray's v2 convention
    docs = {".zarray": zarray}
    if attrs:
        docs[".zattrs"] = attrs
    return V2View(docs)


def unusable_sharding(metadata: Mapping[str, Any], path: str = "") -> str | None:
    """Why a v3 array that says it is sharded cannot be used (damaged or beyond a limit), or None."""
    return next((p for p in v2_view_of_v3(metadata, path).problems if "invalid sharding configuration" in p), None)
