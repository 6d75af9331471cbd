"""An obstore store as base store: ranged, suffix and concurrent reads, conditional puts.

`obstore <https://developmentseed.org/obstore/>`_ wraps the Rust
``object_store`` crate (S3, GCS, Azure, local, memory). :func:`adapt` picks
:class:`ObstoreAdapter` for any obstore store object (``S3Store``,
``MemoryStore``, ...), and for a URL when ``storage_options`` holds
``{"client": "obstore"}`` (the other options go to ``obstore.store.from_url``).

* Every byte range is one GET with a ``Range`` header (a suffix range is
  ``bytes=-n``); several requests run concurrently on a thread pool (obstore
  releases the GIL while it waits), so a batch of ``n`` ranges costs ``n``
  requests and about one round trip.
* Values come back as ``memoryview`` objects over obstore's own buffers: no
  copy into Python ``bytes``.
* Values given as parts (a ``list``/``tuple`` of buffers) are handed to
  obstore as they are; it assembles the single PUT body itself.
* :meth:`ObstoreAdapter.get_versioned` and :meth:`ObstoreAdapter.put_if` give
  compare-and-swap on one key (``PutMode``): create only if absent, or
  replace only if the stored version is still the one read; the engine's
  shard transactions use :class:`shardkv.storage.obstore_conditional.ObstoreConditional`.
* :attr:`ObstoreAdapter.location` names the data (bucket, prefix, endpoint),
  so every adapter over it shares the in-process shard locks; an adapter
  pickles as its store (S3, GCS, Azure, local stores pickle; ``MemoryStore``
  does not).

"Not found" (``obstore.exceptions.NotFoundError``) becomes ``KeyError``;
other errors propagate. This module imports ``obstore`` only when an adapter
is made, so shardkv works without it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Hashable

from shardkv.errors import ConfigurationError, PreconditionFailedError
from shardkv.format.ranges import ByteRange
from shardkv.storage.base import StoreAdapter, file_validator, hidden
from shardkv.storage.buffers import Value, byte_parts
from shardkv.storage.location import StoreLocation

__all__ = ["ObstoreAdapter", "Version", "is_obstore_store", "from_url", "store_location"]

_MAX_CONCURRENCY = 16  # requests in flight per batch


@dataclass(frozen=True)
class Version:
    """The version of a stored value, as the store reports it (for :meth:`ObstoreAdapter.put_if`).

    Attributes
    ----------
    e_tag : str or None
        The entity tag (S3: the ``ETag`` header).
    version : str or None
        The object version, where the bucket keeps versions.
    """

    e_tag: str | None
    version: str | None = None


def is_obstore_store(store: Any) -> bool:
    """True if ``store`` is an obstore store object (checked without importing obstore)."""
    module = type(store).__module__ or ""
    return module == "obstore" or module.startswith(("obstore.", "obstore._"))


def from_url(url: str, options: Mapping[str, Any] | None = None) -> ObstoreAdapter:
    """An :class:`ObstoreAdapter` over ``url`` (``s3://bucket/prefix``, ``file:///path``, ...).

    Parameters
    ----------
    url : str
        The store's URL; its path is the prefix of every key.
    options : mapping, optional
        Passed to ``obstore.store.from_url`` (e.g. ``endpoint``,
        ``region``, ``skip_signature``, ``client_options``).

    Raises
    ------
    ConfigurationError
        If obstore is not installed.
    """
    _obstore()
    from obstore.store import from_url as obstore_from_url

    return ObstoreAdapter(obstore_from_url(url, **dict(options or {})))


def _root(*parts: Any) -> str:
    return "/".join(str(p).strip("/") for p in parts if p and str(p).strip("/"))


def store_location(store: Any) -> StoreLocation:
    """The :class:`StoreLocation` of an obstore store object (see :attr:`ObstoreAdapter.location`)."""
    kind = type(store).__name__
    config = getattr(store, "config", None) or {}
    prefix = getattr(store, "prefix", None)
    if kind == "S3Store":
        return StoreLocation(("s3", config.get("endpoint")), _root(config.get("bucket"), prefix))
    if kind == "GCSStore":
        return StoreLocation(("gs", None), _root(config.get("bucket"), prefix))
    if kind == "AzureStore":
        return StoreLocation(("az", config.get("account_name")), _root(config.get("container_name"), prefix))
    if kind == "HTTPStore":
        return StoreLocation(("http", str(getattr(store, "url", ""))), "")
    if kind == "LocalStore":
        real = os.path.realpath(str(prefix) if prefix else "/")
        return StoreLocation(("file",), real, real)
    return StoreLocation(("obstore", kind, id(store)), "")  # MemoryStore: this object's data


def _obstore() -> Any:
    try:
        import obstore
    except ImportError as exc:
        raise ConfigurationError("the obstore client was asked for but the package is not installed (pip install obstore)") from exc
    return obstore


class ObstoreAdapter(StoreAdapter):
    """An obstore store as base store.

    Parameters
    ----------
    store : obstore store
        Any obstore store object; a prefix set on the store applies to every key.
    max_concurrency : int
        Requests in flight at once for a batch.

    Raises
    ------
    ConfigurationError
        If obstore is not installed.
    """

    supports_ranges = True

    def __init__(self, store: Any, max_concurrency: int = _MAX_CONCURRENCY) -> None:
        self._obs = _obstore()
        from obstore.exceptions import NotFoundError, PreconditionError
        try:
            from obstore.exceptions import AlreadyExistsError
        except ImportError:  # older obstore
            AlreadyExistsError = PreconditionError  # noqa: N806

        self.store = store
        self._not_found = (NotFoundError, FileNotFoundError)  # obstore raises the builtin for a missing key
        self._conflict = (PreconditionError, AlreadyExistsError)
        self._max_concurrency = max(1, int(max_concurrency))
        self.round_trips = type(store).__name__ not in ("MemoryStore", "LocalStore")  # an object store
        self._pool: ThreadPoolExecutor | None = None
        self._local_dir = store_location(store).local_dir  # LocalStore: its resolved directory

    # -- identity and pickling (issue 9) ------------------------------------------

    @property
    def location(self) -> StoreLocation:
        """The data the store reaches, for shared locks (see :mod:`shardkv.storage.location`).

        Object stores: ``("s3", endpoint)`` (as for s3fs, so s3fs and obstore
        writers of one bucket in a process share locks), ``("gs", None)``,
        ``("az", account)``, ``("http", url)``, with root ``bucket/prefix``.
        ``LocalStore``: ``("file",)`` and the resolved directory (a
        ``local_dir``: lock files work there). ``MemoryStore``: that store object.
        """
        return store_location(self.store)

    def validator(self, key: str) -> Hashable:
        """A cheap fingerprint that changes when the value is rewritten; ``None`` where there is none.

        ``LocalStore`` (its location has a ``local_dir``): the file's
        ``(size, mtime_ns, inode)``, ``"missing"`` when absent, as for local
        fsspec files (:func:`~shardkv.storage.base.file_validator`). Other
        stores: ``None`` (object stores pin chunk reads to generations instead,
        :mod:`shardkv.engine.generation_reads`; so does ``MemoryStore``).

        Raises
        ------
        OSError
            Errors of ``os.stat`` other than a missing file.
        """
        if self._local_dir is None:
            return None
        return file_validator(os.path.join(self._local_dir, key))

    def __reduce__(self) -> tuple[Any, ...]:
        # the store pickles as its configuration (obstore >= 0.5); the pool and module are rebuilt
        return (type(self), (self.store, self._max_concurrency))

    # -- concurrency ---------------------------------------------------------------

    def _map(self, fn: Any, items: Sequence[Any]) -> list[Any]:
        """``[fn(x) for x in items]``, concurrently when there is more than one."""
        if len(items) <= 1:
            return [fn(x) for x in items]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._max_concurrency, thread_name_prefix="shardkv-obstore")
        return list(self._pool.map(fn, items))

    def _fetch(self, key: str, byte_range: ByteRange | None) -> Any:
        """One GET: the bytes as a memoryview, ``None`` for a missing key."""
        obs = self._obs
        try:
            if byte_range is None:
                return memoryview(obs.get(self.store, key).bytes())
            if byte_range.is_suffix:
                return memoryview(obs.get(self.store, key, options={"range": {"suffix": -byte_range.start}}).bytes())
            if byte_range.stop is None:
                return memoryview(obs.get(self.store, key, options={"range": {"offset": byte_range.start}}).bytes())
            if byte_range.stop == byte_range.start:
                return memoryview(b"") if self.contains(key) else None
            return memoryview(obs.get_range(self.store, key, start=byte_range.start, end=byte_range.stop))
        except self._not_found:
            return None

    # -- reads ---------------------------------------------------------------------

    def get(self, key: str) -> memoryview:
        value = self._fetch(key, None)
        if value is None:
            raise KeyError(key)
        return value

    def get_many(self, keys: Sequence[str]) -> dict[str, memoryview]:
        values = self._map(lambda k: self._fetch(k, None), list(keys))
        return {k: v for k, v in zip(keys, values) if v is not None}

    def get_ranges(self, requests: Sequence[tuple[str, ByteRange]]) -> list[memoryview | None]:
        return self._map(lambda req: self._fetch(*req), list(requests))

    def contains(self, key: str) -> bool:
        try:
            self._obs.head(self.store, key)
        except self._not_found:
            return False
        return True

    def size(self, key: str) -> int:
        try:
            return int(self._obs.head(self.store, key)["size"])
        except self._not_found as exc:
            raise KeyError(key) from exc

    def iter_keys(self, prefix: str = "") -> Iterator[str]:
        base = prefix.rstrip("/")
        for batch in self._obs.list(self.store, base or None):
            for meta in batch:
                key = meta["path"]
                if key.startswith(prefix) and not hidden(key):
                    yield key

    def list_dir(self, path: str = "") -> list[str]:
        result = self._obs.list_with_delimiter(self.store, path.strip("/") or None)
        names = {p.rstrip("/").rsplit("/", 1)[-1] for p in result["common_prefixes"]}
        names |= {m["path"].rsplit("/", 1)[-1] for m in result["objects"]}
        return sorted(n for n in names if n and not hidden(n))

    # -- writes --------------------------------------------------------------------

    def _put(self, key: str, value: Value, mode: Any = None) -> Any:
        parts = byte_parts(value)  # flat uint8 views, as obstore wants them; no copy
        body: Any = parts[0] if len(parts) == 1 else (parts or b"")
        # one PUT: parts are assembled by obstore (use_multipart=False), never by Python
        return self._obs.put(self.store, key, body, mode=mode, use_multipart=False)

    def set_many(self, values: Mapping[str, Value]) -> None:
        self._map(lambda kv: self._put(*kv), list(values.items()))

    def delete_many(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        if keys:
            # S3 DELETE of a missing key succeeds; other stores may say NotFound
            for key in keys:
                try:
                    self._obs.delete(self.store, key)
                except self._not_found:
                    continue

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    # -- compare-and-swap ------------------------------------------------------------

    def get_versioned(self, key: str) -> tuple[memoryview, Version]:
        """A value with its version, for a later :meth:`put_if`.

        Raises
        ------
        KeyError
            If ``key`` is not stored.
        """
        try:
            result = self._obs.get(self.store, key)
        except self._not_found as exc:
            raise KeyError(key) from exc
        meta = result.meta
        return memoryview(result.bytes()), Version(meta.get("e_tag"), meta.get("version"))

    def put_if(self, key: str, value: Value, expected: Version | None) -> Version:
        """Store ``value`` only if ``key`` is still as the caller saw it (one conditional PUT).

        Parameters
        ----------
        key : str
            The key.
        value : bytes-like or sequence of bytes-like
            The new value, or its parts.
        expected : Version or None
            ``None``: store only if ``key`` does not exist (``PutMode`` "create").
            Else: store only if the stored version still matches (``UpdateVersion``).

        Returns
        -------
        Version
            The version of the value just stored.

        Raises
        ------
        PreconditionFailedError
            If ``key`` exists (``expected`` None) or was changed since ``expected``
            was read; nothing is stored then.
        """
        if expected is None:
            mode: Any = "create"
        else:
            mode = {k: v for k, v in (("e_tag", expected.e_tag), ("version", expected.version)) if v is not None}
        try:
            result = self._put(key, value, mode)
        except self._conflict as exc:
            raise PreconditionFailedError(key, "exists" if expected is None else "changed") from exc
        return Version(result.get("e_tag"), result.get("version"))
