"""Per-shard locks that belong to the data (:class:`ShardLocks`), and the ``concurrency=`` modes.

A process-wide pool of in-process stripes, then (mode ``"files"``) an ``flock`` of
``<array>/.shardkv-locks/<stripe>.lock`` in the array's real directory. The modes: docs/user-guide.md,
"Concurrency"; the stripe order and the waits: docs/architecture.md, "The write path".
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import threading
import time
import zlib
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Any, Literal

from shardkv.engine.retry import LOCK_BACKOFF, Backoff, attempts
from shardkv.errors import ConfigurationError, LockTimeoutError
from shardkv.keys.space import ShardedArray
from shardkv.storage.kv import LOCK_DIR, KVStore, StoreLocation

Concurrency = Literal["auto", "files", "conditional", "process", "none"]  # Options.concurrency
Mode = Literal["files", "conditional", "process", "none"]

THREAD_STRIPES = 1024  # in-process lock stripes of the process (about 100 bytes each)
FILE_STRIPES = 64  # lock files per array, in ``<array>/.shardkv-locks/``

DEFAULT_LOCK_TIMEOUT = 300.0  # seconds (Options.lock_timeout says why five minutes)

_REOPEN_ATTEMPTS = 100  # opens of a lock file that keeps being removed (its array deleted) before giving up
_REOPEN_BACKOFF = Backoff(0.0001, 2.0, 0.01)
_MAX_REAL_DIRS = 4096  # resolved array directories remembered per ShardLocks


def resolve_mode(kv: KVStore, concurrency: Concurrency) -> Mode:
    """The mode ``concurrency`` resolves to on ``kv`` (docs/user-guide.md, "Concurrency").

    Raises
    ------
    ConfigurationError
        For a mode the store cannot give (``"auto"`` where it has neither a
        lock directory, a conditional put nor in-process data).
    """
    caps = kv.caps
    if concurrency == "none" or concurrency == "process":
        return concurrency
    if concurrency == "files" or (concurrency == "auto" and caps.lock_dir):
        if not caps.lock_dir:
            raise ConfigurationError(
                f"concurrency='files' needs a store in a directory; {_store_name(kv)} is not one "
                "(object stores: concurrency='conditional')"
            )
        return "files"
    if caps.conditional_put or caps.in_process:
        return "conditional"
    hint = ""
    if caps.round_trips and caps.stamps == "native":
        hint = (
            " (an object store needs conditional puts: an obstore S3Store with conditional_put='etag', the "
            "default, and without AWS_CONDITIONAL_PUT=disabled)"
        )
    if concurrency == "conditional":
        raise ConfigurationError(
            f"concurrency='conditional' needs a store with conditional writes; {_store_name(kv)} "
            f"has none{hint}: pass concurrency='process' or 'none'"
        )
    raise ConfigurationError(
        f"concurrency='auto' cannot tell who else writes the store {_store_name(kv)}: it is not known to "
        f"live in this process only, and it offers neither lock files nor conditional writes{hint}. Choose: "
        "concurrency='process' (locks shared by this process's threads and stores: safe only if no other "
        "process writes this data), concurrency='none' (no locks: you promise one writer per shard), "
        "concurrency='files' (lock files: needs the data in a local or network directory) or "
        "concurrency='conditional' (compare-and-swap writes: needs a store with conditional puts)"
    )


def _store_name(kv: KVStore) -> str:
    """The class of the user's store behind shardkv's wrappers of ``kv`` (``ZipStore``) and where it is."""
    user: object = kv
    while type(user).__module__.startswith("shardkv."):  # unwrap shardkv's adapters down to the user's store
        inner = next((getattr(user, a) for a in ("mapping", "store", "fs") if getattr(user, a, None) is not None), None)
        if inner is None:
            break
        user = inner
    return f"{type(user).__name__} at {kv.location.root or '(the root)'!r}"


def lock_prefix(arr: ShardedArray) -> str:
    """The key prefix of the directory whose ``.shardkv-locks`` holds the array's shard locks: the array's own
    (v2, v3), or the store root for the 2022 draft layout (whose data directories other readers list)."""
    own = f"{arr.path}/" if arr.path else ""
    return arr.key_prefix if arr.key_prefix == own else ""


def stripe_of(path: str, n_stripes: int) -> int:
    """The stripe (0 ≤ stripe < ``n_stripes``) of a path, the same in every process (a CRC-32, not ``hash``)."""
    return zlib.crc32(path.encode("utf-8")) % n_stripes


def _make_lock_dir(lock_dir: str) -> int:
    """Create ``lock_dir`` (a ``.shardkv-locks``) if it is missing; the mode of its lock files.

    Read and write (and search) for each class that may write the array directory, never a read bit without
    its write bit (no account that cannot write the array can ``flock`` a lock file); its set-group-ID bit kept.
    """
    array_dir = os.path.dirname(lock_dir)
    os.makedirs(array_dir, exist_ok=True)  # as the array's first write would make it
    array_mode = os.stat(array_dir).st_mode
    file_mode, dir_mode = 0o600, 0o700
    if array_mode & stat.S_IWGRP:
        file_mode, dir_mode = file_mode | 0o060, dir_mode | 0o070
    if array_mode & stat.S_IWOTH:
        file_mode, dir_mode = file_mode | 0o006, dir_mode | 0o007
    dir_mode |= array_mode & stat.S_ISGID  # a shared project directory passes its group on to the lock files
    try:
        os.mkdir(lock_dir, dir_mode)
        os.chmod(lock_dir, dir_mode)  # exactly: the umask only narrowed it
    except FileExistsError:
        pass  # made by an earlier hold, or by another writer first
    return file_mode


def _open_lock_file(path: str, make: bool) -> int | None:
    """A read-write descriptor of a lock file, made if missing (``make``); ``None`` if it is (still) missing."""
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        try:
            return os.open(path, flags)  # made by an earlier hold: the usual case
        except FileNotFoundError:
            if not make:
                return None
        mode = _make_lock_dir(os.path.dirname(path))
        try:
            fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, mode)
        except FileExistsError:
            return os.open(path, flags)  # another writer made it meanwhile
    except FileNotFoundError:
        return None  # removed between two opens (the array deleted): made again next round
    except PermissionError as exc:
        raise PermissionError(
            exc.errno,
            f"cannot open lock file {path!r} for writing: this account may not write the array (reading needs no lock)",
            path,
        ) from exc
    try:
        os.fchmod(fd, mode)  # exactly: the umask may have left a read bit without its write bit
    except BaseException:
        os.close(fd)
        raise
    return fd


def _lock_file(path: str, deadline: float | None, make: bool) -> tuple[int, int] | None:
    """``(descriptor, size)`` of the lock file at ``path``, ``flock``ed until ``deadline``; ``None``: another holds it.

    Opened for this hold only (two threads of a process never take one lock file at once: they hold its stripe
    first), so ``flock`` emulated by ``fcntl`` (NFS) stays exclusive; one removed before its ``flock`` (its array
    deleted) is opened again. ``FileNotFoundError`` without ``make`` for a missing one.
    """
    reopens: Iterator[int] | None = None  # the retry loop, only once the file was removed
    waits: Iterator[int] | None = None  # the retry loop, only while another holds it
    while True:
        fd = _open_lock_file(path, make)
        if fd is None and not make:
            raise FileNotFoundError(errno.ENOENT, "no lock file (no writer made one)", path)
        if fd is not None:
            try:
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX if deadline is None else fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except OSError as exc:
                        if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                            raise
                    waits = waits or attempts(None, LOCK_BACKOFF, deadline, made=1)
                    if next(waits, None) is None:
                        os.close(fd)
                        return None
                st = os.fstat(fd)
            except BaseException:
                os.close(fd)
                raise
            if st.st_nlink > 0:
                return fd, st.st_size
            os.close(fd)
        reopens = reopens or attempts(_REOPEN_ATTEMPTS, _REOPEN_BACKOFF, made=1)
        if next(reopens, None) is None:
            raise FileNotFoundError(errno.ENOENT, "lock file keeps being removed while it is taken", path)


_POOL = [threading.Lock() for _ in range(THREAD_STRIPES)]  # the process-wide in-process lock stripes


def _new_pool_in_child() -> None:
    global _POOL
    _POOL = [threading.Lock() for _ in range(THREAD_STRIPES)]  # the parent's may be held by its threads
    _HELD.holds = 0  # the child holds none of them
    _HELD.fds.clear()


class _Held(threading.local):
    """The shard locks the current thread holds through :meth:`ShardLocks.hold`."""

    def __init__(self) -> None:
        self.holds = 0  # holds entered and not left
        self.fds: dict[str, int] = {}  # lock file -> the held lock file's descriptor


_HELD = _Held()
os.register_at_fork(after_in_child=_new_pool_in_child)


def holds_shard_locks() -> bool:
    """Whether the current thread is inside a :meth:`ShardLocks.hold` (of any location)."""
    return _HELD.holds > 0


_STRIPE_HELD = (
    "another thread of this process holds it (a write of a shard of the same lock stripe still running, or a "
    "thread stopped while holding it); pass a longer lock_timeout= if writes of shards this large take that long"
)


def _file_held(lock_file: str) -> str:
    """What a lock file held past the timeout means, and what to do (the reason of its ``LockTimeoutError``)."""
    return (
        "another process holds that lock file. A writer holds it for one shard write only, so a lock held this "
        "long belongs to a process that hangs or is stopped, a client of this network file system that died (its "
        "server frees the lock when the client's lease lapses) or a child forked while a thread held it: find the "
        f"holder with `fuser -v {lock_file}` (or `lsof {lock_file}`) on each machine that mounts the data and end "
        "it, or pass a longer lock_timeout=; do not delete the lock file (its holder would keep its lock, and a "
        "second writer could start beside it)"
    )


class ShardLocks:
    """Per-shard locks of one base store location, shared by every holder of that location.

    Parameters
    ----------
    location : StoreLocation
        Where the data lives (a store's ``location``).
    mode : {"files", "conditional", "process", "none"} or None
        ``"files"`` also takes a lock file per stripe (other processes and
        machines excluded); ``"conditional"`` and ``"process"`` take in-process
        stripes only; ``"none"`` no lock. ``None``: ``"files"`` where the
        location is a directory, else ``"process"``.
    timeout : float or None
        Longest wait (seconds) for the locks of one :meth:`hold`; ``None``: as long as it takes.

    Raises
    ------
    ConfigurationError
        For mode ``"files"`` where there is no directory to keep lock files in.
    """

    def __init__(
        self, location: StoreLocation, mode: Mode | None = None, timeout: float | None = DEFAULT_LOCK_TIMEOUT
    ) -> None:
        root_dir = location.local_dir
        if mode is None:
            mode = "files" if root_dir is not None else "process"
        if mode == "files" and root_dir is None:
            raise ConfigurationError(
                f"cross-process locks need a directory for lock files; location {location!r} has none "
                "(object stores use conditional writes instead: concurrency='conditional')"
            )
        self.location = location
        self.mode: Mode = mode
        self.cross_process = mode == "files"  # lock files are taken
        self.optimistic = mode == "conditional"  # shard puts are conditioned on the generation read
        self.timeout = timeout
        # the data's directory (also without lock files: in-process stripes are chosen by real paths)
        self._dir_root = os.path.abspath(root_dir) if root_dir is not None else None
        self._real_dirs: dict[str, str] = {}  # array key prefix -> its real directory
        self._prefix = f"{location.namespace!r}\0"

    def __reduce__(self) -> tuple[Any, ...]:
        # locks are never pickled: the new process finds them by location (and resolves directories again)
        return (ShardLocks, (self.location, self.mode, self.timeout))

    @classmethod
    def of_store(
        cls, kv: KVStore, concurrency: Concurrency = "auto", timeout: float | None = DEFAULT_LOCK_TIMEOUT
    ) -> ShardLocks:
        """The locks of ``kv`` in the mode ``concurrency`` resolves to there (:func:`resolve_mode`, which raises)."""
        return cls(kv.location, mode=resolve_mode(kv, concurrency), timeout=timeout)

    @property
    def lock_dir(self) -> str | None:
        """The lock directory of root-level keys (a root array's), or ``None`` without lock files."""
        return os.path.join(self._real_dir(""), LOCK_DIR) if self.cross_process else None

    def _real_dir(self, prefix: str) -> str:
        """The real directory (symbolic links resolved) of the array at key prefix ``prefix``."""
        found = self._real_dirs.get(prefix)
        if found is None:
            if self._dir_root is None:
                raise ConfigurationError(f"{self.location!r} is in no directory: no real directory of {prefix!r}")
            found = os.path.realpath(os.path.join(self._dir_root, *[p for p in prefix.split("/") if p]))
            if len(self._real_dirs) >= _MAX_REAL_DIRS:
                self._real_dirs.clear()
            self._real_dirs[prefix] = found
        return found

    def _where(self, key: str, prefix: str) -> tuple[str, str | None]:
        """What names a shard's lock in this process, and the path of its lock file if it has one.

        In a directory the name is the lock file's path in the real array directory: every store of the process
        agrees whatever root or link it came through. Else the shard's full path.
        """
        if self._dir_root is None:
            return self._prefix + self.location.full_path(key), None
        if not key.startswith(prefix):
            raise ConfigurationError(f"shard key {key!r} is not under its array prefix {prefix!r}")
        path = os.path.join(self._real_dir(prefix), LOCK_DIR, f"{stripe_of(key[len(prefix) :], FILE_STRIPES)}.lock")
        return self._prefix + path, path if self.cross_process else None

    def lock_file(self, shard_key: str, prefix: str = "") -> str | None:
        """The path of the lock file of ``shard_key`` (its array at key prefix ``prefix``); ``None`` without one.

        Raises
        ------
        ConfigurationError
            If the shard key is not under its prefix.
        """
        return self._where(shard_key, prefix)[1]

    @contextmanager
    def hold(
        self, shard_keys: Iterable[str], prefixes: Mapping[str, str] | None = None, make: bool = True
    ) -> Iterator[list[tuple[int, str]]]:
        """Hold the locks of every shard in ``shard_keys`` for the ``with`` block (none in mode ``"none"``).

        Parameters
        ----------
        shard_keys : iterable of str
            Shard keys relative to the store root.
        prefixes : mapping of str to str, optional
            Shard key -> key prefix of its array (absent: ``""``, the root):
            its lock file is in that array's directory, the same file for
            every store root, chosen by the key after the prefix.
        make : bool
            False: take only lock files that exist, never make a lock directory
            or file nor change a mode (a read-only store's wait for a writer).

        Yields
        ------
        list of (int, str)
            ``(descriptor, path)`` of the held lock files that are not empty
            (only those may record an append intent).

        Raises
        ------
        LockTimeoutError
            If the locks were not all obtained within ``timeout`` seconds
            (nothing is held when it is raised).
        ConfigurationError
            If a shard key is not under its prefix.
        FileNotFoundError
            Without ``make``, if a lock file is missing.
        """
        if self.mode == "none":
            yield []
            return
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        by_stripe: dict[int, str] = {}  # in-process stripe -> a shard of it
        by_file: dict[str, str] = {}  # lock file -> a shard of it
        for key in shard_keys:
            name, file = self._where(key, "" if prefixes is None else prefixes.get(key, ""))
            by_stripe.setdefault(stripe_of(name, THREAD_STRIPES), key)
            if file is not None:
                by_file.setdefault(file, key)
        _HELD.holds += 1
        try:
            with ExitStack() as stack:
                for stripe in sorted(by_stripe):
                    lock = _POOL[stripe]
                    # a wait longer than the platform allows (a timeout of inf) is as long as it takes
                    wait = -1 if deadline is None else min(threading.TIMEOUT_MAX, max(0.0, deadline - time.monotonic()))
                    if not lock.acquire(timeout=wait):
                        where = f"in-process lock stripe {stripe} of {self.location!r}"
                        raise LockTimeoutError(where, self.timeout or 0.0, _STRIPE_HELD, shard_key=by_stripe[stripe])
                    stack.callback(lock.release)
                yield self._take_files(stack, by_file, deadline, make) if by_file else []
        finally:
            _HELD.holds -= 1  # once every lock of the hold is released

    def hold_arrays(
        self, shards: Mapping[str, ShardedArray], make: bool = True
    ) -> AbstractContextManager[list[tuple[int, str]]]:
        """:meth:`hold` of ``shards`` (shard key -> its array): each lock file is in its array's directory."""
        return self.hold(shards, {k: lock_prefix(arr) for k, arr in shards.items()}, make)

    def _take_files(
        self, stack: ExitStack, by_file: Mapping[str, str], deadline: float | None, make: bool
    ) -> list[tuple[int, str]]:
        """Take the lock files of ``by_file`` onto ``stack``; the non-empty ones, as :meth:`hold` yields them.

        Each round waits for one lock file holding none, then tries the others; one found taken lets go of all
        for the next round, which waits for it.
        """
        files = sorted(by_file)
        waited = files[0]
        rounds: Iterator[int] | None = None  # the retry loop, only once a round found a lock file taken
        while True:
            marked: list[tuple[int, str]] = []
            with ExitStack() as round_stack:
                busy = None
                for file in [waited] + [f for f in files if f != waited]:
                    taken = _lock_file(file, deadline if file == waited else 0.0, make)
                    if taken is None:
                        busy = file
                        break
                    fd, size = taken
                    round_stack.callback(os.close, fd)
                    round_stack.callback(fcntl.flock, fd, fcntl.LOCK_UN)  # also if a forked child shares fd
                    _HELD.fds[file] = fd  # the descriptor an append's intent is recorded in
                    round_stack.callback(_HELD.fds.pop, file, None)
                    if size:
                        marked.append((fd, file))
                if busy is None:
                    stack.enter_context(round_stack.pop_all())
                    return sorted(marked)
            if busy == waited:
                break  # waited for until the deadline
            waited = busy  # all let go: the next round waits for the one another writer holds
            rounds = rounds or attempts(None, LOCK_BACKOFF, deadline, made=1)
            if next(rounds, None) is None:
                break
        raise LockTimeoutError(
            f"lock file {waited!r}", self.timeout or 0.0, _file_held(waited), waited, by_file[waited]
        )

    def held_lock_file(self, shard_key: str, arr: ShardedArray) -> tuple[int, str] | None:
        """``(descriptor, path)`` of the lock file of ``shard_key`` if this thread holds it (where an in-place
        append records its intent)."""
        file = self._where(shard_key, lock_prefix(arr))[1]
        fd = None if file is None else _HELD.fds.get(file)
        return None if file is None or fd is None else (fd, file)
