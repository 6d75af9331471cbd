"""Adapters over the base store: the only module of shardkv that does I/O.

:func:`adapt` turns whatever the user passes (a ``dict`` or any
``MutableMapping``, a zarr-python 2 store, an fsspec ``FSMap``, an fsspec URL
or a local path) into a :class:`StoreAdapter`, a small uniform interface of
batch reads, ranged reads, batch writes and listings.

* :class:`FSMapAdapter` uses the filesystem directly: ranged and suffix reads
  (``cat_file(path, start, end)`` / ``cat_ranges``), concurrent batch reads and
  writes (``cat`` / ``pipe``). On local disks it bypasses fsspec's file
  objects: reads are ``open`` + ``pread`` + ``close``, and writes are atomic (a
  temporary file written from the value's parts, fsync'd, renamed over the
  target, the directory fsync'd: a crash never leaves a torn shard),
  positional updates included (:meth:`FSMapAdapter.write_at`, copy on write).
* :class:`MappingAdapter` works with any ``MutableMapping``; it cannot read
  ranges, so a ranged read fetches the whole value once and slices it. It uses
  a zarr-python 2 store's own ``getitems``/``setitems``/``delitems``/``listdir``
  when it has them.

"Not found" becomes ``KeyError`` (chained with ``from``); every other error of
the base store (permissions, network) propagates unchanged.

A value given to :meth:`StoreAdapter.set_many` is either one bytes-like object
or a ``list``/``tuple`` of them, its *parts* in order (a shard's chunks and
index): adapters that can write parts without joining them (local files,
``os.writev``) do so; the others join them once.
"""

import os
from collections.abc import MutableMapping
from typing import Any, Mapping

import fsspec
from fsspec.mapping import FSMap

from shardkv.errors import ConfigurationError
from shardkv.storage.base import LOCK_DIR, TEMP_MARKER, StoreAdapter
from shardkv.storage.buffers import Value, byte_parts, join_parts
from shardkv.storage.fsmap_adapter import FSMapAdapter
from shardkv.storage.mapping_adapter import MappingAdapter
from shardkv.storage.obstore_adapter import ObstoreAdapter, from_url, is_obstore_store

__all__ = [
    "StoreAdapter", "MappingAdapter", "FSMapAdapter", "adapt", "TEMP_MARKER", "LOCK_DIR", "Value", "join_parts",
    "byte_parts",
]  # fmt: skip


def adapt(store: Any, storage_options: Mapping[str, Any] | None = None) -> StoreAdapter:
    """Wrap a user's store in the best adapter for it.

    Parameters
    ----------
    store : str, os.PathLike, fsspec.FSMap, obstore store, MutableMapping or StoreAdapter
        An fsspec URL (``"s3://bucket/data.zarr"``) or local path; an fsspec
        mapper; an obstore store object (``obstore.store.S3Store``, ...); a
        zarr-python 2 ``DirectoryStore`` or ``FSStore`` (their files are read
        directly, with ranges); any other ``MutableMapping``.
    storage_options : mapping, optional
        Passed to fsspec for a URL. With ``"client": "obstore"`` the URL is
        opened with obstore instead, and the other options go to
        ``obstore.store.from_url``.

    Raises
    ------
    TypeError
        If ``store`` is none of these.
    ConfigurationError
        If obstore is asked for and not installed; for a zarr store that
        rewrites keys (an ``FSStore`` with ``key_separator="/"``, any store
        with ``normalize_keys=True``).
    """
    if isinstance(store, StoreAdapter):
        return store
    if isinstance(store, os.PathLike):
        store = os.fspath(store)
    options = dict(storage_options or {})
    if isinstance(store, str) and options.get("client") == "obstore":
        options.pop("client")
        return from_url(store, options)
    if isinstance(store, str):
        return FSMapAdapter.from_fsmap(fsspec.get_mapper(store, **options))
    if isinstance(store, FSMap):
        return FSMapAdapter.from_fsmap(store)
    cls = type(store).__name__
    if is_obstore_store(store):
        return ObstoreAdapter(store)
    if getattr(store, "normalize_keys", False) is True:
        raise ConfigurationError(
            f"a {cls} with normalize_keys=True lowercases the keys shardkv writes (shards, zarr.json and the "
            "lock directories would no longer match their arrays): open the store without it, or by path"
        )
    if cls == "DirectoryStore" and isinstance(getattr(store, "path", None), str):
        return FSMapAdapter(fsspec.filesystem("file"), store.path)
    if cls == "FSStore" and hasattr(store, "map"):
        if getattr(store, "key_separator", None) not in (None, "."):
            raise ConfigurationError(
                f"an FSStore with key_separator={store.key_separator!r} rewrites the keys shardkv "
                "writes ('zarr.json' would be stored as 'zarr/json', unreadable by other Zarr readers): "
                "pass its URL or its .map instead"
            )
        return FSMapAdapter.from_fsmap(store.map)  # keys as given: its files are read directly
    if isinstance(store, MutableMapping):
        return MappingAdapter(store)
    raise TypeError(
        f"cannot use {cls} as a store: pass a MutableMapping, an fsspec FSMap, a URL or a path"
    )

