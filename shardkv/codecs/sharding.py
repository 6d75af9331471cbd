"""``ShardingCodec``: the v1.0 ``sharding_indexed`` array -> bytes codec. Pure.

The array side of :class:`shardkv.format.layout.ShardLayout`: inner chunks
encoded by the ``codecs`` pipeline, those all of ``fill_value`` left empty.
It works on whole shards of the shard shape (the caller pads edge shards).
"""

from __future__ import annotations

import itertools
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from shardkv.codecs.inner import BytesCodec, Codec, CodecPipeline, Crc32cCodec, _config_of
from shardkv.errors import ConfigurationError, CorruptShardError, UnsupportedError
from shardkv.format.layout import IndexLocation, ShardIndex, ShardLayout
from shardkv.format.ranges import ByteRange

if TYPE_CHECKING:
    import numpy as np

ReadRange = Callable[[ByteRange], "bytes | memoryview | None"]  # None: the shard is not stored

Selection = Sequence["slice | int"]


class ShardingCodec(Codec):
    """The ``sharding_indexed`` codec (v1.0), usable as an array's codec or as an inner codec.

    Parameters
    ----------
    chunk_shape : sequence of int
        The inner chunk shape (elements); it must divide the shard shape.
    codecs : sequence of codec objects or JSON objects, optional
        Inner codecs; default ``[bytes little]``.
    index_codecs : sequence, optional
        ``bytes`` optionally followed by ``crc32c``; default ``[bytes little, crc32c]``.
    index_location : {"end", "start"}
        Where the index is stored in the shard.

    Raises
    ------
    ConfigurationError
        If a codec list has not exactly one array -> bytes codec, an index
        codec has a variable-size output, or an option is invalid.
    UnsupportedError
        For fixed-size index codecs other than ``bytes`` + optional ``crc32c``.
    """

    name = "sharding_indexed"
    kind = "array_to_bytes"
    fixed_size = False

    def __init__(
        self,
        chunk_shape: Sequence[int],
        codecs: Sequence[Any] | None = None,
        index_codecs: Sequence[Any] | None = None,
        index_location: IndexLocation = "end",
    ) -> None:
        shape = tuple(chunk_shape)
        if not shape or any(isinstance(c, bool) or not isinstance(c, numbers.Integral) or c < 1 for c in shape):
            raise ConfigurationError(f"chunk_shape must be a non-empty list of ints >= 1, got {list(chunk_shape)!r}")
        self.chunk_shape = tuple(int(c) for c in shape)
        self.codecs = CodecPipeline([BytesCodec("little")] if codecs is None else codecs, "codecs")
        index = CodecPipeline(
            [BytesCodec("little"), Crc32cCodec()] if index_codecs is None else index_codecs, "index_codecs"
        )
        variable = [c.get_config()["name"] for c in index.codecs if not c.fixed_size]
        if variable:
            raise ConfigurationError(
                f"index_codecs must not produce variable-sized output (spec: MUST NOT), got {variable}"
            )
        names = [c.get_config()["name"] for c in index.codecs]
        if names not in (["bytes"], ["bytes", "crc32c"]):
            raise UnsupportedError(f"index_codecs {names} are not supported; expected ['bytes'] or ['bytes', 'crc32c']")
        if index.codecs[0].endian is None:
            raise ConfigurationError("the index bytes codec needs an endian (the index is uint64)")
        self.index_codecs = index
        if index_location not in ("start", "end"):
            raise ConfigurationError(f"index_location must be 'start' or 'end', got {index_location!r}")
        self.index_location: IndexLocation = index_location

    def get_config(self) -> dict[str, Any]:
        """The codec's JSON object, as in an array's ``codecs`` list (spec "Configuration parameters")."""
        return {
            "name": self.name,
            "configuration": {
                "chunk_shape": list(self.chunk_shape),
                "codecs": self.codecs.get_config(),
                "index_codecs": self.index_codecs.get_config(),
                "index_location": self.index_location,
            },
        }

    @classmethod
    def from_config(cls, obj: Mapping[str, Any]) -> ShardingCodec:
        """A codec from its JSON object; ConfigurationError for another name, a missing or an unknown member."""
        if obj.get("name") != cls.name:
            raise ConfigurationError(f"expected a codec named 'sharding_indexed', got {obj.get('name')!r}")
        config = _config_of(obj, ["chunk_shape", "codecs", "index_codecs", "index_location"])
        for required in ("chunk_shape", "codecs", "index_codecs"):
            if required not in config:
                raise ConfigurationError(f"sharding_indexed: configuration.{required} is required")
        return cls(config["chunk_shape"], config["codecs"], config["index_codecs"], config.get("index_location", "end"))

    def layout(self, shard_shape: Sequence[int]) -> ShardLayout:
        """The layout of shards of ``shard_shape`` (elements); ConfigurationError unless ``chunk_shape`` divides it."""
        shard_shape = tuple(int(s) for s in shard_shape)
        if len(shard_shape) != len(self.chunk_shape) or any(
            s % c for s, c in zip(shard_shape, self.chunk_shape, strict=True)
        ):
            raise ConfigurationError(
                f"inner chunk_shape {list(self.chunk_shape)} does not evenly divide the shard shape {list(shard_shape)}"
            )
        cps = tuple(s // c for s, c in zip(shard_shape, self.chunk_shape, strict=True))
        bytes_codec = self.index_codecs.array_to_bytes
        return ShardLayout.v3(cps, self.index_location, bytes_codec.endian, len(self.index_codecs.codecs) == 2)

    def index_nbytes(self, shard_shape: Sequence[int]) -> int:
        """Size (bytes) of the encoded index of a shard of ``shard_shape``, checksum included."""
        return self.layout(shard_shape).index_nbytes

    def _chunk_slices(self, local: tuple[int, ...]) -> tuple[slice, ...]:
        return tuple(slice(i * c, (i + 1) * c) for i, c in zip(local, self.chunk_shape, strict=True))

    @staticmethod
    def _fill_array(shape: tuple[int, ...], dtype: np.dtype, fill_value: Any) -> np.ndarray:
        import numpy as np

        if fill_value is None:
            return np.zeros(shape, dtype=dtype)
        return np.full(shape, fill_value, dtype=dtype)

    def encode(self, array: np.ndarray, fill_value: Any = None) -> bytes:
        """Encode one whole shard.

        Parameters
        ----------
        array : numpy.ndarray
            The shard, of the shard shape, any numeric or bool dtype.
        fill_value : scalar, optional
            Inner chunks all of exactly its bytes are left empty; ``None`` stores every chunk.

        Returns
        -------
        bytes
            Encoded inner chunks in row-major order and the index at ``index_location``.

        Raises
        ------
        ConfigurationError
            If ``chunk_shape`` does not divide ``array.shape``.
        """
        import numpy as np

        array = np.asarray(array)
        layout = self.layout(array.shape)
        fill_row = None
        if fill_value is not None:
            fill_row = np.full(1, fill_value, dtype=array.dtype).view(np.uint8)
        chunks: dict[tuple[int, ...], bytes] = {}
        for local in itertools.product(*(range(n) for n in layout.chunks_per_shard)):
            chunk = array[self._chunk_slices(local)]
            if fill_row is not None and _all_equal_bytes(chunk, fill_row):
                continue
            chunks[local] = self.codecs.encode(chunk, fill_value)
        return layout.encode_shard(chunks)

    def decode(
        self,
        data: bytes | bytearray | memoryview,
        shape: Sequence[int],
        dtype: Any,
        fill_value: Any = None,
        shard_key: str = "<shard>",
    ) -> np.ndarray:
        """Decode one whole shard.

        Parameters
        ----------
        data : bytes-like
            The stored shard.
        shape : sequence of int
            The shard shape (elements).
        dtype : numpy dtype
            The dtype of the returned array.
        fill_value : scalar, optional
            Value of empty inner chunks (``None``: zeros).
        shard_key : str
            Named in errors.

        Returns
        -------
        numpy.ndarray
            Array of ``shape`` and ``dtype``.

        Raises
        ------
        CorruptShardError
            If the index is truncated or out of range, or a chunk cannot be decoded.
        ChecksumError
            If a CRC32C (index or inner chunk) does not match.
        """
        import numpy as np

        shape = tuple(int(s) for s in shape)
        dtype = np.dtype(dtype)
        layout = self.layout(shape)
        view = memoryview(data).cast("B")
        index = layout.index_of_shard(view, shard_key)
        out = self._fill_array(shape, dtype, fill_value)
        for local, offset, nbytes in index.stored_entries():
            out[self._chunk_slices(local)] = self.codecs.decode(
                view[offset : offset + nbytes], self.chunk_shape, dtype, fill_value, f"{shard_key} inner chunk {local}"
            )
        return out

    def read_index(
        self, read_range: ReadRange, shape: Sequence[int], *, shard_key: str = "<shard>"
    ) -> ShardIndex | None:
        """The index of a stored shard read with one range request (``None``: not stored); errors as :meth:`decode`."""
        layout = self.layout(shape)
        raw = read_range(layout.index_range())
        if raw is None:
            return None
        return layout.decode_index(raw, shard_key)

    def decode_partial(
        self,
        read_range: ReadRange,
        selection: Selection,
        shape: Sequence[int],
        dtype: Any,
        fill_value: Any = None,
        *,
        shard_key: str = "<shard>",
    ) -> np.ndarray:
        """Decode part of a stored shard, reading only the index and the inner chunks the selection touches.

        Parameters
        ----------
        read_range : callable
            ``read_range(ByteRange) -> bytes | None`` (``None``: not stored, all
            fill value); called for the index, then once per touched stored chunk
            (nested sharding codecs read inside their chunk the same way).
        selection : sequence of slice or int
            Per leading dimension (missing ones: all); slices of step >= 1, ints drop their dimension.
        shape, dtype, fill_value, shard_key
            As for :meth:`decode`.

        Returns
        -------
        numpy.ndarray
            ``decode(shard)[selection]``.

        Raises
        ------
        IndexError
            If the selection does not fit the shard shape.
        CorruptShardError, ChecksumError
            If the index or a chunk is damaged, or a chunk read comes back short.
        """
        import numpy as np

        shape = tuple(int(s) for s in shape)
        dtype = np.dtype(dtype)
        per_dim, drop = _normalize_selection(selection, shape)
        out = self._fill_array(tuple(len(ix) for ix in per_dim), dtype, fill_value)
        index = self.read_index(read_range, shape, shard_key=shard_key)
        if index is None:
            return _drop_axes(out, drop)
        # per dimension: each touched chunk's positions in out (found once, not once per chunk of the product)
        touched = [
            {i: np.nonzero(ix // c == i)[0] for i in np.unique(ix // c).tolist()}
            for ix, c in zip(per_dim, self.chunk_shape, strict=True)
        ]
        for local in itertools.product(*touched):
            entry = index.get(local)
            if entry is None:
                continue
            offset, nbytes = entry
            key = f"{shard_key} inner chunk {local}"
            pos = [positions[i] for positions, i in zip(touched, local, strict=True)]
            in_sel = [ix[p] - i * c for ix, p, c, i in zip(per_dim, pos, self.chunk_shape, local, strict=True)]
            out_ix = np.ix_(*pos)
            inner = self.codecs.array_to_bytes
            if isinstance(inner, ShardingCodec) and not self.codecs.array_to_array and not self.codecs.bytes_to_bytes:
                out[out_ix] = inner.decode_partial(
                    _sub_reader(read_range, offset, nbytes, key),
                    tuple(_as_slice(i) for i in in_sel),
                    self.chunk_shape,
                    dtype,
                    fill_value,
                    shard_key=key,
                )
                continue
            raw = read_range(ByteRange(offset, offset + nbytes))
            if raw is None or memoryview(raw).nbytes != nbytes:
                got = "nothing (shard deleted?)" if raw is None else f"{memoryview(raw).nbytes} bytes"
                raise CorruptShardError(
                    shard_key,
                    f"index entry {local} points at bytes [{offset}, {offset + nbytes}) but the read returned {got} "
                    "(truncated shard or offset past the end)",
                )
            chunk = self.codecs.decode(raw, self.chunk_shape, dtype, fill_value, key)
            out[out_ix] = chunk[np.ix_(*in_sel)]
        return _drop_axes(out, drop)


def _all_equal_bytes(chunk: np.ndarray, fill_row: np.ndarray) -> bool:
    """True when every element of ``chunk`` has exactly the bytes in ``fill_row``."""
    import numpy as np

    items = np.ascontiguousarray(chunk).view(np.uint8).reshape(-1, fill_row.size)
    return bool((items == fill_row).all())


def _normalize_selection(selection: Selection, shape: tuple[int, ...]) -> tuple[list[np.ndarray], list[int]]:
    import numpy as np

    axes: Sequence[Any] = selection if isinstance(selection, (tuple, list)) else (selection,)  # one axis' alone
    if len(axes) > len(shape):
        raise IndexError(f"selection {axes!r} has more entries than the shard's {len(shape)} dimension(s)")
    per_dim: list[np.ndarray] = []
    drop: list[int] = []
    for d, n in enumerate(shape):
        s = axes[d] if d < len(axes) else slice(None)
        if isinstance(s, (int, np.integer)) and not isinstance(s, bool):
            if not -n <= s < n:
                raise IndexError(f"index {s} is out of bounds for shard dimension {d} of size {n}")
            drop.append(d)
        elif not isinstance(s, slice):
            raise IndexError(f"selection entries must be slices or ints, got {s!r} in dimension {d}")
        elif s.step is not None and s.step < 1:
            raise IndexError(f"slice steps must be >= 1, got {s.step} in dimension {d}")
        per_dim.append(np.arange(n)[s].reshape(-1))  # an int keeps its dimension, of length 1, until _drop_axes
    return per_dim, drop


def _drop_axes(out: np.ndarray, drop: list[int]) -> np.ndarray:
    return out.reshape([n for d, n in enumerate(out.shape) if d not in drop]) if drop else out


def _as_slice(ix: np.ndarray) -> slice:
    """The slice selecting the sorted, evenly spaced indices ``ix`` (what _normalize_selection produces)."""
    step = int(ix[1] - ix[0]) if len(ix) > 1 else 1
    return slice(int(ix[0]), int(ix[-1]) + 1, step)


def _sub_reader(read_range: ReadRange, offset: int, nbytes: int, key: str) -> ReadRange:
    """A reader of the byte range ``[offset, offset + nbytes)`` of a shard, as if it were a whole object."""

    def read(r: ByteRange) -> bytes | memoryview | None:
        start, stop = r.resolve(nbytes, clamp=False)
        if start < 0 or stop > nbytes:
            raise CorruptShardError(key, f"nested shard of {nbytes} bytes has no byte range [{start}, {stop})")
        return read_range(ByteRange(offset + start, offset + stop))

    return read
