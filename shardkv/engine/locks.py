"""Per-shard locks that belong to the data, not to the object (issue 9).

Sharding turns independent chunk writes into read-modify-writes of a shared
shard, so every writer of a shard must hold that shard's lock from the read of
the old shard to the write of the new one. :class:`ShardLocks` gives that lock
for a :class:`~shardkv.storage.location.StoreLocation`; every ``ShardLocks`` of
one location shares it, however many stores, adapters or threads there are.

Two layers, taken in this order:

1. **In the process**: a process-wide registry keeps one fixed pool of
   ``threading.Lock`` *stripes* (per stripe count, so normally one pool of
   1024 locks for the whole process); a shard uses the stripe chosen by a
   stable hash of its location namespace and full path. The registry is
   bounded whatever the number of stores, locations or shards.
2. **Across processes** (local and network file systems, the default where the
   location has a ``local_dir``): one ``filelock.FileLock`` per *file stripe*,
   lock files ``<top>/.shardkv-locks/<stripe>.lock`` (``file_stripes`` files at
   most per hierarchy, never listed by the store adapters). ``<top>`` is the
   top of the Zarr hierarchy the store root belongs to: the root itself, or
   the highest directory reached by going up through parents that are Zarr
   groups (hold a ``zarr.json`` or ``.zgroup``), looked up at every
   :meth:`ShardLocks.hold`. The stripe is chosen by a stable hash of the shard
   key relative to ``<top>``. So stores opened at different roots of one
   hierarchy (``/data`` and ``/data/group``) take the same lock file for a
   shard, and so do processes that mount the directory at different paths.
   Lock files stay out of the arrays' own directories, which other readers
   (zarr 2.18's transformer) list.

Why stripes are safe: a stripe lock covers a fixed set of shards, and every
writer of a shard takes the stripe of that shard, so two writers of one shard
always exclude each other. Two shards sharing a stripe only wait for each
other without need (false contention, rarer with more stripes); nothing is
ever left unlocked. A bounded number of lock files also means nothing to
clean up as shards come and go: lock files must never be deleted while any
process may use them (a process that re-creates a deleted lock file locks a
different inode), so :meth:`ShardLocks.remove_lock_files` is only for a store
being deleted.

Deadlock freedom: :meth:`ShardLocks.hold` takes all the thread stripes of the
call in ascending order, then all its file stripes in ascending order, and
gives them back in reverse. Every holder follows that one total order, and
nothing waits for a thread stripe while holding a file stripe. ``hold`` is not
re-entrant: do not nest two ``hold`` calls in one thread.

Fork and spawn: locks are never pickled (a :class:`ShardLocks` pickles as its
location and options and finds its locks again in the new process's registry).
After ``os.fork`` the child starts with an empty registry; lock files the
parent held at the fork stay referenced in the child, never released by it
(releasing them would release the parent's lock: ``flock`` locks belong to the
open file, which the child shares).
"""

from __future__ import annotations

import os
import threading
import time
import zlib
from contextlib import ExitStack, contextmanager
from typing import Any, Iterable, Iterator

import filelock

from shardkv.errors import ConfigurationError, LockTimeoutError
from shardkv.storage.adapters import LOCK_DIR
from shardkv.storage.location import StoreLocation, location_of

__all__ = ["ShardLocks", "LOCK_DIR", "stripe_of", "hierarchy_top", "DEFAULT_THREAD_STRIPES", "DEFAULT_FILE_STRIPES"]

DEFAULT_THREAD_STRIPES = 1024
"""Thread lock stripes per location namespace (bytes of memory: about 100 per lock)."""

DEFAULT_FILE_STRIPES = 64
"""Lock files per hierarchy (empty files in ``<top>/.shardkv-locks/``)."""

_GROUP_MARKERS = ("zarr.json", ".zgroup")
"""A directory holding one of these is a Zarr group: a store root below it shares its locks."""
_MAX_DEPTH = 64  # parents looked at, at most


def hierarchy_top(root: str) -> tuple[str, str]:
    """The top directory of the Zarr hierarchy ``root`` belongs to, and ``root``'s key prefix under it.

    Goes up from ``root`` while the parent is a Zarr group (holds a
    ``zarr.json`` or ``.zgroup``). Returns ``(top, prefix)`` with ``prefix``
    ``""`` when ``root`` is the top, else ``"group/sub/"``.
    """
    top = os.path.abspath(root)
    for _ in range(_MAX_DEPTH):
        parent = os.path.dirname(top)
        if parent == top or not any(os.path.isfile(os.path.join(parent, m)) for m in _GROUP_MARKERS):
            break
        top = parent
    rel = os.path.relpath(os.path.abspath(root), top)
    return top, "" if rel == "." else rel.replace(os.sep, "/") + "/"


def stripe_of(path: str, n_stripes: int) -> int:
    """The stripe (0 ≤ stripe < ``n_stripes``) of a path; the same in every process and on every run.

    Python's ``hash`` of a str changes between processes, so a CRC-32 of the
    UTF-8 path is used instead.
    """
    return zlib.crc32(path.encode("utf-8")) % n_stripes


class _Registry:
    """The process-wide tables of lock stripes; rebuilt empty in a forked child."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._pid = os.getpid()
        self._thread_pools: dict[int, list[threading.Lock]] = {}
        self._file_locks: dict[tuple[str, int], tuple[threading.Lock, filelock.BaseFileLock]] = {}
        self._inherited: list[Any] = []

    def reset_after_fork(self) -> None:
        # the parent's locks may be held by its threads: the child must not use (or release) them
        self._inherited.append((self._thread_pools, self._file_locks))
        self._guard = threading.Lock()
        self._pid = os.getpid()
        self._thread_pools = {}
        self._file_locks = {}

    def _check_pid(self) -> None:
        if self._pid != os.getpid():  # forked without the at-fork hook (should not happen)
            self.reset_after_fork()

    def thread_pool(self, n_stripes: int) -> list[threading.Lock]:
        self._check_pid()
        with self._guard:
            pool = self._thread_pools.get(n_stripes)
            if pool is None:
                pool = self._thread_pools[n_stripes] = [threading.Lock() for _ in range(n_stripes)]
            return pool

    def file_lock(self, lock_dir: str, stripe: int) -> tuple[threading.Lock, filelock.BaseFileLock]:
        self._check_pid()
        key = (lock_dir, stripe)
        with self._guard:
            entry = self._file_locks.get(key)
            if entry is None:
                # one FileLock object per process and stripe, used by one thread at a time
                # (the paired threading.Lock), so its re-entrance counter never hides a second thread
                path = os.path.join(lock_dir, f"{stripe}.lock")
                entry = self._file_locks[key] = (
                    threading.Lock(),
                    filelock.FileLock(path, thread_local=False, is_singleton=False),
                )
            return entry


_REGISTRY = _Registry()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_REGISTRY.reset_after_fork)


class ShardLocks:
    """Per-shard locks of one base store location, shared by every holder of that location.

    Parameters
    ----------
    location : StoreLocation or None
        Where the data lives (:func:`~shardkv.storage.location.location_of` an
        adapter). ``None`` (a store without a known location) gives locks
        private to this object: only its own users are serialised.
    cross_process : bool or None
        Also take a lock file per stripe, so that writers in other processes
        (and on other machines sharing a network file system) are excluded.
        ``None`` (default): where the location is a directory (``local_dir``).
        ``True`` for a location without one raises ``ConfigurationError``.
    thread_stripes : int
        Size (locks) of the in-process stripe pool of the location's namespace.
    file_stripes : int
        Number of lock files (stripes) in the store's lock directory.
    lock_root : str or None
        Directory that holds ``.shardkv-locks/`` (default: the top of the
        hierarchy the store root belongs to, :func:`hierarchy_top`); shard
        keys are then hashed as given. Every process must use the same one.
    timeout : float or None
        Longest wait (seconds) for each lock; ``None`` waits as long as it takes.

    Raises
    ------
    ConfigurationError
        For a stripe count below 1, a negative timeout, or cross-process locks
        where there is no directory to keep lock files in.
    """

    def __init__(
        self,
        location: StoreLocation | None,
        *,
        cross_process: bool | None = None,
        thread_stripes: int = DEFAULT_THREAD_STRIPES,
        file_stripes: int = DEFAULT_FILE_STRIPES,
        lock_root: str | None = None,
        timeout: float | None = None,
    ) -> None:
        if thread_stripes < 1 or file_stripes < 1:
            raise ConfigurationError(
                f"lock stripe counts must be >= 1, got thread_stripes={thread_stripes}, file_stripes={file_stripes}"
            )
        if timeout is not None and timeout < 0:
            raise ConfigurationError(f"lock timeout must be >= 0 seconds or None, got {timeout}")
        if lock_root is not None:
            lock_root = os.path.realpath(lock_root)  # one spelling: one FileLock object per file and process
        root_dir = lock_root if lock_root is not None else (location.local_dir if location is not None else None)
        if cross_process is None:
            cross_process = root_dir is not None
        if cross_process and root_dir is None:
            raise ConfigurationError(
                f"cross-process locks need a directory for lock files; location {location!r} has none "
                "(object stores use conditional writes instead: shardkv.storage.conditional)"
            )
        self.location = location
        self.cross_process = bool(cross_process)
        self.thread_stripes = int(thread_stripes)
        self.file_stripes = int(file_stripes)
        self.lock_root = lock_root
        self.timeout = timeout
        self._root_dir = os.path.abspath(root_dir) if self.cross_process else None  # type: ignore[arg-type]
        self._prefix = f"{location.namespace!r}\0" if location is not None else ""
        self._private_pool = [threading.Lock() for _ in range(thread_stripes)] if location is None else None

    @classmethod
    def for_adapter(cls, adapter: Any, **options: Any) -> ShardLocks:
        """The locks of the data behind a store adapter (see :class:`ShardLocks` for ``options``)."""
        return cls(location_of(adapter), **options)

    def __reduce__(self) -> tuple[Any, ...]:
        # locks are never pickled: the new process finds them by location
        return (
            _rebuild,
            (
                self.location,
                self.cross_process,
                self.thread_stripes,
                self.file_stripes,
                self.lock_root,
                self.timeout,
            ),
        )

    @property
    def lock_dir(self) -> str | None:
        """The directory of the lock files (looked up now: the hierarchy may have grown), or ``None``."""
        home = self._lock_home()
        return None if home is None else os.path.join(home[0], LOCK_DIR)

    def _lock_home(self) -> tuple[str, str] | None:
        """``(directory holding .shardkv-locks, prefix of the store root's keys there)``; ``None`` without files."""
        if self._root_dir is None:
            return None
        if self.lock_root is not None:
            return self._root_dir, ""
        return hierarchy_top(self._root_dir)

    def __repr__(self) -> str:
        layer = f"files in {self.lock_dir!r}" if self.cross_process else "this process only"
        return f"ShardLocks({self.location!r}, {layer})"

    # -- stripes --------------------------------------------------------------

    def thread_stripes_of(self, shard_keys: Iterable[str]) -> list[int]:
        """Ascending distinct in-process stripes of the shards (by namespace and full path)."""
        location = self.location
        if location is None:
            return sorted({stripe_of(k, self.thread_stripes) for k in shard_keys})
        return sorted({stripe_of(self._prefix + location.full_path(k), self.thread_stripes) for k in shard_keys})

    def file_stripes_of(self, shard_keys: Iterable[str], prefix: str | None = None) -> list[int]:
        """Ascending distinct lock-file stripes of the shards (by key relative to the hierarchy's top); [] without files.

        ``prefix``: the store root's key prefix under the top (looked up when ``None``).
        """
        if not self.cross_process:
            return []
        if prefix is None:
            home = self._lock_home()
            prefix = "" if home is None else home[1]
        return sorted({stripe_of(prefix + k, self.file_stripes) for k in shard_keys})

    def _pool(self) -> list[threading.Lock]:
        if self._private_pool is not None:
            return self._private_pool
        return _REGISTRY.thread_pool(self.thread_stripes)

    # -- holding --------------------------------------------------------------

    @contextmanager
    def hold(self, shard_keys: Iterable[str]) -> Iterator[None]:
        """Hold the locks of every shard in ``shard_keys`` for the ``with`` block.

        Parameters
        ----------
        shard_keys : iterable of str
            Shard keys relative to the store root (the keys the adapter uses).

        Raises
        ------
        LockTimeoutError
            If a lock was not obtained within ``timeout`` seconds (nothing is
            held when it is raised).
        """
        keys = list(shard_keys)
        with ExitStack() as stack:
            pool = self._pool()
            for stripe in self.thread_stripes_of(keys):
                lock = pool[stripe]
                if not lock.acquire(timeout=-1 if self.timeout is None else self.timeout):
                    raise LockTimeoutError(f"thread stripe {stripe} of {self.location!r}", self.timeout or 0.0)
                stack.callback(lock.release)
            home = self._lock_home() if keys else None
            if home is not None:
                lock_dir = os.path.join(home[0], LOCK_DIR)
                os.makedirs(lock_dir, exist_ok=True)
                for stripe in self.file_stripes_of(keys, home[1]):
                    self._hold_file_stripe(stack, lock_dir, stripe)
            yield

    def _hold_file_stripe(self, stack: ExitStack, lock_dir: str, stripe: int) -> None:
        mutex, flock = _REGISTRY.file_lock(lock_dir, stripe)
        started = time.monotonic()
        if not mutex.acquire(timeout=-1 if self.timeout is None else self.timeout):
            raise LockTimeoutError(os.path.join(lock_dir, f"{stripe}.lock"), self.timeout or 0.0)
        stack.callback(mutex.release)
        left = None if self.timeout is None else max(0.0, self.timeout - (time.monotonic() - started))
        try:
            flock.acquire(timeout=-1 if left is None else left, poll_interval=0.001)
        except filelock.Timeout as exc:
            raise LockTimeoutError(flock.lock_file, self.timeout or 0.0) from exc
        stack.callback(flock.release)

    def remove_lock_files(self) -> int:
        """Delete the lock directory of a store that is being deleted; returns the files removed.

        Only safe when no process uses the store: a writer that still holds or
        is about to open a lock file would no longer exclude the others.
        """
        lock_dir = self.lock_dir
        if lock_dir is None or not os.path.isdir(lock_dir):
            return 0
        removed = 0
        for name in os.listdir(lock_dir):
            if name.endswith(".lock"):
                try:
                    os.remove(os.path.join(lock_dir, name))
                    removed += 1
                except FileNotFoundError:
                    continue
        try:
            os.rmdir(lock_dir)
        except OSError:
            pass  # something else lives there: leave it
        return removed


def _rebuild(
    location: StoreLocation | None,
    cross_process: bool,
    thread_stripes: int,
    file_stripes: int,
    lock_root: str | None,
    timeout: float | None,
) -> ShardLocks:
    return ShardLocks(
        location,
        cross_process=cross_process,
        thread_stripes=thread_stripes,
        file_stripes=file_stripes,
        lock_root=lock_root,
        timeout=timeout,
    )
