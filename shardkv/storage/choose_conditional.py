"""Choosing the :class:`~shardkv.storage.conditional.ConditionalStore` of a store adapter.

Kept apart from :mod:`shardkv.storage.conditional` so that store-specific
implementations in their own modules (:mod:`shardkv.storage.obstore_conditional`)
can subclass the interface without an import cycle.
"""

from __future__ import annotations

from typing import Any

from shardkv.storage.adapters import FSMapAdapter, MappingAdapter
from shardkv.storage.conditional import ConditionalStore, InProcessConditional, S3Conditional
from shardkv.storage.obstore_adapter import ObstoreAdapter
from shardkv.storage.obstore_conditional import obstore_conditional_for

__all__ = ["conditional_store_for", "supports_conditional_writes"]

_BASES = (FSMapAdapter, MappingAdapter, ObstoreAdapter)


def conditional_store_for(adapter: Any, for_writes: bool = True) -> ConditionalStore | None:
    """The :class:`ConditionalStore` for a store adapter, or ``None`` when the store offers none.

    s3fs filesystems get :class:`~shardkv.storage.conditional.S3Conditional`;
    obstore S3, GCS, Azure and memory stores get
    :class:`~shardkv.storage.obstore_conditional.ObstoreConditional`; fsspec
    ``memory://`` and in-memory mappings get
    :class:`~shardkv.storage.conditional.InProcessConditional`, an emulation
    that holds only among writers of this process: a ``dict``,
    ``zarr.MemoryStore``, a ``KVStore`` over a ``dict``, and every mapping
    that is not a zarr-python 2 store (shardkv cannot know where a
    third-party mapping keeps its data: one shared by several processes is
    the caller's to serialise, with ``concurrency="none"`` and shard-aligned
    writes). Local and network file systems (obstore's ``LocalStore`` and
    zarr's ``DirectoryStore`` subclasses included) get ``None`` (they use
    lock files, :class:`shardkv.engine.locks.ShardLocks`), and so do the
    zarr-python 2 stores that keep their data elsewhere (``SQLiteStore``,
    ``ZipStore``, ``RedisStore``, ... :func:`~shardkv.storage.mapping_adapter.zarr2_kind`)
    and every other store. Wrapping adapters (with an ``inner`` adapter) are
    looked through.

    Parameters
    ----------
    adapter : StoreAdapter
        The base store's adapter.
    for_writes : bool
        True (the default): the store is for compare-and-swap writes. False:
        for reads pinned to generations only
        (:func:`shardkv.engine.generation_reads.pinned_store_for`), which an
        obstore ``S3Store`` with conditional puts disabled still offers.

    Raises
    ------
    ConfigurationError
        With ``for_writes``, for an obstore ``S3Store`` whose conditional puts
        are disabled (:func:`~shardkv.storage.obstore_conditional.obstore_conditional_for`).
    """
    for _ in range(16):  # wrappers nest a few levels at most
        if isinstance(adapter, _BASES):
            break
        adapter = getattr(adapter, "inner", None)
        if adapter is None:
            return None
    if isinstance(adapter, MappingAdapter):
        if adapter.kind != "memory":  # its data outlives this process: an in-process emulation would mislead
            return None
        return InProcessConditional.for_mapping(adapter.mapping, adapter.location)
    if isinstance(adapter, ObstoreAdapter):
        return obstore_conditional_for(adapter, for_writes)
    if not isinstance(adapter, FSMapAdapter):
        return None
    fs = adapter.fs
    protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    if "memory" in protocols:
        return InProcessConditional.for_fs(fs, adapter.root, adapter.location)
    if ("s3" in protocols or "s3a" in protocols) and hasattr(fs, "_call_s3"):
        return S3Conditional(fs, adapter.root)
    return None


def supports_conditional_writes(adapter: Any) -> bool:
    """True when :func:`conditional_store_for` gives a conditional store for ``adapter``.

    Raises
    ------
    ConfigurationError
        As :func:`conditional_store_for`.
    """
    return conditional_store_for(adapter) is not None
