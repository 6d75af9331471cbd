"""Which guarantee concurrent writers get: the ``concurrency=`` option (issue 9, item 3).

A shard write is a read-modify-write, so writers of one shard must be
serialised, or must detect that they raced. What a base store allows decides
how; what the user gets is never left implicit:

``"files"``
    In-process stripe locks plus lock files in each array's ``.shardkv-locks/``
    (:class:`~shardkv.engine.locks.ShardLocks`): every writer of the
    directory, in any process (on any machine that mounts it with working
    ``flock``), is excluded. Local and network file systems (obstore's
    ``LocalStore`` too: it offers no conditional update; zarr-python 2's
    ``DirectoryStore`` subclasses such as ``NestedDirectoryStore`` and
    ``N5Store``; an fsspec ``DirFileSystem`` over a local directory).
``"conditional"``
    In-process stripe locks (so threads of one process do not race each
    other) plus compare-and-swap writes (:mod:`shardkv.storage.conditional`):
    a writer whose shard changed since it read it re-reads, re-merges and
    retries. S3 through s3fs (ETag, ``If-Match``); obstore ``S3Store``,
    ``GCSStore``, ``AzureStore`` and ``MemoryStore``
    (:mod:`shardkv.storage.obstore_conditional`: ``PutMode`` puts; an
    ``S3Store`` with ``conditional_put="disabled"`` is refused, never
    downgraded; a shard emptied there stays as an empty shard object, obstore
    having no conditional delete); ``memory://`` and in-memory mappings
    (emulated: writers in this process only; a ``dict``, ``zarr.MemoryStore``,
    and any mapping that is not a zarr-python 2 store). The zarr-python 2
    stores that keep their data elsewhere (``SQLiteStore``, ``ZipStore``,
    ``DBMStore``, ``RedisStore``, a remote ``FSStore`` with a
    ``key_separator``, ...) get no emulation: ``"auto"`` asks for a choice.
``"process"``
    In-process stripe locks only: threads and stores of this process are
    safe; other processes writing the same shards can lose updates. Never
    chosen by ``"auto"``.
``"none"``
    No locks: the caller promises one writer per shard (shard-aligned work).
``"auto"`` (the default)
    ``"files"`` where the store is a directory, ``"conditional"`` where the
    store offers conditional writes, otherwise a ``ConfigurationError`` that
    asks for an explicit choice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from shardkv.engine.locks import ShardLocks
from shardkv.errors import ConfigurationError
from shardkv.storage.choose_conditional import conditional_store_for
from shardkv.storage.conditional import ConditionalStore
from shardkv.storage.location import location_of

__all__ = ["Concurrency", "ConcurrencyPlan", "plan_concurrency", "CONCURRENCY_MODES"]

Concurrency = Literal["auto", "files", "conditional", "process", "none"]
CONCURRENCY_MODES: tuple[str, ...] = ("auto", "files", "conditional", "process", "none")


@dataclass(frozen=True)
class ConcurrencyPlan:
    """What the engine uses for one base store.

    Attributes
    ----------
    mode : {"files", "conditional", "process", "none"}
        The resolved mode (never ``"auto"``).
    locks : ShardLocks or None
        Held around every shard read-modify-write (``None`` for ``"none"``).
    conditional : ConditionalStore or None
        For ``"conditional"``: the generation-aware reads and writes.
    """

    mode: Literal["files", "conditional", "process", "none"]
    locks: ShardLocks | None
    conditional: ConditionalStore | None


def plan_concurrency(adapter: Any, concurrency: Concurrency = "auto", **lock_options: Any) -> ConcurrencyPlan:
    """Resolve ``concurrency`` for the store behind ``adapter``.

    Parameters
    ----------
    adapter : StoreAdapter
        The base store's adapter (wrappers with ``inner`` are looked through).
    concurrency : {"auto", "files", "conditional", "process", "none"}
        The requested guarantee (see the module docstring).
    **lock_options
        Passed to :class:`~shardkv.engine.locks.ShardLocks` (``timeout``, stripe counts).

    Raises
    ------
    ConfigurationError
        For an unknown mode; for ``"files"`` where the store is not a
        directory; for ``"conditional"`` where the store offers no conditional
        writes; for ``"auto"`` where it offers neither.
    """
    if concurrency not in CONCURRENCY_MODES:
        raise ConfigurationError(f"concurrency must be one of {CONCURRENCY_MODES}, got {concurrency!r}")
    location = location_of(adapter)
    if concurrency == "none":
        return ConcurrencyPlan("none", None, None)
    if concurrency == "process":
        return ConcurrencyPlan("process", ShardLocks(location, cross_process=False, **lock_options), None)
    has_dir = location is not None and location.local_dir is not None
    if concurrency == "files" or (concurrency == "auto" and has_dir):
        if not has_dir:
            raise ConfigurationError(
                f"concurrency='files' needs a store in a directory; {location!r} is not one "
                "(object stores: concurrency='conditional')"
            )
        return ConcurrencyPlan("files", ShardLocks(location, cross_process=True, **lock_options), None)
    conditional = conditional_store_for(adapter)
    if conditional is None:
        raise ConfigurationError(
            f"the store {_store_name(adapter)} at {location!r} offers neither lock files nor conditional "
            f"writes, so concurrent writers of one shard could lose updates: pass concurrency='process' "
            "(safe within this process only) or concurrency='none' (one writer per shard)"
        )
    return ConcurrencyPlan("conditional", ShardLocks(location, cross_process=False, **lock_options), conditional)


def _store_name(adapter: Any) -> str:
    """The class of the user's store behind ``adapter`` (a mapping, an obstore store, a filesystem), for messages."""
    for _ in range(16):  # wrappers nest a few levels at most
        inner = getattr(adapter, "inner", None)
        if inner is None:
            break
        adapter = inner
    for attribute in ("mapping", "store", "fs"):
        user = getattr(adapter, attribute, None)
        if user is not None:
            return type(user).__name__
    return type(adapter).__name__
