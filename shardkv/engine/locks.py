"""Per-shard locks that belong to the data, not to the object (:class:`ShardLocks`), and the ``concurrency=`` modes.

Two layers, one stripe scheme: a process-wide pool of in-process stripes,
then (mode ``"files"``) an ``flock`` of ``<array>/.shardkv-locks/<stripe>.lock``
in the array's real directory, opened ``O_RDWR`` with the array directory's
write permissions. The modes: docs/user-guide.md, "Concurrency"; the stripe
order, the waits and why a hold is never nested: docs/architecture.md, "The
write path". Locks are never pickled; a forked child starts with none.
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

Concurrency = Literal["auto", "files", "conditional", "process", "none"]
"""How writers of one shard keep each other's chunks (see :class:`~shardkv.ShardedStore`)."""
Mode = Literal["files", "conditional", "process", "none"]
CONCURRENCY_MODES: tuple[str, ...] = ("auto", "files", "conditional", "process", "none")

DEFAULT_THREAD_STRIPES = 1024
"""Thread lock stripes per location namespace (bytes of memory: about 100 per lock)."""

DEFAULT_FILE_STRIPES = 64
"""Lock files per array (empty files in ``<array>/.shardkv-locks/``)."""

DEFAULT_LOCK_TIMEOUT = 300.0
"""Default longest wait (seconds) for the locks of one hold (``Options.lock_timeout`` says why five minutes)."""

_REOPEN_ATTEMPTS = 100
"""Opens of a lock file that keeps being removed (its array deleted meanwhile) before giving up."""
_REOPEN_BACKOFF = Backoff(0.0001, 2.0, 0.01)
"""Waits between those opens (seconds)."""
_MAX_REAL_DIRS = 4096  # resolved array directories remembered per ShardLocks


def resolve_mode(kv: KVStore, concurrency: str) -> Mode:
    """The mode ``concurrency`` resolves to on ``kv`` (see the module docstring).

    Raises
    ------
    ConfigurationError
        For an unknown mode; ``"files"`` where the store has no lock
        directory; ``"conditional"`` where it has neither a conditional put
        nor in-process data; ``"auto"`` where it has none of these.
    """
    if concurrency not in CONCURRENCY_MODES:
        raise ConfigurationError(f"concurrency must be one of {CONCURRENCY_MODES}, got {concurrency!r}")
    caps = kv.caps
    if concurrency == "none":
        return "none"
    if concurrency == "process":
        return "process"
    if concurrency == "files" or (concurrency == "auto" and caps.lock_dir):
        if not caps.lock_dir:
            raise ConfigurationError(
                f"concurrency='files' needs a store in a directory; {_store_name(kv)} is not one "
                "(object stores: concurrency='conditional')"
            )
        return "files"
    if caps.conditional_put or caps.in_process:
        return "conditional"
    hint = (
        (
            " (an object store needs conditional puts: an obstore S3Store with conditional_put='etag', the "
            "default, and without AWS_CONDITIONAL_PUT=disabled)"
        )
        if caps.round_trips and caps.stamps == "native"
        else ""
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
    """The class of the user's store behind ``kv`` and where it is, for messages.

    The store is found through shardkv's own wrappers (a mapping, a zarr 3 store seen as a mapping, an obstore
    store, a filesystem), so the message names what the user passed (``ZipStore``), not an adapter.
    """
    user: object = kv
    while type(user).__module__.startswith("shardkv."):  # unwrap shardkv's adapters down to the user's store
        inner = next((getattr(user, a) for a in ("mapping", "store", "fs") if getattr(user, a, None) is not None), None)
        if inner is None:
            break
        user = inner
    return f"{type(user).__name__} at {kv.location.root or '(the root)'!r}"


def lock_prefix(arr: ShardedArray) -> str:
    """The key prefix of the directory whose ``.shardkv-locks`` holds the array's shard locks.

    The array's own directory where its shards live beside its metadata (v2
    and v3 layouts); the store root for the 2022 draft layout, whose data
    directories other readers list.
    """
    own = f"{arr.path}/" if arr.path else ""
    return arr.key_prefix if arr.key_prefix == own else ""


def stripe_of(path: str, n_stripes: int) -> int:
    """The stripe (0 ≤ stripe < ``n_stripes``) of a path; the same in every process and on every run.

    Python's ``hash`` of a str changes between processes, so a CRC-32 of the
    UTF-8 path is used instead.
    """
    return zlib.crc32(path.encode("utf-8")) % n_stripes


def lock_modes(array_dir: str) -> tuple[int, int]:
    """``(lock file mode, lock directory mode)`` for the array directory ``array_dir``.

    Read and write (and, for the directory, search) for the owner; for the
    group only if ``array_dir`` is group-writable; for others only if it is
    world-writable; the directory keeps ``array_dir``'s set-group-ID bit. No class gets a read
    bit without its write bit, so no account that cannot write the array can open (and ``flock``) a lock file.
    """
    dir_mode = os.stat(array_dir).st_mode
    file_mode, lock_dir_mode = 0o600, 0o700
    if dir_mode & stat.S_IWGRP:
        file_mode, lock_dir_mode = file_mode | 0o060, lock_dir_mode | 0o070
    if dir_mode & stat.S_IWOTH:
        file_mode, lock_dir_mode = file_mode | 0o006, lock_dir_mode | 0o007
    # a set-group-ID array directory (a shared project directory) passes its group on to the lock files
    return file_mode, lock_dir_mode | (dir_mode & stat.S_ISGID)


def _make_lock_dir(lock_dir: str) -> None:
    """Create ``lock_dir`` (a ``.shardkv-locks``) with the modes of :func:`lock_modes`, if it is missing."""
    if os.path.isdir(lock_dir):
        return
    array_dir = os.path.dirname(lock_dir)
    os.makedirs(array_dir, exist_ok=True)  # as the array's first write would make it
    _, dir_mode = lock_modes(array_dir)
    try:
        os.mkdir(lock_dir, dir_mode)
    except FileExistsError:
        return  # another writer made it first
    os.chmod(lock_dir, dir_mode)  # exactly: the umask only narrowed it


class _LockFile:
    """One exclusive ``flock`` of one lock file, taken through a descriptor opened ``O_RDWR`` for this hold.

    The file is created (``O_CREAT``, never through a symbolic link) with the
    mode of :func:`lock_modes`; a looser existing file owned by this account is
    narrowed to it. The descriptor is opened when the lock is taken and closed
    when it is released; it is never inherited by child processes. One object
    serves one hold: no two threads of a process take one lock file at once
    (they hold its in-process stripe first, :meth:`ShardLocks.hold`), which
    also keeps ``flock`` emulated by ``fcntl`` locks (NFS) exclusive.
    """

    def __init__(self, path: str, make: bool = True) -> None:
        self.path = path
        self.make = make  # False: an existing file only, its mode left as it is (a read-only store's wait)
        self.fd: int | None = None  # the open descriptor while held

    def _open(self) -> int | None:
        """A descriptor of the lock file, created if missing; ``None`` if it vanished between two opens."""
        flags = os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            try:
                return os.open(self.path, flags)  # made by an earlier hold: the usual case
            except FileNotFoundError:
                if not self.make:
                    return None
            mode, _ = lock_modes(os.path.dirname(os.path.dirname(self.path)))
            try:
                fd = os.open(self.path, flags | os.O_CREAT | os.O_EXCL, mode)
            except FileExistsError:
                return os.open(self.path, flags)  # another writer made it meanwhile
        except FileNotFoundError:
            return None  # removed between two opens (the array deleted): made again next round
        except PermissionError as exc:
            raise PermissionError(
                exc.errno,
                f"cannot open lock file {self.path!r} for writing: this account may not write the array "
                "(reading needs no lock)",
                self.path,
            ) from exc
        try:
            os.fchmod(fd, mode)  # exactly: the umask may have left a read bit without its write bit
        except BaseException:
            os.close(fd)
            raise
        return fd

    def acquire(self, deadline: float | None) -> bool:
        """Take the lock, waiting until ``deadline`` (``time.monotonic()``; ``None``: as long as it takes).

        Returns
        -------
        bool
            False if another open file description held it until ``deadline``.

        Raises
        ------
        PermissionError
            If this account cannot open the lock file for writing.
        FileNotFoundError
            If the lock file kept being removed while it was being taken.
        """
        reopens: Iterator[int] | None = None  # the retry loop, only once the file was removed
        while True:
            fd = self._open()
            if fd is not None:
                try:
                    locked = _flock(fd, deadline)
                    if locked and os.fstat(fd).st_nlink > 0:
                        self.fd = fd
                        return True
                except BaseException:
                    os.close(fd)
                    raise
                os.close(fd)
                if not locked:
                    return False
            # the file was removed (the array deleted) between our open and flock: lock the new one
            reopens = reopens or attempts(_REOPEN_ATTEMPTS, _REOPEN_BACKOFF, made=1)
            if next(reopens, None) is None:
                raise FileNotFoundError(errno.ENOENT, "lock file keeps being removed while it is taken", self.path)

    def release(self) -> None:
        """Let go of the lock and close its descriptor."""
        fd, self.fd = self.fd, None
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)


def _flock(fd: int, deadline: float | None) -> bool:
    """``flock(fd, LOCK_EX)``: blocking without a deadline, else tried until ``deadline`` through the retry loop."""
    if deadline is None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return True
    waits: Iterator[int] | None = None  # the retry loop, only while another holds it
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                raise
        waits = waits or attempts(None, LOCK_BACKOFF, deadline, made=1)
        if next(waits, None) is None:
            return False


class _Registry:
    """The process-wide pools of in-process lock stripes; rebuilt empty in a forked child."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._thread_pools: dict[int, list[threading.Lock]] = {}
        self._inherited: list[Any] = []

    def reset_after_fork(self) -> None:
        # the parent's locks may be held by its threads: the child must not use (or release) them
        self._inherited.append(self._thread_pools)
        self._guard = threading.Lock()
        self._thread_pools = {}

    def thread_pool(self, n_stripes: int) -> list[threading.Lock]:
        with self._guard:
            pool = self._thread_pools.get(n_stripes)
            if pool is None:
                pool = self._thread_pools[n_stripes] = [threading.Lock() for _ in range(n_stripes)]
            return pool


_REGISTRY = _Registry()
os.register_at_fork(after_in_child=_REGISTRY.reset_after_fork)


class _Held(threading.local):
    """The shard locks the current thread holds through :meth:`ShardLocks.hold`."""

    def __init__(self) -> None:
        self.holds = 0  # holds entered and not left
        self.fds: dict[tuple[str, int], int] = {}  # (lock directory, stripe) -> the held lock file's descriptor


_HELD = _Held()


def _forget_held_in_child() -> None:
    _HELD.holds = 0  # the child holds none of them
    _HELD.fds.clear()


os.register_at_fork(after_in_child=_forget_held_in_child)


def holds_shard_locks() -> bool:
    """Whether the current thread holds shard locks (it is inside a :meth:`ShardLocks.hold` of any location)."""
    return _HELD.holds > 0


def _left_hold() -> None:
    _HELD.holds -= 1


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
        ``"files"`` also takes a lock file per stripe, so that writers in other
        processes (and on other machines sharing a network file system) are
        excluded; ``"conditional"`` and ``"process"`` take in-process stripes
        only; ``"none"`` takes no lock. ``None`` (default): ``"files"`` where
        the location is a directory (``local_dir``), else ``"process"``.
    thread_stripes : int
        Size (locks) of the in-process stripe pool of the location's namespace.
    file_stripes : int
        Number of lock files (stripes) in an array's lock directory.
    timeout : float or None
        Longest wait (seconds, ``Options.lock_timeout``: checked there) for the
        locks of one :meth:`hold` (default :data:`DEFAULT_LOCK_TIMEOUT`); ``None``
        waits as long as it takes.

    Attributes
    ----------
    mode : {"files", "conditional", "process", "none"}
        The resolved mode.
    cross_process : bool
        Whether lock files are taken (mode ``"files"``).

    Raises
    ------
    ConfigurationError
        For a stripe count below 1, or mode ``"files"``
        where there is no directory to keep lock files in.
    """

    def __init__(
        self,
        location: StoreLocation,
        *,
        mode: Mode | None = None,
        thread_stripes: int = DEFAULT_THREAD_STRIPES,
        file_stripes: int = DEFAULT_FILE_STRIPES,
        timeout: float | None = DEFAULT_LOCK_TIMEOUT,
    ) -> None:
        if thread_stripes < 1 or file_stripes < 1:
            raise ConfigurationError(
                f"lock stripe counts must be >= 1, got thread_stripes={thread_stripes}, file_stripes={file_stripes}"
            )
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
        self.cross_process = mode == "files"
        self.thread_stripes = int(thread_stripes)
        self.file_stripes = int(file_stripes)
        self.timeout = timeout
        # the data's directory (also without lock files: in-process stripes are chosen by real paths)
        self._dir_root = os.path.abspath(root_dir) if root_dir is not None else None
        self._real_dirs: dict[str, str] = {}  # array key prefix -> its real directory
        self._prefix = f"{location.namespace!r}\0"

    def __reduce__(self) -> tuple[Any, ...]:
        # locks are never pickled: the new process finds them by location (and resolves directories again)
        options = {
            "mode": self.mode,
            "thread_stripes": self.thread_stripes,
            "file_stripes": self.file_stripes,
            "timeout": self.timeout,
        }
        return (_rebuild, (self.location, options))

    @classmethod
    def of_store(
        cls, kv: KVStore, concurrency: str = "auto", timeout: float | None = DEFAULT_LOCK_TIMEOUT
    ) -> ShardLocks:
        """The locks of ``kv`` in the mode ``concurrency`` resolves to there (:func:`resolve_mode`).

        Raises
        ------
        ConfigurationError
            As :func:`resolve_mode`; for a negative timeout.
        """
        return cls(kv.location, mode=resolve_mode(kv, concurrency), timeout=timeout)

    @property
    def optimistic(self) -> bool:
        """True when shard puts are conditioned on the generation read (mode ``"conditional"``)."""
        return self.mode == "conditional"

    @property
    def lock_dir(self) -> str | None:
        """The lock directory of root-level keys (a root array's), or ``None`` without lock files."""
        return self.lock_dir_for("") if self.cross_process else None

    def _real_dir(self, prefix: str) -> str:
        """The real directory (symbolic links resolved) of the array at key prefix ``prefix``."""
        found = self._real_dirs.get(prefix)
        if found is None:
            if self._dir_root is None:
                raise ConfigurationError(f"{self.location!r} is in no directory: no real directory of {prefix!r}")
            parts = [p for p in prefix.split("/") if p]
            found = os.path.realpath(os.path.join(self._dir_root, *parts))
            if len(self._real_dirs) >= _MAX_REAL_DIRS:
                self._real_dirs.clear()
            self._real_dirs[prefix] = found
        return found

    def lock_dir_for(self, prefix: str = "") -> str:
        """The lock directory of the shards of the array at key prefix ``prefix`` (``""``: the root's).

        Raises
        ------
        ConfigurationError
            For locks without lock files (``cross_process`` false).
        """
        if not self.cross_process:
            raise ConfigurationError(f"{self!r} keeps no lock files")
        return os.path.join(self._real_dir(prefix), LOCK_DIR)

    def __repr__(self) -> str:
        layer = f"files in {self.lock_dir!r}" if self.cross_process else "this process only"
        return f"ShardLocks({self.location!r}, {self.mode}: {layer})"

    # -- stripes --------------------------------------------------------------

    def _split(self, key: str, prefixes: Mapping[str, str] | None) -> tuple[str, str]:
        """``(array key prefix, key relative to the array)`` of a shard key."""
        prefix = "" if prefixes is None else prefixes.get(key, "")
        if not key.startswith(prefix):
            raise ConfigurationError(f"shard key {key!r} is not under its array prefix {prefix!r}")
        return prefix, key[len(prefix) :]

    def thread_stripes_of(self, shard_keys: Iterable[str], prefixes: Mapping[str, str] | None = None) -> list[int]:
        """Ascending distinct in-process stripes of the shards.

        Where the data is in a directory (with or without lock files), the
        stripe of a shard's lock file (its real array directory and file
        stripe), so every store of the process agrees whatever root or link it
        came through, and no two threads take one lock file at once; else the
        stripe of the shard's namespace and full path.
        """
        return sorted({stripe_of(self._where(k, prefixes)[0], self.thread_stripes) for k in shard_keys})

    def _where(self, key: str, prefixes: Mapping[str, str] | None = None) -> tuple[str, tuple[str, int] | None]:
        """What names a shard's lock in this process, and its lock file (lock directory, stripe) if it has one.

        The name is the lock file's (real array directory, file stripe) where the data is in a directory, else
        the shard's full path; the lock file is ``None`` without lock files.
        """
        if self._dir_root is None:
            return self._prefix + self.location.full_path(key), None
        prefix, rel = self._split(key, prefixes)
        real, stripe = self._real_dir(prefix), stripe_of(rel, self.file_stripes)
        return f"{self._prefix}{real}\0{stripe}", (os.path.join(real, LOCK_DIR), stripe) if self.cross_process else None

    def file_stripes_by_dir(
        self, shard_keys: Iterable[str], prefixes: Mapping[str, str] | None = None
    ) -> dict[str, list[int]]:
        """Lock directory -> ascending lock-file stripes of the shards, directories in ascending order.

        Parameters
        ----------
        shard_keys : iterable of str
            Shard keys relative to the store root.
        prefixes : mapping of str to str, optional
            Shard key -> key prefix of the array whose directory holds its lock
            file (``"group/arr/"``; absent or ``""``: the root). The stripe is
            chosen by the key after the prefix.

        Raises
        ------
        ConfigurationError
            If a shard key is not under its prefix.
        """
        if not self.cross_process:
            return {}
        by_dir: dict[str, set[int]] = {}
        for key in shard_keys:
            prefix, rel = self._split(key, prefixes)
            by_dir.setdefault(self.lock_dir_for(prefix), set()).add(stripe_of(rel, self.file_stripes))
        return {d: sorted(by_dir[d]) for d in sorted(by_dir)}

    # -- holding --------------------------------------------------------------

    @contextmanager
    def hold(
        self, shard_keys: Iterable[str], prefixes: Mapping[str, str] | None = None, make: bool = True
    ) -> Iterator[None]:
        """Hold the locks of every shard in ``shard_keys`` for the ``with`` block (none in mode ``"none"``).

        The in-process stripes are taken in ascending order, then the lock
        files in one global order (lock directory, stripe), never waiting for
        one while holding another (:meth:`_take_files`).

        Parameters
        ----------
        shard_keys : iterable of str
            Shard keys relative to the store root.
        prefixes : mapping of str to str, optional
            Shard key -> key prefix of its array (:meth:`file_stripes_by_dir`):
            its lock file is in that array's directory, the same file for
            every store root.
        make : bool
            False: take only lock files that exist, never make a lock directory
            or file nor change a mode (a read-only store's wait for a writer).

        Raises
        ------
        LockTimeoutError
            If the locks were not all obtained within ``timeout`` seconds
            (nothing is held when it is raised).
        FileNotFoundError
            Without ``make``, if a lock file is missing.
        """
        if self.mode == "none":
            yield
            return
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        keys = list(shard_keys)
        by_stripe: dict[int, list[str]] = {}  # in-process stripe -> its shards
        by_file: dict[tuple[str, int], list[str]] = {}  # (lock directory, stripe) -> its shards
        for key in keys:
            identity, file = self._where(key, prefixes)
            by_stripe.setdefault(stripe_of(identity, self.thread_stripes), []).append(key)
            if file is not None:
                by_file.setdefault(file, []).append(key)
        with ExitStack() as stack:
            _HELD.holds += 1  # counted until the stack closes, before its locks are released
            stack.callback(_left_hold)
            pool = _REGISTRY.thread_pool(self.thread_stripes)
            for stripe in sorted(by_stripe):
                lock = pool[stripe]
                # a wait longer than the platform allows (a timeout of inf) is as long as it takes
                wait = -1 if deadline is None else min(threading.TIMEOUT_MAX, max(0.0, deadline - time.monotonic()))
                if not lock.acquire(timeout=wait):
                    where = f"in-process lock stripe {stripe} of {self.location!r}"
                    raise LockTimeoutError(where, self.timeout or 0.0, _STRIPE_HELD, shard_key=by_stripe[stripe][0])
                stack.callback(lock.release)
            if by_file:
                self._take_files(stack, by_file, deadline, make)
            yield

    def hold_arrays(self, shards: Mapping[str, ShardedArray], make: bool = True) -> AbstractContextManager[None]:
        """:meth:`hold` of ``shards`` (shard key -> its array): each lock file is in its array's directory."""
        return self.hold(list(shards), {k: lock_prefix(arr) for k, arr in shards.items()}, make)

    def _take_files(
        self, stack: ExitStack, by_file: Mapping[tuple[str, int], list[str]], deadline: float | None, make: bool
    ) -> None:
        """Take the lock files of ``by_file`` (``(lock directory, stripe)`` -> its shards) onto ``stack``.

        Each round waits for one lock file holding none, then tries the others
        without waiting; a taken one lets go of all for the next round, which
        waits for it (``LockTimeoutError`` past ``deadline``, nothing held).
        """
        files = sorted(by_file)
        for lock_dir in sorted({d for d, _ in files}) if make else ():
            _make_lock_dir(lock_dir)
        waited = files[0]
        rounds: Iterator[int] | None = None  # the retry loop, only once a round found a lock file taken
        while True:
            with ExitStack() as round_stack:
                if not self._take_file(round_stack, waited, deadline, make):
                    break
                busy = None
                for file in files:
                    if file != waited and not self._take_file(round_stack, file, 0.0, make):
                        busy = file
                        break
                if busy is None:
                    stack.enter_context(round_stack.pop_all())
                    return
            waited = busy  # all let go: the next round waits for the one another writer holds
            rounds = rounds or attempts(None, LOCK_BACKOFF, deadline, made=1)
            if next(rounds, None) is None:
                break
        lock_file = os.path.join(waited[0], f"{waited[1]}.lock")
        raise LockTimeoutError(
            f"lock file {lock_file!r}", self.timeout or 0.0, _file_held(lock_file), lock_file, by_file[waited][0]
        )

    @staticmethod
    def _take_file(stack: ExitStack, file: tuple[str, int], deadline: float | None, make: bool) -> bool:
        """Take one lock file onto ``stack``, waiting until ``deadline`` (``0.0``: one try); False if it is taken."""
        lock_dir, stripe = file
        lock_file = _LockFile(os.path.join(lock_dir, f"{stripe}.lock"), make)
        if not lock_file.acquire(deadline):
            return False
        stack.callback(lock_file.release)
        if lock_file.fd is not None:  # always, once acquired: the descriptor an append's intent is recorded in
            _HELD.fds[file] = lock_file.fd
            stack.callback(_HELD.fds.pop, file, None)
        return True

    def has_lock_dir(self, arr: ShardedArray) -> bool:
        """Whether the lock directory of ``arr``'s shards exists (a writer with lock files made it; no I/O else)."""
        return self.cross_process and os.path.isdir(self.lock_dir_for(lock_prefix(arr)))

    def lock_file_fds(self, shards: Mapping[str, ShardedArray]) -> dict[str, int]:
        """Shard key -> descriptor of its lock file, for the shards of ``shards`` whose lock files this thread holds.

        The lock file of a shard is where an in-place append records its
        intent (:meth:`~shardkv.storage.kv.KVStore.update_tail`); empty
        without lock files (modes other than ``"files"``).
        """
        return {key: fd for key, (fd, _) in self.held_lock_files(shards).items()}

    def held_lock_files(self, shards: Mapping[str, ShardedArray]) -> dict[str, tuple[int, str]]:
        """As :meth:`lock_file_fds`, with each lock file's path: shard key -> (descriptor, path)."""
        if not self.cross_process:
            return {}
        out: dict[str, tuple[int, str]] = {}
        for key, arr in shards.items():
            file = self._where(key, {key: lock_prefix(arr)})[1]
            fd = None if file is None else _HELD.fds.get(file)
            if file is not None and fd is not None:
                out[key] = (fd, os.path.join(file[0], f"{file[1]}.lock"))
        return out


def _rebuild(location: StoreLocation, options: dict[str, Any]) -> ShardLocks:
    return ShardLocks(location, **options)
