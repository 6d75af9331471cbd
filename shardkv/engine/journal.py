"""A write-ahead journal of chunk writes for write-back mode: framed msgpack records, fsync'd.

A :class:`Journal` is one local file. Write-back code appends the chunk
writes it buffers (:meth:`Journal.append` returns only once they are on
disk), writes the shards later, and calls :meth:`Journal.reset` once those
shards are durable. After a crash, :meth:`Journal.replay` yields every record
whose ``append`` returned, in order, to be written again.

File layout (all integers little endian)::

    header (28 bytes):  b"SHARDKV-JOURNAL1" | start_seq uint64 | crc32c uint32 of the 24 bytes before
    frame, repeated:    b"SKJR" | nbytes uint32 | crc32c uint32 | payload (nbytes bytes)
                        payload = msgpack [seq, key, value]  (value: bytes, or nil for a deletion)
                        crc32c covers the nbytes field and the payload

Sequence numbers start at the header's ``start_seq`` and grow by one per
record, across :meth:`~Journal.reset` too.

Durability policy
-----------------
* :meth:`Journal.append` writes all frames of the call with ``write`` and then
  ``fsync``\\ s the file once (group commit): when it returns, every record of
  the call survives a process kill and a power loss. When it raises, none of
  the call's records is acknowledged; the file is cut back to its previous
  end (so a failed append never leaves a torn frame before later ones).
* The journal file is created, and reset, atomically: a temporary file with
  the header is fsync'd, renamed over the journal, and the directory fsync'd.
* A kill or power loss in the middle of an append leaves a torn tail: a
  short frame, or one whose checksum does not match. :meth:`~Journal.replay`
  ignores it, and the next append cuts it off first.
* A frame that does not check *followed by frames that do* is not a torn
  tail: acknowledged records would be lost by skipping it, so
  :meth:`~Journal.replay` raises :class:`~shardkv.errors.JournalCorruptError`
  (``on_corrupt="stop"`` yields the records before it instead).

One process writes a journal at a time (an advisory ``flock`` is taken).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import struct
import uuid
from dataclasses import dataclass
from typing import Iterable, Iterator, Literal

import msgpack

from shardkv.errors import JournalCorruptError
from shardkv.format.layout import crc32c_of

__all__ = ["Journal", "JournalRecord"]

_MAGIC = b"SHARDKV-JOURNAL1"
_HEADER = struct.Struct("<16sQ")  # magic, start_seq
_HEADER_NBYTES = _HEADER.size + 4
_FRAME_MAGIC = b"SKJR"
_FRAME = struct.Struct("<4sII")  # magic, nbytes, crc32c
_MAX_RECORD_NBYTES = 2**31  # a length field beyond this is damage, never an allocation


@dataclass(frozen=True, slots=True)
class JournalRecord:
    """One journalled write: ``value`` None means the key was deleted."""

    seq: int
    key: str
    value: bytes | None


def _fsync_dir(path: str) -> None:
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _encode_frame(record: JournalRecord) -> bytes:
    payload = msgpack.packb([record.seq, record.key, record.value], use_bin_type=True)
    length = struct.pack("<I", len(payload))
    return _FRAME_MAGIC + length + struct.pack("<I", crc32c_of(length + payload)) + payload


def _decode_frame(data: memoryview, pos: int) -> tuple[JournalRecord, int] | str:
    """The record at ``pos`` and the position after it, or why there is none."""
    if len(data) - pos < _FRAME.size:
        return f"short frame header ({len(data) - pos} bytes)"
    magic, nbytes, stored = _FRAME.unpack_from(data, pos)
    if magic != _FRAME_MAGIC:
        return "no frame marker"
    if nbytes > _MAX_RECORD_NBYTES or pos + _FRAME.size + nbytes > len(data):
        return f"frame of {nbytes} bytes runs past the end of the file"
    payload = data[pos + _FRAME.size : pos + _FRAME.size + nbytes]
    computed = crc32c_of(bytes(data[pos + 4 : pos + 8]) + bytes(payload))
    if stored != computed:
        return f"crc32c mismatch: stored 0x{stored:08x}, computed 0x{computed:08x}"
    try:
        seq, key, value = msgpack.unpackb(payload, raw=False)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:  # crc matched: written wrong, not torn
        return f"undecodable payload: {exc}"
    if not isinstance(seq, int) or not isinstance(key, str) or not (value is None or isinstance(value, bytes)):
        return "payload is not [seq, key, value]"
    return JournalRecord(seq, key, value), pos + _FRAME.size + nbytes


class Journal:
    """An append-only, fsync'd log of chunk writes in one local file (see the module docstring).

    Parameters
    ----------
    path : str or os.PathLike
        The journal file; created (empty, ``start_seq`` 0) if missing.

    Raises
    ------
    JournalCorruptError
        If the file exists but its header is not a journal header, or it is
        damaged before its last record.
    BlockingIOError
        If another process holds the journal open for writing.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        if not os.path.exists(self.path):
            self._create(0)
        self._fd = os.open(self.path, os.O_RDWR)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            records, self._end, self.torn_tail_nbytes = self._scan("raise")
        except BaseException:
            os.close(self._fd)
            raise
        self._next_seq = records[-1].seq + 1 if records else self._start_seq

    # -- file ---------------------------------------------------------------------------

    def _create(self, start_seq: int, frames: bytes = b"") -> None:
        """Atomically make ``path`` a journal starting at ``start_seq`` holding ``frames``."""
        body = _HEADER.pack(_MAGIC, start_seq)
        tmp = f"{self.path}.{uuid.uuid4().hex}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            try:
                data = memoryview(body + struct.pack("<I", crc32c_of(body)) + frames)
                while len(data):
                    data = data[os.write(fd, data) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)
            raise
        _fsync_dir(self.path)

    def _scan(self, on_corrupt: Literal["raise", "stop"]) -> tuple[list[JournalRecord], int, int]:
        """Records, the end of the last valid frame, and the bytes of a torn tail after it."""
        size = os.fstat(self._fd).st_size
        data = memoryview(os.pread(self._fd, size, 0))
        if len(data) < _HEADER_NBYTES:
            raise JournalCorruptError(self.path, 0, f"file of {len(data)} bytes is shorter than the header")
        magic, start_seq = _HEADER.unpack_from(data, 0)
        (stored,) = struct.unpack_from("<I", data, _HEADER.size)
        if magic != _MAGIC or stored != crc32c_of(data[: _HEADER.size]):
            raise JournalCorruptError(self.path, 0, "not a shardkv journal header")
        self._start_seq = start_seq
        records: list[JournalRecord] = []
        pos = _HEADER_NBYTES
        expected = start_seq
        while pos < len(data):
            result = _decode_frame(data, pos)
            if not isinstance(result, str):
                record, nxt = result  # type: ignore[misc]
                if record.seq != expected:
                    result = f"sequence number {record.seq}, expected {expected}"
                else:
                    records.append(record)
                    expected += 1
                    pos = nxt
                    continue
            if on_corrupt == "raise" and self._valid_frame_after(data, pos + 1):
                raise JournalCorruptError(self.path, pos, f"{result}, and valid records follow it")
            return records, pos, len(data) - pos
        return records, pos, 0

    @staticmethod
    def _valid_frame_after(data: memoryview, start: int) -> bool:
        raw = bytes(data)
        pos = raw.find(_FRAME_MAGIC, start)
        while pos != -1:
            if not isinstance(_decode_frame(data, pos), str):
                return True
            pos = raw.find(_FRAME_MAGIC, pos + 1)
        return False

    # -- API ------------------------------------------------------------------------------

    @property
    def next_seq(self) -> int:
        """The sequence number the next appended record gets."""
        return self._next_seq

    def append(self, records: Iterable[tuple[str, bytes | None]]) -> list[int]:
        """Append ``(key, value)`` records and fsync; returns their sequence numbers.

        Parameters
        ----------
        records : iterable of (str, bytes or None)
            Chunk key and encoded value (bytes); ``None`` records a deletion.

        Returns
        -------
        list of int
            Sequence numbers, in order. When this returns, the records are durable.

        Raises
        ------
        OSError
            A write or the fsync failed: nothing of this call is acknowledged,
            and the file has been cut back to its previous end.
        TypeError
            If a key is not a str or a value not bytes-like or None.
        """
        batch: list[JournalRecord] = []
        for key, value in records:
            if not isinstance(key, str):
                raise TypeError(f"journal keys are str, got {type(key).__name__}")
            if value is not None:
                value = bytes(memoryview(value).cast("B"))
            batch.append(JournalRecord(self._next_seq + len(batch), key, value))
        if not batch:
            return []
        frames = memoryview(b"".join(_encode_frame(r) for r in batch))
        try:
            if self.torn_tail_nbytes:  # a torn frame of an earlier crash: never leave it before new frames
                os.ftruncate(self._fd, self._end)
                self.torn_tail_nbytes = 0
            pos = self._end
            while len(frames):
                n = os.pwrite(self._fd, frames, pos)
                frames, pos = frames[n:], pos + n
            os.fsync(self._fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._end)
            raise
        self._end = pos
        self._next_seq += len(batch)
        return [r.seq for r in batch]

    def replay(self, on_corrupt: Literal["raise", "stop"] = "raise") -> Iterator[JournalRecord]:
        """The durable records, in sequence order; a torn last record is left out.

        Parameters
        ----------
        on_corrupt : {"raise", "stop"}
            What to do with a damaged frame that valid frames follow:
            raise (default), or stop before it.

        Raises
        ------
        JournalCorruptError
            With ``on_corrupt="raise"``, for damage before the last record
            (raised before any record is yielded).
        """
        records, _, _ = self._scan(on_corrupt)
        yield from records

    def reset(self, keep: Iterable[tuple[str, bytes | None]] = ()) -> None:
        """Drop every record (call once their shards are durable); sequence numbers go on.

        The journal is replaced atomically by one whose header starts at
        :attr:`next_seq` and that holds only the records ``keep`` (as
        :meth:`append` takes them, fsync'd before the replacement): a crash
        leaves either the old journal or the new one, never a mix.

        Parameters
        ----------
        keep : iterable of (str, bytes or None)
            Writes still to be kept (not yet durable elsewhere).
        """
        start = self._next_seq
        batch = [
            JournalRecord(start + i, key, None if value is None else bytes(memoryview(value).cast("B")))
            for i, (key, value) in enumerate(keep)
        ]
        frames = b"".join(_encode_frame(r) for r in batch)
        self._create(start, frames)
        fd = os.open(self.path, os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.close(self._fd)
        self._fd = fd
        self._start_seq = start
        self._next_seq = start + len(batch)
        self._end = _HEADER_NBYTES + len(frames)
        self.torn_tail_nbytes = 0

    @property
    def empty(self) -> bool:
        """True when the journal holds no record (nor a torn tail)."""
        return self._end == _HEADER_NBYTES and not self.torn_tail_nbytes

    @property
    def nbytes(self) -> int:
        """Bytes of the journal file up to the end of its last record."""
        return self._end

    truncate = reset

    def close(self) -> None:
        """Close the file (and release the lock)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
