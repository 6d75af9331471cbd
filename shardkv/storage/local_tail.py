"""O(chunk) updates of local shard files: a reflink clone renamed over the shard, or an in-place append.

The file I/O of :meth:`LocalStore.update_tail <shardkv.storage.local.LocalStore.update_tail>`
(the plan is :mod:`shardkv.format.tail`'s; docs/architecture.md has the why):

``"clone"`` (:func:`clone_update`), where the file system clones files (``ioctl(FICLONE)``,
    :func:`clones_files`): a held temporary file beside the shard is made a
    clone of it, the new bytes written into it, then it is fsync'd and renamed
    over the shard. Readers see the old or the new value, never a mix.
``"append"`` (:func:`append_update`), in place, where no clone can be made and the caller asks:
    an :class:`~shardkv.format.tail.AppendIntent` is written at the start of
    the lock file the caller holds and fdatasync'd, the new bytes appended
    (chunks first, the index last, each fdatasync'd before the next), then
    the intent cleared (zeros over its magic, in place: the lock file keeps
    its size, so a record is one small data write). :func:`recover_append`
    keeps a complete append, cuts a torn one back to the old size and leaves
    a file that is no longer the one appended to alone.

Every byte goes through the ``write_at`` the caller passes (the crash tests replace it).
"""

from __future__ import annotations

import fcntl
import os
import stat
from collections.abc import Callable, Sequence

from shardkv.format.tail import (
    INTENT_MAGIC,
    INTENT_MAX_NBYTES,
    AppendIntent,
    old_tail_range,
    parts_crc32c,
    recovered_nbytes,
)
from shardkv.storage.files import FICLONE, NO_CLONES, byte_parts, held_temporary, no_clones, pread_exact
from shardkv.storage.kv import Value

WriteAt = Callable[[int, int, list[memoryview]], None]
"""``write_at(fd, offset, parts)``: write ``parts`` back to back from byte ``offset`` of ``fd``."""

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


_NO_RECORD = bytes(len(INTENT_MAGIC))  # what clears a record: zeros over its magic (the rest stays, unread)


def recorded_append(lock_dir: str, shard_path: str) -> str | None:
    """The lock file in ``lock_dir`` that records an append intent for the shard file ``shard_path``, or ``None``.

    Reads the lock files without taking them (``shardkv verify``); paths compared as real paths.

    Raises
    ------
    OSError
        If a lock file cannot be read (``PermissionError``: an account that may not write the array).
    """
    try:
        names = sorted(n for n in os.listdir(lock_dir) if n.endswith(".lock"))
    except (FileNotFoundError, NotADirectoryError):
        return None  # no writer with lock files was there: no append either
    real = os.path.realpath(shard_path)
    for name in names:
        lock_file = os.path.join(lock_dir, name)
        try:
            fd = os.open(lock_file, os.O_RDONLY | _CLOEXEC)
        except FileNotFoundError:
            continue  # removed meanwhile (the array deleted)
        try:
            intent = AppendIntent.decode(os.pread(fd, INTENT_MAX_NBYTES, 0))
        finally:
            os.close(fd)
        if intent is not None and intent.path == real:
            return lock_file
    return None


def clear_intent(intent_fd: int, write_at: WriteAt) -> None:
    """Forget the intent in ``intent_fd``: zeros over its magic, in place (not synced: recovery is idempotent)."""
    write_at(intent_fd, 0, [memoryview(_NO_RECORD)])


def inside(path: str, directory: str) -> bool:
    """Whether the real path ``path`` names a file under the real directory ``directory`` (no ``..``, no link)."""
    return (
        os.path.isabs(path)
        and os.path.normpath(path) == path
        and os.path.commonpath([directory, path]) == directory
        and os.path.realpath(path) == path
    )


def recover_append(intent_fd: int, write_at: WriteAt, within: str, repair: bool = True) -> str | None:
    """Finish or undo the in-place append recorded in the lock file ``intent_fd``; the shard path, if one was named.

    The caller holds the lock. A torn append is cut back to the old size, a
    complete one stays, a file that is no longer the one appended to is left
    alone (:func:`~shardkv.format.tail.recovered_nbytes`); then the intent is
    cleared. Idempotent. With ``repair`` false nothing is written (what a
    read-only store reports). A record naming a file outside the real
    directory ``within`` (the array's), or through a symbolic link, is not
    acted on (:func:`inside`): a group-writable lock file must not cut a file elsewhere.

    Raises
    ------
    OSError
        If the shard cannot be opened, read or truncated (permissions).
    """
    raw = os.pread(intent_fd, INTENT_MAX_NBYTES, 0)
    if raw[: len(INTENT_MAGIC)] != INTENT_MAGIC:  # no record, or one cleared (or torn before its magic)
        return None
    intent = AppendIntent.decode(raw)
    if intent is None:  # a record torn while it was written: the shard was not touched yet
        if repair:
            clear_intent(intent_fd, write_at)
        return None
    if not inside(intent.path, within):
        return None
    if not repair:
        return intent.path
    try:
        fd = os.open(intent.path, os.O_RDWR | _CLOEXEC | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:  # the shard was deleted since: nothing to repair
        clear_intent(intent_fd, write_at)
        return intent.path
    try:
        try:  # the real path of the file opened (Linux /proc), where it can be told
            opened: str | None = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            opened = None
        if opened is not None and opened != intent.path:  # a directory of the path became a link since the check
            return None
        st = os.fstat(fd)
        if st.st_ino == intent.inode and stat.S_ISREG(st.st_mode):
            old, new = intent.old_nbytes, intent.new_nbytes
            keep = None
            if old < st.st_size <= new:  # only then can it be a torn append: read what tells
                start, stop = old_tail_range(old)
                old_tail_holds = parts_crc32c([pread_exact(fd, start, stop)]) == intent.old_tail_crc32c
                appended = pread_exact(fd, old, new) if st.st_size == new else b""
                appended_holds = len(appended) == new - old and parts_crc32c([appended]) == intent.crc32c
                keep = recovered_nbytes(intent, st.st_size, old_tail_holds, appended_holds)
            if keep is not None:
                os.ftruncate(fd, keep)
                os.fsync(fd)
    finally:
        os.close(fd)
    clear_intent(intent_fd, write_at)
    return intent.path


def _open_checked(path: str, flags: int, holds: Callable[[os.stat_result], bool]) -> tuple[int, os.stat_result] | None:
    """A descriptor of the shard and its ``fstat`` if ``holds`` accepts it (its generation); else ``None``."""
    try:
        fd = os.open(path, flags | _CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or not holds(st):
        os.close(fd)
        return None
    return fd, st


def clone_update(
    path: str,
    writes: Sequence[tuple[int, Value]],
    nbytes: int,
    holds: Callable[[os.stat_result], bool],
    fsync: bool,
    write_at: WriteAt,
) -> os.stat_result | None:
    """Clone the shard at ``path``, write ``writes`` into the clone, rename it over the shard; the new file's stat.

    ``None`` (nothing changed) when the shard is missing, ``holds`` refuses
    its stat, or this file cannot be cloned after all (then :func:`clones_files`
    says no for its directory). The caller fsyncs the directory.

    Raises
    ------
    OSError
        If a write fails (the temporary clone is removed).
    """
    opened = _open_checked(path, os.O_RDONLY, holds)
    if opened is None:
        return None
    src, _ = opened
    try:
        with held_temporary(os.path.dirname(path)) as (fd, tmp):  # locked until renamed (storage/files.py)
            try:
                fcntl.ioctl(fd, FICLONE, src)
            except OSError as exc:
                if exc.errno not in NO_CLONES:
                    raise
                # the probe said yes, this file says no: no clones on its device, nor in the directory the next
                # plan asks about (another device for a shard linked to another file system: EXDEV every round)
                no_clones(os.path.dirname(path), os.fstat(src).st_dev, os.fstat(fd).st_dev)
                return None
            for offset, value in writes:
                write_at(fd, offset, byte_parts(value))
            if os.fstat(fd).st_size != nbytes:
                os.ftruncate(fd, nbytes)
            if fsync:
                os.fsync(fd)
            st = os.fstat(fd)
            os.replace(tmp, path)
            return st
    finally:
        os.close(src)


def append_update(
    path: str,
    writes: Sequence[tuple[int, Value]],
    nbytes: int,
    holds: Callable[[os.stat_result], bool],
    intent_fd: int,
    fsync: bool,
    write_at: WriteAt,
) -> os.stat_result | None:
    """Append ``writes`` (back to back from its size) to the shard at ``path``, under an intent in ``intent_fd``.

    With ``fsync``, each write is fdatasync'd before the next (the index
    last): a file system may persist blocks in any order. ``None`` (nothing
    written) when the shard is missing or ``holds`` refuses its stat.

    Raises
    ------
    ValueError
        If ``writes`` do not follow each other from the shard's size to ``nbytes``.
    OSError
        Any error of the file system (the intent then stays, and the next
        holder of the lock cuts the shard back to its old size).
    """
    opened = _open_checked(path, os.O_RDWR, holds)  # read: the CRC32C of its last bytes goes into the intent
    if opened is None:
        return None
    fd, st = opened
    try:
        at, ordered = st.st_size, []
        for offset, value in writes:
            if offset != at:
                raise ValueError(f"an in-place append to {path!r} writes from its size {st.st_size}, back to back")
            parts = byte_parts(value)
            ordered.append(parts)
            at += sum(p.nbytes for p in parts)
        if not ordered or at != nbytes:
            raise ValueError(f"an in-place append to {path!r} must end at byte {nbytes}")
        old_tail = pread_exact(fd, *old_tail_range(st.st_size))
        appended = parts_crc32c(p for parts in ordered for p in parts)
        intent = AppendIntent(os.path.realpath(path), st.st_ino, st.st_size, nbytes, parts_crc32c([old_tail]), appended)
        write_at(intent_fd, 0, [memoryview(intent.encode())])
        if fsync:
            os.fdatasync(intent_fd)
        at = st.st_size
        for parts in ordered:  # the chunks, then the index that points at them (a sync between)
            write_at(fd, at, parts)
            at += sum(p.nbytes for p in parts)
            if fsync:
                os.fdatasync(fd)
        new_st = os.fstat(fd)
    finally:
        os.close(fd)
    clear_intent(intent_fd, write_at)
    return new_st
