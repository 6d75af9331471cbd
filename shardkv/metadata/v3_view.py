"""Array metadata: the Zarr v3 view of a sharded Zarr v2 array, and reading it back. Pure.

shardkv keeps each sharded v2 array's sharding configuration next to its
``.zarray`` as a ``zarr.json`` that describes the *same bytes* as a Zarr v3
array (v3 core "Array metadata") whose only array -> bytes codec is
``sharding_indexed`` (v1.0 codec):

* ``chunk_grid``: regular, ``chunk_shape`` = shard shape = v2 ``chunks`` x ``chunks_per_shard``;
* ``chunk_key_encoding``: ``v2`` with the array's ``dimension_separator``, so
  the shard of shard coords ``(i, j)`` is stored at the v2 key ``i.j``;
* inner ``chunk_shape`` = v2 ``chunks``; inner ``codecs`` translated from the v2
  ``order`` (``transpose`` for F), ``dtype`` (``bytes`` with its endian) and
  ``compressor`` (``gzip``, ``zstd``, ``blosc``; zlib, bz2, lz4 and v2 filters
  as zarr-python 3's ``numcodecs.*`` codecs);
* ``attributes`` mirror ``.zattrs``.

Fixed-size strings, bytes, void, datetime64 and timedelta64 (``<U4``, ``|S8``,
``|V2``, ``<M8[ns]``) have no core v3 type: the view names the extension types
zarr-python 3 registers (``fixed_length_utf32``, ``null_terminated_bytes``,
``raw_bytes``, ``numpy.datetime64``/``numpy.timedelta64``; see
:func:`v3_data_type`), which zarr-python 3 reads with the same values and
tensorstore refuses. Where no reader has a type (structured, object), the view
names a data type and codec no v3 reader knows (``shardkv.*``), so v3 readers
refuse the array instead of misreading it. :attr:`V3View.problems` says why.

A v2 ``fill_value: null`` becomes the type's zero (``0``, ``false``, ``""``,
zero bytes) plus the field ``"shardkv.v2_fill_value": {"must_understand":
false, "fill_value": null}`` (:data:`V2_FILL_FIELD`), which v3 readers skip and
:func:`shardkv.metadata.v2_view.v2_view_of_v3` turns back into ``null``.
"""

from __future__ import annotations

import base64
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from shardkv.codecs.inner import BLOSC_SHUFFLE_IDS
from shardkv.errors import ConfigurationError, UnsupportedError
from shardkv.format.layout import ShardLayout, chunk_nbytes_bound
from shardkv.keys.encodings import ChunkKeyEncoding, V2ChunkKeyEncoding, chunk_key_encoding_from_metadata

__all__ = [
    "V3View",
    "SHARDING_CODEC",
    "V2_FILL_FIELD",
    "v3_data_type",
    "numpy_dtype_of",
    "v3_fill_value",
    "inner_codecs_of",
    "v3_view_of_v2",
    "ShardingSpec",
    "sharding_spec_from_v3",
    "v2_dimension_separator",
]

SHARDING_CODEC = "sharding_indexed"

_V3_DTYPES = {
    "b1": "bool",
    "i1": "int8", "i2": "int16", "i4": "int32", "i8": "int64",
    "u1": "uint8", "u2": "uint16", "u4": "uint32", "u8": "uint64",
    "f2": "float16", "f4": "float32", "f8": "float64",
    "c8": "complex64", "c16": "complex128",
}  # fmt: skip

_BLOSC_SHUFFLE = {i: name for name, i in BLOSC_SHUFFLE_IDS.items()}  # numcodecs id -> v3 name


@dataclass(frozen=True)
class V3View:
    """A v3 ``zarr.json`` document and the reasons it cannot be read by v3 readers, if any."""

    metadata: dict[str, Any]
    problems: tuple[str, ...] = field(default=())

    @property
    def translatable(self) -> bool:
        """True when zarr-python 3 can read the array through this document."""
        return not self.problems


def v2_dimension_separator(zarray: Mapping[str, Any]) -> str:
    """The chunk key separator of a v2 array (``"."`` unless ``dimension_separator`` says ``"/"``)."""
    sep = zarray.get("dimension_separator") or "."
    if sep not in (".", "/"):
        raise ConfigurationError(f"dimension_separator must be '.' or '/', got {sep!r}")
    return sep


# -- v2 -> v3 ------------------------------------------------------------


V2_FILL_FIELD = "shardkv.v2_fill_value"
"""The ``zarr.json`` field that records a v2 ``fill_value: null`` (``must_understand: false``)."""


def v3_data_type(dtype: np.dtype) -> tuple[Any, str | None]:
    """The v3 ``data_type`` of a numpy dtype, and whether it is a core type.

    Core numeric and bool types map to their v3 core names; fixed-size
    strings, bytes, void, datetime64 and timedelta64 map to the extension
    names zarr-python 3 registers (``fixed_length_utf32``,
    ``null_terminated_bytes``, ``raw_bytes``, ``numpy.datetime64``,
    ``numpy.timedelta64``), which zarr-python 3 reads with the same bytes.

    Parameters
    ----------
    dtype : numpy.dtype
        The v2 dtype (its byte order goes to the ``bytes`` codec, not here).

    Returns
    -------
    data_type : str or dict or None
        The v3 ``data_type``; ``None`` when no reader has one (structured,
        object, unit-less datetime).
    extension : str or None
        The extension name when ``data_type`` is not a core type, else ``None``.
    """
    if dtype.fields is not None:
        return None, None
    core = _V3_DTYPES.get(f"{dtype.kind}{dtype.itemsize}")
    if core is not None:
        return core, None
    length = {"name": None, "configuration": {"length_bytes": dtype.itemsize}}
    if dtype.kind == "U" and dtype.itemsize:
        length["name"] = "fixed_length_utf32"
    elif dtype.kind == "S" and dtype.itemsize:
        length["name"] = "null_terminated_bytes"
    elif dtype.kind == "V" and dtype.itemsize:
        length["name"] = "raw_bytes"
    elif dtype.kind in "Mm":
        unit, scale = np.datetime_data(dtype)
        if unit == "generic":
            return None, None
        name = "numpy.datetime64" if dtype.kind == "M" else "numpy.timedelta64"
        return {"name": name, "configuration": {"unit": unit, "scale_factor": int(scale)}}, name
    else:
        return None, None
    return length, str(length["name"])


def numpy_dtype_of(v2_dtype: Any) -> np.dtype:
    """The numpy dtype of a v2 ``dtype`` (a string, or a structured dtype's list of fields)."""
    if isinstance(v2_dtype, list):
        return np.dtype([tuple(f) for f in v2_dtype])
    return np.dtype(v2_dtype)


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
    if fill is None:
        return _null_fill_value(dtype)
    if dtype.kind in "USV":
        if isinstance(fill, str):
            return fill  # v2 and v3 spell these alike: the string, or base64 of the bytes
        if dtype.kind == "V":
            raise ConfigurationError(f"fill_value {fill!r} of a {dtype.str} array must be a base64 string")
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
        if isinstance(fill, (list, tuple)):
            return [v3_fill_value(v, np.dtype("f8")) for v in fill]
        return [v3_fill_value(float(np.real(fill)), np.dtype("f8")), v3_fill_value(float(np.imag(fill)), np.dtype("f8"))]
    if dtype.kind == "b":
        return bool(fill)
    return int(fill)


def _compressor_codecs(compressor: Mapping[str, Any] | None, dtype: np.dtype) -> list[dict[str, Any]]:
    if compressor is None:
        return []
    config = {k: v for k, v in compressor.items() if k != "id"}
    cid = compressor["id"]
    if cid == "gzip":
        return [{"name": "gzip", "configuration": {"level": int(config.get("level", 1))}}]
    if cid == "zstd":
        return [{"name": "zstd", "configuration": {"level": int(config.get("level", 1)), "checksum": bool(config.get("checksum", False))}}]
    if cid == "blosc":
        shuffle = int(config.get("shuffle", 1))
        if shuffle == -1:  # numcodecs AUTOSHUFFLE: bit shuffle for 1-byte items, else byte shuffle
            shuffle = 2 if dtype.itemsize == 1 else 1
        return [
            {
                "name": "blosc",
                "configuration": {
                    "cname": config.get("cname", "lz4"),
                    "clevel": int(config.get("clevel", 5)),
                    "shuffle": _BLOSC_SHUFFLE[shuffle],
                    "typesize": dtype.itemsize,
                    "blocksize": int(config.get("blocksize", 0)),
                },
            }
        ]
    return [{"name": f"numcodecs.{cid}", "configuration": config}]


def inner_codecs_of(zarray: Mapping[str, Any], dtype: np.dtype, ndim: int, problems: list[str]) -> list[dict[str, Any]]:
    """The v3 inner codecs of a v2 array with a v3 core data type; what v3 readers lack goes to ``problems``."""
    inner: list[dict[str, Any]] = []
    if zarray.get("order", "C") == "F" and ndim > 1:
        inner.append({"name": "transpose", "configuration": {"order": list(range(ndim))[::-1]}})
    for f in zarray.get("filters") or []:
        inner.append({"name": f"numcodecs.{f['id']}", "configuration": {k: v for k, v in f.items() if k != "id"}})
        problems.append(f"v2 filter {f['id']!r} is not a Zarr v3 core codec (zarr-python 3 only, as numcodecs.{f['id']})")
    if dtype.itemsize > 1 and dtype.byteorder != "|":
        endian = "big" if dtype.byteorder == ">" or (dtype.byteorder == "=" and np.little_endian is False) else "little"
        inner.append({"name": "bytes", "configuration": {"endian": endian}})
    else:
        inner.append({"name": "bytes"})
    compressor_codecs = _compressor_codecs(zarray.get("compressor"), dtype)
    for c in compressor_codecs:
        if c["name"].startswith("numcodecs."):
            problems.append(f"compressor {c['name'][10:]!r} is not a Zarr v3 core codec (zarr-python 3 only, as {c['name']})")
    return inner + compressor_codecs


def v3_view_of_v2(
    zarray: Mapping[str, Any],
    zattrs: Mapping[str, Any] | None,
    layout: ShardLayout,
) -> V3View:
    """The ``zarr.json`` that reads a sharded v2 array as a v3 array.

    Parameters
    ----------
    zarray : mapping
        The v2 ``.zarray`` document.
    zattrs : mapping or None
        The v2 ``.zattrs`` document (becomes ``attributes``).
    layout : ShardLayout
        ``chunks_per_shard`` (one per dimension) and index options of the shards.

    Returns
    -------
    V3View
        The document, and the reasons v3 readers cannot use it (empty when they can).

    Raises
    ------
    ConfigurationError
        If ``layout.chunks_per_shard`` does not have one value per dimension.
    """
    shape = [int(s) for s in zarray["shape"]]
    chunks = [int(c) for c in zarray["chunks"]]
    if len(layout.chunks_per_shard) != len(shape):
        raise ConfigurationError(
            f"chunks_per_shard {layout.chunks_per_shard} has {len(layout.chunks_per_shard)} value(s), "
            f"the array has {len(shape)} dimension(s)"
        )
    problems: list[str] = []
    dtype = numpy_dtype_of(zarray["dtype"])
    data_type, extension = v3_data_type(dtype)
    opaque = data_type is None
    if opaque:
        problems.append(f"dtype {zarray['dtype']!r} has no Zarr v3 core data type")
        data_type = {"name": "shardkv.v2_dtype", "configuration": {"dtype": zarray["dtype"]}}
        fill_value: Any = zarray.get("fill_value")
        inner_codecs_of(zarray, dtype, len(shape), problems)  # its problems are reported all the same
        # no v3 reader may decode these chunks as anything else: one opaque codec
        inner: list[dict[str, Any]] = [{"name": "shardkv.v2_chunk", "configuration": {
            "dtype": zarray["dtype"], "order": zarray.get("order", "C"),
            "compressor": zarray.get("compressor"), "filters": zarray.get("filters"),
        }}]  # fmt: skip
    else:
        if extension is not None:
            problems.append(
                f"dtype {zarray['dtype']!r} has no Zarr v3 core data type; stored as the zarr-python 3 "
                f"extension {extension!r} (zarr-python 3 only)"
            )
        fill_value = v3_fill_value(zarray.get("fill_value"), dtype)
        inner = inner_codecs_of(zarray, dtype, len(shape), problems)

    index_codecs: list[dict[str, Any]] = [{"name": "bytes", "configuration": {"endian": layout.index_endian}}]
    if layout.index_checksum:
        index_codecs.append({"name": "crc32c"})
    metadata = {
        "zarr_format": 3,
        "node_type": "array",
        "shape": shape,
        "data_type": data_type,
        "chunk_grid": {
            "name": "regular",
            "configuration": {"chunk_shape": [c * n for c, n in zip(chunks, layout.chunks_per_shard)]},
        },
        "chunk_key_encoding": V2ChunkKeyEncoding(v2_dimension_separator(zarray)).to_metadata(),  # type: ignore[arg-type]
        "fill_value": fill_value,
        "codecs": [
            {
                "name": SHARDING_CODEC,
                "configuration": {
                    "chunk_shape": chunks,
                    "codecs": inner,
                    "index_codecs": index_codecs,
                    "index_location": layout.index_location,
                },
            }
        ],
        "attributes": dict(zattrs or {}),
    }
    if not opaque:
        mark_null_fill(metadata, zarray)
    return V3View(metadata, tuple(problems))


def mark_null_fill(metadata: dict[str, Any], zarray: Mapping[str, Any]) -> None:
    """Add the :data:`V2_FILL_FIELD` marker to a v3 array document when the v2 ``fill_value`` is null.

    v3 has no null fill: the type's zero stands for it, and the marker (which
    v3 readers skip, ``must_understand: false``) brings null back to zarr 2.
    """
    if zarray.get("fill_value") is None:
        metadata[V2_FILL_FIELD] = {"must_understand": False, "fill_value": None}


def dimension_names_of(names: Any, ndim: int) -> list[str] | None:
    """xarray's v2 ``_ARRAY_DIMENSIONS`` attribute as v3 ``dimension_names``, or ``None`` if it is not one str per dimension."""
    if isinstance(names, list) and len(names) == ndim and all(isinstance(n, str) for n in names):
        return list(names)
    return None


# -- v3 -> sharding spec ---------------------------------------------------


@dataclass(frozen=True)
class ShardingSpec:
    """What the proxy needs to move bytes between chunk keys and shards of one array.

    Attributes
    ----------
    shape : tuple of int
        Array shape (elements).
    chunks : tuple of int
        Inner chunk shape (elements).
    layout : ShardLayout
        chunks_per_shard and the index layout.
    shard_key_encoding : ChunkKeyEncoding
        How shard coords become keys in the underlying store.
    """

    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    layout: ShardLayout
    shard_key_encoding: ChunkKeyEncoding

    @property
    def chunks_per_shard(self) -> tuple[int, ...]:
        return self.layout.chunks_per_shard

    @property
    def shard_shape(self) -> tuple[int, ...]:
        """Shard shape (elements): ``chunks * chunks_per_shard``."""
        return tuple(c * n for c, n in zip(self.chunks, self.layout.chunks_per_shard))


_V3_ITEMSIZES = {name: int(code[1:]) for code, name in _V3_DTYPES.items()}
_SIZED_EXTENSIONS = ("fixed_length_utf32", "null_terminated_bytes", "raw_bytes")
_TIME_EXTENSIONS = ("numpy.datetime64", "numpy.timedelta64")


def v3_itemsize(data_type: Any) -> int | None:
    """Bytes per element of a v3 ``data_type``, or ``None`` when not known here.

    Core numeric and bool types, the fixed-size extension types (by their
    ``length_bytes``) and datetime64/timedelta64 (8 bytes); ``None`` for any
    other (opaque or unknown) type.
    """
    if isinstance(data_type, str):
        return _V3_ITEMSIZES.get(data_type)
    if not isinstance(data_type, Mapping):
        return None
    name = data_type.get("name")
    if name in _TIME_EXTENSIONS:
        return 8
    n = (data_type.get("configuration") or {}).get("length_bytes")
    if name in _SIZED_EXTENSIONS and isinstance(n, int) and not isinstance(n, bool) and n >= 1:
        return n
    return None


def layout_from_codec_config(
    config: Mapping[str, Any], shard_shape: Sequence[int], path: str | None = None, itemsize: int | None = None
) -> tuple[tuple[int, ...], ShardLayout]:
    """Inner chunk shape and layout from a ``sharding_indexed`` configuration.

    ``itemsize`` (bytes per element, ``None`` if unknown) bounds each index
    entry's ``nbytes`` through :func:`shardkv.format.layout.chunk_nbytes_bound`;
    inner codecs that nest another ``sharding_indexed`` keep the default bound
    (a nested shard adds 16 bytes of index per sub-chunk).

    Raises
    ------
    ConfigurationError
        If the inner ``chunk_shape`` does not divide the shard shape, or
        ``index_location`` is invalid.
    UnsupportedError
        If ``index_codecs`` is anything but ``bytes`` optionally followed by ``crc32c``.
    """
    inner = tuple(int(c) for c in config["chunk_shape"])
    if len(inner) != len(shard_shape) or any(c < 1 or s % c for s, c in zip(shard_shape, inner)):
        raise ConfigurationError(
            f"inner chunk_shape {list(inner)} does not evenly divide the shard shape {list(shard_shape)}", path
        )
    names = [c.get("name") for c in config.get("index_codecs", [])]
    if names not in (["bytes"], ["bytes", "crc32c"]):
        raise UnsupportedError(f"index_codecs {names} are not supported; expected ['bytes'] or ['bytes', 'crc32c']")
    endian = (config["index_codecs"][0].get("configuration") or {}).get("endian", "little")
    location = config.get("index_location", "end")
    if location not in ("start", "end"):
        raise ConfigurationError(f"index_location must be 'start' or 'end', got {location!r}", path)
    cps = tuple(s // c for s, c in zip(shard_shape, inner))
    nested = any(isinstance(c, Mapping) and c.get("name") == SHARDING_CODEC for c in config.get("codecs") or [])
    bound = None if nested else chunk_nbytes_bound(inner, itemsize)
    return inner, ShardLayout(cps, location, endian, len(names) == 2, bound)


def sharding_spec_from_v3(metadata: Mapping[str, Any], path: str | None = None) -> ShardingSpec | None:
    """The sharding of a v3 array document, or ``None`` if it is not sharded.

    An array is sharded when its first array -> bytes codec is
    ``sharding_indexed`` and no array -> array codec precedes it.

    Raises
    ------
    ConfigurationError, UnsupportedError
        If the sharding configuration is invalid or not supported.
    """
    codecs = list(metadata.get("codecs", []))
    if not codecs or codecs[0].get("name") != SHARDING_CODEC:
        return None
    if metadata.get("chunk_grid", {}).get("name") != "regular":
        raise UnsupportedError(f"chunk grid {metadata.get('chunk_grid')!r} is not supported (regular only)")
    shard_shape = tuple(int(c) for c in metadata["chunk_grid"]["configuration"]["chunk_shape"])
    itemsize = v3_itemsize(metadata.get("data_type"))
    inner, layout = layout_from_codec_config(codecs[0].get("configuration") or {}, shard_shape, path, itemsize)
    return ShardingSpec(
        shape=tuple(int(s) for s in metadata["shape"]),
        chunks=inner,
        layout=layout,
        shard_key_encoding=chunk_key_encoding_from_metadata(
            metadata.get("chunk_key_encoding") or {"name": "default"}
        ),
    )
