"""Buffers and local-file primitives of the stores: value parts, ``writev``/``pread``, held temporary files.

* A value's parts (:data:`~shardkv.storage.kv.Value`) as flat byte views
  (:func:`byte_parts`, no copy) or joined once (:func:`join_parts`);
  :func:`write_parts` writes them with ``os.writev``, :func:`pread_exact` reads
  a byte range with one ``pread``.
* Whether a directory's file system clones files (:func:`clones_files`, once per device and directory).
* Temporary files that tell whether their writer still runs
  (:func:`held_temporary`, :func:`stale_in`): a writer creates
  ``.shardkv-tmp-held-<hex>`` (:data:`HELD_MARKER`) and holds an exclusive
  ``flock`` on it from creation to rename. The kernel drops the lock of a
  killed process (NFS: once its lease expires), so a temporary whose lock a
  sweeper can take has no live writer and is removed at once, the sweeper
  holding the lock and checking the name still leads to the file it locked. A
  writer that lost the race between ``open`` and ``flock`` starts again under
  a new name. Within one process a sweeper never opens a temporary that process
  writes (a registry of paths and ``(st_dev, st_ino)``): on NFS ``flock`` is
  POSIX record locks, which belong to the process, and closing any descriptor
  drops them. Temporaries without the marker and those whose lock cannot be
  tried go by age (``min_age``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import os
import threading
import uuid
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

from shardkv._types import BytesLike
from shardkv.format.ranges import ByteRange
from shardkv.storage.kv import TEMP_MARKER, Value

IOV_MAX = 1024  # buffers per writev call (Linux's IOV_MAX; os.sysconf may not know it)


@functools.cache
def read_pool() -> ThreadPoolExecutor:
    """One thread pool for concurrent local reads, made on first use (threads are not free)."""
    return ThreadPoolExecutor(max_workers=8, thread_name_prefix="shardkv-read")


os.register_at_fork(after_in_child=read_pool.cache_clear)  # a forked child has none of the parent's threads


def byte_parts(value: Value) -> list[memoryview]:
    """The parts of ``value`` as flat byte views (no copy); one part for a plain bytes-like value."""
    parts = value if isinstance(value, (list, tuple)) else (value,)
    out = []
    for part in parts:
        view = memoryview(part)
        if view.ndim != 1 or view.format != "B":
            view = view.cast("B")  # a contiguous array of another item type
        if view.nbytes:
            out.append(view)
    return out


def join_parts(value: Value) -> bytes:
    """``value`` as one ``bytes`` object: joined when it is parts, unchanged when it already is ``bytes``."""
    if isinstance(value, (list, tuple)):
        return value[0] if len(value) == 1 and isinstance(value[0], bytes) else b"".join(value)
    return value if isinstance(value, bytes) else memoryview(cast(BytesLike, value)).tobytes()


def slice_value(value: Any, byte_range: ByteRange) -> bytes | memoryview:
    """``value[byte_range]``: a view when ``value`` is immutable ``bytes`` (no copy), else a copy."""
    view = memoryview(value).cast("B")
    part = view[slice(*byte_range.resolve(view.nbytes))]
    return part if isinstance(value, bytes) else bytes(part)


def write_parts(fd: int, parts: list[memoryview]) -> None:
    """Write every part to ``fd`` with as few ``writev`` calls as the kernel allows."""
    while parts:
        batch = parts[:IOV_MAX]
        written = os.writev(fd, batch)
        # drop the parts written in full, keep the rest of a part written in part
        i = 0
        while i < len(batch) and written >= batch[i].nbytes:
            written -= batch[i].nbytes
            i += 1
        rest = parts[i:]
        if written:
            rest[0] = rest[0][written:]
        parts = rest


def pread_exact(fd: int, start: int, stop: int) -> bytes:
    """Bytes ``[start, stop)`` of ``fd`` (absolute offsets): one ``pread``, more only after a short read."""
    want = stop - start
    pieces = [os.pread(fd, max(0, want), start)]
    got = len(pieces[0])
    while 0 < got < want:  # a short read (a file growing, a slow device, a signal): read the rest
        more = os.pread(fd, want - got, start + got)
        if not more:
            break
        pieces.append(more)
        got += len(more)
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


# -- clones ----------------------------------------------------------------------

FICLONE = getattr(fcntl, "FICLONE", 0x40049409)  # Linux's ioctl number (Python < 3.12 does not name it)
NO_CLONES = {errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV, errno.EINVAL, errno.ENOTTY, errno.ENOSYS, errno.EPERM}
_CLONES: dict[int, bool] = {}  # device (st_dev) -> whether its file system clones files (probed once per process)
_CLONE_DIRS: dict[str, bool] = {}  # directory -> its device's answer (no stat per update)
_CLONE_DIRS_MAX = 65536


def clones_files(directory: str) -> bool:
    """Whether the file system of ``directory`` clones files (``ioctl(FICLONE)``), known once per directory.

    Probed once per device by cloning an empty temporary file into another
    beside it; ``EOPNOTSUPP``, ``EXDEV``, ``EINVAL``, ``ENOTTY``... mean no.

    Raises
    ------
    OSError
        If ``directory`` cannot be examined or written (permissions).
    """
    known = _CLONE_DIRS.get(directory)
    if known is None:
        device = os.stat(directory).st_dev
        known = _CLONES.get(device)
        if known is None:
            known = _CLONES[device] = _probe_clone(directory)
        if len(_CLONE_DIRS) >= _CLONE_DIRS_MAX:
            _CLONE_DIRS.clear()
        _CLONE_DIRS[directory] = known
    return known


def _probe_clone(directory: str) -> bool:
    """Clone an empty temporary file into another in ``directory``: whether that worked."""
    with held_temporary(directory) as (target, _), held_temporary(directory) as (_, source_path):
        source = os.open(source_path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))  # a clone's source is read
        try:
            fcntl.ioctl(target, FICLONE, source)
        except OSError as exc:
            if exc.errno not in NO_CLONES:
                raise
            return False
        finally:
            os.close(source)
    return True


def no_clones(directory: str, *devices: int) -> None:
    """Take ``directory`` and ``devices`` for ones without clones from now on (a clone failed there after all)."""
    _CLONE_DIRS[directory] = False
    for device in devices:
        _CLONES[device] = False


# -- held temporary files --------------------------------------------------------

HELD_MARKER = f"{TEMP_MARKER}held-"
"""The name prefix of a temporary file locked by its writer for as long as it writes."""

_OPEN_TEMP = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
_OPEN_PROBE = os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
_NO_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EINVAL}
_CREATE_ATTEMPTS = 16  # names tried when sweepers keep taking the new file between open and flock (never seen)

_WRITING: set[str] = set()  # temporaries this process is writing (sweepers here leave them unopened)
_WRITING_FILES: set[tuple[int, int]] = set()  # their files, (st_dev, st_ino): the same under any path
_WRITING_LOCK = threading.Lock()  # also held by a sweeper of this process while it probes a locked temporary


def _forget_after_fork() -> None:
    """A forked child writes none of its parent's temporaries, and its copy of the lock may be held by a thread
    that does not exist there (a sweeper probing): a new lock, empty registries."""
    global _WRITING_LOCK
    _WRITING_LOCK = threading.Lock()
    _WRITING.clear()
    _WRITING_FILES.clear()


os.register_at_fork(after_in_child=_forget_after_fork)


def _register(path: str, writing: bool, file: tuple[int, int] | None = None) -> None:
    with _WRITING_LOCK:
        if writing:
            _WRITING.add(path)
            if file is not None:
                _WRITING_FILES.add(file)
        else:
            _WRITING.discard(path)
            if file is not None:
                _WRITING_FILES.discard(file)


def _create(directory: str) -> tuple[int, str, tuple[int, int] | None] | None:
    """A new locked temporary in ``directory``: ``(fd, path, (st_dev, st_ino))``, registered; or ``None``."""
    path = os.path.join(directory, f"{HELD_MARKER}{uuid.uuid4().hex}")
    _register(path, True)
    try:
        try:
            fd = os.open(path, _OPEN_TEMP, 0o666)
        except FileNotFoundError:  # the directory is made only when it is missing (no stat per write)
            os.makedirs(directory, exist_ok=True)
            fd = os.open(path, _OPEN_TEMP, 0o666)
    except BaseException:
        _register(path, False)
        raise
    file = None
    try:
        st = os.fstat(fd)
        file = (st.st_dev, st.st_ino)
        _register(path, True, file)  # before the lock: a sweeper here that probed first removed it (stat below)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.stat(path).st_ino == st.st_ino:
            return fd, path, file
    except (BlockingIOError, FileNotFoundError):
        pass  # a sweeper holds it (and removes it), or locked and removed it before this flock
    except OSError as exc:
        if exc.errno in _NO_LOCKS:
            return fd, path, file  # no locks here: sweepers cannot take it either, and go by age
        os.close(fd)
        _register(path, False, file)
        raise
    os.close(fd)
    _register(path, False, file)
    return None


@contextlib.contextmanager
def held_temporary(directory: str) -> Iterator[tuple[int, str]]:
    """``(descriptor, path)`` of a new temporary file in ``directory``, locked until the block ends.

    The caller writes through the descriptor and renames the path inside the
    block; a path not renamed away is removed at its end, then the descriptor
    is closed (the lock dropped). A missing ``directory`` is made.

    Raises
    ------
    OSError
        If the file cannot be created or locked.
    """
    for _ in range(_CREATE_ATTEMPTS):
        made = _create(directory)
        if made is None:
            continue
        fd, path, file = made
        try:
            yield fd, path
        finally:
            try:
                if os.path.lexists(path):  # not renamed into place
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(path)
            finally:
                os.close(fd)
                _register(path, False, file)
        return
    raise OSError(errno.EAGAIN, f"shardkv: every new temporary file in {directory!r} was taken by a sweeper")


def _unheld(path: str, remove: bool) -> bool | None:
    """Whether no live writer holds the temporary ``path`` (removed then, if ``remove``); ``None``: cannot tell.

    The caller holds ``_WRITING_LOCK``.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if (st.st_dev, st.st_ino) in _WRITING_FILES:
        return False  # this process writes it (under another path): never opened, as a close drops an NFS lock
    try:
        try:
            fd = os.open(path, _OPEN_PROBE)
        except PermissionError:  # another account's file: read-only is enough for flock on local disks
            fd = os.open(path, _OPEN_PROBE & ~os.O_WRONLY)
    except FileNotFoundError:
        return False  # renamed into place or removed meanwhile
    except OSError:
        return None  # not readable either, a symbolic link: by age
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        except OSError:
            return None  # no locks here (NFS wants a descriptor open for writing): by age
        try:
            if os.lstat(path).st_ino != os.fstat(fd).st_ino:
                return False
            if remove:
                os.remove(path)
        except FileNotFoundError:
            return False
        return True
    finally:
        os.close(fd)


def stale_in(directory: str, names: Iterable[str], now: float, min_age: float, remove: bool) -> list[str]:
    """The temporaries among ``names`` (in ``directory``) that no live writer holds; removed if ``remove``.

    Locked temporaries (:data:`HELD_MARKER`) by their lock, the others by age:
    not modified for ``min_age`` seconds before ``now`` (``time.time()``).
    Vanished files are skipped.

    Raises
    ------
    OSError
        If a stale temporary cannot be removed (permissions).
    """
    out = []
    for name in names:
        if TEMP_MARKER not in name:
            continue
        path = os.path.join(directory, name)
        unheld = None
        with _WRITING_LOCK:  # held while probing, so that a writer of this process registers before its flock
            if path in _WRITING:
                continue
            if name.startswith(HELD_MARKER):
                unheld = _unheld(path, remove)
        if unheld is not None:  # a locked temporary, told by its lock
            if unheld:
                out.append(path)
            continue
        try:
            if now - os.stat(path).st_mtime < min_age:
                continue
            if remove:
                os.remove(path)
        except FileNotFoundError:  # its writer just renamed or removed it
            continue
        out.append(path)
    return out
