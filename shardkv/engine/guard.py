"""Which guarantee concurrent shard writers get, and the locks that give it (the ``concurrency=`` option).

A shard write is a read-modify-write, so writers of one shard are serialised
or detect that they raced. The mode is resolved once per engine from the
store's :class:`~shardkv.storage.kv.Capabilities` (the modes and what each
guarantees: docs/user-guide.md, "Concurrency"):

* ``"files"``: in-process stripes plus lock files
  (:class:`~shardkv.engine.locks.ShardLocks`); puts are unconditional.
* ``"conditional"``: in-process stripes plus puts conditioned on the
  generation read (a writer that lost its race re-reads, re-merges, retries).
* ``"process"``: in-process stripes only; ``"none"``: no locks.
* ``"auto"``: ``"files"`` where the store has lock directories,
  ``"conditional"`` where it has a conditional put or lives in this process,
  otherwise a ``ConfigurationError`` that asks for an explicit choice.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Literal, Mapping

from shardkv.engine.locks import ShardLocks
from shardkv.errors import ConfigurationError
from shardkv.keys.space import ShardedArray
from shardkv.storage.kv import KVStore

__all__ = ["Concurrency", "Mode", "CONCURRENCY_MODES", "Guard", "resolve_mode", "lock_prefix"]

Concurrency = Literal["auto", "files", "conditional", "process", "none"]
Mode = Literal["files", "conditional", "process", "none"]
CONCURRENCY_MODES: tuple[str, ...] = ("auto", "files", "conditional", "process", "none")


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
    if concurrency in ("none", "process"):
        return concurrency  # type: ignore[return-value]
    if concurrency == "files" or (concurrency == "auto" and caps.lock_dir):
        if not caps.lock_dir:
            raise ConfigurationError(
                f"concurrency='files' needs a store in a directory; {kv.location!r} is not one "
                "(object stores: concurrency='conditional')"
            )
        return "files"
    if caps.conditional_put or caps.in_process:
        return "conditional"
    hint = (" (an object store needs conditional puts: an obstore S3Store with conditional_put='etag', the "
            "default, and without AWS_CONDITIONAL_PUT=disabled)") if caps.round_trips and caps.stamps == "native" else ""
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


class Guard:
    """The locks held around shard read-modify-writes on one store, by resolved mode.

    Parameters
    ----------
    kv : KVStore
        The store (its capabilities choose the mode, its location names the locks).
    concurrency : {"auto", "files", "conditional", "process", "none"}
        The requested guarantee.
    timeout : float or None
        Longest wait (seconds) for each lock; ``None`` waits as long as it takes.

    Attributes
    ----------
    mode : {"files", "conditional", "process", "none"}
        The resolved mode.
    locks : ShardLocks or None
        The locks (``None`` in mode ``"none"``).

    Raises
    ------
    ConfigurationError
        As :func:`resolve_mode`; for a negative timeout.
    """

    def __init__(self, kv: KVStore, concurrency: str = "auto", timeout: float | None = None) -> None:
        self.mode: Mode = resolve_mode(kv, concurrency)
        self.locks: ShardLocks | None = None
        if self.mode != "none":
            self.locks = ShardLocks(kv.location, cross_process=self.mode == "files", timeout=timeout)

    @property
    def optimistic(self) -> bool:
        """True when shard puts are conditioned on the generation read (mode ``"conditional"``)."""
        return self.mode == "conditional"

    def hold(self, shards: Mapping[str, ShardedArray]) -> AbstractContextManager[None]:
        """The locks of ``shards`` (shard key -> its array) for a ``with`` block; a no-op in mode ``"none"``.

        Each shard's lock file (mode ``"files"``) is in its array's directory.

        Raises
        ------
        LockTimeoutError
            If a lock was not obtained within the timeout (nothing is held then).
        """
        if self.locks is None:
            return nullcontext()
        return self.locks.hold(list(shards), {k: lock_prefix(arr) for k, arr in shards.items()})
