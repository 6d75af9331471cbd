"""A :class:`~shardkv.storage.kv.KVStore` over a local directory: one file per key, generations from ``fstat``.

A read is ``open`` + ``fstat`` + one ``pread`` per range: the generation,
``(st_ino, st_mtime_ns, st_size)``, is the reading descriptor's, so every range
of one read comes from the file it names. Only regular files are values
(anything else at a key raises ``OSError`` naming it). A write goes to a held
temporary file beside the target (:mod:`shardkv.storage.files`), fsync'd and
renamed over it; a create-only put links it instead (atomic against every
process). :func:`_pwrite_all` and :func:`write_parts` are the only low-level
writes (the crash tests replace them here). O(chunk) updates:
:mod:`shardkv.storage.local_tail`. Keys never leave the root.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import itertools
import os
import shutil
import stat
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from shardkv._types import BytesLike
from shardkv.errors import InvalidKeyError, UnsupportedError
from shardkv.format.tail import TailHow
from shardkv.storage.files import (
    byte_parts,
    clones_files,
    held_temporary,
    pread_exact,
    read_pool,
    stale_in,
    write_parts,
)
from shardkv.storage.kv import (
    LOCK_DIR,
    MISSING_RESULT,
    NO_VALUE,
    STAMPS,
    Capabilities,
    Generation,
    KVStore,
    ReadRequest,
    ReadResult,
    StoreLocation,
    Value,
    hidden,
)
from shardkv.storage.local_tail import append_update, clone_update, inside, recover_append

_READ_GROUPS = 8  # tasks one batched local read is split into (the size of read_pool)
_POOLED_READ_NBYTES = 64 * 1024  # bytes the first read of a batch must return for the rest to go to the pool

FSYNC = True
"""Default of :attr:`LocalStore.fsync`: fsync each written file before its rename, and the directories after."""

DEFAULT_TEMP_AGE = 3600.0
"""Seconds a temporary file whose writer's lock cannot be tried must be left untouched to count as stale;
also how often a writer sweeps a directory it writes into."""

_MAX_REMEMBERED = 4096  # keys (checked paths, linked shards) one store remembers (all forgotten past that)
_SWEPT_MAX = 65536  # directories remembered as swept, per process
_OPEN_READ = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)
_NO_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV, errno.EMLINK, errno.ENOSYS}
_KINDS = {stat.S_IFIFO: "FIFO", stat.S_IFSOCK: "socket", stat.S_IFCHR: "character device", stat.S_IFBLK: "block device"}


def file_generation(st: os.stat_result) -> Generation:
    """The generation of a local file: ``(st_ino, st_mtime_ns, st_size)`` (the inode tells a rename apart)."""
    return Generation((st.st_ino, st.st_mtime_ns, st.st_size))


def stat_generation(path: str) -> tuple[Generation, int | None]:
    """``(generation, size)`` of the local file at ``path``; ``(NO_VALUE, None)`` when missing or not a file."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return NO_VALUE, None
    return (file_generation(st), st.st_size) if stat.S_ISREG(st.st_mode) else (NO_VALUE, None)


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    """Write all of ``data`` at ``offset`` of ``fd`` (the one place a single local buffer is written)."""
    while len(data):
        n = os.pwrite(fd, data, offset)
        data, offset = data[n:], offset + n


def _write_at(fd: int, offset: int, parts: list[memoryview]) -> None:
    """Write ``parts`` back to back from byte ``offset`` of ``fd``."""
    if len(parts) == 1:
        _pwrite_all(fd, parts[0], offset)
    elif parts:
        os.lseek(fd, offset, os.SEEK_SET)
        write_parts(fd, parts)


def _not_a_file(key: str, path: str, mode: int) -> OSError:
    """The error of a key at which something other than a regular file is stored."""
    if stat.S_ISDIR(mode):
        return IsADirectoryError(errno.EISDIR, f"key {key!r} is a directory, not a stored value", path)
    what = _KINDS.get(stat.S_IFMT(mode), f"file of mode {stat.filemode(mode)}")
    return OSError(errno.EINVAL, f"key {key!r} is a {what}, not a regular file: not read as a value", path)


def _check_key(key: str) -> str:
    """``key`` if it names a file inside the root; else :class:`InvalidKeyError` (no I/O)."""
    if not isinstance(key, str):
        raise TypeError(f"store keys are str, got {type(key).__name__}: {key!r}")
    if not key or key[0] == "/" or "\\" in key or "\x00" in key:
        raise InvalidKeyError(key, "a local key is relative, non-empty, without backslash or NUL")
    if "." in key or "//" in key or key[-1] == "/":
        for segment in key.split("/"):
            if not segment or segment.strip(".") == "":
                raise InvalidKeyError(key, f"segment {segment!r} would leave its directory (empty or periods only)")
    return key


def atomic_write(path: str, parts: list[memoryview], fsync: bool, create_only: bool = False) -> Generation | None:
    """Write ``parts`` to a temporary file beside ``path`` and rename it there; its generation.

    ``create_only``: hard-linked instead (``None`` if anything is there). The
    directory is fsync'd by the caller, once per batch.
    """
    with held_temporary(os.path.dirname(path)) as (fd, tmp):  # locked until renamed: no sweeper removes it
        _write_at(fd, 0, parts)
        if fsync:
            os.fsync(fd)
        generation = file_generation(os.fstat(fd))
        if create_only:
            try:
                os.link(tmp, path)  # fails if anything is at path: atomic against every process
                return generation
            except FileExistsError:
                return None
            except OSError as exc:
                if exc.errno not in _NO_LINKS:
                    raise
                if os.path.lexists(path):  # no hard links here: checked, atomic within this process only
                    return None
        os.replace(tmp, path)
        return generation


def fsync_dirs(paths: Iterable[str]) -> None:
    """fsync the directories holding ``paths`` (each once): makes their renames durable."""
    for directory in sorted({os.path.dirname(p) for p in paths}):
        dir_fd = os.open(directory, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


_SWEPT: dict[str, float] = {}  # directory -> time.monotonic() of its last sweep in this process


@functools.lru_cache(maxsize=_SWEPT_MAX)  # once per lock file and process
def _make_durable(lock_file: str) -> None:
    """fsync the directories of ``lock_file`` and of its lock directory, once per process.

    A lock file is made when a hold first needs it, unsynced; an append's
    intent recorded in it must survive a power loss.
    """
    fsync_dirs([lock_file, os.path.dirname(lock_file)])


def _claim_sweep(directory: str, every: float) -> bool:
    """True when ``directory`` was not swept in this process in the last ``every`` seconds (sweep it now)."""
    now = time.monotonic()
    last = _SWEPT.get(directory)
    if last is not None and now - last < every:
        return False
    if len(_SWEPT) >= _SWEPT_MAX:
        _SWEPT.clear()
    _SWEPT[directory] = now
    return True


class LocalStore(KVStore):
    """A local directory as a :class:`KVStore` (one file per key, native generations).

    Parameters
    ----------
    root : str or os.PathLike
        The directory (made on the first write if missing). Resolved with
        ``realpath`` for :attr:`location`; files are reached under it as given.
    fsync : bool, optional
        Override :data:`FSYNC` for this store (False: atomic against killed
        processes but not durable against power loss; for bulk writes redone
        after a crash).
    temp_age : float
        Seconds from which a temporary file without its writer's lock counts
        as stale (:data:`DEFAULT_TEMP_AGE`); one whose lock can be taken is stale at once.

    Notes
    -----
    Conditional puts are atomic within this process only (a create-only put:
    against every process), so ``conditional_put`` is False; the engine takes
    lock files for the rest.
    """

    caps = Capabilities(ranged=True, stamps="native", lock_dir=True, tail_updates=True)

    def __init__(
        self, root: str | os.PathLike[str], *, fsync: bool | None = None, temp_age: float = DEFAULT_TEMP_AGE
    ) -> None:
        root = os.fspath(root)
        self.root = root.rstrip("/") or "/"
        self._prefix = self.root if self.root.endswith("/") else self.root + "/"
        real = os.path.realpath(self.root)  # in-place append records may name files under it only
        self.location = StoreLocation(("file",), real, real)
        self.fsync = FSYNC if fsync is None else bool(fsync)
        self.temp_age = float(temp_age)
        self._checked: dict[str, str] = {}  # key -> its local path, checked by _check_key (reads look it up)
        self._no_append: set[str] = set()  # keys of shards outside their array's real directory (linked)

    def __reduce__(self) -> tuple[Any, ...]:
        return (functools.partial(LocalStore, fsync=self.fsync, temp_age=self.temp_age), (self.root,))

    def __repr__(self) -> str:
        return f"LocalStore({self.root!r})"

    def path(self, key: str) -> str:
        """The local path of ``key`` (checked: it stays inside the root)."""
        return self._prefix + _check_key(key)

    # -- reads ----------------------------------------------------------------

    def _read(self, request: ReadRequest) -> ReadResult:
        key, ranges, cond = request
        path = self._checked.get(key) if type(key) is str else None
        if path is None:  # checked once, not per read
            path = self.path(key)
            if len(self._checked) >= _MAX_REMEMBERED:
                self._checked.clear()
            self._checked[key] = path
        try:
            fd = os.open(path, _OPEN_READ)
        except (FileNotFoundError, NotADirectoryError):
            return MISSING_RESULT
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # a socket (or a FIFO end that cannot open): not a value
                raise OSError(errno.ENXIO, f"key {key!r} is not a regular file: not read as a value", path) from exc
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise _not_a_file(key, path, st.st_mode)
            size = st.st_size
            token = (st.st_ino, st.st_mtime_ns, st.st_size)
            if cond.token == token:
                generation = cond  # the stamp asked for: no new object
            elif cond.is_any:
                generation = Generation(token)
            else:
                return ReadResult("stale", None, Generation(token), size)
            if ranges is None:
                values: list[BytesLike] = [pread_exact(fd, 0, size)]
            elif len(ranges) == 1 and (stop := ranges[0].stop) is not None and ranges[0].start >= 0:
                # one plain range (a warm chunk read): clipped to the file as resolve() would, without it
                values = [pread_exact(fd, ranges[0].start, min(stop, size))]
            else:
                values = [pread_exact(fd, *r.resolve(size)) for r in ranges]
            return ReadResult("value", values, generation, size)
        finally:
            os.close(fd)

    def get_many(self, reads: Sequence[ReadRequest]) -> list[ReadResult]:
        if len(reads) <= 1:
            return [self._read(reads[0])] if reads else []
        for key, _, _ in reads:  # refuse a bad key before any I/O
            _check_key(key)
        # Local reads release the GIL, so large ones go side by side, one task per worker (not per
        # read: a task costs more than a small read from the page cache). Small ones (chunk files of
        # a few KiB, index ranges) are read here in turn: threads would hand the GIL back and forth
        # at every system call (a 100,000-chunk convert: 2.3 million futex calls, twice the time).
        # The first read decides: the reads of one batch are of one kind.
        first = self._read(reads[0])
        rest = reads[1:]
        if first.values is None or sum(memoryview(v).nbytes for v in first.values) < _POOLED_READ_NBYTES:
            return [first, *map(self._read, rest)]
        n = len(rest)
        groups = min(n, _READ_GROUPS)
        bounds = [n * g // groups for g in range(groups + 1)]
        parts = read_pool().map(self._read_group, [rest[a:b] for a, b in itertools.pairwise(bounds)])
        return [first, *(result for part in parts for result in part)]

    def _read_group(self, reads: Sequence[ReadRequest]) -> list[ReadResult]:
        """:meth:`_read` of each request, in order (one task of the read pool)."""
        return [self._read(r) for r in reads]

    def size(self, key: str) -> int | None:
        """The size of the file at ``key`` (one ``stat``); ``None`` when missing or a directory (a path).

        Raises
        ------
        OSError
            For a FIFO, socket or device at ``key``, or a failed ``stat`` (permissions).
        """
        path = self.path(key)
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        if stat.S_ISDIR(st.st_mode):
            return None
        if not stat.S_ISREG(st.st_mode):
            raise _not_a_file(key, path, st.st_mode)
        return st.st_size

    def contains(self, key: str) -> bool:
        """True when a regular file is stored at ``key`` (one ``stat``; a directory is a path, not a value)."""
        return self.size(key) is not None

    # -- writes ---------------------------------------------------------------

    def _write_one(self, key: str, value: Value | None, cond: Generation) -> Generation | None:
        path = self.path(key)
        create_only = value is not None and cond.is_missing  # linked into place: atomic against every process
        if not cond.is_any and not create_only and stat_generation(path)[0] != cond:
            return None
        if value is None:
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                os.remove(path)
            return NO_VALUE
        return atomic_write(path, byte_parts(value), self.fsync, create_only=create_only)

    def put_many(self, writes: Mapping[str, tuple[Value | None, Generation]]) -> dict[str, Generation | None]:
        for key in writes:  # refuse a bad key before any I/O
            _check_key(key)
        self.sweep_before_writing([k for k, (v, _) in writes.items() if v is not None])
        out: dict[str, Generation | None] = {}
        # conditions are checked and writes made under the writer locks of the keys' stripes:
        # no other write of this process to these keys comes between check and rename
        with STAMPS.writing(self.location, writes):
            for key, (value, cond) in writes.items():
                out[key] = self._write_one(key, value, cond)
        written = [self._prefix + k for k, g in out.items() if g is not None and writes[k][0] is not None]
        if self.fsync and written:
            fsync_dirs(written)
        return out

    # -- O(chunk) updates -----------------------------------------------------

    def tail_method(self, key: str, in_place: bool) -> TailHow | None:
        """``"clone"`` where the shard's file system clones files, else ``"append"`` if ``in_place``, else ``None``.

        Raises
        ------
        OSError
            If the shard's directory cannot be examined or written (permissions).
        """
        try:
            clones = clones_files(os.path.dirname(self.path(key)))
        except FileNotFoundError:  # no shard there yet: a whole write
            return None
        if clones:
            return "clone"
        return "append" if in_place and key not in self._no_append else None

    def update_tail(
        self,
        key: str,
        writes: Sequence[tuple[int, Value]],
        nbytes: int,
        if_generation: Generation,
        how: TailHow,
        intent_fd: int | None = None,
        intent_path: str | None = None,
        drop: int = 0,
    ) -> Generation | None:
        """Write ``writes`` into the shard at ``key``: into a clone renamed over it, or appended in place.

        See :meth:`KVStore.update_tail`. ``"append"`` writes back to back from
        the shard's size under the intent in the lock file ``intent_fd`` (at
        ``intent_path``, made durable first with :attr:`fsync`). A shard whose
        real path is outside its array's real directory (a link elsewhere) is
        not appended to: ``None``, and :meth:`tail_method` says ``None`` for it
        from then on, as recovery acts only on files there.

        Raises
        ------
        ValueError
            For ``"append"`` without ``intent_fd``, or with writes that do not
            follow each other from the shard's size to ``nbytes``.
        OSError
            Any error of the file system (a full disk: a clone is removed, an
            append cut back to the old size by the next recovery).
        UnsupportedError
            For a ``drop`` (files keep their leading bytes).
        """
        if drop:
            raise UnsupportedError(f"{key!r}: a local shard keeps its leading bytes (drop={drop})")
        path = self.path(key)
        self.sweep_before_writing([key])

        def holds(st: os.stat_result) -> bool:
            return if_generation.is_any or file_generation(st) == if_generation

        with STAMPS.writing(self.location, [key]):
            if how == "clone":
                st = clone_update(path, writes, nbytes, holds, self.fsync, _write_at)
            else:
                if intent_fd is None:
                    raise ValueError(f"an in-place append to {key!r} needs the lock file that records its intent")
                if not inside(os.path.realpath(path), self._repairable(intent_path)):
                    if len(self._no_append) >= _MAX_REMEMBERED:
                        self._no_append.clear()
                    self._no_append.add(key)
                    return None
                if self.fsync and intent_path is not None:
                    _make_durable(intent_path)
                st = append_update(path, writes, nbytes, holds, intent_fd, self.fsync, _write_at)
        if st is not None and how == "clone" and self.fsync:
            fsync_dirs([path])
        return None if st is None else file_generation(st)

    def recover_tail(self, intent_fd: int, intent_path: str | None = None, repair: bool = True) -> str | None:
        """:func:`~shardkv.storage.local_tail.recover_append` of the lock file ``intent_fd`` (the caller holds it).

        A record may name files under the real directory of the array of
        ``intent_path`` (``<array>/.shardkv-locks/<stripe>.lock``), else under the store's real root.
        """
        if not os.fstat(intent_fd).st_size:  # no append was ever recorded in this lock file
            return None
        return recover_append(intent_fd, _write_at, self._repairable(intent_path), repair)

    def _repairable(self, intent_path: str | None) -> str:
        """The directory whose files the records of the lock file at ``intent_path`` may name."""
        return self.location.root if intent_path is None else os.path.dirname(os.path.dirname(intent_path))

    # -- listings -------------------------------------------------------------

    def _walk(
        self, prefix: str, stat_entries: Callable[[str], bool] | None
    ) -> Iterator[tuple[str, os.stat_result | None]]:
        """``(key, stat or None)`` of every file under ``prefix`` but hidden ones; ``stat_entries``: which to stat."""
        if prefix:
            _check_key(prefix.rstrip("/"))
        head = prefix.rpartition("/")[0]
        start = self._prefix + head if head else self.root
        pending = [(start, head + "/" if head else "")]
        while pending:
            directory, rel = pending.pop()
            try:
                entries = sorted(os.scandir(directory), key=lambda e: e.name)
            except (FileNotFoundError, NotADirectoryError):
                continue
            for entry in entries:
                key = rel + entry.name
                if hidden(key) or not (key.startswith(prefix) or prefix.startswith(key + "/")):
                    continue
                if entry.is_dir():
                    pending.append((entry.path, key + "/"))
                elif key.startswith(prefix):
                    yield key, (entry.stat() if stat_entries is not None and stat_entries(key) else None)

    def list_prefix(self, prefix: str) -> Iterator[str]:
        return (key for key, _ in self._walk(prefix, None))

    def list_generations(
        self, prefix: str, wanted: Callable[[str], bool] | None = None
    ) -> Iterator[tuple[str, Generation | None]]:
        """Every key under ``prefix`` with its generation: one ``stat`` per ``wanted`` file, else ``None``."""
        for key, st in self._walk(prefix, wanted or (lambda key: True)):
            yield key, None if st is None else file_generation(st)

    def list_dir(self, prefix: str) -> tuple[list[str], list[str]]:
        directory = self.path(prefix.rstrip("/")) if prefix else self.root
        keys: list[str] = []
        dirs: list[str] = []
        try:
            with os.scandir(directory) as it:
                for entry in it:
                    if hidden(entry.name):
                        continue
                    (dirs if entry.is_dir() else keys).append(entry.name)
        except (FileNotFoundError, NotADirectoryError):
            return [], []
        return sorted(keys), sorted(dirs)

    def delete_prefix(self, prefix: str) -> None:
        """Delete every key under ``prefix``; a path (ending in ``/``) goes as a directory tree.

        For ``""`` everything goes but the root's lock directory (other processes may hold its locks).
        """
        if prefix and not prefix.endswith("/"):
            super().delete_prefix(prefix)
            return
        if prefix:
            targets = [self.path(prefix.rstrip("/"))]
        else:
            try:
                with os.scandir(self.root) as it:
                    targets = [e.path for e in it if e.name != LOCK_DIR]
            except (FileNotFoundError, NotADirectoryError):
                return
        for target in targets:
            if os.path.isdir(target) and not os.path.islink(target):
                with contextlib.suppress(FileNotFoundError):
                    shutil.rmtree(target)
            elif prefix == "":
                with contextlib.suppress(FileNotFoundError):
                    os.remove(target)

    def prune_empty_dirs(self, prefix: str) -> None:
        """Remove the directories left empty under ``prefix`` (``""``: below the root), deepest first.

        No file goes but the lock files of a lock directory holding nothing else.
        """
        top = self.path(prefix.strip("/")) if prefix.strip("/") else self.root
        for dirpath, _, names in os.walk(top, topdown=False):
            if os.path.basename(dirpath) == LOCK_DIR and all(n.endswith(".lock") for n in names):
                for name in names:
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(os.path.join(dirpath, name))
            if dirpath != self.root:
                with contextlib.suppress(OSError):  # not empty (a racing writer's file): kept
                    os.rmdir(dirpath)

    # -- stale temporaries ----------------------------------------------------

    def find_stale_temporaries(self, min_age_seconds: float | None = None) -> list[str]:
        """Temporary files of writers that no longer run (:func:`~shardkv.storage.files.stale_in`), sorted paths.

        Parameters
        ----------
        min_age_seconds : float, optional
            Seconds a temporary without its writer's lock must have been left
            untouched (default :attr:`temp_age`); locked ones go by their lock.
        """
        return self._sweep(min_age_seconds, remove=False)

    def remove_stale_temporaries(self, min_age_seconds: float | None = None) -> list[str]:
        """Remove what :meth:`find_stale_temporaries` finds; the paths removed (vanished ones skipped)."""
        return self._sweep(min_age_seconds, remove=True)

    def _sweep(self, min_age_seconds: float | None, remove: bool) -> list[str]:
        min_age = self.temp_age if min_age_seconds is None else float(min_age_seconds)
        now = time.time()
        out: list[str] = []
        for dirpath, _, files in os.walk(self.root):
            out.extend(stale_in(dirpath, files, now, min_age, remove))
        return sorted(out)

    def sweep_before_writing(self, keys: Iterable[str]) -> list[str]:
        """Remove stale temporaries from the directories of ``keys``, each once per :attr:`temp_age` and process.

        An error (permissions) is a ``RuntimeWarning``, never a failed write. Returns the paths removed.
        """
        removed: list[str] = []
        now = time.time()
        for parent in {key.rpartition("/")[0] for key in keys}:
            directory = self._prefix + parent if parent else self.root
            if not _claim_sweep(directory, self.temp_age):
                continue
            try:
                removed.extend(stale_in(directory, os.listdir(directory), now, self.temp_age, remove=True))
            except (FileNotFoundError, NotADirectoryError):
                continue  # nothing written there yet
            except OSError as exc:  # housekeeping only: the user's write goes on
                warnings.warn(
                    f"shardkv: could not remove stale temporary files in {directory!r}: {exc}",
                    RuntimeWarning,
                    stacklevel=3,
                )
        return removed
