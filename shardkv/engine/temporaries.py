"""Temporary files that killed writers left in a local store, and their removal.

An atomic local write (:mod:`shardkv.storage.fsmap_adapter`) writes a
temporary file beside its target and renames it over the target; a writer
killed in between leaves the temporary file. Such files are never read (the
adapters hide them) but take space, so they are removed once they are older
than an age guard (a live writer's is younger):

* :func:`remove_stale_temporaries` walks the whole store: ``shardkv verify
  --repair``, ``compact()``, a resumed ``convert``;
* :class:`DirectorySweeper` looks only in the directories a write is about to
  write into, each at most once per age guard (an hour) and process (a
  process-wide bounded table shared by every store, so a dask worker that
  rebuilds the store for each task does not list a directory again; sweeping
  more often would find nothing new, since only files older than the guard
  count). Opening a store over a tree of a million shards costs nothing up
  front.
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from collections import OrderedDict
from typing import Iterable

from shardkv.storage.adapters import TEMP_MARKER, FSMapAdapter, StoreAdapter
from shardkv.storage.kv import KVStore
from shardkv.storage.local import LocalStore

__all__ = ["DEFAULT_TEMP_AGE", "find_stale_temporaries", "remove_stale_temporaries", "DirectorySweeper"]

DEFAULT_TEMP_AGE = 3600.0
"""Seconds a temporary file must have been left untouched before it counts as stale.
A live writer finishes a shard in far less; a killed one never comes back."""

_SWEPT_MAX = 65536  # directories remembered as swept, per process (least recently swept forgotten first)


def _innermost(adapter: StoreAdapter) -> StoreAdapter:
    seen = 0
    while hasattr(adapter, "inner") and seen < 8:  # presenting wrappers keep the real adapter as .inner
        adapter = adapter.inner
        seen += 1
    return adapter


def _local_root(adapter: StoreAdapter | KVStore) -> str | None:
    """The local directory of a store whose writes leave temporary files, else ``None``."""
    if isinstance(adapter, LocalStore):
        return adapter.root
    if isinstance(adapter, KVStore):
        return None
    adapter = _innermost(adapter)
    if not isinstance(adapter, FSMapAdapter) or not adapter.supports_append:
        return None
    return str(adapter.fs._strip_protocol(adapter.root))


def _stale_in(dirpath: str, names: Iterable[str], now: float, min_age_seconds: float) -> list[str]:
    out = []
    for name in names:
        if TEMP_MARKER not in name:
            continue
        path = os.path.join(dirpath, name)
        try:
            age = now - os.stat(path).st_mtime
        except FileNotFoundError:  # its writer just renamed or removed it
            continue
        if age >= min_age_seconds:
            out.append(path)
    return out


def _remove(paths: Iterable[str]) -> list[str]:
    removed = []
    for path in paths:
        try:
            os.remove(path)
        except FileNotFoundError:
            continue
        removed.append(path)
    return removed


def find_stale_temporaries(adapter: StoreAdapter | KVStore, min_age_seconds: float = DEFAULT_TEMP_AGE) -> list[str]:
    """Temporary files of atomic local writes not modified for ``min_age_seconds`` seconds.

    Parameters
    ----------
    adapter : StoreAdapter
        The base store (as :attr:`ShardedStore.base`; wrappers are looked through).
    min_age_seconds : float
        Age guard (seconds since the last modification): a live writer's
        temporary file is younger and is left alone.

    Returns
    -------
    list of str
        Local paths, sorted. Empty for stores other than local directories
        (only they get temporary files: other stores write whole objects).
    """
    root = _local_root(adapter)
    if root is None:
        return []
    now = time.time()
    out = []
    for dirpath, _, files in os.walk(root):
        out.extend(_stale_in(dirpath, files, now, min_age_seconds))
    return sorted(out)


def remove_stale_temporaries(adapter: StoreAdapter | KVStore, min_age_seconds: float = DEFAULT_TEMP_AGE) -> list[str]:
    """Remove the files :func:`find_stale_temporaries` finds; returns the paths removed.

    Called by ``shardkv verify --repair``, ``compact()`` and a resumed
    ``convert``. Files that vanish meanwhile are skipped.
    """
    return _remove(find_stale_temporaries(adapter, min_age_seconds))


class _Swept:
    """The process-wide table of directories already swept (bounded, thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._dirs: OrderedDict[str, float] = OrderedDict()  # directory -> time.monotonic() of its sweep

    def claim(self, directory: str, every: float) -> bool:
        """True when ``directory`` was not swept in this process in the last ``every`` seconds (sweep it now)."""
        now = time.monotonic()
        with self._lock:
            last = self._dirs.get(directory)
            if last is not None and now - last < every:
                return False
            self._dirs[directory] = now
            self._dirs.move_to_end(directory)
            if len(self._dirs) > _SWEPT_MAX:
                self._dirs.popitem(last=False)
            return True

    def forget(self) -> None:
        """Forget every sweep (the next write into any directory sweeps it)."""
        with self._lock:
            self._dirs.clear()


_SWEPT = _Swept()


class DirectorySweeper:
    """Removes stale temporaries from the directories a store writes into, once per directory and process.

    Parameters
    ----------
    adapter : StoreAdapter
        The base store; stores that are not local directories get a sweeper that does nothing.
    min_age_seconds : float
        Age guard (seconds), as for :func:`find_stale_temporaries`.
    """

    def __init__(self, adapter: StoreAdapter, min_age_seconds: float = DEFAULT_TEMP_AGE) -> None:
        root = _local_root(adapter)
        self.root = None if root is None else os.path.realpath(root)
        self.min_age_seconds = float(min_age_seconds)

    def before_writing(self, keys: Iterable[str]) -> list[str]:
        """Sweep the directories of ``keys`` (store keys about to be written) not yet swept; the paths removed.

        Costs one table lookup per distinct directory once each has been swept.
        A missing directory (nothing written there yet) is skipped; any other
        error listing a directory or removing a file (permissions) is a
        ``RuntimeWarning``, never a failed write.
        """
        if self.root is None:
            return []
        removed: list[str] = []
        now = time.time()
        for parent in {key.rpartition("/")[0] for key in keys}:
            directory = os.path.join(self.root, *parent.split("/")) if parent else self.root
            if not _SWEPT.claim(directory, self.min_age_seconds):
                continue
            try:
                names = os.listdir(directory)
                removed.extend(_remove(_stale_in(directory, names, now, self.min_age_seconds)))
            except (FileNotFoundError, NotADirectoryError):
                continue  # nothing written there yet
            except OSError as exc:  # housekeeping only: the user's write goes on
                warnings.warn(
                    f"shardkv: could not remove stale temporary files in {directory!r}: {exc}",
                    RuntimeWarning,
                    stacklevel=3,
                )
        return removed
