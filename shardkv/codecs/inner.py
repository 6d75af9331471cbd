"""The Zarr v3 codecs an inner chunk (or a shard index) passes through, and their pipeline. Pure.

A codec list (v3 core "Codecs") is array -> array codecs, one array -> bytes
codec, then bytes -> bytes codecs; each codec's ``get_config()`` /
``from_config()`` round-trip its JSON object. Here: ``transpose``, ``bytes``,
``gzip``, ``zstd``, ``blosc``, ``crc32c``, ``numcodecs.<id>``; in
:mod:`shardkv.codecs.numcodecs_v3` the array -> array ``numcodecs.<id>``,
``vlen-utf8``/``vlen-bytes`` and ``shardkv.v2_chunk``; ``sharding_indexed``
in :mod:`shardkv.codecs.sharding`. Unknown names or members raise
:class:`~shardkv.errors.ConfigurationError`.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping, Sequence
from math import prod
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Self

from shardkv.codecs.bounded import decode_bounded
from shardkv.errors import ChecksumError, ConfigurationError, CorruptShardError
from shardkv.format.layout import Endian, crc32c_of

if TYPE_CHECKING:
    import numpy as np

CodecKind = Literal["array_to_array", "array_to_bytes", "bytes_to_bytes"]


def _config_of(obj: Mapping[str, Any], allowed: Sequence[str]) -> dict[str, Any]:
    """The ``configuration`` member of a codec object, checked against ``allowed`` names."""
    if not isinstance(obj, Mapping) or not isinstance(obj.get("name"), str):
        raise ConfigurationError(f"a codec is an object with a string 'name', got {obj!r}")
    extra = set(obj) - {"name", "configuration"}
    if extra:
        raise ConfigurationError(f"codec {obj['name']!r} has unknown member(s) {sorted(extra)}")
    config = obj.get("configuration") or {}
    if not isinstance(config, Mapping):
        raise ConfigurationError(f"codec {obj['name']!r}: configuration must be an object, got {config!r}")
    unknown = set(config) - set(allowed)
    if unknown:
        raise ConfigurationError(
            f"codec {obj['name']!r}: unknown configuration member(s) {sorted(unknown)}; expected {sorted(allowed)}"
        )
    return dict(config)


class Codec:
    """Base of the codecs. Subclasses set ``name``, ``kind``, ``fixed_size`` and their configuration ``params``.

    ``params`` are the members of ``configuration``, each an ``__init__``
    keyword and an attribute; ``required`` ones must be given.
    """

    name: str  # a class constant, but for the numcodecs codecs named by their id
    kind: ClassVar[CodecKind]
    fixed_size: ClassVar[bool] = False
    params: ClassVar[tuple[str, ...]] = ()
    required: ClassVar[tuple[str, ...]] = ()

    def get_config(self) -> dict[str, Any]:
        """The codec's JSON object: ``name``, and ``configuration`` (``params`` not ``None``) unless it is empty."""
        config = {p: getattr(self, p) for p in self.params if getattr(self, p) is not None}
        return {"name": self.name, "configuration": config} if config else {"name": self.name}

    @classmethod
    def from_config(cls, obj: Mapping[str, Any]) -> Self:
        """A codec from its JSON object; ConfigurationError for an unknown or missing member or an invalid value."""
        config = _config_of(obj, cls.params)
        for p in cls.required:
            if p not in config:
                raise ConfigurationError(f"codec {cls.name!r} needs configuration.{p}")
        return cls(**config)

    def numcodecs_config(self) -> dict[str, Any] | None:
        """The numcodecs (Zarr v2) configuration of the same codec, or ``None`` when v2 has none."""
        return None

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.get_config() == self.get_config()

    def __hash__(self) -> int:
        return hash(repr(self.get_config()))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.get_config()!r})"


class TransposeCodec(Codec):
    """``transpose``: ``order[i]`` (a permutation of ``range(ndim)``) is the input axis that becomes axis ``i``."""

    name = "transpose"
    kind = "array_to_array"
    fixed_size = True
    params = required = ("order",)

    def __init__(self, order: Sequence[int]) -> None:
        if isinstance(order, str) or sorted(int(o) for o in order) != list(range(len(order))):
            raise ConfigurationError(f"transpose order must be a permutation of 0..n-1, got {order!r}")
        self.order = [int(o) for o in order]

    def _check(self, ndim: int) -> None:
        if len(self.order) != ndim:
            raise ConfigurationError(f"transpose order {self.order} does not fit a {ndim}-d chunk")

    def resolve_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape after encoding."""
        self._check(len(shape))
        return tuple(shape[o] for o in self.order)

    def encode(self, array: np.ndarray) -> np.ndarray:
        import numpy as np

        self._check(array.ndim)
        return np.transpose(array, self.order)

    def decode(self, array: np.ndarray) -> np.ndarray:
        import numpy as np

        self._check(array.ndim)
        return np.transpose(array, np.argsort(self.order))


class BytesCodec(Codec):
    """``bytes``: the elements in C order, in ``endian`` byte order (``None``: 1-byte types only)."""

    name = "bytes"
    kind = "array_to_bytes"
    fixed_size = True
    params = ("endian",)

    def __init__(self, endian: Endian | None = None) -> None:
        if endian not in ("little", "big", None):
            raise ConfigurationError(f"bytes endian must be 'little' or 'big', got {endian!r}")
        self.endian = endian

    def stored_dtype(self, dtype: np.dtype) -> np.dtype:
        """``dtype`` in this codec's byte order; ConfigurationError for object, or multi-byte without endian."""
        import numpy as np

        dtype = np.dtype(dtype)
        if dtype.hasobject:
            raise ConfigurationError(f"the bytes codec cannot store object dtype {dtype}")
        if dtype.byteorder == "|" or dtype.itemsize == 1:
            return dtype
        if self.endian is None:
            raise ConfigurationError(f"the bytes codec needs an endian for the {dtype.itemsize}-byte dtype {dtype}")
        return dtype.newbyteorder("<" if self.endian == "little" else ">")

    def encode(self, array: np.ndarray, fill_value: Any = None) -> bytes:
        import numpy as np

        return np.asarray(array).astype(self.stored_dtype(array.dtype), copy=False).tobytes(order="C")

    def decode(
        self, data: bytes | memoryview, shape: tuple[int, ...], dtype: np.dtype, fill_value: Any = None, key: str = ""
    ) -> np.ndarray:
        import numpy as np

        stored = self.stored_dtype(dtype)
        expected = prod(shape) * stored.itemsize
        if memoryview(data).nbytes != expected:
            raise CorruptShardError(
                key, f"bytes codec expected {expected} bytes for shape {shape} {stored}, got {memoryview(data).nbytes}"
            )
        return np.frombuffer(data, dtype=stored).reshape(shape)


class _NumcodecsBacked(Codec):
    kind = "bytes_to_bytes"
    _impl: Any

    def encode(self, data: bytes | memoryview) -> bytes:
        import numpy as np

        return bytes(self._impl.encode(np.frombuffer(data, dtype=np.uint8)))

    def numcodecs_config(self) -> dict[str, Any]:
        """The numcodecs (Zarr v2) configuration of this codec."""
        return dict(self._impl.get_config())

    def decode(self, data: bytes | memoryview, key: str = "", limit: int | None = None) -> bytes:
        """Decompress; with ``limit``, stop at (and report) output beyond ``limit`` bytes (:mod:`.bounded`)."""
        try:
            if limit is not None:
                return decode_bounded(self._impl, data, limit, key)
            return bytes(self._impl.decode(data))
        except CorruptShardError:
            raise
        except (RuntimeError, ValueError, OSError, EOFError, zlib.error) as exc:  # decompression failures
            raise CorruptShardError(
                key, f"{self.name} could not decode {memoryview(data).nbytes} bytes: {exc}"
            ) from exc


class GzipCodec(_NumcodecsBacked):
    """``gzip``: RFC 1952 gzip at ``level`` (0-9)."""

    name = "gzip"
    params = required = ("level",)

    def __init__(self, level: int = 5) -> None:
        if isinstance(level, bool) or not isinstance(level, int) or not 0 <= level <= 9:
            raise ConfigurationError(f"gzip level must be an int in 0..9, got {level!r}")
        self.level = level
        import numcodecs  # imported where a codec is made: the command line's jobs that move bytes need none

        self._impl = numcodecs.GZip(level)


class ZstdCodec(_NumcodecsBacked):
    """``zstd``: Zstandard at ``level``, with the frame ``checksum`` flag."""

    name = "zstd"
    params = ("level", "checksum")

    def __init__(self, level: int = 0, checksum: bool = False) -> None:
        if isinstance(level, bool) or not isinstance(level, int):
            raise ConfigurationError(f"zstd level must be an int, got {level!r}")
        self.level, self.checksum = level, bool(checksum)
        import numcodecs

        self._impl = numcodecs.Zstd(level=level, checksum=self.checksum)


BLOSC_SHUFFLE_IDS = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}
"""Blosc ``shuffle`` names of Zarr v3 and the numcodecs ``shuffle`` ids of Zarr v2 (the one table)."""


class BloscCodec(_NumcodecsBacked):
    """``blosc``: Blosc 1 with ``cname``, ``clevel``, ``shuffle``, ``typesize`` and ``blocksize`` (bytes; 0 = auto)."""

    name = "blosc"
    params = ("cname", "clevel", "shuffle", "typesize", "blocksize")

    def __init__(
        self,
        cname: str = "zstd",
        clevel: int = 5,
        shuffle: str = "noshuffle",
        typesize: int | None = None,
        blocksize: int = 0,
    ) -> None:
        if cname not in ("blosclz", "lz4", "lz4hc", "snappy", "zlib", "zstd"):
            raise ConfigurationError(f"blosc cname {cname!r} is not one of blosclz, lz4, lz4hc, snappy, zlib, zstd")
        if shuffle not in BLOSC_SHUFFLE_IDS:
            raise ConfigurationError(f"blosc shuffle must be one of {sorted(BLOSC_SHUFFLE_IDS)}, got {shuffle!r}")
        if shuffle != "noshuffle" and not (isinstance(typesize, int) and typesize >= 1):
            raise ConfigurationError(f"blosc with shuffle {shuffle!r} needs a typesize >= 1, got {typesize!r}")
        self.cname, self.clevel, self.shuffle, self.blocksize = cname, int(clevel), shuffle, int(blocksize)
        self.typesize = typesize
        import numcodecs

        self._impl = numcodecs.Blosc(
            cname=cname, clevel=self.clevel, shuffle=BLOSC_SHUFFLE_IDS[shuffle], blocksize=self.blocksize
        )

    def encode(self, data: bytes | memoryview) -> bytes:
        import numpy as np

        n = memoryview(data).nbytes
        ts = self.typesize or 1
        view = np.frombuffer(data, dtype=f"V{ts}" if n % ts == 0 and ts > 1 else np.uint8)
        return bytes(self._impl.encode(view))


class Crc32cCodec(Codec):
    """``crc32c``: append the CRC32C (Castagnoli) of the bytes as a little-endian uint32 (4 bytes)."""

    name = "crc32c"
    kind = "bytes_to_bytes"
    fixed_size = True

    def numcodecs_config(self) -> dict[str, Any]:
        return {"id": "crc32c"}  # numcodecs CRC32C: little-endian checksum at the end, as v3

    def encode(self, data: bytes | memoryview) -> bytes:
        body = bytes(data)  # one copy, which the checksum reads too
        return body + crc32c_of(body).to_bytes(4, "little")

    def decode(self, data: bytes | memoryview, key: str = "") -> bytes:
        view = memoryview(data).cast("B")
        if len(view) < 4:
            raise CorruptShardError(key, f"crc32c needs at least 4 bytes, got {len(view)}")
        stored = int.from_bytes(view[-4:], "little")
        body = bytes(view[:-4])  # one copy, which the checksum reads too
        computed = crc32c_of(body)
        if stored != computed:
            raise ChecksumError(key, stored, computed, what="inner chunk")
        return body


def numcodecs_codec(config: Mapping[str, Any], what: str) -> Any:
    """The numcodecs codec of a ``{"id": ...}`` configuration; ConfigurationError (naming ``what``) if refused."""
    import numcodecs

    try:
        return numcodecs.get_codec(dict(config))
    except (ValueError, TypeError, KeyError) as exc:
        raise ConfigurationError(f"codec {what!r}: {exc}") from exc


class _NumcodecsById(Codec):
    """A codec named ``numcodecs.<id>`` (zarr-python 3's names), configured as numcodecs configures ``<id>``."""

    _impl: Any

    def __init__(self, codec_id: str, configuration: Mapping[str, Any] | None = None) -> None:
        self.codec_id, self.name = codec_id, f"numcodecs.{codec_id}"
        self.configuration = {k: v for k, v in (configuration or {}).items() if k != "id"}
        self._impl = numcodecs_codec({"id": codec_id, **self.configuration}, f"numcodecs.{codec_id}")

    def get_config(self) -> dict[str, Any]:
        return {"name": self.name, "configuration": dict(self.configuration)}

    def numcodecs_config(self) -> dict[str, Any]:
        return {"id": self.codec_id, **self.configuration}

    @classmethod
    def from_config(cls, obj: Mapping[str, Any]) -> Self:
        name = str(obj.get("name", ""))
        return cls(name[len("numcodecs.") :], obj.get("configuration") or {})


class NumcodecsCodec(_NumcodecsById, _NumcodecsBacked):
    """``numcodecs.<id>``: a bytes -> bytes numcodecs codec under zarr-python 3's name (zlib, bz2, lz4, ...)."""


_REGISTRY: dict[str, Callable[[Mapping[str, Any]], Any]] = {
    c.name: c.from_config for c in (TransposeCodec, BytesCodec, GzipCodec, ZstdCodec, BloscCodec, Crc32cCodec)
}


def register_codec(name: str, from_config: Callable[[Mapping[str, Any]], Any]) -> None:
    """Make ``codec_from_config`` build codecs named ``name`` (used by :mod:`shardkv.codecs.sharding`)."""
    _REGISTRY[name] = from_config


def codec_from_config(obj: Any) -> Any:
    """A codec object from its JSON object (codec objects pass through); ConfigurationError for an unknown one."""
    if isinstance(obj, Codec):
        return obj
    if not isinstance(obj, Mapping) or not isinstance(obj.get("name"), str):
        raise ConfigurationError(f"a codec is an object with a string 'name', got {obj!r}")
    name = obj["name"]
    if name.startswith("numcodecs.") and name not in _REGISTRY:  # array -> array ones are registered by name
        return NumcodecsCodec.from_config(obj)
    if name not in _REGISTRY:
        raise ConfigurationError(f"unknown codec {name!r}; known: {sorted(_REGISTRY)} and numcodecs.<id>")
    return _REGISTRY[name](obj)


class CodecPipeline:
    """A validated codec list (codec or JSON objects, in encoding order); ``what`` names it in errors.

    Raises
    ------
    ConfigurationError
        If there is not exactly one array -> bytes codec, or the kinds are out of order.
    """

    def __init__(self, codecs: Sequence[Any], what: str = "codecs") -> None:
        built = [codec_from_config(c) for c in codecs]
        kinds = [c.kind for c in built]
        n_ab = kinds.count("array_to_bytes")
        if n_ab != 1:
            names = [c.get_config()["name"] for c in built]
            raise ConfigurationError(f"{what} must contain exactly one array -> bytes codec, got {n_ab} in {names}")
        i = kinds.index("array_to_bytes")
        if any(k != "array_to_array" for k in kinds[:i]) or any(k != "bytes_to_bytes" for k in kinds[i + 1 :]):
            raise ConfigurationError(
                f"{what} must be array -> array codecs, one array -> bytes codec, then bytes -> bytes codecs; "
                f"got {kinds}"
            )
        self.codecs = built
        self.array_to_array = built[:i]
        self.array_to_bytes = built[i]
        self.bytes_to_bytes = built[i + 1 :]

    def get_config(self) -> list[dict[str, Any]]:
        return [c.get_config() for c in self.codecs]

    def encode(self, array: np.ndarray, fill_value: Any = None) -> bytes:
        """Encode one chunk (shape = the inner chunk shape) to bytes."""
        for c in self.array_to_array:
            array = c.encode(array)
        data = self.array_to_bytes.encode(array, fill_value)
        for c in self.bytes_to_bytes:
            data = c.encode(data)
        return data

    def decode(
        self, data: bytes | memoryview, shape: tuple[int, ...], dtype: np.dtype, fill_value: Any = None, key: str = ""
    ) -> np.ndarray:
        """Decode one chunk to an array of ``shape`` and ``dtype``; CorruptShardError (naming ``key``) if it cannot."""
        import numpy as np

        shapes, dtypes = [tuple(shape)], [np.dtype(dtype)]
        for c in self.array_to_array:  # what each array -> array codec hands on (numcodecs ones may cast)
            shapes.append(c.resolve_shape(shapes[-1]))
            dtypes.append(c.resolve_dtype(dtypes[-1]) if hasattr(c, "resolve_dtype") else dtypes[-1])
        sized = isinstance(self.array_to_bytes, BytesCodec)  # its output is shape x itemsize bytes
        limit = prod(shapes[-1]) * dtypes[-1].itemsize + 64 * len(self.bytes_to_bytes) if sized else None
        for c in reversed(self.bytes_to_bytes):  # a decompressor stops at the chunk's declared size (+ checksums)
            data = c.decode(data, key, limit) if isinstance(c, _NumcodecsBacked) else c.decode(data, key)
        array = self.array_to_bytes.decode(data, shapes[-1], dtypes[-1], fill_value, key)
        for i, c in reversed(list(enumerate(self.array_to_array))):
            array = c.decode(array).reshape(shapes[i])
        return array.astype(dtype, copy=False)
