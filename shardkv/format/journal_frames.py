"""The file format of the write-back journal (:mod:`shardkv.engine.journal`): pure encoding and decoding.

See :mod:`shardkv.engine.journal` for the layout and the durability policy;
this module only turns records, watermark slots and headers into bytes and
back (no I/O).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import msgpack

from shardkv.format.layout import crc32c_of

MAGIC = b"SHARDKV-JOURNAL2"
_SLOT = struct.Struct("<4sQQQ")  # marker, gen, end, next_seq (+ crc32c uint32, + 4 bytes padding)
_SLOT_MARKER = b"SKJW"
_SLOT_NBYTES = 32
SLOT_OFFSETS = (16, 16 + _SLOT_NBYTES)
IDENT = struct.Struct("<IQ")  # nbytes, start_seq (+ crc32c uint32)
IDENT_OFFSET = 16 + 2 * _SLOT_NBYTES
MAX_IDENT_NBYTES = 2**16
FRAME_MAGIC = b"SKJR"
_FRAME = struct.Struct("<4sII")  # magic, nbytes, crc32c
_MAX_RECORD_NBYTES = 2**31  # a length field beyond this is damage, never an allocation

Identity = Mapping[str, str]
RecordItem = tuple[str, "bytes | None"] | tuple[str, "bytes | None", str]
"""What :meth:`~shardkv.engine.journal.Journal.append` takes: ``(key, value)`` or ``(key, value, layout)``."""


@dataclass(frozen=True, slots=True)
class JournalRecord:
    """One journalled write: ``value`` None means the key was deleted.

    ``layout`` describes the array the chunk belongs to as it was when the
    write was acknowledged (``""``: not recorded); a replay into an array of
    another layout is refused rather than writing bytes encoded for it.
    """

    seq: int
    key: str
    value: bytes | None
    layout: str = ""


def encode_slot(gen: int, end: int, next_seq: int) -> bytes:
    """A watermark slot: generation ``gen`` acknowledges bytes up to ``end`` and seqs below ``next_seq``."""
    body = _SLOT.pack(_SLOT_MARKER, gen, end, next_seq)
    return body + struct.pack("<I", crc32c_of(body)) + b"\0" * (_SLOT_NBYTES - _SLOT.size - 4)


def decode_slot(data: memoryview, offset: int) -> tuple[int, int, int] | None:
    """``(gen, end, next_seq)`` of the slot at ``offset``, or None when it does not check."""
    marker, gen, end, next_seq = _SLOT.unpack_from(data, offset)
    (stored,) = struct.unpack_from("<I", data, offset + _SLOT.size)
    if marker != _SLOT_MARKER or stored != crc32c_of(data[offset : offset + _SLOT.size]):
        return None
    return gen, end, next_seq


def encode_header(start_seq: int, identity: Identity, end_extra: int = 0, n_records: int = 0) -> bytes:
    """Magic, both slots (acknowledging ``n_records`` in ``end_extra`` frame bytes) and the identity block."""
    ident = msgpack.packb(dict(sorted(identity.items())), use_bin_type=True)
    block = IDENT.pack(len(ident), start_seq)
    block += struct.pack("<I", crc32c_of(block + ident)) + ident
    data_start = IDENT_OFFSET + len(block)
    end = data_start + end_extra
    return MAGIC + encode_slot(1, end, start_seq + n_records) + encode_slot(0, data_start, start_seq) + block


def encode_frame(record: JournalRecord) -> bytes:
    fields = [record.seq, record.key, record.value] + ([record.layout] if record.layout else [])
    payload = msgpack.packb(fields, use_bin_type=True)
    length = struct.pack("<I", len(payload))
    return FRAME_MAGIC + length + struct.pack("<I", crc32c_of(length + payload)) + payload


def decode_frame(data: memoryview, pos: int) -> tuple[JournalRecord, int] | str:
    """The record at ``pos`` and the position after it, or why there is none."""
    if len(data) - pos < _FRAME.size:
        return f"short frame header ({len(data) - pos} bytes)"
    magic, nbytes, stored = _FRAME.unpack_from(data, pos)
    if magic != FRAME_MAGIC:
        return "no frame marker"
    if nbytes > _MAX_RECORD_NBYTES or pos + _FRAME.size + nbytes > len(data):
        return f"frame of {nbytes} bytes runs past the end of the file"
    payload = data[pos + _FRAME.size : pos + _FRAME.size + nbytes]
    computed = crc32c_of(bytes(data[pos + 4 : pos + 8]) + bytes(payload))
    if stored != computed:
        return f"crc32c mismatch: stored 0x{stored:08x}, computed 0x{computed:08x}"
    try:
        fields = msgpack.unpackb(payload, raw=False)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:  # crc matched: written wrong, not torn
        return f"undecodable payload: {exc}"
    if not isinstance(fields, list) or len(fields) not in (3, 4):
        return "payload is not [seq, key, value, layout?]"
    seq, key, value = fields[:3]
    layout = fields[3] if len(fields) == 4 else ""
    if not isinstance(seq, int) or not isinstance(key, str) or not (value is None or isinstance(value, bytes)):
        return "payload is not [seq, key, value, layout?]"
    if not isinstance(layout, str):
        return "payload layout is not a string"
    return JournalRecord(seq, key, value, layout), pos + _FRAME.size + nbytes


def describe_identity(identity: Identity) -> str:
    shown = ", ".join(f"{k}={identity[k]!r}" for k in ("location", "store_id", "layout") if k in identity)
    return f"{{{shown}}}" if shown else repr(dict(identity))


def make_records(items: Iterable[RecordItem], first_seq: int) -> list[JournalRecord]:
    """Records numbered from ``first_seq`` of ``(key, value[, layout])`` items (values copied to bytes)."""
    batch: list[JournalRecord] = []
    for item in items:
        key, value = item[0], item[1]
        layout = item[2] if len(item) > 2 else ""
        if not isinstance(key, str) or not isinstance(layout, str):
            raise TypeError(f"journal keys and layouts are str, got {type(key).__name__}, {type(layout).__name__}")
        if value is not None:
            value = bytes(memoryview(value).cast("B"))
        batch.append(JournalRecord(first_seq + len(batch), key, value, layout))
    return batch
