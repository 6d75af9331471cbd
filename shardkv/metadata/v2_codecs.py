"""How a Zarr v2 array's dtype, order, filters, compressor and fill value read as Zarr v3. Pure.

One mapping (docs/architecture.md, "Metadata documents"; the user guide's
table), inverted by :mod:`shardkv.metadata.v2_view`; every name is one
zarr-python 3 registers, and what it has no name for is *opaque*.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shardkv.codecs.inner import BLOSC_SHUFFLE_IDS
from shardkv.codecs.numcodecs_v3 import ARRAY_TO_ARRAY_IDS, BYTES_TO_BYTES_IDS, V2_CHUNK_CODEC, VLEN_IDS
from shardkv.errors import ConfigurationError

if TYPE_CHECKING:
    import numpy as np

OPAQUE_DATA_TYPE = "shardkv.v2_dtype"  # the data type of an array no v3 reader can decode

CORE_DATA_TYPES = {
    "b1": "bool",
    "i1": "int8", "i2": "int16", "i4": "int32", "i8": "int64",
    "u1": "uint8", "u2": "uint16", "u4": "uint32", "u8": "uint64",
    "f2": "float16", "f4": "float32", "f8": "float64",
    "c8": "complex64", "c16": "complex128",
}  # numpy kind + itemsize -> v3 core name; a table: its rows read better aligned # fmt: skip
SIZED_DATA_TYPES = {"U": "fixed_length_utf32", "S": "null_terminated_bytes", "V": "raw_bytes"}  # length_bytes
TIME_DATA_TYPES = {"M": "numpy.datetime64", "m": "numpy.timedelta64"}  # unit, scale_factor
_CORE_COMPRESSORS = ("gzip", "zstd", "blosc")
_V3_TO_NUMPY = {name: code for code, name in CORE_DATA_TYPES.items()}  # "int16" -> "i2"
_BLOSC_SHUFFLE = {i: name for name, i in BLOSC_SHUFFLE_IDS.items()}  # numcodecs id -> v3 name


@dataclass(frozen=True)
class V3Encoding:
    """The v3 ``data_type``, ``codecs`` (of one v2 chunk, in encoding order) and ``fill_value`` of one v2 array.

    ``keep_v2_fill``: the v2 fill value must be recorded beside; ``opaque``: no
    v3 reader decodes it; ``problems``: why v3 readers other than zarr-python 3
    (every one, when opaque) cannot read it.
    """

    data_type: Any
    codecs: list[dict[str, Any]]
    fill_value: Any
    keep_v2_fill: bool
    opaque: bool
    problems: tuple[str, ...]


def numpy_dtype_of(v2_dtype: Any) -> np.dtype:
    """The numpy dtype of a v2 ``dtype`` (a string, or a structured dtype's nested list of fields).

    Raises
    ------
    ConfigurationError
        If numpy does not accept it.
    """
    import numpy as np

    try:
        return np.dtype(_fields_of(v2_dtype))
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"dtype {v2_dtype!r} is not a Zarr v2 dtype: {exc}") from None


def _fields_of(v2_dtype: Any) -> Any:
    if not isinstance(v2_dtype, list):
        return v2_dtype
    return [tuple([f[0], _fields_of(f[1]), *([tuple(f[2])] if len(f) > 2 else [])]) for f in v2_dtype]


def v2_dtype_json(dtype: np.dtype) -> Any:
    """The ``.zarray`` spelling of a dtype, as zarr-python 2 writes it (``descr`` lists for structured)."""
    if dtype.fields is None:
        return dtype.str
    return _as_lists(dtype.descr)


def _as_lists(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_as_lists(v) for v in value]
    return value


def leaf_data_type(dtype: np.dtype) -> Any:
    """The v3 data type of a non-structured dtype (core name or zarr-python 3 extension object), or None."""
    import numpy as np

    core = CORE_DATA_TYPES.get(f"{dtype.kind}{dtype.itemsize}")
    if core is not None:
        return core
    if not dtype.itemsize and dtype.kind in "USV":
        return None
    sized = SIZED_DATA_TYPES.get(dtype.kind)
    if sized is not None:
        return {"name": sized, "configuration": {"length_bytes": dtype.itemsize}}
    if dtype.kind in "Mm":
        unit, scale = np.datetime_data(dtype)
        if unit == "generic":
            return None
        return {"name": TIME_DATA_TYPES[dtype.kind], "configuration": {"unit": unit, "scale_factor": int(scale)}}
    return None


def structured_data_type(dtype: np.dtype) -> dict[str, Any] | None:
    """zarr-python 3's ``structured`` data type of a packed, little-endian dtype without subarrays, or None."""
    if dtype.fields is None or dtype.names is None:
        return None
    fields: list[list[Any]] = []
    offset = 0
    for name in dtype.names:
        field_dtype, field_offset, *title = dtype.fields[name]
        inner = structured_data_type(field_dtype) if field_dtype.fields is not None else leaf_data_type(field_dtype)
        big = field_dtype.itemsize > 1 and field_dtype.byteorder == ">"
        if title or field_offset != offset or field_dtype.subdtype is not None or not name or big or inner is None:
            return None
        fields.append([name, inner])
        offset += field_dtype.itemsize
    if offset != dtype.itemsize:
        return None
    return {"name": "structured", "configuration": {"fields": fields}}


def numpy_dtype_of_structured(data_type: Mapping[str, Any]) -> np.dtype:
    """The numpy dtype of a v3 ``structured`` data type (fields little-endian, as zarr-python 3 stores them).

    Raises
    ------
    ConfigurationError
        If ``fields`` is not a list of ``[name, data_type]``.
    """
    import numpy as np

    fields = (data_type.get("configuration") or {}).get("fields")
    if not isinstance(fields, list) or not fields:
        raise ConfigurationError(f"data_type {dict(data_type)!r}: fields must be a non-empty list")
    out = []
    for f in fields:
        if not isinstance(f, (list, tuple)) or len(f) != 2 or not isinstance(f[0], str):
            raise ConfigurationError(f"data_type structured: field {f!r} is not [name, data_type]")
        out.append((f[0], numpy_dtype_of_v3(f[1], "little")))
    return np.dtype(out)


_EXTENSION_KINDS = {name: kind for kind, name in SIZED_DATA_TYPES.items()}  # "raw_bytes" -> "V"
_TIME_KINDS = {name: kind + "8" for kind, name in TIME_DATA_TYPES.items()}  # "numpy.datetime64" -> "M8"
_VLEN_DATA_TYPES = {data_type: codec_id for codec_id, data_type in VLEN_IDS.items()}  # "string" -> "vlen-utf8"


def numpy_dtype_of_v3(data_type: Any, endian: str | None = "little") -> np.dtype:
    """The numpy dtype of a v3 core or zarr-python 3 extension ``data_type`` stored with ``bytes``' ``endian``.

    Raises
    ------
    ConfigurationError
        If ``data_type`` is neither (``r<N>`` and other extensions included).
    """
    import numpy as np

    order = "<" if endian != "big" else ">"
    if isinstance(data_type, str) and data_type in _VLEN_DATA_TYPES:
        return np.dtype(object)
    if isinstance(data_type, Mapping) and data_type.get("name") == "structured":
        return numpy_dtype_of_structured(data_type)
    if isinstance(data_type, Mapping):
        name = data_type.get("name")
        config = data_type.get("configuration") or {}
        if name in _EXTENSION_KINDS:
            n = config.get("length_bytes")
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ConfigurationError(f"data_type {data_type!r}: length_bytes must be an int >= 1")
            if name == "fixed_length_utf32":
                if n % 4:
                    raise ConfigurationError(f"data_type {data_type!r}: length_bytes must be a multiple of 4")
                return np.dtype(f"{order}U{n // 4}")
            return np.dtype(f"|{_EXTENSION_KINDS[name]}{n}")
        if name in _TIME_KINDS:
            unit, scale = config.get("unit"), config.get("scale_factor", 1)
            try:
                return np.dtype(f"{order}{_TIME_KINDS[name]}[{'' if scale == 1 else int(scale)}{unit}]")
            except (TypeError, ValueError):
                raise ConfigurationError(f"data_type {data_type!r}: unknown unit or scale_factor") from None
    if not isinstance(data_type, str) or data_type not in _V3_TO_NUMPY:
        raise ConfigurationError(f"data_type {data_type!r} is not a Zarr v3 core numeric or bool type")
    return np.dtype(order + _V3_TO_NUMPY[data_type])  # numpy makes 1-byte types "|"


def _null_fill_value(dtype: np.dtype) -> Any:
    """The v3 fill value that stands for a v2 ``null`` (see spec_notes, clause M7)."""
    if dtype.kind == "b":
        return False
    if dtype.kind == "c":
        return [0.0, 0.0]
    if dtype.kind in "US":
        return ""
    if dtype.kind == "V":
        return base64.standard_b64encode(bytes(dtype.itemsize)).decode("ascii")
    return 0


def v3_fill_value(fill: Any, dtype: np.dtype) -> Any:
    """The v3 ``fill_value`` of a v2 fill value ``fill`` of dtype ``dtype`` (``None``: see clause M7)."""
    import numpy as np

    if fill is None:
        return _null_fill_value(dtype)
    if dtype.kind in "USV":
        if isinstance(fill, str):
            return fill  # v2 and v3 spell these alike: the string, or base64 of the bytes
        if dtype.kind == "V":
            of = "structured" if dtype.fields is not None else dtype.str
            raise ConfigurationError(f"fill_value {fill!r} of a {of} array must be a base64 string")
        # zarr-python 2 fills with numpy's conversion: 0 becomes "0" (U) or b"0" (S)
        try:
            value = np.array(fill, dtype=dtype)[()]
        except (TypeError, ValueError):
            raise ConfigurationError(f"fill_value {fill!r} does not convert to {dtype.str}") from None
        return str(value) if dtype.kind == "U" else base64.standard_b64encode(bytes(value)).decode("ascii")
    if dtype.kind in "Mm":
        if isinstance(fill, bool) or not isinstance(fill, int):
            raise ConfigurationError(f"fill_value {fill!r} of a {dtype.str} array must be an integer")
        return fill
    if dtype.kind == "f":
        if isinstance(fill, str):
            return fill  # "NaN", "Infinity", "-Infinity" are spelt the same in v3
        if math.isnan(fill):
            return "NaN"
        if math.isinf(fill):
            return "Infinity" if fill > 0 else "-Infinity"
        return float(fill)
    if dtype.kind == "c":
        parts = fill if isinstance(fill, (list, tuple)) else [float(np.real(fill)), float(np.imag(fill))]
        return [v3_fill_value(v, np.dtype("f8")) for v in parts]
    if dtype.kind == "b":
        return bool(fill)
    return int(fill)


def core_compressor_codec(compressor: Mapping[str, Any], dtype: np.dtype) -> dict[str, Any]:
    """The v3 codec of a v2 compressor: ``gzip``/``zstd``/``blosc`` by their core names, else ``numcodecs.<id>``."""
    config = {k: v for k, v in compressor.items() if k != "id"}
    cid = compressor["id"]
    if cid == "gzip":
        return {"name": "gzip", "configuration": {"level": int(config.get("level", 1))}}
    if cid == "zstd":
        return {
            "name": "zstd",
            "configuration": {"level": int(config.get("level", 1)), "checksum": bool(config.get("checksum", False))},
        }
    if cid == "blosc":
        shuffle = int(config.get("shuffle", 1))
        if shuffle == -1:  # numcodecs AUTOSHUFFLE: bit shuffle for 1-byte items, else byte shuffle
            shuffle = 2 if dtype.itemsize == 1 else 1
        return {
            "name": "blosc",
            "configuration": {
                "cname": config.get("cname", "lz4"),
                "clevel": int(config.get("clevel", 5)),
                "shuffle": _BLOSC_SHUFFLE[shuffle],
                "typesize": dtype.itemsize,
                "blocksize": int(config.get("blocksize", 0)),
            },
        }
    return {"name": f"numcodecs.{cid}", "configuration": config}


def _opaque(zarray: Mapping[str, Any], why: str) -> V3Encoding:
    config = {"order": zarray.get("order", "C"), **{k: zarray.get(k) for k in ("dtype", "compressor", "filters")}}
    return V3Encoding(
        data_type={"name": OPAQUE_DATA_TYPE, "configuration": {"dtype": zarray["dtype"]}},
        codecs=[{"name": V2_CHUNK_CODEC, "configuration": config}],
        fill_value=zarray.get("fill_value"),
        keep_v2_fill=False,
        opaque=True,
        problems=(f"{why}: no Zarr v3 reader decodes it (stored as {OPAQUE_DATA_TYPE!r} / {V2_CHUNK_CODEC!r})",),
    )


def _numcodecs_entry(config: Mapping[str, Any]) -> dict[str, Any]:
    return {"name": f"numcodecs.{config['id']}", "configuration": {k: v for k, v in config.items() if k != "id"}}


def _big_endian(dtype: np.dtype, config: Mapping[str, Any]) -> bool:
    """True when the array or a dtype a filter names is big-endian (multi-byte)."""
    import numpy as np

    named = [np.dtype(v) for k, v in config.items() if k in ("dtype", "astype", "encode_dtype", "decode_dtype") and v]
    return any(d.byteorder == ">" and d.itemsize > 1 for d in [dtype, *named])


def v3_encoding_of_v2(zarray: Mapping[str, Any]) -> V3Encoding:
    """The v3 data type, codecs and fill value that decode a v2 array's chunks to the same values.

    Opaque when zarr-python 3 has no name for a part.

    Raises
    ------
    ConfigurationError
        If the dtype or a fill value is invalid.
    """
    dtype = numpy_dtype_of(zarray["dtype"])
    ndim = len(zarray["shape"])
    filters = list(zarray.get("filters") or [])
    compressor = zarray.get("compressor")
    problems: list[str] = []
    codecs: list[dict[str, Any]] = []
    if zarray.get("order", "C") == "F" and ndim >= 1:
        codecs.append({"name": "transpose", "configuration": {"order": list(range(ndim))[::-1]}})
    if dtype.hasobject:
        object_codec = filters.pop(0)["id"] if filters else None
        if object_codec not in VLEN_IDS:
            return _opaque(zarray, f"dtype |O with object codec {object_codec!r}")
        data_type: Any = VLEN_IDS[object_codec]
        array_to_bytes: dict[str, Any] = {"name": object_codec, "configuration": {}}
        fill = zarray.get("fill_value")
        keep = not (isinstance(fill, str) and object_codec == "vlen-utf8")
        fill_value: Any = fill if not keep else ""
    else:
        data_type = structured_data_type(dtype) if dtype.fields is not None else leaf_data_type(dtype)
        if data_type is None:
            return _opaque(zarray, f"dtype {zarray['dtype']!r}")
        if dtype.fields is not None or dtype.kind in "USVMm":
            problems.append(
                f"dtype {zarray['dtype']!r} has no Zarr v3 core data type; stored as the zarr-python 3 "
                f"extension {data_type['name']!r} (zarr-python 3 only)"
            )
        multibyte = dtype.itemsize > 1 and (dtype.byteorder != "|" or dtype.fields is not None)
        endian = "big" if dtype.byteorder == ">" else "little"
        array_to_bytes = {"name": "bytes", "configuration": {"endian": endian}} if multibyte else {"name": "bytes"}
        fill_value, keep = v3_fill_value(zarray.get("fill_value"), dtype), zarray.get("fill_value") is None
    after: list[dict[str, Any]] = []
    for f in filters:
        fid = f.get("id")
        if fid in ARRAY_TO_ARRAY_IDS and _big_endian(dtype, f):
            # zarr 3 decodes the bytes codec's output as the array's byte order, not the filter's: it misreads these
            return _opaque(zarray, f"filter {fid!r} on big-endian data")
        if fid in ARRAY_TO_ARRAY_IDS and not after:
            codecs.append(_numcodecs_entry(f))
        elif fid in BYTES_TO_BYTES_IDS:
            after.append(_numcodecs_entry(f))
        else:
            return _opaque(
                zarray, f"filter {fid!r}" + (" after a bytes -> bytes filter" if fid in ARRAY_TO_ARRAY_IDS else "")
            )
        problems.append(f"v2 filter {fid!r} is not a Zarr v3 core codec (zarr-python 3 only, as numcodecs.{fid})")
    codecs.append(array_to_bytes)
    codecs.extend(after)
    if compressor is not None:
        if compressor.get("id") not in _CORE_COMPRESSORS and compressor.get("id") not in BYTES_TO_BYTES_IDS:
            return _opaque(zarray, f"compressor {compressor.get('id')!r}")
        entry = core_compressor_codec(compressor, dtype)
        if entry["name"].startswith("numcodecs."):
            problems.append(
                f"compressor {compressor['id']!r} is not a Zarr v3 core codec (zarr-python 3 only, as {entry['name']})"
            )
        codecs.append(entry)
    if dtype.hasobject:
        problems.append(
            f"dtype |O has no Zarr v3 core data type; stored as the zarr-python 3 extension {data_type!r} "
            f"with codec {array_to_bytes['name']!r} (zarr-python 3 only)"
        )
    return V3Encoding(data_type, codecs, fill_value, keep, False, tuple(problems))
