"""Decompression bounded by the size a chunk declares. Pure.

zlib, gzip, bz2 and lzma are streamed with ``max_length``; blosc, lz4 and zstd
have the size their header states checked first (a zstd frame without one is
refused); other codecs are checked after decoding.
"""

from __future__ import annotations

import bz2
import lzma
import struct
import zlib
from typing import Any

from shardkv.errors import CorruptShardError

_ZSTD_MAGIC = 0xFD2FB528


_STOPPED = ("decoding stopped: ", "decoding refused: ")


def stopped_at_declared_size(exc: CorruptShardError) -> bool:
    """True when ``exc`` is this module's refusal to decode beyond a chunk's declared size (not a codec error)."""
    return exc.reason.startswith(_STOPPED)


def _expands(key: str, stated: int | None, limit: int) -> CorruptShardError:
    """The error for a chunk that decodes (or says it decodes) to more than ``limit`` bytes: decoding stopped."""
    grows = f"states it decodes to {stated} bytes" if stated is not None else "expands"
    return CorruptShardError(key, f"{_STOPPED[0]}the chunk {grows}, beyond the {limit} bytes its declared size allows")


def zstd_content_size(data: bytes | memoryview) -> int | None:
    """The decompressed size a zstd frame header states (RFC 8878 3.1.1.1), or None; ValueError if not a frame."""
    view = memoryview(data).cast("B")
    if len(view) < 5 or struct.unpack_from("<I", view, 0)[0] != _ZSTD_MAGIC:
        raise ValueError("not a zstd frame")
    fhd = view[4]
    fcs_flag, single_segment, dict_flag = fhd >> 6, (fhd >> 5) & 1, fhd & 3
    pos = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[dict_flag]
    size = (1 if single_segment else 0, 2, 4, 8)[fcs_flag]
    if size == 0:
        return None
    if len(view) < pos + size:
        raise ValueError("zstd frame header is truncated")
    value = int.from_bytes(bytes(view[pos : pos + size]), "little")
    return value + 256 if size == 2 else value


def decode_bounded(codec: Any, data: bytes | memoryview, limit: int, key: str) -> bytes:
    """Decode ``data`` with the numcodecs ``codec`` into at most ``limit`` bytes (its declared size).

    Raises
    ------
    CorruptShardError
        Naming ``key``, if the chunk decodes (or states it decodes) to more
        than ``limit`` bytes, or a bounded decoder finds the stream damaged.
    """
    raw = bytes(data)
    codec_id = getattr(codec, "codec_id", type(codec).__name__)
    try:
        # a max_length decompressor stops at limit + 1 bytes: beyond the limit, and no further
        if codec_id in ("zlib", "gzip"):
            out = zlib.decompressobj(31 if codec_id == "gzip" else 15).decompress(raw, limit + 1)
        elif codec_id == "bz2":
            out = bz2.BZ2Decompressor().decompress(raw, limit + 1)
        elif codec_id == "lzma":
            out = lzma.LZMADecompressor().decompress(raw, limit + 1)
        else:
            stated = _stated_size(codec_id, raw, key)
            if stated is not None and stated > limit:
                raise _expands(key, stated, limit)
            decoded = codec.decode(raw)
            out = bytes(memoryview(decoded).cast("B")) if not isinstance(decoded, bytes) else decoded
    except (zlib.error, OSError, EOFError, lzma.LZMAError) as exc:
        raise CorruptShardError(key, f"{codec_id} could not decode {len(raw)} bytes: {exc}") from exc
    if len(out) > limit:
        raise _expands(key, None, limit)
    return out


def _stated_size(codec_id: str, raw: bytes, key: str) -> int | None:
    """The uncompressed size a blosc / lz4 / zstd stream states in its header (None: other codecs)."""
    if codec_id == "blosc":
        if len(raw) < 16:
            raise CorruptShardError(key, f"blosc stream of {len(raw)} bytes is shorter than its header")
        return int(struct.unpack_from("<I", raw, 4)[0])
    if codec_id == "lz4":
        if len(raw) < 4:
            raise CorruptShardError(key, f"lz4 stream of {len(raw)} bytes is shorter than its size prefix")
        return int(struct.unpack_from("<I", raw, 0)[0])
    if codec_id == "zstd":
        try:
            size = zstd_content_size(raw)
        except ValueError as exc:
            raise CorruptShardError(key, f"zstd: {exc}") from None
        if size is None:
            raise CorruptShardError(key, _STOPPED[1] + "a zstd frame that does not state its decompressed size")
        return size
    return None
