"""A write-ahead journal of chunk writes for write-back mode: framed msgpack records, fsync'd.

One local file that belongs to one store: :meth:`Journal.append` returns once the records are on disk,
:meth:`Journal.reset` drops them once their shards are durable, :meth:`Journal.replay` yields every record
whose ``append`` returned. The file layout and the durability policy: docs/architecture.md, "The journal".
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import struct
import uuid
from collections.abc import Iterable, Iterator

import msgpack

from shardkv.errors import JournalCorruptError, JournalMismatchError, LockTimeoutError
from shardkv.format.journal_frames import (
    FRAME_MAGIC,
    IDENT,
    IDENT_OFFSET,
    MAGIC,
    MAX_IDENT_NBYTES,
    SLOT_OFFSETS,
    Identity,
    JournalRecord,
    RecordItem,
    decode_frame,
    decode_slot,
    describe_identity,
    encode_frame,
    encode_header,
    encode_slot,
    make_records,
)
from shardkv.format.layout import crc32c_of
from shardkv.storage.local import fsync_dirs

_OPEN_ATTEMPTS = 100  # lock-then-verify retries when the file is replaced under us (bounded)


def _datasync(fd: int) -> None:
    (getattr(os, "fdatasync", None) or os.fsync)(fd)


def _write_all(fd: int, data: bytes | memoryview, pos: int) -> int:
    view = memoryview(data)
    while len(view):
        n = os.pwrite(fd, view, pos)
        view, pos = view[n:], pos + n
    return pos


def _journal_locked(
    path: str, reason: str = "it is open in another process (one writer per journal)"
) -> LockTimeoutError:
    return LockTimeoutError(f"journal {path!r}", 0.0, reason, path=path)


class Journal:
    """An append-only, fsync'd log of chunk writes in one local file, locked by its one writer process.

    Parameters
    ----------
    path : str or os.PathLike
        The journal file; created (empty, ``start_seq`` 0) if missing.
    identity : mapping of str to str, optional
        The store the journal belongs to (``location``, ``store_id``,
        ``layout``). A new journal records it; an existing one holding
        records must have been created with an equal identity. ``None``
        accepts any journal and records ``{}``.

    Raises
    ------
    JournalCorruptError
        If the file exists but is not a journal, or an acknowledged record is
        damaged or missing (the message names the records lost).
    JournalMismatchError
        If the journal holds records of a store with another identity.
    LockTimeoutError
        If another process holds the journal open (a ``BlockingIOError``).
    """

    def __init__(self, path: str | os.PathLike[str], identity: Identity | None = None) -> None:
        self._fd = -1
        self.path = os.fspath(path)
        self._fd = self._open_locked()
        try:
            records, self._identity = self._scan()
            if identity is not None and dict(identity) != self._identity:
                if records:
                    raise JournalMismatchError(
                        self.path,
                        f"store {describe_identity(self._identity)}",
                        f"store {describe_identity(identity)}",
                        len(records),
                    )
                self._identity = dict(identity)
                self.reset()  # an empty journal: stamped with this store's identity
        except BaseException:
            self.close()
            raise

    # -- file ---------------------------------------------------------------------------

    def _open_locked(self) -> int:
        """A locked read-write descriptor of the file now at ``path`` (created, locked, if missing)."""
        for _ in range(_OPEN_ATTEMPTS):
            try:
                fd = os.open(self.path, os.O_RDWR)
            except FileNotFoundError:
                created = self._create_new()
                if created is None:  # another process created it first: open theirs
                    continue
                return created
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    raise _journal_locked(self.path) from None
                with contextlib.suppress(FileNotFoundError):  # removed: a reset of the previous holder replaces it
                    if os.path.samestat(os.stat(self.path), os.fstat(fd)):
                        return fd
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)  # replaced by a reset of the previous holder: lock the new file
        raise _journal_locked(self.path, f"replaced {_OPEN_ATTEMPTS} times while being opened")

    def _write_temp(self, data: bytes) -> tuple[str, int]:
        """A locked, fsync'd temporary file holding ``data`` beside the journal: ``(name, fd)``."""
        tmp = f"{self.path}.{uuid.uuid4().hex}.tmp"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new inode: nobody else has it yet
            _write_all(fd, data, 0)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)
            raise
        return tmp, fd

    def _create_new(self) -> int | None:
        """Create an empty journal at ``path`` (locked from birth); None if another process got there first."""
        tmp, fd = self._write_temp(encode_header(0, {}))
        try:
            try:
                os.link(tmp, self.path)
            except FileExistsError:
                os.close(fd)
                return None
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(tmp)
            fsync_dirs([os.path.abspath(self.path)])
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            raise
        return fd

    def _scan(self) -> tuple[list[JournalRecord], dict[str, str]]:
        """Parse the whole file (records up to the acknowledged end, the torn tail after it), taking up its state;
        the records and the identity."""
        size = os.fstat(self._fd).st_size
        data = memoryview(os.pread(self._fd, size, 0))
        if bytes(data[:16]) != MAGIC:
            raise JournalCorruptError(self.path, 0, "not a shardkv journal header")
        if len(data) < IDENT_OFFSET + IDENT.size + 4:
            raise JournalCorruptError(self.path, 0, f"file of {len(data)} bytes is shorter than a journal header")
        nbytes, start_seq = IDENT.unpack_from(data, IDENT_OFFSET)
        crc_at = IDENT_OFFSET + IDENT.size
        data_start = crc_at + 4 + nbytes
        if nbytes > MAX_IDENT_NBYTES or data_start > len(data):
            raise JournalCorruptError(self.path, IDENT_OFFSET, "identity block runs past the end of the file")
        (stored,) = struct.unpack_from("<I", data, crc_at)
        if stored != crc32c_of(bytes(data[IDENT_OFFSET:crc_at]) + bytes(data[crc_at + 4 : data_start])):
            raise JournalCorruptError(self.path, IDENT_OFFSET, "identity block fails its crc32c")
        try:
            identity = msgpack.unpackb(data[crc_at + 4 : data_start], raw=False)
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise JournalCorruptError(self.path, IDENT_OFFSET, f"undecodable identity block: {exc}") from None
        if not isinstance(identity, dict) or not all(isinstance(v, str) for v in identity.values()):
            raise JournalCorruptError(self.path, IDENT_OFFSET, "identity block is not a map of strings")
        slots = [decode_slot(data, off) for off in SLOT_OFFSETS]
        for off, slot in zip(SLOT_OFFSETS, slots, strict=True):
            if slot is None:  # slot writes are one sector: a bad one is damage, not a torn write
                raise JournalCorruptError(
                    self.path, off, "a watermark slot fails its crc32c: which records were acknowledged is lost"
                )
        gen, acked_end, acked_next = max(slot for slot in slots if slot is not None)
        if acked_end < data_start:
            raise JournalCorruptError(self.path, SLOT_OFFSETS[0], f"watermark end {acked_end} precedes the records")
        records: list[JournalRecord] = []
        pos = data_start
        expected = start_seq
        while pos < acked_end:
            result = decode_frame(data[:acked_end], pos)
            if not isinstance(result, str):
                record, nxt = result
                if record.seq == expected:
                    records.append(record)
                    expected += 1
                    pos = nxt
                    continue
                result = f"sequence number {record.seq}, expected {expected}"
            raise self._loss(data, pos, acked_end, expected, acked_next, result)
        if expected != acked_next:
            raise JournalCorruptError(
                self.path,
                pos,
                f"the watermark acknowledges records up to seq {acked_next - 1}, "
                f"the file holds them up to seq {expected - 1}",
            )
        self._data_start, self._end, self._gen, self._next_seq = data_start, pos, gen, expected
        self.torn_tail_nbytes = max(len(data) - acked_end, 0)
        return records, identity

    def _loss(
        self, data: memoryview, pos: int, acked_end: int, expected: int, acked_next: int, why: str
    ) -> JournalCorruptError:
        """The error for damage at ``pos`` before the acknowledged end: names the records lost."""
        lost = f"acknowledged records seq {expected}..{acked_next - 1} (bytes {pos}..{acked_end})"
        if len(data) < acked_end:
            why = f"{why}; the file ends at byte {len(data)}, before the acknowledged end {acked_end} (truncated)"
        keys: list[str] = []  # of valid frames after the damage (as ``seq:key``), five at most
        acked = data[:acked_end]
        raw = bytes(acked)
        at = raw.find(FRAME_MAGIC, pos + 1)
        while at != -1 and len(keys) < 5:
            result = decode_frame(acked, at)
            if not isinstance(result, str):
                keys.append(f"{result[0].seq}:{result[0].key!r}")
            at = raw.find(FRAME_MAGIC, at + 1 if isinstance(result, str) else result[1])
        tail = f", and valid records follow it ({', '.join(keys)})" if keys else ""
        return JournalCorruptError(self.path, pos, f"{why}{tail}; lost: {lost}")

    def _write_slot(self, gen: int, end: int, next_seq: int) -> None:
        _write_all(self._fd, encode_slot(gen, end, next_seq), SLOT_OFFSETS[gen % 2])

    # -- API ------------------------------------------------------------------------------

    @property
    def identity(self) -> dict[str, str]:
        """The identity of the store this journal belongs to (as recorded in its header)."""
        return dict(self._identity)

    @property
    def next_seq(self) -> int:
        """The sequence number the next appended record gets."""
        return self._next_seq

    def append(self, records: Iterable[RecordItem]) -> list[int]:
        """Append ``(key, value[, layout])`` records (``None``: a deletion) and fsync; their sequence numbers.

        When this returns, the records are durable.

        Raises
        ------
        OSError
            A write or an fsync failed: nothing of this call is acknowledged
            (none of it is ever replayed), and the file has been cut back to
            its previous end.
        TypeError
            If a key is not a str or a value not bytes-like or None.
        ValueError
            If the journal is closed.
        """
        if self._fd < 0:
            raise ValueError(f"journal {self.path!r} is closed")
        batch = make_records(records, self._next_seq)
        if not batch:
            return []
        frames = b"".join(encode_frame(r) for r in batch)
        gen, next_seq = self._gen + 1, self._next_seq + len(batch)
        slot_written = False
        try:
            if self.torn_tail_nbytes:  # bytes of an unacknowledged append: never leave them before new frames
                os.ftruncate(self._fd, self._end)
                self.torn_tail_nbytes = 0
            end = _write_all(self._fd, frames, self._end)
            _datasync(self._fd)
            slot_written = True
            self._write_slot(gen, end, next_seq)
            _datasync(self._fd)
        except BaseException:
            with contextlib.suppress(OSError):
                if slot_written:  # the new slot may reach the disk later: make it say the old end
                    self._write_slot(gen, self._end, self._next_seq)
                    self._gen = gen
                os.ftruncate(self._fd, self._end)
                _datasync(self._fd)
            raise
        self._gen = gen
        self._end = end
        self._next_seq = next_seq
        return [r.seq for r in batch]

    def replay(self) -> Iterator[JournalRecord]:
        """The acknowledged records, in order (``JournalCorruptError`` for any damage before their end)."""
        yield from self._scan()[0]

    def reset(self, keep: Iterable[RecordItem] = ()) -> None:
        """Drop every record but those of ``keep`` (as :meth:`append` takes them); sequence numbers go on.

        The journal is replaced atomically (a crash leaves the old one or the new one) by a file locked
        before it replaces the old one, so the lock is never let go.
        """
        if self._fd < 0:
            raise ValueError(f"journal {self.path!r} is closed")
        start = self._next_seq
        batch = make_records(keep, start)
        frames = b"".join(encode_frame(r) for r in batch)
        header = encode_header(start, self._identity, len(frames), len(batch))
        tmp, fd = self._write_temp(header + frames)
        try:
            os.replace(tmp, self.path)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)
            raise
        os.close(self._fd)
        self._fd = fd
        fsync_dirs([os.path.abspath(self.path)])
        self._next_seq = start + len(batch)
        self._data_start = len(header)
        self._end = len(header) + len(frames)
        self._gen = 1
        self.torn_tail_nbytes = 0

    @property
    def empty(self) -> bool:
        """True when the journal holds no record (nor a torn tail)."""
        return self._end == self._data_start and not self.torn_tail_nbytes

    @property
    def nbytes(self) -> int:
        """Bytes of the journal file up to the end of its last record."""
        return self._end

    def close(self) -> None:
        """Close the file (and release the lock). Idempotent."""
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    __del__ = close  # a journal dropped without close() still lets go of its descriptor

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
