"""Per-shard locks that belong to the data, not to the object, and the ``concurrency=`` option.

A shard write is a read-modify-write: every writer of a shard holds that
shard's lock from the read of the old shard to the write of the new one, or
detects that it raced. The mode is resolved once per engine from the store's
:class:`~shardkv.storage.kv.Capabilities` (the modes and what each guarantees:
docs/user-guide.md, "Concurrency"):

* ``"files"``: in-process stripes plus lock files; puts are unconditional.
* ``"conditional"``: in-process stripes plus puts conditioned on the
  generation read (a writer that lost its race re-reads, re-merges, retries).
* ``"process"``: in-process stripes only; ``"none"``: no locks.
* ``"auto"``: ``"files"`` where the store has lock directories,
  ``"conditional"`` where it has a conditional put or lives in this process,
  otherwise a ``ConfigurationError`` that asks for an explicit choice.

:class:`ShardLocks` gives the locks for a
:class:`~shardkv.storage.location.StoreLocation`; every ``ShardLocks`` of one
location shares them. Two layers, taken in this order:

1. **In the process**: one process-wide pool of ``threading.Lock`` stripes; a
   shard takes the stripe of a CRC-32 of its namespace and full path (for data
   in a directory: of its real array directory and its key in that array).
2. **Across processes** (where the location has a ``local_dir``): an ``flock``
   of ``<array>/.shardkv-locks/<stripe>.lock`` in the real directory of the
   array that owns the shard (the store root for the 2022 draft layout), so
   every store takes the same file for a shard whatever root or symbolic link
   it came through. Lock files are opened ``O_RDWR`` and get the array
   directory's write permissions (docs/user-guide.md, "Concurrency"): an
   account that cannot write the array cannot block its writers.

Stripes are safe: every writer of a shard takes that shard's stripe; shards
that share a stripe only wait for each other. Deadlock freedom:
:meth:`ShardLocks.hold` takes its thread stripes in ascending order, then the
file stripes of its first lock directory in ascending order, and only *tries*
those of other directories (if one is taken it lets go of everything, backs
off and starts again). A hold nested in another of the same thread (stacked
transformers) skips the stripes its thread holds. Locks are never pickled, and
a forked child starts with an empty registry (it never releases the parent's
lock files: ``flock`` locks belong to the open file, which the child shares).
"""

from __future__ import annotations

import errno
import fcntl
import os
import random
import stat
import threading
import time
import zlib
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Any, Literal

from shardkv.errors import ConfigurationError, LockTimeoutError
from shardkv.keys.space import ShardedArray
from shardkv.storage.kv import LOCK_DIR, KVStore
from shardkv.storage.location import StoreLocation

__all__ = [
    "ShardLocks", "LOCK_DIR", "stripe_of", "DEFAULT_THREAD_STRIPES", "DEFAULT_FILE_STRIPES",
    "Concurrency", "Mode", "CONCURRENCY_MODES", "resolve_mode", "lock_prefix",
]

Concurrency = Literal["auto", "files", "conditional", "process", "none"]
"""How writers of one shard keep each other's chunks (see :class:`~shardkv.ShardedStore`)."""
Mode = Literal["files", "conditional", "process", "none"]
CONCURRENCY_MODES: tuple[str, ...] = ("auto", "files", "conditional", "process", "none")

DEFAULT_THREAD_STRIPES = 1024
"""Thread lock stripes per location namespace (bytes of memory: about 100 per lock)."""

DEFAULT_FILE_STRIPES = 64
"""Lock files per array (empty files in ``<array>/.shardkv-locks/``)."""

_MAX_FILE_LOCKS = 4096
"""Lock file objects a process keeps at most; unheld ones are dropped beyond it."""
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
                f"concurrency='files' needs a store in a directory; {kv.location!r} is not one "
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
            f"concurrency='conditional' needs a store with conditional writes; {_store_name(kv)} at "
            f"{kv.location!r} has none{hint}: pass concurrency='process' or 'none'"
        )
    raise ConfigurationError(
        f"the store {_store_name(kv)} at {kv.location!r} offers neither lock files nor conditional "
        f"writes{hint}, so concurrent writers of one shard could lose updates: pass concurrency='process' "
        "(safe within this process only) or concurrency='none' (one writer per shard)"
    )


def _store_name(kv: KVStore) -> str:
    """The class of the user's store behind ``kv`` (a mapping, an obstore store, a filesystem), for messages."""
    for attribute in ("mapping", "store", "fs"):
        user = getattr(kv, attribute, None)
        if user is not None:
            return type(user).__name__
    return type(kv).__name__


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

    Raises
    ------
    OSError
        If ``array_dir`` cannot be examined (``FileNotFoundError``, ``PermissionError``).
    """
    dir_mode = os.stat(array_dir).st_mode
    file_mode, lock_dir_mode = 0o600, 0o700
    if dir_mode & stat.S_IWGRP:
        file_mode, lock_dir_mode = file_mode | 0o060, lock_dir_mode | 0o070
    if dir_mode & stat.S_IWOTH:
        file_mode, lock_dir_mode = file_mode | 0o006, lock_dir_mode | 0o007
    # a set-group-ID array directory (a shared project directory) passes its group on to the lock files
    return file_mode, lock_dir_mode | (dir_mode & stat.S_ISGID)


def _too_open(found: int, wanted: int) -> bool:
    """Whether permission bits ``found`` grant what ``wanted`` does not, or a read without its write."""
    found &= 0o777
    readers_not_writers = (found & 0o444) & ~((found & 0o222) << 1)
    return bool(found & ~wanted or readers_not_writers)


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
    """One exclusive ``flock`` of one lock file, taken through a descriptor opened ``O_RDWR``.

    The file is created (``O_CREAT``, never through a symbolic link) with the
    mode of :func:`lock_modes`; a looser existing file owned by this account is
    narrowed to it. The descriptor is opened for each hold and closed when the
    lock is released; it is never inherited by child processes.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd: int | None = None  # the open descriptor while held
        self._mode: int | None = None  # from the array directory, at the first open

    def _open(self) -> int:
        flags = os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        first = self._mode is None
        if self._mode is None:
            self._mode, _ = lock_modes(os.path.dirname(os.path.dirname(self.path)))
        mode = self._mode
        for _ in range(100):  # a file removed between the two opens (the array deleted) is made again
            try:
                try:
                    fd, created = os.open(self.path, flags | os.O_CREAT | os.O_EXCL, mode), True
                except FileExistsError:
                    fd, created = os.open(self.path, flags), False
            except FileNotFoundError:
                continue
            except PermissionError as exc:
                raise PermissionError(
                    exc.errno,
                    f"cannot open lock file {self.path!r} for writing: this account may not write the array "
                    "(reading needs no lock)",
                    self.path,
                ) from exc
            break
        else:
            raise FileNotFoundError(errno.ENOENT, "lock file keeps disappearing while being opened", self.path)
        try:
            if created:
                os.fchmod(fd, mode)  # exactly: the umask may have left a read bit without its write bit
            elif first:
                st = os.fstat(fd)
                if _too_open(st.st_mode, mode) and st.st_uid == os.geteuid():
                    os.fchmod(fd, mode)  # left 0644 by an older shardkv
        except BaseException:
            os.close(fd)
            raise
        return fd

    def acquire(self, timeout: float | None) -> None:
        """Take the lock, waiting at most ``timeout`` seconds (``None``: as long as it takes).

        Raises
        ------
        LockTimeoutError
            If another open file description holds it for longer than ``timeout``.
        PermissionError
            If this account cannot open the lock file for writing.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        for _ in range(100):  # another round only if the file was removed under us
            fd = self._open()
            try:
                if deadline is None:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                    locked = True
                else:
                    locked = self._try_until(fd, deadline)
                if locked and os.fstat(fd).st_nlink > 0:
                    self.fd = fd
                    return
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)
            if not locked:
                raise LockTimeoutError(self.path, timeout or 0.0)
            # the file was removed (the array deleted) between our open and flock: lock the new one
        raise FileNotFoundError(errno.ENOENT, "lock file keeps being removed while it is locked", self.path)

    @staticmethod
    def _try_until(fd: int, deadline: float) -> bool:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                    raise
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(0.001, left))

    def release(self) -> None:
        """Let go of the lock and close its descriptor."""
        fd, self.fd = self.fd, None
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)


class _Registry:
    """The process-wide tables of lock stripes; rebuilt empty in a forked child."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._thread_pools: dict[int, list[threading.Lock]] = {}
        self._file_locks: dict[tuple[str, int], tuple[threading.Lock, _LockFile]] = {}
        self._inherited: list[Any] = []

    def reset_after_fork(self) -> None:
        # the parent's locks may be held by its threads: the child must not use (or release) them
        self._inherited.append((self._thread_pools, self._file_locks))
        self._guard = threading.Lock()
        self._thread_pools = {}
        self._file_locks = {}

    def thread_pool(self, n_stripes: int) -> list[threading.Lock]:
        with self._guard:
            pool = self._thread_pools.get(n_stripes)
            if pool is None:
                pool = self._thread_pools[n_stripes] = [threading.Lock() for _ in range(n_stripes)]
            return pool

    def file_lock(self, lock_dir: str, stripe: int) -> tuple[threading.Lock, _LockFile]:
        key = (lock_dir, stripe)
        with self._guard:
            entry = self._file_locks.get(key)
            if entry is None:
                if len(self._file_locks) >= _MAX_FILE_LOCKS:
                    self._drop_unheld()
                # one lock file object per process and stripe, used by one thread at a time (the paired mutex)
                path = os.path.join(lock_dir, f"{stripe}.lock")
                entry = self._file_locks[key] = (threading.Lock(), _LockFile(path))
            return entry

    def _drop_unheld(self) -> None:
        """Forget the file locks no thread holds (guard held), so the table stays bounded.

        Safe even for an entry a thread fetched and is about to use: a second
        ``_LockFile`` of the same file opens its own file description, and
        ``flock`` locks of two descriptions exclude each other in one process too.
        """
        for key, (mutex, _) in list(self._file_locks.items()):
            if mutex.acquire(blocking=False):
                try:
                    del self._file_locks[key]
                finally:
                    mutex.release()


_REGISTRY = _Registry()
os.register_at_fork(after_in_child=_REGISTRY.reset_after_fork)


class _Held(threading.local):
    """The locks the current thread holds through :meth:`ShardLocks.hold` (token -> nesting depth)."""

    def __init__(self) -> None:
        self.depth: dict[tuple[Any, ...], int] = {}


_HELD = _Held()
os.register_at_fork(after_in_child=lambda: _HELD.depth.clear())  # the child holds none of them


def _held_by_this_thread(token: tuple[Any, ...]) -> bool:
    return _HELD.depth.get(token, 0) > 0


def _note_held(stack: ExitStack, token: tuple[Any, ...]) -> None:
    """Record ``token`` as held by this thread until ``stack`` closes (before its lock is released)."""
    depth = _HELD.depth
    depth[token] = depth.get(token, 0) + 1

    def unnote() -> None:
        left = depth[token] - 1
        if left:
            depth[token] = left
        else:
            del depth[token]

    stack.callback(unnote)


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
        Longest wait (seconds) for each lock; ``None`` waits as long as it takes.

    Attributes
    ----------
    mode : {"files", "conditional", "process", "none"}
        The resolved mode.
    cross_process : bool
        Whether lock files are taken (mode ``"files"``).

    Raises
    ------
    ConfigurationError
        For a stripe count below 1, a negative timeout, or mode ``"files"``
        where there is no directory to keep lock files in.
    """

    def __init__(
        self,
        location: StoreLocation,
        *,
        mode: Mode | None = None,
        thread_stripes: int = DEFAULT_THREAD_STRIPES,
        file_stripes: int = DEFAULT_FILE_STRIPES,
        timeout: float | None = None,
    ) -> None:
        if thread_stripes < 1 or file_stripes < 1:
            raise ConfigurationError(
                f"lock stripe counts must be >= 1, got thread_stripes={thread_stripes}, file_stripes={file_stripes}"
            )
        if timeout is not None and timeout < 0:
            raise ConfigurationError(f"lock timeout must be >= 0 seconds or None, got {timeout}")
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
        options = {"mode": self.mode, "thread_stripes": self.thread_stripes,
                   "file_stripes": self.file_stripes, "timeout": self.timeout}
        return (_rebuild, (self.location, options))

    @classmethod
    def of_store(cls, kv: KVStore, concurrency: str = "auto", timeout: float | None = None) -> ShardLocks:
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

        By namespace and full path; where the data is in a directory (with or
        without lock files), by the real array directory and the key in it
        (the file stripe's identity), so every store of the process agrees
        whatever root or link it came through.
        """
        return sorted({stripe_of(self._identity(k, prefixes), self.thread_stripes) for k in shard_keys})

    def _identity(self, key: str, prefixes: Mapping[str, str] | None = None) -> str:
        """What names a shard for locking in this process: its namespace and full path, or real directory and key."""
        if self._dir_root is not None:
            prefix, rel = self._split(key, prefixes)
            return f"{self._prefix}{self._real_dir(prefix)}\0{rel}"
        return self._prefix + self.location.full_path(key)

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
    def hold(self, shard_keys: Iterable[str], prefixes: Mapping[str, str] | None = None) -> Iterator[None]:
        """Hold the locks of every shard in ``shard_keys`` for the ``with`` block (none in mode ``"none"``).

        Parameters
        ----------
        shard_keys : iterable of str
            Shard keys relative to the store root.
        prefixes : mapping of str to str, optional
            Shard key -> key prefix of its array (:meth:`file_stripes_by_dir`):
            its lock file is in that array's directory, the same file for
            every store root.

        Raises
        ------
        LockTimeoutError
            If a lock was not obtained within ``timeout`` seconds (nothing is
            held when it is raised).
        """
        if self.mode == "none":
            yield
            return
        keys = list(shard_keys)
        identities = [self._identity(k, prefixes) for k in keys]
        # nested in a hold of other shards (stacked transformers): the stripes this thread holds are skipped;
        # a shard this thread holds already is waited for as any writer would (contention, never skipped)
        skip_held = not any(_held_by_this_thread(("shard", i)) for i in identities)
        with ExitStack() as stack:
            pool = _REGISTRY.thread_pool(self.thread_stripes)
            for stripe in sorted({stripe_of(i, self.thread_stripes) for i in identities}):
                token = ("thread", id(pool), stripe)
                if skip_held and _held_by_this_thread(token):
                    continue  # a nested hold: this thread holds it already
                lock = pool[stripe]
                if not lock.acquire(timeout=-1 if self.timeout is None else self.timeout):
                    raise LockTimeoutError(f"thread stripe {stripe} of {self.location!r}", self.timeout or 0.0)
                stack.callback(lock.release)
                _note_held(stack, token)
            by_dir = self.file_stripes_by_dir(keys, prefixes)
            if skip_held:
                by_dir = {d: [s for s in ss if not _held_by_this_thread(("file", d, s))] for d, ss in by_dir.items()}
                by_dir = {d: ss for d, ss in by_dir.items() if ss}
            if len(by_dir) == 1:
                ((lock_dir, stripes),) = by_dir.items()
                _make_lock_dir(lock_dir)
                for stripe in stripes:
                    self._hold_file_stripe(stack, lock_dir, stripe, self.timeout)
            elif by_dir:
                stack.enter_context(self._hold_dirs(by_dir))
            for identity in identities:
                _note_held(stack, ("shard", identity))
            yield

    def hold_arrays(self, shards: Mapping[str, ShardedArray]) -> AbstractContextManager[None]:
        """:meth:`hold` of ``shards`` (shard key -> its array): each lock file is in its array's directory."""
        return self.hold(list(shards), {k: lock_prefix(arr) for k, arr in shards.items()})

    @contextmanager
    def _hold_dirs(self, by_dir: Mapping[str, list[int]]) -> Iterator[None]:
        """Hold the stripes of several lock directories: wait for the first one's, try the others'."""
        started = time.monotonic()
        dirs = list(by_dir)
        for lock_dir in dirs:
            _make_lock_dir(lock_dir)
        attempt = 0
        while True:
            attempt += 1
            left = None if self.timeout is None else self.timeout - (time.monotonic() - started)
            if left is not None and left < 0:
                raise LockTimeoutError(dirs[-1], self.timeout or 0.0)
            with ExitStack() as stack:
                for stripe in by_dir[dirs[0]]:
                    self._hold_file_stripe(stack, dirs[0], stripe, left)
                try:
                    for lock_dir in dirs[1:]:
                        for stripe in by_dir[lock_dir]:
                            self._hold_file_stripe(stack, lock_dir, stripe, 0.0)
                except LockTimeoutError:
                    pass  # taken by another writer: let go of everything, back off, start again
                else:
                    held = stack.pop_all()
                    break
            time.sleep(random.uniform(0.0, min(0.05, 0.001 * attempt)))
        with held:
            yield

    def _hold_file_stripe(self, stack: ExitStack, lock_dir: str, stripe: int, timeout: float | None) -> None:
        token = ("file", lock_dir, stripe)
        mutex, lock_file = _REGISTRY.file_lock(lock_dir, stripe)
        started = time.monotonic()
        if not mutex.acquire(timeout=-1 if timeout is None else max(0.0, timeout)):
            raise LockTimeoutError(lock_file.path, timeout or 0.0)
        stack.callback(mutex.release)
        left = None if timeout is None else max(0.0, timeout - (time.monotonic() - started))
        lock_file.acquire(left)
        stack.callback(lock_file.release)
        _note_held(stack, token)


def _rebuild(location: StoreLocation, options: dict[str, Any]) -> ShardLocks:
    return ShardLocks(location, **options)
