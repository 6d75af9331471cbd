"""The inner codecs that carry Zarr v2 filters and object codecs into Zarr v3. Pure.

The array -> array ``numcodecs.<id>`` codecs zarr-python 3 registers,
``vlen-utf8`` / ``vlen-bytes``, and ``shardkv.v2_chunk``, the whole v2 chunk
encoding :mod:`shardkv.metadata.v2_codecs` falls back to (v3 readers refuse
it instead of misreading it).
"""

from __future__ import annotations

from collections.abc import Mapping
from math import prod
from typing import TYPE_CHECKING, Any, Literal

from shardkv.codecs.inner import Codec, _config_of, _NumcodecsById, numcodecs_codec, register_codec
from shardkv.errors import ConfigurationError, CorruptShardError

if TYPE_CHECKING:
    import numpy as np

ARRAY_TO_ARRAY_IDS = frozenset({"astype", "bitround", "delta", "fixedscaleoffset", "packbits", "quantize"})
"""numcodecs ids zarr-python 3 registers as ``numcodecs.<id>`` array -> array codecs."""

BYTES_TO_BYTES_IDS = frozenset(
    "adler32 blosc bz2 crc32 crc32c fletcher32 gzip jenkins_lookup3 lz4 lzma shuffle zlib zstd".split()
)
"""numcodecs ids zarr-python 3 registers as ``numcodecs.<id>`` bytes -> bytes codecs."""

VLEN_IDS = {"vlen-utf8": "string", "vlen-bytes": "variable_length_bytes"}
"""Object codec id -> the zarr-python 3 data type it encodes (the codec's v3 name is the id)."""

V2_CHUNK_CODEC = "shardkv.v2_chunk"


class NumcodecsArrayCodec(_NumcodecsById):
    """``numcodecs.<id>`` for the array -> array ids of :data:`ARRAY_TO_ARRAY_IDS` (``delta``, ``astype``, ...)."""

    kind = "array_to_array"

    def resolve_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape handed on: ``packbits`` makes one header byte plus a bit per element, 1-d."""
        if self.codec_id == "packbits":
            return (1 + -(-prod(shape) // 8),)
        return tuple(shape)

    def resolve_dtype(self, dtype: np.dtype) -> np.dtype:
        """The dtype handed on (``astype``, ``delta``, ``fixedscaleoffset`` may cast)."""
        import numpy as np

        return np.asarray(self._impl.encode(np.zeros(8, dtype=dtype))).dtype

    def encode(self, array: np.ndarray) -> np.ndarray:
        import numpy as np

        out = np.asarray(self._impl.encode(np.ascontiguousarray(array)))
        return out.reshape(self.resolve_shape(array.shape))

    def decode(self, array: np.ndarray) -> np.ndarray:
        import numpy as np

        return np.asarray(self._impl.decode(np.ascontiguousarray(array)))


class VlenCodec(Codec):
    """``vlen-utf8`` / ``vlen-bytes``: numcodecs ``VLenUTF8`` / ``VLenBytes`` of an object array (C order)."""

    kind = "array_to_bytes"

    def __init__(self, codec_id: str) -> None:
        if codec_id not in VLEN_IDS:
            raise ConfigurationError(f"vlen codec must be one of {sorted(VLEN_IDS)}, got {codec_id!r}")
        self.codec_id = self.name = codec_id
        import numcodecs  # imported where a codec is made (see shardkv.codecs.inner)

        self._impl = numcodecs.get_codec({"id": codec_id})

    def get_config(self) -> dict[str, Any]:
        return {"name": self.name, "configuration": {}}

    @classmethod
    def from_config(cls, obj: Mapping[str, Any]) -> VlenCodec:
        _config_of(obj, [])
        return cls(str(obj["name"]))

    def encode(self, array: np.ndarray, fill_value: Any = None) -> bytes:
        import numpy as np

        return bytes(self._impl.encode(np.ascontiguousarray(array, dtype=object).reshape(-1)))

    def decode(
        self, data: bytes | memoryview, shape: tuple[int, ...], dtype: np.dtype, fill_value: Any = None, key: str = ""
    ) -> np.ndarray:
        import numpy as np

        try:
            out = np.asarray(self._impl.decode(bytes(data)), dtype=object)
        except (ValueError, RuntimeError, UnicodeDecodeError) as exc:
            raise CorruptShardError(
                key, f"{self.name} could not decode {memoryview(data).nbytes} bytes: {exc}"
            ) from exc
        if out.size != prod(shape):
            raise CorruptShardError(key, f"{self.name} decoded {out.size} items for a chunk of shape {shape}")
        return out.reshape(shape)


class V2ChunkCodec(Codec):
    """``shardkv.v2_chunk``: one Zarr v2 chunk encoding (v2 spec "Chunks"), for what v3 has no name for.

    The chunk in ``order``, then ``filters``, then ``compressor``, as zarr-python 2 does.

    Parameters
    ----------
    dtype : str or list
        The v2 ``dtype`` (structured dtypes as lists of fields).
    order : {"C", "F"}
    compressor : dict or None
        numcodecs configuration.
    filters : list of dict or None
        numcodecs configurations (the object codec first for ``|O`` arrays).

    Raises
    ------
    ConfigurationError
        If ``order`` is not C or F or numcodecs does not know a codec.
    """

    name = V2_CHUNK_CODEC
    kind = "array_to_bytes"
    params = ("dtype", "order", "compressor", "filters")
    required = ("dtype",)

    def __init__(
        self, dtype: Any, order: str = "C", compressor: Mapping[str, Any] | None = None, filters: Any = None
    ) -> None:
        if order not in ("C", "F"):
            raise ConfigurationError(f"codec {V2_CHUNK_CODEC!r}: order must be 'C' or 'F', got {order!r}")
        self.dtype = dtype
        self.order: Literal["C", "F"] = "F" if order == "F" else "C"
        self.compressor = dict(compressor) if compressor is not None else None
        self.filters = [dict(f) for f in filters] if filters else None
        self._compressor = numcodecs_codec(self.compressor, V2_CHUNK_CODEC) if self.compressor else None
        self._filters = [numcodecs_codec(f, V2_CHUNK_CODEC) for f in self.filters or []]

    def get_config(self) -> dict[str, Any]:
        config = {"dtype": self.dtype, "order": self.order, "compressor": self.compressor, "filters": self.filters}
        return {"name": self.name, "configuration": config}

    def encode(self, array: np.ndarray, fill_value: Any = None) -> bytes:
        import numpy as np
        from numcodecs.compat import ensure_ndarray_like

        chunk: Any = np.asarray(array).copy(order=self.order)  # the v2 layout in memory
        for f in self._filters:
            chunk = f.encode(chunk)
        if self._compressor is not None:
            chunk = self._compressor.encode(chunk)
        return bytes(ensure_ndarray_like(chunk).reshape(-1, order="A").view(np.uint8))

    def decode(
        self, data: bytes | memoryview, shape: tuple[int, ...], dtype: np.dtype, fill_value: Any = None, key: str = ""
    ) -> np.ndarray:
        import numpy as np
        from numcodecs.compat import ensure_ndarray_like

        try:
            chunk: Any = self._compressor.decode(bytes(data)) if self._compressor is not None else bytes(data)
            for f in reversed(self._filters):
                chunk = f.decode(chunk)
            array = ensure_ndarray_like(chunk)
            if not np.dtype(dtype).hasobject:
                array = array.reshape(-1).view(dtype)
            return np.asarray(array).reshape(shape, order=self.order)
        except (ValueError, RuntimeError, TypeError) as exc:
            raise CorruptShardError(
                key, f"{V2_CHUNK_CODEC} could not decode {memoryview(data).nbytes} bytes: {exc}"
            ) from exc


for _id in sorted(ARRAY_TO_ARRAY_IDS):
    register_codec(f"numcodecs.{_id}", NumcodecsArrayCodec.from_config)
for _id in VLEN_IDS:
    register_codec(_id, VlenCodec.from_config)
register_codec(V2_CHUNK_CODEC, V2ChunkCodec.from_config)
