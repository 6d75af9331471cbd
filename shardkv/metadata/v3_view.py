"""The Zarr v3 ``zarr.json`` of a sharded Zarr v2 array, and the sharding a v3 document describes. Pure.

The v3 array reads the *same bytes*, ``sharding_indexed`` its only codec
(user guide, "The on-disk format"); what v3 cannot spell of the v2
documents goes to fields v3 readers skip, which
:func:`shardkv.metadata.v2_view.v2_view_of_v3` turns back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from shardkv.errors import ConfigurationError, UnsupportedError
from shardkv.format.layout import ShardLayout, chunk_nbytes_bound
from shardkv.keys.paths import path_prefix
from shardkv.keys.space import (
    ChunkKeyEncoding,
    Separator,
    ShardedArray,
    V2ChunkKeyEncoding,
    chunk_key_encoding_from_metadata,
)
from shardkv.metadata.v2_codecs import numpy_dtype_of_v3, v3_encoding_of_v2

SHARDING_CODEC = "sharding_indexed"


@dataclass(frozen=True)
class V3View:
    """A v3 ``zarr.json`` document and the reasons it cannot be read by v3 readers, if any."""

    metadata: dict[str, Any]
    problems: tuple[str, ...] = field(default=())

    @property
    def translatable(self) -> bool:
        """True when zarr-python 3 can read the array through this document."""
        return not self.problems


def v2_dimension_separator(zarray: Mapping[str, Any]) -> Separator:
    """The chunk key separator of a v2 array (``"."`` unless ``dimension_separator`` says ``"/"``)."""
    sep = zarray.get("dimension_separator") or "."
    if sep not in (".", "/"):
        raise ConfigurationError(f"dimension_separator must be '.' or '/', got {sep!r}")
    return cast(Separator, sep)


# -- v2 -> v3 ------------------------------------------------------------


V2_FILL_FIELD = "shardkv.v2_fill_value"  # a v2 fill value v3 cannot spell (null, an object array's)
V2_COMPRESSOR_FIELD = "shardkv.v2_compressor"  # null after v2 filters, or Blosc AUTOSHUFFLE (shuffle -1)


def sharding_codec(
    chunk_shape: Sequence[int],
    codecs: list[dict[str, Any]],
    index_location: str,
    index_checksum: bool,
    index_endian: str = "little",
) -> dict[str, Any]:
    """The v1.0 ``sharding_indexed`` codec object: index codecs ``bytes`` (then ``crc32c`` with ``index_checksum``)."""
    index_codecs: list[dict[str, Any]] = [{"name": "bytes", "configuration": {"endian": index_endian}}]
    if index_checksum:
        index_codecs.append({"name": "crc32c"})
    config = {"chunk_shape": list(chunk_shape), "codecs": codecs, "index_codecs": index_codecs}
    return {"name": SHARDING_CODEC, "configuration": {**config, "index_location": index_location}}


def v3_view_of_v2(
    zarray: Mapping[str, Any], zattrs: Mapping[str, Any] | None, layout: ShardLayout | None = None
) -> V3View:
    """The ``zarr.json`` that reads a v2 array's chunks as a v3 array, and why v3 readers may not use it.

    Sharded with ``layout`` (shard shape: the v2 ``chunks`` x
    ``layout.chunks_per_shard``; inner chunks: the v2 chunks), or else the
    chunk objects as they are: then empty when opaque, and a well-formed
    ``_ARRAY_DIMENSIONS`` becomes ``dimension_names``. What v3 cannot spell
    of the v2 documents is recorded (:data:`V2_FILL_FIELD`, :data:`V2_COMPRESSOR_FIELD`).

    Raises
    ------
    ConfigurationError
        If ``layout.chunks_per_shard`` does not have one value per dimension,
        or the separator or fill value is invalid.
    """
    shape = [int(s) for s in zarray["shape"]]
    chunks = [int(c) for c in zarray["chunks"]]
    if layout is not None and len(layout.chunks_per_shard) != len(shape):
        raise ConfigurationError(
            f"chunks_per_shard {layout.chunks_per_shard} has {len(layout.chunks_per_shard)} value(s), "
            f"the array has {len(shape)} dimension(s)"
        )
    encoding = v3_encoding_of_v2(zarray)
    if layout is None and encoding.opaque:
        return V3View({}, encoding.problems)
    grid, codecs = chunks, encoding.codecs
    if layout is not None:
        grid = [c * n for c, n in zip(chunks, layout.chunks_per_shard, strict=True)]
        codecs = [sharding_codec(chunks, codecs, layout.index_location, layout.index_checksum, layout.index_endian)]
    metadata = {
        "zarr_format": 3,
        "node_type": "array",
        "shape": shape,
        "data_type": encoding.data_type,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": grid}},
        "chunk_key_encoding": V2ChunkKeyEncoding(v2_dimension_separator(zarray)).to_metadata(),
        "fill_value": encoding.fill_value,
        "codecs": codecs,
        "attributes": dict(zattrs or {}),
    }
    names = dimension_names_of(metadata["attributes"].get("_ARRAY_DIMENSIONS"), len(shape))
    if layout is None and names is not None:  # a malformed one stays an attribute
        del metadata["attributes"]["_ARRAY_DIMENSIONS"]
        metadata["dimension_names"] = names
    if encoding.keep_v2_fill:
        metadata[V2_FILL_FIELD] = {"must_understand": False, "fill_value": zarray.get("fill_value")}
    compressor = zarray.get("compressor")
    if encoding.opaque:  # its v2 encoding is kept whole
        return V3View(metadata, encoding.problems)
    if compressor is None and encoding.codecs[-1]["name"].startswith("numcodecs."):
        metadata[V2_COMPRESSOR_FIELD] = {"must_understand": False, "compressor": None}
    elif compressor is not None and compressor.get("id") == "blosc" and compressor.get("shuffle") == -1:
        metadata[V2_COMPRESSOR_FIELD] = {"must_understand": False, "compressor": dict(compressor)}  # AUTOSHUFFLE
    return V3View(metadata, encoding.problems)


def dimension_names_of(names: Any, ndim: int) -> list[str] | None:
    """xarray's v2 ``_ARRAY_DIMENSIONS`` as v3 ``dimension_names``; ``None`` if it is not one str per dimension."""
    if isinstance(names, list) and len(names) == ndim and all(isinstance(n, str) for n in names):
        return list(names)
    return None


# -- v3 -> sharding spec ---------------------------------------------------


@dataclass(frozen=True)
class ShardingSpec:
    """The sharding of one array: shape and inner chunk shape (elements), layout, and its shards' key encoding."""

    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    layout: ShardLayout
    shard_key_encoding: ChunkKeyEncoding

    def array_at(
        self, path: str, chunk_key_encoding: ChunkKeyEncoding, shape: tuple[int, ...] | None = None
    ) -> ShardedArray:
        """The key mapping of the array at ``path`` whose chunk keys use ``chunk_key_encoding``."""
        return ShardedArray(
            path=path,
            key_prefix=path_prefix(path),
            shape=self.shape if shape is None else shape,
            chunks=self.chunks,
            layout=self.layout,
            chunk_key_encoding=chunk_key_encoding,
            shard_key_encoding=self.shard_key_encoding,
        )


def v3_itemsize(data_type: Any) -> int | None:
    """Bytes per element of a v3 core, fixed-size extension or datetime type; ``None`` for any other."""
    try:
        dtype = numpy_dtype_of_v3(data_type)
    except ConfigurationError:
        return None
    return None if dtype.hasobject or dtype.fields is not None else dtype.itemsize


def sharding_spec_from_v3(metadata: Mapping[str, Any], path: str | None = None) -> ShardingSpec | None:
    """The sharding of a v3 array document, or ``None`` unless its first codec is ``sharding_indexed``.

    The data type's item size (:func:`v3_itemsize`) bounds each index
    entry's ``nbytes`` (:func:`shardkv.format.layout.chunk_nbytes_bound`),
    except under nested sharding (16 bytes of index per sub-chunk).

    Raises
    ------
    ConfigurationError
        If the inner ``chunk_shape`` does not divide the shard shape, or
        ``index_location`` is invalid.
    UnsupportedError
        If the grid is not regular, or ``index_codecs`` is anything but
        ``bytes`` optionally followed by ``crc32c``.
    """
    codecs = list(metadata.get("codecs", []))
    if not codecs or codecs[0].get("name") != SHARDING_CODEC:
        return None
    if metadata.get("chunk_grid", {}).get("name") != "regular":
        raise UnsupportedError(f"chunk grid {metadata.get('chunk_grid')!r} is not supported (regular only)")
    shard_shape = tuple(int(c) for c in metadata["chunk_grid"]["configuration"]["chunk_shape"])
    config = codecs[0].get("configuration") or {}
    inner = tuple(int(c) for c in config["chunk_shape"])
    if len(inner) != len(shard_shape) or any(c < 1 or s % c for s, c in zip(shard_shape, inner, strict=True)):
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
    cps = tuple(s // c for s, c in zip(shard_shape, inner, strict=True))
    nested = any(isinstance(c, Mapping) and c.get("name") == SHARDING_CODEC for c in config.get("codecs") or [])
    bound = None if nested else chunk_nbytes_bound(inner, v3_itemsize(metadata.get("data_type")))
    return ShardingSpec(
        shape=tuple(int(s) for s in metadata["shape"]),
        chunks=inner,
        layout=ShardLayout(cps, location, endian, len(names) == 2, bound),
        shard_key_encoding=chunk_key_encoding_from_metadata(metadata.get("chunk_key_encoding") or {"name": "default"}),
    )
