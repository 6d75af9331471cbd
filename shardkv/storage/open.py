"""``open_kv``: the one place that turns what a user passes as a store into a :class:`~shardkv.storage.kv.KVStore`.

Which store each kind gets: docs/architecture.md ("Where generations come from").
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any

import fsspec
from fsspec.implementations.dirfs import DirFileSystem
from fsspec.implementations.local import LocalFileSystem
from fsspec.mapping import FSMap

from shardkv.errors import ConfigurationError
from shardkv.storage.fsspec import FsspecStore
from shardkv.storage.kv import KVStore
from shardkv.storage.local import LocalStore
from shardkv.storage.mapping import MappingStore, zarr2_storage
from shardkv.storage.obstore import ObstoreStore, is_obstore_store, open_obstore_url
from shardkv.storage.s3 import S3Store


def kv_of_fs(fs: fsspec.AbstractFileSystem, root: str) -> KVStore:
    """The store of ``root`` inside an fsspec filesystem.

    fsspec's own local filesystem, and a ``DirFileSystem`` over it, become a
    :class:`LocalStore` of the directory; s3fs an :class:`S3Store`; anything
    else an :class:`FsspecStore`.
    """
    if isinstance(fs, DirFileSystem) and type(fs.fs) is LocalFileSystem and isinstance(fs.path, str):
        return LocalStore(fs.fs._strip_protocol(fs._join(root)))
    if type(fs) is LocalFileSystem:  # a subclass may change what a read does (or count it): FsspecStore
        return LocalStore(fs._strip_protocol(root))
    s3fs = sys.modules.get("s3fs")  # imported by fsspec for s3:// before any s3fs filesystem exists
    if s3fs is not None and isinstance(fs, s3fs.S3FileSystem):
        return S3Store(fs, root)
    return FsspecStore(fs, root)


def _obstore_kv(store: Any) -> KVStore:
    from obstore.store import LocalStore as ObstoreLocalStore  # obstore made ``store``: it is imported

    if isinstance(store, ObstoreLocalStore):
        return LocalStore(os.fspath(store.prefix) if store.prefix else "/")
    return ObstoreStore(store)


def open_kv(store: Any, storage_options: Mapping[str, Any] | None = None) -> KVStore:
    """The :class:`KVStore` of what a user passes as a store (see the module docstring).

    Parameters
    ----------
    store : str, os.PathLike, fsspec.FSMap, obstore store, MutableMapping or KVStore
        An fsspec URL (``"s3://bucket/data.zarr"``) or local path; an fsspec
        mapper; an obstore store object; a zarr-python 2 store; any other
        ``MutableMapping``. A :class:`KVStore` is returned as it is.
    storage_options : mapping, optional
        Passed to fsspec for a URL. With ``"client": "obstore"`` the URL is
        opened with obstore instead, and the other options go to
        ``obstore.store.from_url``.

    Returns
    -------
    KVStore

    Raises
    ------
    TypeError
        If ``store`` is none of these.
    ConfigurationError
        If obstore is asked for and not installed; for a zarr store that
        rewrites keys (an ``FSStore`` with ``key_separator="/"``, any store
        with ``normalize_keys=True``).
    """
    if isinstance(store, KVStore):
        return store
    if isinstance(store, os.PathLike):
        store = os.fspath(store)
    options = dict(storage_options or {})
    if isinstance(store, str) and options.get("client") == "obstore":
        options.pop("client")
        return _obstore_kv(open_obstore_url(store, options))
    if isinstance(store, str):
        fs, root = fsspec.core.url_to_fs(store, **options)
        return kv_of_fs(fs, root)
    if isinstance(store, FSMap):
        return kv_of_fs(store.fs, store.root)
    cls = type(store).__name__
    if is_obstore_store(store):
        return _obstore_kv(store)
    if getattr(store, "normalize_keys", False) is True:
        raise ConfigurationError(
            f"a {cls} with normalize_keys=True lowercases the keys shardkv writes (shards, zarr.json and the "
            "lock directories would no longer match their arrays): open the store without it, or by path"
        )
    zs = zarr2_storage()  # zarr 2's stores by class, where the user's process has imported zarr 2
    if zs is not None and type(store) in (zs.DirectoryStore, zs.TempStore):  # keys as files (subclasses nest them)
        return LocalStore(store.path)
    if zs is not None and isinstance(store, zs.FSStore):
        if getattr(store, "key_separator", None) not in (None, "."):
            raise ConfigurationError(
                f"an FSStore with key_separator={store.key_separator!r} rewrites the keys shardkv "
                "writes ('zarr.json' would be stored as 'zarr/json', unreadable by other Zarr readers): "
                "pass its URL or its .map instead"
            )
        return kv_of_fs(store.map.fs, store.map.root)  # keys as given: its files are read directly
    if isinstance(store, MutableMapping):
        return MappingStore(store)
    raise TypeError(f"cannot use {cls} as a store: pass a MutableMapping, an fsspec FSMap, a URL or a path")
