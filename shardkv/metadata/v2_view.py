"""Zarr v3 sharded arrays presented as Zarr v2 arrays (for zarr-python 2.18 through ShardedStore).

A Zarr v3 array written by zarr-python 3 or tensorstore has a ``zarr.json``
and no ``.zarray``. When its only codec is ``sharding_indexed`` and the inner
codecs have a Zarr v2 equivalent, :func:`v2_view_of_v3` derives the
``.zarray`` that reads the *inner chunks* as v2 chunks, byte for byte:

==========================================  =====================================
v3 (inside ``sharding_indexed``)            v2 ``.zarray``
==========================================  =====================================
``chunk_shape`` (inner)                     ``chunks``
``data_type`` + ``bytes`` ``endian``        ``dtype`` (``<i2``, ``>f8``, ``|u1``)
no ``transpose``, or the reversed order     ``order`` ``C``, or ``F``
bytes -> bytes codecs b1 ... bn             ``filters`` [b1 ... bn-1], ``compressor`` bn
``gzip``/``zstd``/``blosc``/``crc32c``      numcodecs ``gzip``/``zstd``/``blosc``/``crc32c``
``numcodecs.<id>``                          numcodecs ``<id>``
``fill_value``                              ``fill_value`` (v2 JSON spelling)
``attributes`` (+ ``dimension_names``)      ``.zattrs`` (+ ``_ARRAY_DIMENSIONS``)
==========================================  =====================================

Logical v2 chunk keys use ``"."`` (``dimension_separator: "."``); shard keys
stay as the array's ``chunk_key_encoding`` says (``c/1/2`` for ``default``).
A v3 group's ``zarr.json`` is presented as ``.zgroup`` (+ ``.zattrs``).
Anything else (nested sharding, other transposes, codecs after
``sharding_indexed``, extension data types, 0-d arrays, storage transformers)
is not presented; :attr:`V2View.problems` says why (``shardkv info`` reports it).

:class:`PresentingAdapter` is the one hook into :class:`~shardkv.ShardedStore`:
it wraps the base store adapter and serves the derived documents for paths
whose ``zarr.json`` is a v3 document with neither ``.zarray`` nor ``.zgroup``
beside it. Those documents are read-only (writing them raises
:class:`~shardkv.errors.ReservedKeyError`); chunk writes go to the shards.
"""

from __future__ import annotations

import base64
import binascii
import json
import struct
from dataclasses import dataclass, field
from typing import Any, Hashable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from shardkv.codecs import sharding as _codec  # noqa: F401  (registers sharding_indexed, so nested sharding is named in problems)
from shardkv.codecs.inner import (
    BloscCodec,
    BytesCodec,
    CodecPipeline,
    Crc32cCodec,
    GzipCodec,
    NumcodecsCodec,
    TransposeCodec,
    ZstdCodec,
)
from shardkv.errors import ConfigurationError, ReservedKeyError, ShardKVError
from shardkv.format.ranges import ByteRange
from shardkv.metadata.v3_view import SHARDING_CODEC, V2_FILL_FIELD, sharding_spec_from_v3
from shardkv.storage.adapters import StoreAdapter

__all__ = ["V2View", "v2_view_of_v3", "numpy_dtype_of_v3", "fill_value_from_v3", "PresentingAdapter"]

_V3_TO_NUMPY = {
    "bool": "b1", "int8": "i1", "int16": "i2", "int32": "i4", "int64": "i8",
    "uint8": "u1", "uint16": "u2", "uint32": "u4", "uint64": "u8",
    "float16": "f2", "float32": "f4", "float64": "f8", "complex64": "c8", "complex128": "c16",
}  # fmt: skip
_SHUFFLE_IDS = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}
_PRESENTED = (".zarray", ".zattrs", ".zgroup")


@dataclass(frozen=True)
class V2View:
    """The v2 documents presenting one v3 node, or why it is not presented.

    Attributes
    ----------
    documents : dict of str to dict
        ``{".zarray": ..., ".zattrs": ...}`` for an array, ``{".zgroup": ...}``
        (and ``.zattrs``) for a group; empty when not presented.
    problems : tuple of str
        Why the node is not presented (empty when it is).
    """

    documents: dict[str, dict[str, Any]] = field(default_factory=dict)
    problems: tuple[str, ...] = ()

    @property
    def presented(self) -> bool:
        return bool(self.documents)


_EXTENSION_KINDS = {"fixed_length_utf32": "U", "null_terminated_bytes": "S", "raw_bytes": "V"}
_TIME_KINDS = {"numpy.datetime64": "M8", "numpy.timedelta64": "m8"}


def numpy_dtype_of_v3(data_type: Any, endian: str | None = "little") -> np.dtype:
    """The numpy dtype of a v3 ``data_type`` stored with the ``bytes`` codec's ``endian``.

    Core numeric and bool types, and the zarr-python 3 extension types that
    :func:`shardkv.metadata.v3_view.v3_data_type` writes (fixed-size strings,
    bytes, void, datetime64, timedelta64).

    Raises
    ------
    ConfigurationError
        If ``data_type`` is neither (``r<N>`` and other extensions included).
    """
    order = "<" if endian != "big" else ">"
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
    code = _V3_TO_NUMPY[data_type]
    if code in ("b1", "i1", "u1"):
        return np.dtype("|" + code)
    return np.dtype(order + code)


def fill_value_from_v3(fill: Any, dtype: np.dtype) -> Any:
    """A v3 JSON ``fill_value`` as a numpy scalar of ``dtype`` (v3 core "fill_value").

    Strings are kept as they are, bytes and void are base64, datetime64 and
    timedelta64 are integers (zarr-python 3's spellings).

    Raises
    ------
    ConfigurationError
        If the value does not fit the data type.
    """
    dtype = np.dtype(dtype)
    try:
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
        if dtype.kind in "SV":
            if not isinstance(fill, str):
                raise ValueError("expected a base64 string")
            raw = base64.standard_b64decode(fill.encode("ascii"))
            if len(raw) > dtype.itemsize or (dtype.kind == "V" and len(raw) != dtype.itemsize):
                raise ValueError(f"base64 of {len(raw)} bytes for a {dtype.itemsize}-byte type")
            return np.bytes_(raw) if dtype.kind == "S" else np.void(raw.ljust(dtype.itemsize, b"\0"))
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
    """A numpy fill value in zarr-python 2's ``.zarray`` JSON spelling."""
    if dtype.kind == "U":
        return str(value)
    if dtype.kind in "SV":
        return base64.standard_b64encode(bytes(value)).decode("ascii")
    if dtype.kind in "Mm":
        return int(np.asarray(value, dtype=dtype.newbyteorder("=")).view(np.int64))
    if dtype.kind == "b":
        return bool(value)
    if dtype.kind in "iu":
        return int(value)
    if dtype.kind == "f":
        v = float(value)
        return "NaN" if np.isnan(v) else ("Infinity" if v == np.inf else ("-Infinity" if v == -np.inf else v))
    return [_v2_fill(value.real, np.dtype("f8")), _v2_fill(value.imag, np.dtype("f8"))]


def _v2_codec(codec: Any, dtype: np.dtype) -> dict[str, Any] | None:
    """The numcodecs config equal to a v3 bytes -> bytes codec, or None."""
    if isinstance(codec, GzipCodec):
        return {"id": "gzip", "level": codec.level}
    if isinstance(codec, ZstdCodec):
        return {"id": "zstd", "level": codec.level, "checksum": codec.checksum}
    if isinstance(codec, BloscCodec):
        return {
            "id": "blosc", "cname": codec.cname, "clevel": codec.clevel,
            "shuffle": _SHUFFLE_IDS[codec.shuffle], "blocksize": codec.blocksize,
        }  # fmt: skip
    if isinstance(codec, Crc32cCodec):
        return {"id": "crc32c"}  # numcodecs CRC32C: little-endian checksum at the end, as v3
    if isinstance(codec, NumcodecsCodec):
        return {"id": codec.codec_id, **codec.configuration}
    return None


def v2_view_of_v3(metadata: Mapping[str, Any], path: str = "") -> V2View:
    """The v2 documents that present a v3 ``zarr.json`` to zarr-python 2, or why there are none.

    Parameters
    ----------
    metadata : mapping
        A v3 array or group metadata document.
    path : str
        The node's path (named in problems).

    Returns
    -------
    V2View
        Documents and problems; exactly one of the two is empty.
    """
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
    problems: list[str] = []
    codecs = list(metadata.get("codecs") or [])
    if metadata.get("storage_transformers"):
        problems.append("storage transformers have no v2 equivalent")
    if not codecs or codecs[0].get("name") != SHARDING_CODEC:
        problems.append("the array is not sharded (its first codec is not sharding_indexed)")
    elif len(codecs) > 1:
        problems.append(f"codecs after sharding_indexed ({[c.get('name') for c in codecs[1:]]}) encode whole shards")
    if not metadata.get("shape"):
        problems.append("0-d arrays are not presented")
    if problems:
        return V2View(problems=tuple(where + p for p in problems))
    try:
        spec = sharding_spec_from_v3(metadata, path)
        inner = CodecPipeline(codecs[0]["configuration"]["codecs"], "inner codecs")
    except (ShardKVError, KeyError, TypeError) as exc:
        return V2View(problems=(f"{where}invalid sharding configuration: {exc}",))
    if spec is None:  # pragma: no cover - excluded above
        return V2View(problems=(f"{where}not sharded",))
    ndim = len(spec.shape)
    order = "C"
    for c in inner.array_to_array:
        if isinstance(c, TransposeCodec) and c.order == tuple(range(ndim))[::-1]:
            order = "F" if order == "C" else "C"
        elif isinstance(c, TransposeCodec) and c.order == tuple(range(ndim)):
            continue
        else:
            problems.append(f"inner codec {c.get_config()} has no v2 equivalent (only transpose to F order)")
    if not isinstance(inner.array_to_bytes, BytesCodec):
        name = inner.array_to_bytes.get_config()["name"]
        problems.append(f"inner array -> bytes codec {name!r} has no v2 equivalent (nested sharding?)")
        endian = None
    else:
        endian = inner.array_to_bytes.endian
    try:
        dtype = numpy_dtype_of_v3(metadata.get("data_type"), endian)
        fill = _v2_fill(fill_value_from_v3(metadata.get("fill_value"), dtype), dtype)
        marker = metadata.get(V2_FILL_FIELD)
        if isinstance(marker, Mapping) and "fill_value" in marker and marker["fill_value"] is None:
            fill = None  # a v2 null fill, kept by the writer of this document
    except ConfigurationError as exc:
        problems.append(exc.reason)
        dtype, fill = np.dtype("u1"), 0
    numcodecs_configs = []
    for c in inner.bytes_to_bytes:
        conf = _v2_codec(c, dtype)
        if conf is None:
            problems.append(f"inner codec {c.get_config()['name']!r} has no v2 equivalent")
        numcodecs_configs.append(conf)
    if problems:
        return V2View(problems=tuple(where + p for p in problems))
    zarray = {
        "zarr_format": 2,
        "shape": list(spec.shape),
        "chunks": list(spec.chunks),
        "dtype": dtype.str,
        "compressor": numcodecs_configs[-1] if numcodecs_configs else None,
        "fill_value": fill,
        "order": order,
        "filters": numcodecs_configs[:-1] or None,
        "dimension_separator": ".",
    }
    names = metadata.get("dimension_names")
    if names and all(isinstance(n, str) for n in names) and "_ARRAY_DIMENSIONS" not in attrs:
        attrs["_ARRAY_DIMENSIONS"] = list(names)  # xarray's v2 convention
    docs = {".zarray": zarray}
    if attrs:
        docs[".zattrs"] = attrs
    return V2View(docs)


def _dump(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc, indent=4, sort_keys=True, allow_nan=False).encode()


def _split(key: str) -> tuple[str, str]:
    path, _, name = key.rpartition("/")
    return path, name


def _join(path: str, name: str) -> str:
    return f"{path}/{name}" if path else name


class PresentingAdapter(StoreAdapter):
    """A store adapter that adds the v2 documents of v3 nodes to what the base adapter holds.

    Parameters
    ----------
    inner : StoreAdapter
        The adapter over the base store; every call is passed to it, and a
        read of ``.zarray`` / ``.zattrs`` / ``.zgroup`` that it misses is
        answered from the sibling ``zarr.json`` when that is a v3 document
        with neither ``.zarray`` nor ``.zgroup`` beside it.
    """

    def __init__(self, inner: StoreAdapter) -> None:
        self.inner = inner
        self.supports_ranges = inner.supports_ranges

    # -- presentation ------------------------------------------------------

    def _view(self, path: str, zarr_json: bytes | None = None) -> V2View | None:
        """The v2 view of the v3 node at ``path``, or None when it is not a v3-only node."""
        if zarr_json is None:
            found = self.inner.get_many([_join(path, "zarr.json")])
            zarr_json = found.get(_join(path, "zarr.json"))
            if zarr_json is None:
                return None
        try:
            doc = json.loads(bytes(zarr_json))
        except ValueError:
            return None
        if not isinstance(doc, dict) or doc.get("zarr_format") != 3:
            return None
        if self.inner.contains(_join(path, ".zarray")) or self.inner.contains(_join(path, ".zgroup")):
            return None  # a v2 node (a sharded v2 array's zarr.json is shardkv's own view)
        return v2_view_of_v3(doc, path)

    def _presented(self, key: str, zarr_json: bytes | None = None) -> bytes | None:
        path, name = _split(key)
        if name not in _PRESENTED:
            return None
        view = self._view(path, zarr_json)
        if view is None or name not in view.documents:
            return None
        return _dump(view.documents[name])

    def view_of(self, path: str) -> V2View | None:
        """The v2 view of the v3-only node at ``path`` (``None`` if there is none)."""
        return self._view(path.strip("/"))

    # -- reads -------------------------------------------------------------

    def get(self, key: str) -> bytes:
        try:
            return self.inner.get(key)
        except KeyError:
            value = self._presented(key)
            if value is None:
                raise
            return value

    def get_many(self, keys: Sequence[str]) -> dict[str, bytes]:
        out = self.inner.get_many(keys)
        for key in keys:
            if key not in out and _split(key)[1] in _PRESENTED:
                sibling = _join(_split(key)[0], "zarr.json")
                value = self._presented(key, out.get(sibling))
                if value is not None:
                    out[key] = value
        return out

    def get_ranges(self, requests: Sequence[tuple[str, ByteRange]]) -> list[bytes | None]:
        return self.inner.get_ranges(requests)

    def contains(self, key: str) -> bool:
        return self.inner.contains(key) or self._presented(key) is not None

    def iter_keys(self, prefix: str = "") -> Iterator[str]:
        zarr_jsons: list[str] = []
        v2_meta: set[str] = set()
        for key in self.inner.iter_keys(prefix):
            path, name = _split(key)
            if name == "zarr.json":
                zarr_jsons.append(path)
            elif name in _PRESENTED:
                v2_meta.add(key)
            yield key
        for path in zarr_jsons:
            if _join(path, ".zarray") in v2_meta or _join(path, ".zgroup") in v2_meta:
                continue
            view = self._view(path)
            for name in view.documents if view is not None else ():
                if _join(path, name) not in v2_meta:
                    yield _join(path, name)

    def list_dir(self, path: str = "") -> list[str]:
        names = self.inner.list_dir(path)
        if "zarr.json" in names and ".zarray" not in names and ".zgroup" not in names:
            view = self._view(path)
            if view is not None:
                names = sorted(set(names) | set(view.documents))
        return names

    def size(self, key: str) -> int:
        try:
            return self.inner.size(key)
        except KeyError:
            value = self._presented(key)
            if value is None:
                raise
            return len(value)

    def validator(self, key: str) -> Hashable:
        return self.inner.validator(key)

    def size_if_free(self, key: str) -> int | None:
        return self.inner.size_if_free(key)

    # -- writes ------------------------------------------------------------

    def _refuse_presented(self, keys: Iterable[str]) -> None:
        for key in keys:
            path, name = _split(key)
            if name in _PRESENTED and self._view(path) is not None:
                raise ReservedKeyError(
                    key, "the v2 documents of a Zarr v3 node are read-only; change its zarr.json with a v3 library"
                )

    def set_many(self, values: Mapping[str, bytes]) -> None:
        self._refuse_presented(values)
        self.inner.set_many(values)

    def delete_many(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        self._refuse_presented(keys)
        self.inner.delete_many(keys)

    def rmdir(self, path: str) -> None:
        self.inner.rmdir(path)

    @property
    def supports_append(self) -> bool:
        return self.inner.supports_append

    def write_at(self, key: str, writes: Sequence[tuple[int, bytes]]) -> None:
        self.inner.write_at(key, writes)

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> Any:  # anything else a concrete adapter offers
        return getattr(self.inner, name)
